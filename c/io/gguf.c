/* GGUF reader: one read-only mapping, every header byte bounds-checked before it is read, the
 * checks of llama.cpp's gguf.cpp (docs/reference/gguf.md §1) plus a few stricter ones (dims
 * >= 1, no NUL inside names, bools 0 or 1).  Keys and tensor names are copied so the API hands
 * out C strings; values stay in the mapping. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "io/gguf.h"
#include "core/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define DEFAULT_ALIGNMENT 32u
#define MAX_STRING_BYTES ((uint64_t)1 << 30)   /* llama.cpp's bound on one string */
#define MAX_ARRAY_ELEMS ((uint64_t)1 << 30)    /* and on one array */
#define MAX_NAME_BYTES 63                      /* GGML_MAX_NAME 64, with its NUL */
/* The smallest encodings, which bound the counts by the file size: a KV is a key length (8),
 * a type (4) and at least one value byte; a tensor info is a name length (8), n_dims (4), one
 * dim (8), a type (4) and an offset (8). */
#define MIN_KV_BYTES 13u
#define MIN_TENSOR_INFO_BYTES 32u

/* ---- types (docs/reference/gguf.md §1 and §2; ids as in ggml.h) --------------------------- */

#define T(name, blck, size, sup) {name, blck, size, sup}
static const mg_ggml_type ggml_types[] = {
    [0] = T("F32", 1, 4, 1),         [1] = T("F16", 1, 2, 1),
    [2] = T("Q4_0", 32, 18, 1),      [3] = T("Q4_1", 32, 20, 1),
    /* 4, 5: Q4_2, Q4_3, removed */
    [6] = T("Q5_0", 32, 22, 1),      [7] = T("Q5_1", 32, 24, 1),
    [8] = T("Q8_0", 32, 34, 1),      [9] = T("Q8_1", 32, 36, 0), /* 2 f16 + 32 i8, as in ggml */
    [10] = T("Q2_K", 256, 84, 1),    [11] = T("Q3_K", 256, 110, 1),
    [12] = T("Q4_K", 256, 144, 1),   [13] = T("Q5_K", 256, 176, 1),
    [14] = T("Q6_K", 256, 210, 1),   [15] = T("Q8_K", 256, 292, 0),
    [16] = T("IQ2_XXS", 256, 66, 1), [17] = T("IQ2_XS", 256, 74, 1),
    [18] = T("IQ3_XXS", 256, 98, 1), [19] = T("IQ1_S", 256, 50, 1),
    [20] = T("IQ4_NL", 32, 18, 1),   [21] = T("IQ3_S", 256, 110, 1),
    [22] = T("IQ2_S", 256, 82, 1),   [23] = T("IQ4_XS", 256, 136, 1),
    [24] = T("I8", 1, 1, 0),         [25] = T("I16", 1, 2, 0),
    [26] = T("I32", 1, 4, 0),        [27] = T("I64", 1, 8, 0),
    [28] = T("F64", 1, 8, 0),        [29] = T("IQ1_M", 256, 56, 1),
    [30] = T("BF16", 1, 2, 1),
    /* 31-33: Q4_0_4_4, Q4_0_4_8, Q4_0_8_8, removed (repacking happens at load now) */
    [34] = T("TQ1_0", 256, 54, 0),   [35] = T("TQ2_0", 256, 66, 0),
    /* 36-38: IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8, removed */
    [39] = T("MXFP4", 32, 17, 1),    [40] = T("NVFP4", 64, 36, 0),
    [41] = T("Q1_0", 128, 18, 0),
};
#undef T
#define N_GGML_TYPES (sizeof ggml_types / sizeof *ggml_types)

const mg_ggml_type *mg_ggml_type_info(uint32_t id) {
    return id < N_GGML_TYPES && ggml_types[id].block_size ? &ggml_types[id] : NULL;
}

uint32_t mg_ggml_type_id_end(void) { return (uint32_t)N_GGML_TYPES; }

/* ik_llama.cpp's own ids (its ggml.h), so that its files are refused by name, not as noise. */
static const struct { uint32_t id; const char *name; } foreign_types[] = {
    {133, "Q6_0"},    {134, "IQ1_BN"},  {135, "IQ2_BN"},  {137, "IQ2_K"},   {138, "IQ3_K"},
    {139, "IQ4_K"},   {140, "IQ5_K"},   {141, "IQ6_K"},   {144, "IQ4_KS"},  {145, "IQ2_KS"},
    {146, "IQ4_KSS"}, {152, "IQ5_KS"},  {153, "IQ2_KT"},  {154, "IQ3_KT"},  {155, "IQ4_KT"},
    {156, "IQ3_KS"},  {157, "IQ2_KL"},  {158, "IQ1_KT"},
};

const char *mg_ggml_foreign_type_name(uint32_t id) {
    for (size_t i = 0; i < sizeof foreign_types / sizeof *foreign_types; i++)
        if (foreign_types[i].id == id) return foreign_types[i].name;
    return NULL;
}

static const char *const vtype_names[MG_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
static const uint8_t vtype_sizes[MG_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *mg_gguf_vtype_name(uint32_t t) { return t < MG_GGUF_VTYPE_COUNT ? vtype_names[t] : "?"; }

/* ---- the file object ------------------------------------------------------------------- */

struct mg_gguf {
    char *path;
    int fd;
    const unsigned char *map;
    uint64_t size;
    uint32_t version, alignment;
    uint64_t data_offset;
    mg_gguf_kv *kvs; /* grown as entries are read, so memory follows the bytes really parsed */
    size_t n_kv, cap_kv;
    mg_gguf_tensor *tensors;
    size_t n_tensors, cap_tensors;
    uint32_t *kv_index, *tensor_index; /* open addressing: slot -> index + 1 */
    size_t kv_mask, tensor_mask;
};

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* A cursor over the mapping: every read checks that the bytes exist first. */
typedef struct cursor {
    const mg_gguf *g;
    uint64_t pos;
} cursor;

static int need(cursor *c, uint64_t n, const char *what, const char *name, mg_error *err) {
    if (n <= c->g->size - c->pos) return 0;
    return mg_fail(err, "%s: truncated file: %s%s%s%s needs %llu bytes at offset %llu, but the file "
                   "ends at %llu", c->g->path, what, name ? " '" : "", name ? name : "",
                   name ? "'" : "", (unsigned long long)n, (unsigned long long)c->pos,
                   (unsigned long long)c->g->size);
}

static int read_u32(cursor *c, uint32_t *v, const char *what, const char *name, mg_error *err) {
    if (need(c, 4, what, name, err)) return -1;
    *v = (uint32_t)le(c->g->map + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int read_u64(cursor *c, uint64_t *v, const char *what, const char *name, mg_error *err) {
    if (need(c, 8, what, name, err)) return -1;
    *v = le(c->g->map + c->pos, 8);
    c->pos += 8;
    return 0;
}

/* Reads a length-prefixed string; *s points into the mapping. */
static int read_string(cursor *c, const unsigned char **s, uint64_t *len, const char *what,
                       const char *name, mg_error *err) {
    if (read_u64(c, len, what, name, err)) return -1;
    if (*len > MAX_STRING_BYTES)
        return mg_fail(err, "%s: %s%s%s%s: string length %llu exceeds the 1 GiB limit", c->g->path,
                       what, name ? " '" : "", name ? name : "", name ? "'" : "",
                       (unsigned long long)*len);
    if (need(c, *len, what, name, err)) return -1;
    *s = c->g->map + c->pos;
    c->pos += *len;
    return 0;
}

/* A key or tensor name: no NUL inside (they are handed out as C strings); copied. */
static int read_name(cursor *c, const char **out, const char *what, mg_error *err) {
    const unsigned char *s = NULL;
    uint64_t len = 0;
    if (read_string(c, &s, &len, what, NULL, err)) return -1;
    if (memchr(s, 0, (size_t)len))
        return mg_fail(err, "%s: %s at offset %llu contains a NUL byte", c->g->path, what,
                       (unsigned long long)(c->pos - len));
    char *copy = malloc((size_t)len + 1);
    if (!copy) return mg_fail(err, "%s: %s: out of memory", c->g->path, what);
    memcpy(copy, s, (size_t)len);
    copy[len] = 0;
    *out = copy;
    return 0;
}

/* Makes room for one more element of an array that doubles. */
static int grow(void **arr, size_t *cap, size_t n, size_t elem, const char *path, mg_error *err) {
    if (n < *cap) return 0;
    size_t c = *cap ? *cap * 2 : 64;
    void *p = realloc(*arr, c * elem);
    if (!p) return mg_fail(err, "%s: out of memory", path);
    memset((char *)p + *cap * elem, 0, (c - *cap) * elem);
    *arr = p;
    *cap = c;
    return 0;
}

static int read_value(cursor *c, mg_gguf_kv *kv, mg_error *err) {
    const char *path = c->g->path, *key = kv->key;
    uint32_t t;
    if (read_u32(c, &t, "the type of key", key, err)) return -1;
    if (t >= MG_GGUF_VTYPE_COUNT)
        return mg_fail(err, "%s: key '%s': unknown value type %u", path, key, t);
    kv->type = kv->elem_type = (mg_gguf_vtype)t;
    kv->count = 1;
    if (t == MG_GGUF_ARRAY) {
        uint32_t et;
        if (read_u32(c, &et, "the element type of key", key, err)) return -1;
        if (et == MG_GGUF_ARRAY)
            return mg_fail(err, "%s: key '%s': array of arrays (nested arrays are not supported)",
                           path, key);
        if (et >= MG_GGUF_VTYPE_COUNT)
            return mg_fail(err, "%s: key '%s': unknown array element type %u", path, key, et);
        kv->elem_type = (mg_gguf_vtype)et;
        if (read_u64(c, &kv->count, "the element count of key", key, err)) return -1;
        if (kv->count > MAX_ARRAY_ELEMS)
            return mg_fail(err, "%s: key '%s': array of %llu elements exceeds the 2^30 limit", path,
                           key, (unsigned long long)kv->count);
    }
    kv->value = c->g->map + c->pos;
    if (kv->elem_type != MG_GGUF_STRING) {
        uint64_t n = kv->count * vtype_sizes[kv->elem_type];
        if (need(c, n, "the value of key", key, err)) return -1;
        if (kv->elem_type == MG_GGUF_BOOL)
            for (uint64_t i = 0; i < kv->count; i++)
                if (kv->value[i] > 1)
                    return mg_fail(err, "%s: key '%s': bool value %u is neither 0 nor 1", path,
                                   key, kv->value[i]);
        c->pos += n;
        return 0;
    }
    uint64_t start = c->pos;
    uint64_t *offs = NULL;
    if (t == MG_GGUF_ARRAY) {
        /* each element needs at least its 8-byte length: bounds the table before allocating */
        if (need(c, kv->count * 8, "the strings of key", key, err)) return -1;
        offs = malloc((size_t)(kv->count ? kv->count : 1) * sizeof *offs);
        if (!offs) return mg_fail(err, "%s: key '%s': out of memory", path, key);
        kv->str_offsets = offs;
    }
    for (uint64_t i = 0; i < kv->count; i++) {
        const unsigned char *s = NULL;
        uint64_t len = 0;
        if (offs) offs[i] = c->pos - start;
        if (read_string(c, &s, &len, "a string of key", key, err)) return -1;
    }
    return 0;
}

static int build_index(const char *path, const char *what, const char **names, size_t n,
                       size_t stride, uint32_t **index, size_t *mask, mg_error *err) {
    size_t slots = 16;
    while (slots < 2 * n) slots *= 2;
    *index = calloc(slots, sizeof **index);
    if (!*index) return mg_fail(err, "%s: out of memory", path);
    *mask = slots - 1;
    for (size_t i = 0; i < n; i++) {
        const char *name = *(const char **)((const char *)names + i * stride);
        size_t h = (size_t)mg_hash_string(name) & *mask;
        while ((*index)[h]) {
            const char *o = *(const char **)((const char *)names + ((*index)[h] - 1) * stride);
            if (!strcmp(o, name))
                return mg_fail(err, "%s: %s '%s' appears twice (duplicate %s)", path, what, name,
                               what);
            h = (h + 1) & *mask;
        }
        (*index)[h] = (uint32_t)(i + 1);
    }
    return 0;
}

static uint32_t lookup(const uint32_t *index, size_t mask, const void *base, size_t stride,
                       const char *name) {
    if (!index || !name) return 0;
    size_t h = (size_t)mg_hash_string(name) & mask;
    while (index[h]) {
        const char *o = *(const char *const *)((const char *)base + (index[h] - 1) * stride);
        if (!strcmp(o, name)) return index[h];
        h = (h + 1) & mask;
    }
    return 0;
}

static int read_alignment(mg_gguf *g, mg_error *err) {
    g->alignment = DEFAULT_ALIGNMENT;
    uint32_t i = lookup(g->kv_index, g->kv_mask, g->kvs, sizeof *g->kvs, "general.alignment");
    if (!i) return 0;
    const mg_gguf_kv *kv = &g->kvs[i - 1];
    /* A u32 and nothing else: reading it as signed shifted every tensor in one reader (§7). */
    if (kv->type != MG_GGUF_U32)
        return mg_fail(err, "%s: key 'general.alignment' is %s, expected u32", g->path,
                       mg_gguf_vtype_name(kv->type));
    uint32_t a = (uint32_t)le(kv->value, 4);
    if (a == 0 || (a & (a - 1)))
        return mg_fail(err, "%s: key 'general.alignment' is %u, not a power of two", g->path, a);
    g->alignment = a;
    return 0;
}

static int read_tensor_info(cursor *c, mg_gguf_tensor *t, const char *what, mg_error *err) {
    const char *path = c->g->path;
    if (read_name(c, &t->name, what, err)) return -1;
    const char *name = t->name;
    if (strlen(name) > MAX_NAME_BYTES)
        return mg_fail(err, "%s: tensor '%s': name of %zu bytes (at most %d)", path, name,
                       strlen(name), MAX_NAME_BYTES);
    if (!*name) return mg_fail(err, "%s: a tensor has an empty name", path);
    uint32_t nd;
    if (read_u32(c, &nd, "n_dims of tensor", name, err)) return -1;
    if (nd < 1 || nd > MG_GGML_MAX_DIMS)
        return mg_fail(err, "%s: tensor '%s': n_dims %u (must be 1..%d)", path, name, nd,
                       MG_GGML_MAX_DIMS);
    t->n_dims = (int)nd;
    for (int i = 0; i < MG_GGML_MAX_DIMS; i++) t->ne[i] = 1;
    for (uint32_t i = 0; i < nd; i++) {
        uint64_t d;
        if (read_u64(c, &d, "the dims of tensor", name, err)) return -1;
        if (d == 0 || d > (uint64_t)INT64_MAX)
            return mg_fail(err, "%s: tensor '%s': dim %u is %llu (must be 1..2^63-1)", path, name,
                           i, (unsigned long long)d);
        t->ne[i] = (int64_t)d;
    }
    if (read_u32(c, &t->type, "the type of tensor", name, err)) return -1;
    if (read_u64(c, &t->offset, "the offset of tensor", name, err)) return -1;
    const mg_ggml_type *ty = mg_ggml_type_info(t->type);
    if (!ty) {
        const char *ik = mg_ggml_foreign_type_name(t->type);
        if (ik)
            return mg_fail(err, "%s: tensor '%s': ggml type %u (%s) exists only in ik_llama.cpp "
                           "and is not supported", path, name, t->type, ik);
        return mg_fail(err, "%s: tensor '%s': unknown or removed ggml type %u", path, name, t->type);
    }
    if (t->ne[0] % ty->block_size)
        return mg_fail(err, "%s: tensor '%s': row length ne[0] = %lld is not a multiple of %s's "
                       "block size %u", path, name, (long long)t->ne[0], ty->name, ty->block_size);
    /* Element count must fit int64 (as in ggml); bytes then fit too: type_size <= block. */
    uint64_t count = (uint64_t)t->ne[0], rows = 1;
    for (int i = 1; i < MG_GGML_MAX_DIMS; i++) {
        if ((uint64_t)t->ne[i] > (uint64_t)INT64_MAX / count)
            return mg_fail(err, "%s: tensor '%s': element count overflows (dims %lld x %lld x %lld "
                           "x %lld)", path, name, (long long)t->ne[0], (long long)t->ne[1],
                           (long long)t->ne[2], (long long)t->ne[3]);
        count *= (uint64_t)t->ne[i];
        rows *= (uint64_t)t->ne[i];
    }
    t->row_bytes = (uint64_t)t->ne[0] / ty->block_size * ty->type_size;
    if (rows > UINT64_MAX / t->row_bytes)
        return mg_fail(err, "%s: tensor '%s': byte size overflows", path, name);
    t->nbytes = t->row_bytes * rows;
    return 0;
}

static int check_layout(mg_gguf *g, mg_error *err) {
    const uint64_t a = g->alignment;
    uint64_t expected = 0; /* the padded end of the tensors so far, relative to the data */
    const char *prev = NULL;
    uint64_t data_room = g->size >= g->data_offset ? g->size - g->data_offset : 0;
    for (size_t i = 0; i < g->n_tensors; i++) {
        mg_gguf_tensor *t = &g->tensors[i];
        const mg_ggml_type *ty = mg_ggml_type_info(t->type);
        if (t->offset % a)
            return mg_fail(err, "%s: tensor '%s': offset %llu is not a multiple of the alignment %llu",
                           g->path, t->name, (unsigned long long)t->offset, (unsigned long long)a);
        if (t->offset > data_room || t->nbytes > data_room - t->offset)
            return mg_fail(err, "%s: tensor '%s' (%s, %llu bytes at data offset %llu) ends past "
                           "the end of the file (%llu bytes of data; truncated file?)", g->path,
                           t->name, ty->name, (unsigned long long)t->nbytes,
                           (unsigned long long)t->offset, (unsigned long long)data_room);
        if (t->offset < expected)
            return mg_fail(err, "%s: tensor '%s': offset %llu overlaps tensor '%s', which ends at %llu",
                           g->path, t->name, (unsigned long long)t->offset, prev,
                           (unsigned long long)expected);
        if (t->offset != expected)
            return mg_fail(err, "%s: tensor '%s': offset %llu, expected %llu (tensors are stored in "
                           "order, each padded to the alignment %llu)", g->path, t->name,
                           (unsigned long long)t->offset, (unsigned long long)expected,
                           (unsigned long long)a);
        uint64_t padded = t->nbytes + (a - t->nbytes % a) % a;
        expected = t->offset + padded; /* no overflow: offset + nbytes <= file size */
        t->file_offset = g->data_offset + t->offset;
        t->data = g->map + t->file_offset;
        prev = t->name;
    }
    return 0;
}

static int parse(mg_gguf *g, mg_error *err) {
    cursor c = {g, 0};
    if (g->size < 4 || memcmp(g->map, GGUF_MAGIC, 4))
        return mg_fail(err, "%s: not a GGUF file (the first 4 bytes are not \"GGUF\")", g->path);
    c.pos = 4;
    if (read_u32(&c, &g->version, "the version", NULL, err)) return -1;
    if (g->version && (g->version & 0xffffu) == 0)
        return mg_fail(err, "%s: the file is big-endian (version reads as 0x%08x); only "
                       "little-endian GGUF files are supported", g->path, g->version);
    if (g->version == 1)
        return mg_fail(err, "%s: GGUF version 1 is no longer supported (convert the file again)",
                       g->path);
    if (g->version != 2 && g->version != 3)
        return mg_fail(err, "%s: unsupported GGUF version %u (2 and 3 are supported)", g->path,
                       g->version);
    uint64_t n_tensors, n_kv;
    if (read_u64(&c, &n_tensors, "the tensor count", NULL, err)) return -1;
    if (read_u64(&c, &n_kv, "the metadata count", NULL, err)) return -1;
    uint64_t rest = g->size - c.pos;
    if (n_kv > rest / MIN_KV_BYTES)
        return mg_fail(err, "%s: %llu metadata entries cannot fit in the file's %llu bytes", g->path,
                       (unsigned long long)n_kv, (unsigned long long)g->size);
    if (n_tensors > rest / MIN_TENSOR_INFO_BYTES || n_tensors > UINT32_MAX / 4)
        return mg_fail(err, "%s: %llu tensors cannot fit in the file's %llu bytes", g->path,
                       (unsigned long long)n_tensors, (unsigned long long)g->size);
    char what[64];
    for (uint64_t i = 0; i < n_kv; i++) {
        if (grow((void **)&g->kvs, &g->cap_kv, g->n_kv, sizeof *g->kvs, g->path, err)) return -1;
        mg_gguf_kv *kv = &g->kvs[g->n_kv++]; /* counted now, so close() frees what it holds */
        snprintf(what, sizeof what, "metadata key #%llu", (unsigned long long)i);
        if (read_name(&c, &kv->key, what, err)) return -1;
        if (read_value(&c, kv, err)) return -1;
    }
    if (grow((void **)&g->kvs, &g->cap_kv, g->n_kv, sizeof *g->kvs, g->path, err) ||
        build_index(g->path, "key", &g->kvs[0].key, g->n_kv, sizeof *g->kvs, &g->kv_index,
                    &g->kv_mask, err))
        return -1;
    if (read_alignment(g, err)) return -1;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors, sizeof *g->tensors, g->path,
                 err))
            return -1;
        mg_gguf_tensor *t = &g->tensors[g->n_tensors++];
        snprintf(what, sizeof what, "the name of tensor #%llu", (unsigned long long)i);
        if (read_tensor_info(&c, t, what, err)) return -1;
    }
    if (grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors, sizeof *g->tensors, g->path,
             err) ||
        build_index(g->path, "tensor name", &g->tensors[0].name, g->n_tensors, sizeof *g->tensors,
                    &g->tensor_index, &g->tensor_mask, err))
        return -1;
    uint64_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    g->data_offset = c.pos + pad;
    return check_layout(g, err);
}

/* ---- public API ------------------------------------------------------------------------ */

mg_gguf *mg_gguf_open(const char *path, mg_error *err) {
    if (!path || !*path) {
        mg_fail(err, "GGUF file not given");
        return NULL;
    }
    mg_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        mg_fail(err, "%s: out of memory", path);
        return NULL;
    }
    g->fd = -1;
    g->fd = open(path, O_RDONLY | O_CLOEXEC);
    int rc = 0;
    struct stat st;
    if (g->fd < 0) rc = mg_fail(err, "%s: cannot open: %s", path, strerror(errno));
    else if (fstat(g->fd, &st)) rc = mg_fail(err, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) rc = mg_fail(err, "%s: not a regular file", path);
    else if (st.st_size < 4)
        rc = mg_fail(err, "%s: not a GGUF file (%llu bytes long)", path,
                     (unsigned long long)st.st_size);
    else if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX / 2)
        rc = mg_fail(err, "%s: file too large to map", path);
    if (!rc) {
        g->size = (uint64_t)st.st_size;
        void *m = mmap(NULL, (size_t)g->size, PROT_READ, MAP_PRIVATE, g->fd, 0);
        if (m == MAP_FAILED) rc = mg_fail(err, "%s: cannot map: %s", path, strerror(errno));
        else g->map = m;
    }
    if (!rc) rc = parse(g, err);
    if (rc) {
        mg_gguf_close(g);
        return NULL;
    }
    return g;
}

void mg_gguf_close(mg_gguf *g) {
    if (!g) return;
    if (g->map) munmap((void *)g->map, (size_t)g->size);
    if (g->fd >= 0) close(g->fd);
    for (size_t i = 0; i < g->n_kv; i++) {
        free((void *)g->kvs[i].key);
        free((void *)g->kvs[i].str_offsets);
    }
    for (size_t i = 0; i < g->n_tensors; i++) free((void *)g->tensors[i].name);
    free(g->kvs);
    free(g->tensors);
    free(g->kv_index);
    free(g->tensor_index);
    free(g->path);
    free(g);
}

const char *mg_gguf_path(const mg_gguf *g) { return g ? g->path : NULL; }
uint32_t mg_gguf_version(const mg_gguf *g) { return g ? g->version : 0; }
uint32_t mg_gguf_alignment(const mg_gguf *g) { return g ? g->alignment : 0; }
uint64_t mg_gguf_data_offset(const mg_gguf *g) { return g ? g->data_offset : 0; }
uint64_t mg_gguf_file_size(const mg_gguf *g) { return g ? g->size : 0; }
int mg_gguf_fd(const mg_gguf *g) { return g ? g->fd : -1; }
size_t mg_gguf_tensor_count(const mg_gguf *g) { return g ? g->n_tensors : 0; }
size_t mg_gguf_kv_count(const mg_gguf *g) { return g ? g->n_kv : 0; }

const mg_gguf_tensor *mg_gguf_tensor_at(const mg_gguf *g, size_t i) {
    return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const mg_gguf_kv *mg_gguf_kv_at(const mg_gguf *g, size_t i) {
    return g && i < g->n_kv ? &g->kvs[i] : NULL;
}

const mg_gguf_tensor *mg_gguf_find_tensor(const mg_gguf *g, const char *name) {
    uint32_t i = g ? lookup(g->tensor_index, g->tensor_mask, g->tensors, sizeof *g->tensors, name) : 0;
    return i ? &g->tensors[i - 1] : NULL;
}

const mg_gguf_kv *mg_gguf_find_kv(const mg_gguf *g, const char *key) {
    uint32_t i = g ? lookup(g->kv_index, g->kv_mask, g->kvs, sizeof *g->kvs, key) : 0;
    return i ? &g->kvs[i - 1] : NULL;
}

int mg_gguf_tensor_slice(const mg_gguf_tensor *t, int64_t i, uint64_t *file_offset,
                         uint64_t *nbytes) {
    if (!t || i < 0 || i >= t->ne[t->n_dims - 1]) return -1;
    uint64_t per = t->nbytes / (uint64_t)t->ne[t->n_dims - 1]; /* exact: nbytes = row_bytes * rows */
    *file_offset = t->file_offset + (uint64_t)i * per;
    *nbytes = per;
    return 0;
}

/* ---- values ---------------------------------------------------------------------------- */

static const unsigned char *element(const mg_gguf_kv *kv, uint64_t i) {
    if (!kv || i >= kv->count || kv->elem_type == MG_GGUF_STRING) return NULL;
    return kv->value + i * vtype_sizes[kv->elem_type];
}

int mg_gguf_kv_int_at(const mg_gguf_kv *kv, uint64_t i, int64_t *out) {
    const unsigned char *p = element(kv, i);
    if (!p) return -1;
    switch (kv->elem_type) {
    case MG_GGUF_U8: *out = p[0]; return 0;
    case MG_GGUF_I8: *out = (int8_t)p[0]; return 0;
    case MG_GGUF_U16: *out = (uint16_t)le(p, 2); return 0;
    case MG_GGUF_I16: *out = (int16_t)(uint16_t)le(p, 2); return 0;
    case MG_GGUF_U32: *out = (uint32_t)le(p, 4); return 0;
    case MG_GGUF_I32: *out = (int32_t)(uint32_t)le(p, 4); return 0;
    case MG_GGUF_I64: *out = (int64_t)le(p, 8); return 0;
    case MG_GGUF_U64: {
        uint64_t v = le(p, 8);
        if (v > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)v;
        return 0;
    }
    default: return -1;
    }
}

int mg_gguf_kv_uint_at(const mg_gguf_kv *kv, uint64_t i, uint64_t *out) {
    const unsigned char *p = element(kv, i);
    if (!p) return -1;
    if (kv->elem_type == MG_GGUF_U64) {
        *out = le(p, 8);
        return 0;
    }
    int64_t v;
    if (mg_gguf_kv_int_at(kv, i, &v) || v < 0) return -1;
    *out = (uint64_t)v;
    return 0;
}

int mg_gguf_kv_float_at(const mg_gguf_kv *kv, uint64_t i, double *out) {
    const unsigned char *p = element(kv, i);
    if (!p) return -1;
    if (kv->elem_type == MG_GGUF_F32) {
        uint32_t bits = (uint32_t)le(p, 4);
        float f;
        memcpy(&f, &bits, 4);
        *out = f;
        return 0;
    }
    if (kv->elem_type == MG_GGUF_F64) {
        uint64_t bits = le(p, 8);
        memcpy(out, &bits, 8);
        return 0;
    }
    return -1;
}

int mg_gguf_kv_bool_at(const mg_gguf_kv *kv, uint64_t i, int *out) {
    const unsigned char *p = element(kv, i);
    if (!p || kv->elem_type != MG_GGUF_BOOL) return -1;
    *out = p[0] != 0;
    return 0;
}

const char *mg_gguf_kv_string_at(const mg_gguf_kv *kv, uint64_t i, size_t *len) {
    if (!kv || kv->elem_type != MG_GGUF_STRING || i >= kv->count) return NULL;
    const unsigned char *p = kv->value + (kv->type == MG_GGUF_ARRAY ? kv->str_offsets[i] : 0);
    if (len) *len = (size_t)le(p, 8);
    return (const char *)p + 8;
}

static int scalar(const mg_gguf_kv *kv) { return kv && kv->type != MG_GGUF_ARRAY; }

int mg_gguf_kv_int(const mg_gguf_kv *kv, int64_t *out) {
    return scalar(kv) ? mg_gguf_kv_int_at(kv, 0, out) : -1;
}
int mg_gguf_kv_uint(const mg_gguf_kv *kv, uint64_t *out) {
    return scalar(kv) ? mg_gguf_kv_uint_at(kv, 0, out) : -1;
}
int mg_gguf_kv_float(const mg_gguf_kv *kv, double *out) {
    return scalar(kv) ? mg_gguf_kv_float_at(kv, 0, out) : -1;
}
int mg_gguf_kv_bool(const mg_gguf_kv *kv, int *out) {
    return scalar(kv) ? mg_gguf_kv_bool_at(kv, 0, out) : -1;
}
const char *mg_gguf_kv_string(const mg_gguf_kv *kv, size_t *len) {
    return scalar(kv) ? mg_gguf_kv_string_at(kv, 0, len) : NULL;
}

static const mg_gguf_kv *get(const mg_gguf *g, const char *key, const char *want, mg_error *err) {
    const mg_gguf_kv *kv = mg_gguf_find_kv(g, key);
    if (!kv) mg_fail(err, "%s: key '%s' not found (expected %s)", mg_gguf_path(g), key, want);
    return kv;
}

static int wrong(const mg_gguf *g, const mg_gguf_kv *kv, const char *want, mg_error *err) {
    if (kv->type == MG_GGUF_ARRAY)
        return mg_fail(err, "%s: key '%s' is an array of %s, expected %s", g->path, kv->key,
                       mg_gguf_vtype_name(kv->elem_type), want);
    return mg_fail(err, "%s: key '%s' is %s, expected %s", g->path, kv->key,
                   mg_gguf_vtype_name(kv->type), want);
}

int mg_gguf_get_int(const mg_gguf *g, const char *key, int64_t *out, mg_error *err) {
    const mg_gguf_kv *kv = get(g, key, "an integer", err);
    if (!kv) return -1;
    return mg_gguf_kv_int(kv, out) ? wrong(g, kv, "an integer that fits in int64", err) : 0;
}

int mg_gguf_get_float(const mg_gguf *g, const char *key, double *out, mg_error *err) {
    const mg_gguf_kv *kv = get(g, key, "f32 or f64", err);
    if (!kv) return -1;
    return mg_gguf_kv_float(kv, out) ? wrong(g, kv, "f32 or f64", err) : 0;
}

const char *mg_gguf_get_string(const mg_gguf *g, const char *key, size_t *len, mg_error *err) {
    const mg_gguf_kv *kv = get(g, key, "a string", err);
    if (!kv) return NULL;
    const char *s = mg_gguf_kv_string(kv, len);
    if (!s) wrong(g, kv, "a string", err);
    return s;
}
