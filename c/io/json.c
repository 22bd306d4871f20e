/* Strict RFC 8259 JSON reader.
 *
 * Every node, string and child array of one document lives in a single arena, so a parse
 * does few allocations and one free releases everything.  Containers are collected on a
 * shared scratch stack while their children are parsed and copied into the arena when they
 * close.  Objects with many keys get an open-addressing hash index, so mg_json_get() stays
 * O(1) on headers with ~100k keys.  Duplicate keys are rejected: they make a document
 * ambiguous (different readers keep different copies). */
#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include "io/json.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define MG_JSON_MAX_DEPTH 256
#define MG_JSON_HASH_MIN 8 /* objects with at least this many keys get a hash index */

struct mg_json {
    mg_json_type type;
    union {
        int boolean;
        struct {
            double value;
            int64_t ivalue;
            int is_int; /* literal without fraction/exponent that fits int64 */
        } num;
        struct {
            const char *s;
            size_t len;
        } str;
        struct {
            size_t n;
            mg_json **items;       /* values (arrays and objects) */
            const char **keys;     /* objects only */
            size_t *key_lens;      /* objects only */
            uint32_t *index;       /* objects with >= MG_JSON_HASH_MIN keys: slot -> i+1 */
            size_t index_mask;
        } c;
    } u;
};

/* ---- arena ---------------------------------------------------------------------------- */

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    max_align_t data[]; /* flexible payload */
} arena_block;

typedef struct arena {
    arena_block *head;
} arena;

static void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    arena_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    return p;
}

static void arena_free(arena *a) {
    arena_block *b = a->head;
    while (b) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}

/* The document root is embedded after the arena, so mg_json_free() can find the arena. */
typedef struct json_doc {
    arena mem;
    mg_json root;
} json_doc;

/* ---- parser state --------------------------------------------------------------------- */

typedef struct scratch_entry {
    mg_json *value;
    const char *key;
    size_t key_len;
} scratch_entry;

typedef struct parser {
    const unsigned char *p, *end, *begin;
    arena *mem;
    mg_error *err;
    scratch_entry *stack;
    size_t top, cap;
    char *buf; /* string decoding scratch */
    size_t buf_cap;
} parser;

static int fail_at(parser *ps, const unsigned char *where, const char *what) {
    return mg_fail(ps->err, "JSON error at byte %zu: %s", (size_t)(where - ps->begin), what);
}

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int push_entry(parser *ps, mg_json *v, const char *key, size_t key_len) {
    if (ps->top == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 256;
        scratch_entry *s = realloc(ps->stack, cap * sizeof *s);
        if (!s) return mg_fail(ps->err, "JSON: out of memory");
        ps->stack = s;
        ps->cap = cap;
    }
    ps->stack[ps->top].value = v;
    ps->stack[ps->top].key = key;
    ps->stack[ps->top].key_len = key_len;
    ps->top++;
    return 0;
}

static int buf_reserve(parser *ps, size_t need) {
    if (need <= ps->buf_cap) return 0;
    size_t cap = ps->buf_cap ? ps->buf_cap : 256;
    while (cap < need) cap *= 2;
    char *b = realloc(ps->buf, cap);
    if (!b) return mg_fail(ps->err, "JSON: out of memory");
    ps->buf = b;
    ps->buf_cap = cap;
    return 0;
}

static int hex4(const unsigned char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when it is malformed, overlong,
 * a surrogate or beyond U+10FFFF. */
static size_t utf8_seq(const unsigned char *s, const unsigned char *end) {
    unsigned c = s[0];
    size_t n;
    unsigned cp, min;
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) { n = 2; cp = c & 0x1f; min = 0x80; }
    else if ((c & 0xf0) == 0xe0) { n = 3; cp = c & 0x0f; min = 0x800; }
    else if ((c & 0xf8) == 0xf0) { n = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if ((size_t)(end - s) < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

/* Parses a string at ps->p (which is at the opening quote) into the arena. */
static int parse_string(parser *ps, const char **out, size_t *out_len) {
    const unsigned char *start = ps->p;
    ps->p++; /* opening quote */
    size_t n = 0;
    for (;;) {
        if (ps->p >= ps->end) return fail_at(ps, start, "unterminated string");
        /* Fast path: a run of printable ASCII without quotes or escapes. */
        const unsigned char *run = ps->p;
        while (run < ps->end && *run >= 0x20 && *run < 0x80 && *run != '"' && *run != '\\') run++;
        if (run > ps->p) {
            size_t k = (size_t)(run - ps->p);
            if (buf_reserve(ps, n + k + 8)) return -1;
            memcpy(ps->buf + n, ps->p, k);
            n += k;
            ps->p = run;
            continue;
        }
        unsigned c = *ps->p;
        if (buf_reserve(ps, n + 8)) return -1;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) return fail_at(ps, ps->p, "control character in string");
        if (c == '\\') {
            if (ps->end - ps->p < 2) return fail_at(ps, start, "unterminated string");
            unsigned e = ps->p[1];
            const unsigned char *esc = ps->p;
            ps->p += 2;
            switch (e) {
            case '"': ps->buf[n++] = '"'; break;
            case '\\': ps->buf[n++] = '\\'; break;
            case '/': ps->buf[n++] = '/'; break;
            case 'b': ps->buf[n++] = '\b'; break;
            case 'f': ps->buf[n++] = '\f'; break;
            case 'n': ps->buf[n++] = '\n'; break;
            case 'r': ps->buf[n++] = '\r'; break;
            case 't': ps->buf[n++] = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (ps->end - ps->p < 4 || hex4(ps->p, &cp))
                    return fail_at(ps, esc, "bad \\u escape");
                ps->p += 4;
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return fail_at(ps, esc, "unpaired low surrogate in \\u escape");
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u' ||
                        hex4(ps->p + 2, &lo) || lo < 0xdc00 || lo > 0xdfff)
                        return fail_at(ps, esc, "unpaired high surrogate in \\u escape");
                    ps->p += 6;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                n += put_utf8(ps->buf + n, cp);
                break;
            }
            default: return fail_at(ps, esc, "invalid escape in string");
            }
            continue;
        }
        size_t k = utf8_seq(ps->p, ps->end);
        if (!k) return fail_at(ps, ps->p, "invalid UTF-8 in string");
        memcpy(ps->buf + n, ps->p, k);
        n += k;
        ps->p += k;
    }
    char *s = arena_alloc(ps->mem, n + 1);
    if (!s) return mg_fail(ps->err, "JSON: out of memory");
    if (n) memcpy(s, ps->buf, n);
    s[n] = 0;
    *out = s;
    *out_len = n;
    return 0;
}

static int parse_number(parser *ps, mg_json *v) {
    const unsigned char *s = ps->p, *q = s;
    int is_int = 1;
    if (q < ps->end && *q == '-') q++;
    if (q >= ps->end || !(*q >= '0' && *q <= '9')) return fail_at(ps, s, "invalid number");
    if (*q == '0') {
        q++;
        if (q < ps->end && *q >= '0' && *q <= '9')
            return fail_at(ps, s, "leading zero in number");
    } else {
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < ps->end && *q == '.') {
        is_int = 0;
        q++;
        if (q >= ps->end || !(*q >= '0' && *q <= '9'))
            return fail_at(ps, s, "digit expected after decimal point");
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        is_int = 0;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (q >= ps->end || !(*q >= '0' && *q <= '9'))
            return fail_at(ps, s, "digit expected in exponent");
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    size_t len = (size_t)(q - s);
    /* Integers are converted exactly (byte offsets beyond 2^53 must not round). */
    v->type = MG_JSON_NUMBER;
    v->u.num.is_int = 0;
    v->u.num.ivalue = 0;
    if (is_int) {
        const unsigned char *d = s;
        int neg = *d == '-';
        if (neg) d++;
        uint64_t acc = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        int fits = 1;
        for (; d < q; d++) {
            unsigned dig = (unsigned)(*d - '0');
            if (acc > (lim - dig) / 10) { fits = 0; break; }
            acc = acc * 10 + dig;
        }
        if (fits) {
            v->u.num.is_int = 1;
            v->u.num.ivalue = neg ? (acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc)
                                  : (int64_t)acc;
        }
    }
    if (v->u.num.is_int) { /* int64 -> double rounds to nearest, as strtod would */
        v->u.num.value = (double)v->u.num.ivalue;
        ps->p = q;
        return 0;
    }
    /* strtod honours the C locale's decimal point; translate '.' if the host changed it. */
    char small[64], *tmp = len < sizeof small ? small : malloc(len + 1);
    if (!tmp) return mg_fail(ps->err, "JSON: out of memory");
    memcpy(tmp, s, len);
    tmp[len] = 0;
    const char *dp = localeconv()->decimal_point;
    if (dp && dp[0] && dp[0] != '.' && !dp[1]) {
        for (size_t i = 0; i < len; i++)
            if (tmp[i] == '.') tmp[i] = dp[0];
    }
    errno = 0;
    double d = strtod(tmp, NULL);
    if (tmp != small) free(tmp);
    if (!isfinite(d)) return fail_at(ps, s, "number out of range");
    v->u.num.value = d;
    ps->p = q;
    return 0;
}

static int expect_literal(parser *ps, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, lit, n))
        return fail_at(ps, ps->p, "unexpected token");
    ps->p += n;
    return 0;
}

static uint64_t hash_key(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Copies the scratch entries [base, top) into v's arena arrays; builds the key index and
 * rejects duplicate keys for objects. */
static int close_container(parser *ps, mg_json *v, size_t base, int is_object,
                           const unsigned char *open) {
    size_t n = ps->top - base;
    v->u.c.n = n;
    v->u.c.items = NULL;
    v->u.c.keys = NULL;
    v->u.c.key_lens = NULL;
    v->u.c.index = NULL;
    v->u.c.index_mask = 0;
    if (n) {
        v->u.c.items = arena_alloc(ps->mem, n * sizeof(mg_json *));
        if (!v->u.c.items) return mg_fail(ps->err, "JSON: out of memory");
        for (size_t i = 0; i < n; i++) v->u.c.items[i] = ps->stack[base + i].value;
    }
    if (is_object && n) {
        v->u.c.keys = arena_alloc(ps->mem, n * sizeof(char *));
        v->u.c.key_lens = arena_alloc(ps->mem, n * sizeof(size_t));
        if (!v->u.c.keys || !v->u.c.key_lens) return mg_fail(ps->err, "JSON: out of memory");
        for (size_t i = 0; i < n; i++) {
            v->u.c.keys[i] = ps->stack[base + i].key;
            v->u.c.key_lens[i] = ps->stack[base + i].key_len;
        }
        if (n >= MG_JSON_HASH_MIN) {
            if (n > UINT32_MAX / 4) return fail_at(ps, open, "object too large");
            size_t slots = 16;
            while (slots < 2 * n) slots *= 2;
            uint32_t *idx = arena_alloc(ps->mem, slots * sizeof(uint32_t));
            if (!idx) return mg_fail(ps->err, "JSON: out of memory");
            memset(idx, 0, slots * sizeof(uint32_t));
            for (size_t i = 0; i < n; i++) {
                const char *k = v->u.c.keys[i];
                size_t kl = v->u.c.key_lens[i];
                size_t h = (size_t)hash_key(k, kl) & (slots - 1);
                while (idx[h]) {
                    size_t j = idx[h] - 1;
                    if (v->u.c.key_lens[j] == kl && !memcmp(v->u.c.keys[j], k, kl)) {
                        mg_fail(ps->err, "JSON error in object at byte %zu: duplicate key '%.200s'",
                                (size_t)(open - ps->begin), k);
                        return -1;
                    }
                    h = (h + 1) & (slots - 1);
                }
                idx[h] = (uint32_t)(i + 1);
            }
            v->u.c.index = idx;
            v->u.c.index_mask = slots - 1;
        } else {
            for (size_t i = 1; i < n; i++)
                for (size_t j = 0; j < i; j++)
                    if (v->u.c.key_lens[i] == v->u.c.key_lens[j] &&
                        !memcmp(v->u.c.keys[i], v->u.c.keys[j], v->u.c.key_lens[i])) {
                        mg_fail(ps->err, "JSON error in object at byte %zu: duplicate key '%.200s'",
                                (size_t)(open - ps->begin), v->u.c.keys[i]);
                        return -1;
                    }
        }
    }
    ps->top = base;
    return 0;
}

static int parse_value(parser *ps, mg_json *v, int depth) {
    skip_ws(ps);
    if (ps->p >= ps->end) return fail_at(ps, ps->p, "unexpected end of input");
    unsigned c = *ps->p;
    switch (c) {
    case 'n': v->type = MG_JSON_NULL; return expect_literal(ps, "null");
    case 't': v->type = MG_JSON_BOOL; v->u.boolean = 1; return expect_literal(ps, "true");
    case 'f': v->type = MG_JSON_BOOL; v->u.boolean = 0; return expect_literal(ps, "false");
    case '"':
        v->type = MG_JSON_STRING;
        return parse_string(ps, &v->u.str.s, &v->u.str.len);
    case '[':
    case '{': {
        int is_object = c == '{';
        const unsigned char *open = ps->p;
        if (depth >= MG_JSON_MAX_DEPTH) return fail_at(ps, open, "nesting too deep");
        v->type = is_object ? MG_JSON_OBJECT : MG_JSON_ARRAY;
        v->u.c.n = 0; /* valid even if we fail below */
        size_t base = ps->top;
        ps->p++;
        skip_ws(ps);
        unsigned close = is_object ? '}' : ']';
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return close_container(ps, v, base, is_object, open);
        }
        for (;;) {
            const char *key = NULL;
            size_t key_len = 0;
            if (is_object) {
                skip_ws(ps);
                if (ps->p >= ps->end) return fail_at(ps, ps->p, "unexpected end of input in object");
                if (*ps->p != '"') return fail_at(ps, ps->p, "object key (string) expected");
                if (parse_string(ps, &key, &key_len)) return -1;
                skip_ws(ps);
                if (ps->p >= ps->end || *ps->p != ':') return fail_at(ps, ps->p, "':' expected");
                ps->p++;
            }
            mg_json *child = arena_alloc(ps->mem, sizeof *child);
            if (!child) return mg_fail(ps->err, "JSON: out of memory");
            if (parse_value(ps, child, depth + 1)) return -1;
            if (push_entry(ps, child, key, key_len)) return -1;
            skip_ws(ps);
            if (ps->p >= ps->end) return fail_at(ps, ps->p, "unexpected end of input in container");
            if (*ps->p == ',') {
                ps->p++;
                continue;
            }
            if (*ps->p == close) {
                ps->p++;
                return close_container(ps, v, base, is_object, open);
            }
            return fail_at(ps, ps->p, is_object ? "',' or '}' expected" : "',' or ']' expected");
        }
    }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(ps, v);
        return fail_at(ps, ps->p, "unexpected character");
    }
}

mg_json *mg_json_parse(const char *text, size_t len, mg_error *err) {
    if (!text && len) {
        mg_fail(err, "JSON: no input");
        return NULL;
    }
    json_doc *doc = calloc(1, sizeof *doc);
    if (!doc) {
        mg_fail(err, "JSON: out of memory");
        return NULL;
    }
    parser ps = {0};
    ps.begin = ps.p = (const unsigned char *)text;
    ps.end = ps.begin + len;
    ps.mem = &doc->mem;
    ps.err = err;
    int rc = parse_value(&ps, &doc->root, 0);
    if (!rc) {
        skip_ws(&ps);
        if (ps.p != ps.end) rc = fail_at(&ps, ps.p, "unexpected data after the JSON value");
    }
    free(ps.stack);
    free(ps.buf);
    if (rc) {
        arena_free(&doc->mem);
        free(doc);
        return NULL;
    }
    return &doc->root;
}

void mg_json_free(mg_json *root) {
    if (!root) return;
    json_doc *doc = (json_doc *)((char *)root - offsetof(json_doc, root));
    arena_free(&doc->mem);
    free(doc);
}

mg_json_type mg_json_type_of(const mg_json *v) { return v ? v->type : MG_JSON_NULL; }

const mg_json *mg_json_get_n(const mg_json *obj, const char *key, size_t key_len) {
    if (!obj || obj->type != MG_JSON_OBJECT || !key) return NULL;
    size_t n = obj->u.c.n;
    if (obj->u.c.index) {
        size_t mask = obj->u.c.index_mask, h = (size_t)hash_key(key, key_len) & mask;
        while (obj->u.c.index[h]) {
            size_t j = obj->u.c.index[h] - 1;
            if (obj->u.c.key_lens[j] == key_len && !memcmp(obj->u.c.keys[j], key, key_len))
                return obj->u.c.items[j];
            h = (h + 1) & mask;
        }
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (obj->u.c.key_lens[i] == key_len && !memcmp(obj->u.c.keys[i], key, key_len))
            return obj->u.c.items[i];
    return NULL;
}

const mg_json *mg_json_get(const mg_json *obj, const char *key) {
    return key ? mg_json_get_n(obj, key, strlen(key)) : NULL;
}

size_t mg_json_len(const mg_json *v) {
    if (!v || (v->type != MG_JSON_ARRAY && v->type != MG_JSON_OBJECT)) return 0;
    return v->u.c.n;
}

const mg_json *mg_json_at(const mg_json *v, size_t i) {
    if (!v || (v->type != MG_JSON_ARRAY && v->type != MG_JSON_OBJECT) || i >= v->u.c.n) return NULL;
    return v->u.c.items[i];
}

const char *mg_json_key_at(const mg_json *obj, size_t i) {
    if (!obj || obj->type != MG_JSON_OBJECT || i >= obj->u.c.n) return NULL;
    return obj->u.c.keys[i];
}

size_t mg_json_key_len_at(const mg_json *obj, size_t i) {
    if (!obj || obj->type != MG_JSON_OBJECT || i >= obj->u.c.n) return 0;
    return obj->u.c.key_lens[i];
}

double mg_json_number(const mg_json *v) {
    return v && v->type == MG_JSON_NUMBER ? v->u.num.value : 0.0;
}

int mg_json_is_integer(const mg_json *v) {
    if (!v || v->type != MG_JSON_NUMBER) return 0;
    if (v->u.num.is_int) return 1;
    double d = v->u.num.value; /* e.g. 1.0 or 1e3: integral and exactly representable */
    return d == floor(d) && fabs(d) <= 9007199254740992.0;
}

int64_t mg_json_int(const mg_json *v) {
    if (!v || v->type != MG_JSON_NUMBER) return 0;
    if (v->u.num.is_int) return v->u.num.ivalue;
    double d = v->u.num.value;
    if (!(d > -9223372036854775808.0)) return INT64_MIN;
    if (!(d < 9223372036854775808.0)) return INT64_MAX;
    return (int64_t)d;
}

int mg_json_bool(const mg_json *v) { return v && v->type == MG_JSON_BOOL ? v->u.boolean : 0; }

const char *mg_json_string(const mg_json *v) {
    return v && v->type == MG_JSON_STRING ? v->u.str.s : NULL;
}

size_t mg_json_string_len(const mg_json *v) {
    return v && v->type == MG_JSON_STRING ? v->u.str.len : 0;
}
