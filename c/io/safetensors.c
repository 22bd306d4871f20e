/* safetensors checkpoint loader: strict header validation, read-only mappings, one hash
 * table of tensor names for the whole checkpoint. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "io/safetensors.h"
#include "core/hash.h"
#include "io/checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/formats.h"
#include "io/json.h"

#define INDEX_FILE "model.safetensors.index.json"
#define MAX_HEADER_BYTES ((uint64_t)100 * 1000 * 1000) /* the reference library's limit */
#define MAX_INDEX_BYTES ((off_t)512 * 1024 * 1024)
#define ST_SUFFIX ".safetensors"

static const char *const dtype_names[MG_DT_COUNT] = {
    [MG_DT_F32] = "F32",         [MG_DT_F16] = "F16",         [MG_DT_BF16] = "BF16",
    [MG_DT_F64] = "F64",         [MG_DT_F8_E4M3] = "F8_E4M3", [MG_DT_F8_E5M2] = "F8_E5M2",
    [MG_DT_F8_E8M0] = "F8_E8M0", [MG_DT_I8] = "I8",           [MG_DT_U8] = "U8",
    [MG_DT_I16] = "I16",         [MG_DT_I32] = "I32",         [MG_DT_I64] = "I64",
    [MG_DT_BOOL] = "BOOL",        [MG_DT_GGML] = "GGML",
};

static const size_t dtype_sizes[MG_DT_COUNT] = {
    [MG_DT_F32] = 4,     [MG_DT_F16] = 2,     [MG_DT_BF16] = 2,    [MG_DT_F64] = 8,
    [MG_DT_F8_E4M3] = 1, [MG_DT_F8_E5M2] = 1, [MG_DT_F8_E8M0] = 1, [MG_DT_I8] = 1,
    [MG_DT_U8] = 1,      [MG_DT_I16] = 2,     [MG_DT_I32] = 4,     [MG_DT_I64] = 8,
    [MG_DT_BOOL] = 1,    [MG_DT_GGML] = 0,
};

const char *mg_dtype_name(mg_dtype dt) {
    return (unsigned)dt < MG_DT_COUNT ? dtype_names[dt] : "?";
}

size_t mg_dtype_size(mg_dtype dt) { return (unsigned)dt < MG_DT_COUNT ? dtype_sizes[dt] : 0; }

static int dtype_from_name(const char *s, mg_dtype *out) {
    /* Up to MG_DT_GGML: a safetensors header never names a ggml block format (its size 0
     * would break the byte count check). */
    for (int i = 0; i < MG_DT_GGML; i++)
        if (!strcmp(s, dtype_names[i])) {
            *out = (mg_dtype)i;
            return 0;
        }
    return -1;
}

/* ---- small helpers ------------------------------------------------------------------- */

static char *join_path(const char *dir, const char *name) {
    size_t dl = strlen(dir), nl = strlen(name);
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    char *p = malloc(dl + 1 + nl + 1);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    p[dl] = '/';
    memcpy(p + dl + 1, name, nl + 1);
    return p;
}

static int ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

/* A shard name taken from index.json must name a file directly inside the folder. */
static const char *unsafe_shard_name(const char *s, size_t len) {
    if (len == 0) return "empty file name";
    if (strlen(s) != len) return "file name contains a NUL character";
    if (strchr(s, '/') || strchr(s, '\\')) return "file name contains a path separator";
    if (!strcmp(s, ".") || !strcmp(s, "..") || s[0] == '.') return "file name starts with '.'";
    if (len <= strlen(ST_SUFFIX) || !ends_with(s, len, ST_SUFFIX))
        return "file name does not end in " ST_SUFFIX;
    return NULL;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* ---- shards -------------------------------------------------------------------------- */

static void shard_release(mg_shard *sh) {
    if (sh->gguf) {
        mg_gguf_close(sh->gguf); /* owns the mapping and the descriptor */
    } else {
        if (sh->map) munmap((void *)sh->map, (size_t)sh->size);
        if (sh->fd >= 0) close(sh->fd);
    }
    sh->gguf = NULL;
    mg_json_free(sh->header);
    free(sh->path);
    sh->map = NULL;
    sh->fd = -1;
    sh->header = NULL;
    sh->path = NULL;
}

int mg_ck_push_tensor(mg_checkpoint *ck, const mg_tensor *t, mg_error *err) {
    if (ck->n_tensors == ck->cap_tensors) {
        size_t cap = ck->cap_tensors ? ck->cap_tensors * 2 : 256;
        mg_tensor *p = realloc(ck->tensors, cap * sizeof *p);
        if (!p) return mg_fail(err, "%s: out of memory", ck->dir);
        ck->tensors = p;
        ck->cap_tensors = cap;
    }
    ck->tensors[ck->n_tensors++] = *t;
    return 0;
}

typedef struct range {
    uint64_t begin, end;
    size_t tensor;
} range;

static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Reads one tensor entry of a header into t (data pointers are set later). */
static int parse_entry(const mg_shard *sh, const char *name, size_t name_len, const mg_json *e,
                       mg_tensor *t, uint64_t *begin, uint64_t *end, mg_error *err) {
    const char *path = sh->path;
    if (strlen(name) != name_len)
        return mg_fail(err, "%s: tensor '%s': name contains a NUL character", path, name);
    if (mg_json_type_of(e) != MG_JSON_OBJECT)
        return mg_fail(err, "%s: tensor '%s': header entry is not an object", path, name);
    const mg_json *jd = mg_json_get(e, "dtype"), *js = mg_json_get(e, "shape"),
                  *jo = mg_json_get(e, "data_offsets");
    if (!jd || !js || !jo)
        return mg_fail(err, "%s: tensor '%s': header entry needs dtype, shape and data_offsets",
                       path, name);
    if (mg_json_len(e) != 3)
        return mg_fail(err, "%s: tensor '%s': unexpected extra fields in header entry", path, name);
    if (mg_json_type_of(jd) != MG_JSON_STRING)
        return mg_fail(err, "%s: tensor '%s': dtype is not a string", path, name);
    if (dtype_from_name(mg_json_string(jd), &t->dtype))
        return mg_fail(err, "%s: tensor '%s': unknown dtype '%.64s'", path, name, mg_json_string(jd));
    if (mg_json_type_of(js) != MG_JSON_ARRAY)
        return mg_fail(err, "%s: tensor '%s': shape is not an array", path, name);
    size_t nd = mg_json_len(js);
    if (nd > MG_MAX_DIMS)
        return mg_fail(err, "%s: tensor '%s': %zu dimensions (at most %d supported)", path, name,
                       nd, MG_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t count = 1;
    int overflow = 0;
    for (size_t i = 0; i < nd; i++) {
        const mg_json *d = mg_json_at(js, i);
        if (mg_json_type_of(d) != MG_JSON_NUMBER || !mg_json_is_integer(d) || mg_json_int(d) < 0)
            return mg_fail(err, "%s: tensor '%s': shape[%zu] is not a non-negative integer", path,
                           name, i);
        int64_t v = mg_json_int(d);
        t->shape[i] = v;
        if (v && count > UINT64_MAX / (uint64_t)v) overflow = 1;
        else count *= (uint64_t)v;
    }
    for (size_t i = nd; i < MG_MAX_DIMS; i++) t->shape[i] = 0;
    if (mg_json_type_of(jo) != MG_JSON_ARRAY || mg_json_len(jo) != 2)
        return mg_fail(err, "%s: tensor '%s': data_offsets is not a pair [begin, end]", path, name);
    const mg_json *jb = mg_json_at(jo, 0), *je = mg_json_at(jo, 1);
    if (!mg_json_is_integer(jb) || !mg_json_is_integer(je) || mg_json_int(jb) < 0 ||
        mg_json_int(je) < 0)
        return mg_fail(err, "%s: tensor '%s': data_offsets are not non-negative integers", path,
                       name);
    *begin = (uint64_t)mg_json_int(jb);
    *end = (uint64_t)mg_json_int(je);
    if (*end < *begin)
        return mg_fail(err, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin",
                       path, name, (unsigned long long)*begin, (unsigned long long)*end);
    size_t esz = dtype_sizes[t->dtype];
    if (overflow || count > UINT64_MAX / esz || count * esz != *end - *begin) {
        char shp[160];
        format_shape(shp, sizeof shp, t->ndim, t->shape);
        return mg_fail(err,
                       "%s: tensor '%s': shape %s of %s needs %s%llu bytes but data_offsets "
                       "[%llu, %llu] hold %llu",
                       path, name, shp, dtype_names[t->dtype], overflow ? "more than " : "",
                       overflow ? (unsigned long long)UINT64_MAX
                                : (unsigned long long)(count * esz),
                       (unsigned long long)*begin, (unsigned long long)*end,
                       (unsigned long long)(*end - *begin));
    }
    t->name = name;
    t->nbytes = (size_t)(*end - *begin);
    return 0;
}

/* Opens, maps and validates shard ck->shards[si] (whose path is already set); appends its
 * tensors.  `why` (may be NULL) names a tensor that needed this shard, for open errors. */
static int load_shard(mg_checkpoint *ck, int si, const char *why, const char *index_path,
                      mg_error *err) {
    mg_shard *sh = &ck->shards[si];
    const char *path = sh->path;
    sh->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (sh->fd < 0) {
        if (why)
            return mg_fail(err, "%s: tensor '%s' is mapped to shard %s, which cannot be opened: %s",
                           index_path, why, path, strerror(errno));
        return mg_fail(err, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(sh->fd, &st)) return mg_fail(err, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return mg_fail(err, "%s: not a regular file", path);
    sh->size = (uint64_t)st.st_size;
    if (sh->size < 8)
        return mg_fail(err, "%s: file is %llu bytes, too short for a safetensors header", path,
                       (unsigned long long)sh->size);
    if (sh->size > (uint64_t)SIZE_MAX) return mg_fail(err, "%s: file too large to map", path);
    void *m = mmap(NULL, (size_t)sh->size, PROT_READ, MAP_PRIVATE, sh->fd, 0);
    if (m == MAP_FAILED) return mg_fail(err, "%s: cannot map: %s", path, strerror(errno));
    sh->map = m;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | sh->map[i];
    if (hlen > sh->size - 8)
        return mg_fail(err,
                       "%s: header length %llu exceeds the file size %llu (truncated file or "
                       "not a safetensors file)",
                       path, (unsigned long long)hlen, (unsigned long long)sh->size);
    if (hlen > MAX_HEADER_BYTES)
        return mg_fail(err, "%s: header length %llu is larger than the %llu bytes allowed", path,
                       (unsigned long long)hlen, (unsigned long long)MAX_HEADER_BYTES);
    if (hlen < 2) return mg_fail(err, "%s: header of %llu bytes is too short", path,
                                 (unsigned long long)hlen);
    sh->data_start = 8 + hlen;
    mg_error jerr;
    sh->header = mg_json_parse((const char *)sh->map + 8, (size_t)hlen, &jerr);
    if (!sh->header) return mg_fail(err, "%s: header: %s", path, jerr.msg);
    if (mg_json_type_of(sh->header) != MG_JSON_OBJECT)
        return mg_fail(err, "%s: header is not a JSON object", path);

    size_t n = mg_json_len(sh->header), first = ck->n_tensors;
    uint64_t data_size = sh->size - sh->data_start;
    range *ranges = malloc((n ? n : 1) * sizeof *ranges);
    if (!ranges) return mg_fail(err, "%s: out of memory", path);
    size_t nr = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *key = mg_json_key_at(sh->header, i);
        const mg_json *e = mg_json_at(sh->header, i);
        if (!strcmp(key, "__metadata__")) {
            if (mg_json_type_of(e) != MG_JSON_OBJECT) {
                rc = mg_fail(err, "%s: __metadata__ is not an object", path);
                break;
            }
            for (size_t j = 0; j < mg_json_len(e); j++)
                if (mg_json_type_of(mg_json_at(e, j)) != MG_JSON_STRING) {
                    rc = mg_fail(err, "%s: __metadata__ value '%s' is not a string", path,
                                 mg_json_key_at(e, j));
                    break;
                }
            continue;
        }
        mg_tensor t;
        memset(&t, 0, sizeof t);
        uint64_t b = 0, en = 0;
        rc = parse_entry(sh, key, mg_json_key_len_at(sh->header, i), e, &t, &b, &en, err);
        if (rc) break;
        t.shard = si;
        t.file_offset = sh->data_start + b;
        ranges[nr].begin = b;
        ranges[nr].end = en;
        ranges[nr].tensor = ck->n_tensors;
        nr++;
        rc = mg_ck_push_tensor(ck, &t, err);
    }
    if (!rc) {
        /* Truncation: report the tensor that starts first among those that do not fit. */
        const range *bad = NULL;
        for (size_t i = 0; i < nr; i++)
            if (ranges[i].end > data_size && (!bad || ranges[i].begin < bad->begin)) bad = &ranges[i];
        if (bad)
            rc = mg_fail(err,
                         "%s: tensor '%s': data [%llu, %llu) lies beyond the end of the file "
                         "(data area holds %llu bytes; file truncated?)",
                         path, ck->tensors[bad->tensor].name, (unsigned long long)bad->begin,
                         (unsigned long long)bad->end, (unsigned long long)data_size);
    }
    if (!rc && nr > 0) {
        /* Overlap: the reference writer never produces it; aliasing tensors are a defect. */
        qsort(ranges, nr, sizeof *ranges, cmp_range);
        const range *prev = NULL;
        for (size_t i = 0; i < nr && !rc; i++) {
            if (ranges[i].begin == ranges[i].end) continue;
            if (prev && ranges[i].begin < prev->end)
                rc = mg_fail(err, "%s: tensor '%s': data [%llu, %llu) overlaps tensor '%s' [%llu, %llu)",
                             path, ck->tensors[ranges[i].tensor].name,
                             (unsigned long long)ranges[i].begin, (unsigned long long)ranges[i].end,
                             ck->tensors[prev->tensor].name, (unsigned long long)prev->begin,
                             (unsigned long long)prev->end);
            if (!prev || ranges[i].end > prev->end) prev = &ranges[i];
        }
    }
    if (!rc) {
        /* Coverage: the format indexes every byte of the data area, with no holes and nothing
         * after the last tensor.  A header length a few bytes off can still parse (the JSON
         * ends in padding spaces) and would shift every tensor's data; this catches it. */
        uint64_t covered = 0;
        for (size_t i = 0; i < nr && !rc; i++) {
            if (ranges[i].begin == ranges[i].end) continue;
            if (ranges[i].begin > covered)
                rc = mg_fail(err, "%s: data bytes [%llu, %llu) before tensor '%s' belong to no tensor "
                             "(wrong data_offsets or header length?)",
                             path, (unsigned long long)covered, (unsigned long long)ranges[i].begin,
                             ck->tensors[ranges[i].tensor].name);
            if (ranges[i].end > covered) covered = ranges[i].end;
        }
        if (!rc && covered != data_size)
            rc = mg_fail(err, "%s: the data area holds %llu bytes but the tensors cover %llu "
                         "(wrong header length or data_offsets, or bytes appended to the file?)",
                         path, (unsigned long long)data_size, (unsigned long long)covered);
    }
    free(ranges);
    if (rc) return rc;
    for (size_t i = first; i < ck->n_tensors; i++) {
        mg_tensor *t = &ck->tensors[i];
        t->data = sh->map + t->file_offset;
        ck->total_bytes += t->nbytes;
    }
    return 0;
}

int mg_ck_build_index(mg_checkpoint *ck, mg_error *err) {
    if (ck->n_tensors > UINT32_MAX / 4) return mg_fail(err, "%s: too many tensors", ck->dir);
    size_t slots = 16;
    while (slots < 2 * ck->n_tensors) slots *= 2;
    ck->index = calloc(slots, sizeof *ck->index);
    if (!ck->index) return mg_fail(err, "%s: out of memory", ck->dir);
    ck->index_mask = slots - 1;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const mg_tensor *t = &ck->tensors[i];
        size_t h = (size_t)mg_hash_string(t->name) & ck->index_mask;
        while (ck->index[h]) {
            const mg_tensor *o = &ck->tensors[ck->index[h] - 1];
            if (!strcmp(o->name, t->name))
                return mg_fail(err, "%s: tensor '%s': also present in %s (duplicate tensor name)",
                               ck->shards[t->shard].path, t->name, ck->shards[o->shard].path);
            h = (h + 1) & ck->index_mask;
        }
        ck->index[h] = (uint32_t)(i + 1);
    }
    return 0;
}

/* ---- folder discovery ---------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int mg_ck_alloc_shards(mg_checkpoint *ck, int n, mg_error *err) {
    ck->shards = calloc((size_t)(n ? n : 1), sizeof *ck->shards);
    if (!ck->shards) return mg_fail(err, "%s: out of memory", ck->dir);
    for (int i = 0; i < n; i++) ck->shards[i].fd = -1;
    ck->n_shards = n;
    return 0;
}

/* Reads a whole small file into a malloc'd buffer. */
static char *read_file(const char *path, size_t *len, mg_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        mg_fail(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > MAX_INDEX_BYTES) {
        mg_fail(err, "%s: not a regular file of reasonable size", path);
        close(fd);
        return NULL;
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = malloc(n ? n : 1);
    if (!buf) {
        mg_fail(err, "%s: out of memory", path);
        close(fd);
        return NULL;
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            mg_fail(err, "%s: read error: %s", path, r ? strerror(errno) : "unexpected end of file");
            free(buf);
            close(fd);
            return NULL;
        }
        got += (size_t)r;
    }
    close(fd);
    *len = n;
    return buf;
}

typedef struct shard_ref {
    const char *file;
    const char *first_tensor;
} shard_ref;

static int cmp_ref(const void *a, const void *b) {
    return strcmp(((const shard_ref *)a)->file, ((const shard_ref *)b)->file);
}

static int open_from_index(mg_checkpoint *ck, const char *index_path, mg_error *err) {
    size_t len = 0;
    char *text = read_file(index_path, &len, err);
    if (!text) return -1;
    mg_error jerr;
    mg_json *doc = mg_json_parse(text, len, &jerr);
    free(text);
    if (!doc) return mg_fail(err, "%s: %s", index_path, jerr.msg);
    int rc = 0;
    shard_ref *refs = NULL;
    const mg_json *wm = mg_json_get(doc, "weight_map");
    if (mg_json_type_of(doc) != MG_JSON_OBJECT || mg_json_type_of(wm) != MG_JSON_OBJECT) {
        rc = mg_fail(err, "%s: no \"weight_map\" object", index_path);
        goto done;
    }
    const mg_json *md = mg_json_get(doc, "metadata");
    if (md && mg_json_type_of(md) != MG_JSON_OBJECT && mg_json_type_of(md) != MG_JSON_NULL) {
        rc = mg_fail(err, "%s: \"metadata\" is not an object", index_path);
        goto done;
    }
    size_t n = mg_json_len(wm);
    if (n == 0) {
        rc = mg_fail(err, "%s: weight_map is empty", index_path);
        goto done;
    }
    refs = malloc(n * sizeof *refs);
    if (!refs) {
        rc = mg_fail(err, "%s: out of memory", index_path);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const char *tname = mg_json_key_at(wm, i);
        const mg_json *v = mg_json_at(wm, i);
        if (mg_json_type_of(v) != MG_JSON_STRING) {
            rc = mg_fail(err, "%s: tensor '%s': weight_map value is not a file name", index_path,
                         tname);
            goto done;
        }
        const char *why = unsafe_shard_name(mg_json_string(v), mg_json_string_len(v));
        if (why) {
            rc = mg_fail(err, "%s: tensor '%s': refusing shard name '%.200s': %s", index_path,
                         tname, mg_json_string(v), why);
            goto done;
        }
        refs[i].file = mg_json_string(v);
        refs[i].first_tensor = tname;
    }
    /* Unique shard names, sorted; a stable sort is not needed because any tensor naming the
     * shard serves to explain an open error. */
    qsort(refs, n, sizeof *refs, cmp_ref);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (!u || strcmp(refs[u - 1].file, refs[i].file)) refs[u++] = refs[i];
    if (u > 100000) {
        rc = mg_fail(err, "%s: too many shards (%zu)", index_path, u);
        goto done;
    }
    if ((rc = mg_ck_alloc_shards(ck, (int)u, err))) goto done;
    for (size_t i = 0; i < u; i++) {
        ck->shards[i].path = join_path(ck->dir, refs[i].file);
        if (!ck->shards[i].path) {
            rc = mg_fail(err, "%s: out of memory", index_path);
            goto done;
        }
        if ((rc = load_shard(ck, (int)i, refs[i].first_tensor, index_path, err))) goto done;
    }
    if ((rc = mg_ck_build_index(ck, err))) goto done;
    for (size_t i = 0; i < n; i++) {
        const char *tname = mg_json_key_at(wm, i);
        const char *file = mg_json_string(mg_json_at(wm, i));
        const mg_tensor *t = mg_checkpoint_find(ck, tname);
        const char *found_in = t ? ck->shards[t->shard].path : NULL;
        const char *base = found_in ? strrchr(found_in, '/') + 1 : NULL;
        if (!t) {
            rc = mg_fail(err, "%s: tensor '%s' is listed in shard %s, which does not contain it",
                         index_path, tname, file);
            goto done;
        }
        if (strcmp(base, file)) {
            rc = mg_fail(err, "%s: tensor '%s' is listed in shard %s but is stored in %s",
                         index_path, tname, file, base);
            goto done;
        }
    }
done:
    free(refs);
    mg_json_free(doc);
    return rc;
}

static int open_from_listing(mg_checkpoint *ck, mg_error *err) {
    DIR *d = opendir(ck->dir);
    if (!d) return mg_fail(err, "%s: cannot open folder: %s", ck->dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (de->d_name[0] == '.' || l <= strlen(ST_SUFFIX) || !ends_with(de->d_name, l, ST_SUFFIX))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) {
                rc = mg_fail(err, "%s: out of memory", ck->dir);
                break;
            }
            names = p;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = mg_fail(err, "%s: out of memory", ck->dir);
            break;
        }
        n++;
    }
    closedir(d);
    if (!rc && n == 0)
        rc = mg_fail(err, "%s: no " INDEX_FILE " and no *" ST_SUFFIX " files", ck->dir);
    if (!rc && n > 100000) rc = mg_fail(err, "%s: too many shards", ck->dir);
    if (!rc) {
        qsort(names, n, sizeof *names, cmp_str);
        rc = mg_ck_alloc_shards(ck, (int)n, err);
    }
    for (size_t i = 0; i < n && !rc; i++) {
        ck->shards[i].path = join_path(ck->dir, names[i]);
        if (!ck->shards[i].path) rc = mg_fail(err, "%s: out of memory", ck->dir);
        else rc = load_shard(ck, (int)i, NULL, NULL, err);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (!rc) rc = mg_ck_build_index(ck, err);
    return rc;
}

/* ---- public API ---------------------------------------------------------------------- */

char *mg_ck_own_string(mg_checkpoint *ck, const char *s) {
    if (ck->n_names == ck->cap_names) {
        size_t cap = ck->cap_names ? ck->cap_names * 2 : 256;
        char **p = realloc(ck->names, cap * sizeof *p);
        if (!p) return NULL;
        ck->names = p;
        ck->cap_names = cap;
    }
    char *c = strdup(s);
    if (c) ck->names[ck->n_names++] = c;
    return c;
}

static int is_gguf_name(const char *path) {
    size_t n = strlen(path);
    return ends_with(path, n, ".gguf") || ends_with(path, n, ".GGUF");
}

mg_checkpoint *mg_checkpoint_open(const char *dir, mg_error *err) {
    if (!dir || !*dir) {
        mg_fail(err, "checkpoint folder or GGUF file not given");
        return NULL;
    }
    mg_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->dir = strdup(dir))) {
        free(ck);
        mg_fail(err, "%s: out of memory", dir);
        return NULL;
    }
    struct stat st;
    int rc;
    if (stat(dir, &st)) rc = mg_fail(err, "%s: %s", dir, strerror(errno));
    else if (S_ISREG(st.st_mode) && is_gguf_name(dir)) {
        ck->is_gguf = 1;
        rc = mg_gguf_checkpoint_load(ck, err);
    } else if (!S_ISDIR(st.st_mode))
        rc = mg_fail(err, "%s: not a folder of safetensors nor a .gguf file", dir);
    else {
        char *index_path = join_path(dir, INDEX_FILE);
        if (!index_path) rc = mg_fail(err, "%s: out of memory", dir);
        else if (access(index_path, F_OK) == 0) rc = open_from_index(ck, index_path, err);
        else rc = open_from_listing(ck, err);
        free(index_path);
    }
    if (!rc && !(ck->f32_copies = calloc(ck->n_tensors ? ck->n_tensors : 1, sizeof(float *))))
        rc = mg_fail(err, "%s: out of memory", dir);
    if (rc) {
        mg_checkpoint_close(ck);
        return NULL;
    }
    return ck;
}

void mg_checkpoint_close(mg_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->n_shards; i++) shard_release(&ck->shards[i]);
    free(ck->shards);
    if (ck->f32_copies)
        for (size_t i = 0; i < ck->n_tensors; i++) free(ck->f32_copies[i]);
    free(ck->f32_copies);
    free(ck->tensors);
    free(ck->index);
    for (size_t i = 0; i < ck->n_names; i++) free(ck->names[i]);
    free(ck->names);
    free(ck->dir);
    free(ck);
}

const mg_tensor *mg_checkpoint_find(const mg_checkpoint *ck, const char *name) {
    if (!ck || !name || !ck->index) return NULL;
    size_t h = (size_t)mg_hash_string(name) & ck->index_mask;
    while (ck->index[h]) {
        const mg_tensor *t = &ck->tensors[ck->index[h] - 1];
        if (!strcmp(t->name, name)) return t;
        h = (h + 1) & ck->index_mask;
    }
    return NULL;
}

size_t mg_checkpoint_count(const mg_checkpoint *ck) { return ck ? ck->n_tensors : 0; }

const mg_tensor *mg_checkpoint_at(const mg_checkpoint *ck, size_t i) {
    return ck && i < ck->n_tensors ? &ck->tensors[i] : NULL;
}

int mg_checkpoint_shards(const mg_checkpoint *ck) { return ck ? ck->n_shards : 0; }

const char *mg_checkpoint_shard_path(const mg_checkpoint *ck, int shard) {
    return ck && shard >= 0 && shard < ck->n_shards ? ck->shards[shard].path : NULL;
}

int mg_checkpoint_shard_fd(const mg_checkpoint *ck, int shard) {
    return ck && shard >= 0 && shard < ck->n_shards ? ck->shards[shard].fd : -1;
}

uint64_t mg_checkpoint_shard_size(const mg_checkpoint *ck, int shard) {
    return ck && shard >= 0 && shard < ck->n_shards ? ck->shards[shard].size : 0;
}

const char *mg_checkpoint_dir(const mg_checkpoint *ck) { return ck ? ck->dir : NULL; }

int mg_checkpoint_is_gguf(const mg_checkpoint *ck) { return ck ? ck->is_gguf : 0; }

uint64_t mg_checkpoint_total_bytes(const mg_checkpoint *ck) { return ck ? ck->total_bytes : 0; }

const float *mg_checkpoint_tensor_f32(const mg_checkpoint *ck, const mg_tensor *t, mg_error *err) {
    size_t i = (size_t)(t - ck->tensors);
    if (i >= ck->n_tensors) {
        mg_fail(err, "tensor '%s' does not belong to checkpoint %s", t->name, ck->dir);
        return NULL;
    }
    if (t->dtype == MG_DT_F32 && ((uintptr_t)t->data & 3) == 0) return t->data;
    if (ck->f32_copies[i]) return ck->f32_copies[i];
    if (t->dtype != MG_DT_F32 && t->dtype != MG_DT_BF16 && t->dtype != MG_DT_F16) {
        mg_fail(err, "%s: tensor '%s': %s%s cannot be converted to F32",
                ck->shards[t->shard].path, t->name,
                t->dtype == MG_DT_GGML ? "ggml type " : "dtype ",
                t->dtype == MG_DT_GGML ? mg_ggml_type_info(t->ggml_type)->name : dtype_names[t->dtype]);
        return NULL;
    }
    size_t esz = dtype_sizes[t->dtype], n = t->nbytes / esz;
    float *out = malloc((n ? n : 1) * sizeof *out);
    if (!out) {
        mg_fail(err, "%s: tensor '%s': out of memory", ck->shards[t->shard].path, t->name);
        return NULL;
    }
    const unsigned char *p = t->data;
    for (size_t k = 0; k < n; k++) {
        if (esz == 4) {
            memcpy(&out[k], p + 4 * k, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * k, 2);
            out[k] = t->dtype == MG_DT_BF16 ? mg_bf16_to_f32(h) : mg_f16_to_f32(h);
        }
    }
    ck->f32_copies[i] = out;
    return out;
}

const mg_tensor *mg_checkpoint_expect(const mg_checkpoint *ck, const char *name, int ndim,
                                      const int64_t *expected, mg_error *err) {
    const mg_tensor *t = mg_checkpoint_find(ck, name);
    if (!t) {
        mg_fail(err, "%s: tensor '%s' not found in the checkpoint", ck ? ck->dir : "?",
                name ? name : "(null)");
        return NULL;
    }
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        if (expected[i] >= 0 && expected[i] != t->shape[i]) ok = 0;
    if (!ok) {
        char got[160], want[160];
        format_shape(got, sizeof got, t->ndim, t->shape);
        format_shape(want, sizeof want, ndim, expected);
        mg_fail(err, "%s: tensor '%s': shape %s, expected %s (-1: any size)",
                ck->shards[t->shard].path, name, got, want);
        return NULL;
    }
    return t;
}
