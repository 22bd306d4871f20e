/* Tests for the safetensors checkpoint loader, weight binding, scalar matrix accessors and
 * the resident expert store.  Test files are written into a fresh mkdtemp() folder. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/kernels.h"
#include "core/matrix.h"
#include "io/safetensors.h"
#include "model/experts.h"
#include "model/weights.h"
#include "check.h"

static char g_root[256];


/* ---- writing test files -------------------------------------------------------------- */

typedef struct spec {
    const char *name, *dtype;
    int ndim;
    int64_t shape[4];
    const void *data;
    size_t nbytes;
} spec;

static char *new_dir(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_root, name);
    if (mkdir(path, 0700)) perror(path);
    return path;
}

static void write_bytes(const char *dir, const char *file, const void *a, size_t na, const void *b,
                        size_t nb) {
    char path[768];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    if ((na && fwrite(a, 1, na, f) != na) || (nb && fwrite(b, 1, nb, f) != nb)) exit(2);
    fclose(f);
}

/* Writes a raw safetensors file: length prefix, header text verbatim, then data. */
static void write_raw(const char *dir, const char *file, const char *header, const void *data,
                      size_t nbytes) {
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    write_bytes(dir, file, buf, 8 + hl, data, nbytes);
    free(buf);
}

/* Writes a well-formed file from specs (data packed in order, header padded to 8 bytes). */
static void write_st(const char *dir, const char *file, const spec *s, int n, const char *metadata) {
    size_t cap = 65536, hl = 0, total = 0;
    char *h = malloc(cap);
    hl += (size_t)snprintf(h + hl, cap - hl, "{");
    if (metadata) hl += (size_t)snprintf(h + hl, cap - hl, "\"__metadata__\":%s", metadata);
    for (int i = 0; i < n; i++) {
        hl += (size_t)snprintf(h + hl, cap - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                               (i || metadata) ? "," : "", s[i].name, s[i].dtype);
        for (int d = 0; d < s[i].ndim; d++)
            hl += (size_t)snprintf(h + hl, cap - hl, d ? ",%lld" : "%lld", (long long)s[i].shape[d]);
        hl += (size_t)snprintf(h + hl, cap - hl, "],\"data_offsets\":[%zu,%zu]}", total,
                               total + s[i].nbytes);
        total += s[i].nbytes;
    }
    hl += (size_t)snprintf(h + hl, cap - hl, "}");
    while (hl % 8) h[hl++] = ' ';
    h[hl] = 0;
    unsigned char *data = malloc(total ? total : 1);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].nbytes) memcpy(data + off, s[i].data, s[i].nbytes);
        off += s[i].nbytes;
    }
    write_raw(dir, file, h, data, total);
    free(data);
    free(h);
}

static void write_text(const char *dir, const char *file, const char *text) {
    write_bytes(dir, file, text, strlen(text), NULL, 0);
}

/* Opening must fail with a message containing every non-NULL string in want[]. */
static void expect_open_error(const char *dir, const char *want1, const char *want2,
                              const char *want3) {
    mg_error err = {{0}};
    mg_checkpoint *ck = mg_checkpoint_open(dir, &err);
    CHECK(ck == NULL, "%s: opened although it is defective", dir);
    const char *want[3] = {want1, want2, want3};
    for (int i = 0; i < 3; i++)
        if (want[i]) CHECK(strstr(err.msg, want[i]) != NULL, "message '%s' lacks '%s'", err.msg, want[i]);
    mg_checkpoint_close(ck);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* ---- data shared by the cases -------------------------------------------------------- */

static const float A_F32[6] = {1, 2, 3, 4, 5, 6};
static const uint16_t B_BF16[4] = {0x3f80, 0xc000, 0x4040, 0x0000}; /* 1, -2, 3, 0 */
static const uint16_t C_F16[3] = {0x3c00, 0xbc00, 0x3800};           /* 1, -1, 0.5 */
static const int64_t D_I64[2] = {7, -9};

static void test_single_file(void) {
    char *dir = new_dir("single");
    spec s[] = {
        {"a", "F32", 2, {2, 3}, A_F32, sizeof A_F32},
        {"b.weight", "BF16", 1, {4}, B_BF16, sizeof B_BF16},
        {"c", "F16", 1, {3}, C_F16, sizeof C_F16},
        {"d", "I64", 1, {2}, D_I64, sizeof D_I64},
        {"empty", "F32", 2, {0, 5}, NULL, 0},
    };
    write_st(dir, "model.safetensors", s, 5, "{\"format\":\"pt\"}");
    write_text(dir, "config.json", "{}"); /* ignored: not a shard */
    mg_error err = {{0}};
    mg_checkpoint *ck = mg_checkpoint_open(dir, &err);
    CHECK(ck != NULL, "%s", err.msg);
    if (!ck) return;
    CHECK(mg_checkpoint_count(ck) == 5, "count %zu", mg_checkpoint_count(ck));
    CHECK(mg_checkpoint_shards(ck) == 1, "one shard");
    CHECK(strstr(mg_checkpoint_shard_path(ck, 0), "single/model.safetensors") != NULL, "shard path");
    CHECK(mg_checkpoint_total_bytes(ck) == 24 + 8 + 6 + 16, "total bytes %llu",
          (unsigned long long)mg_checkpoint_total_bytes(ck));
    const mg_tensor *a = mg_checkpoint_find(ck, "a");
    CHECK(a && a->dtype == MG_DT_F32 && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3 &&
              a->nbytes == 24 && !memcmp(a->data, A_F32, 24),
          "tensor a");
    const mg_tensor *d = mg_checkpoint_find(ck, "d");
    CHECK(d && d->dtype == MG_DT_I64 && !memcmp(d->data, D_I64, 16), "tensor d");
    CHECK(mg_checkpoint_find(ck, "zzz") == NULL && mg_checkpoint_find(ck, "") == NULL, "absent");
    const mg_tensor *e = mg_checkpoint_find(ck, "empty");
    CHECK(e && e->nbytes == 0 && e->shape[0] == 0, "empty tensor");
    /* file_offset + fd reproduce the bytes with pread (the expert store's path). */
    if (d) {
        int64_t got[2] = {0, 0};
        ssize_t r = pread(mg_checkpoint_shard_fd(ck, d->shard), got, 16, (off_t)d->file_offset);
        CHECK(r == 16 && got[0] == 7 && got[1] == -9, "pread at file_offset");
        CHECK(mg_checkpoint_shard_size(ck, 0) == d->file_offset + 16 + 0, "shard size");
    }
    /* expect */
    int64_t ok_shape[2] = {2, -1}, bad_shape[2] = {3, 2};
    CHECK(mg_checkpoint_expect(ck, "a", 2, ok_shape, &err) == a, "expect with wildcard: %s", err.msg);
    CHECK(mg_checkpoint_expect(ck, "a", 2, bad_shape, &err) == NULL &&
              strstr(err.msg, "model.safetensors: tensor 'a': shape [2, 3], expected [3, 2]"),
          "expect mismatch: %s", err.msg);
    CHECK(mg_checkpoint_expect(ck, "nope", 1, ok_shape, &err) == NULL &&
              strstr(err.msg, "tensor 'nope' not found"), "expect missing: %s", err.msg);
    /* vectors */
    float *v = mg_bind_vector(ck, "b.weight", 4, &err);
    CHECK(v && v[0] == 1 && v[1] == -2 && v[2] == 3 && v[3] == 0, "bf16 vector: %s", v ? "" : err.msg);
    free(v);
    v = mg_bind_vector(ck, "c", 3, &err);
    CHECK(v && v[0] == 1 && v[1] == -1 && v[2] == 0.5f, "f16 vector");
    free(v);
    v = mg_bind_vector(ck, "c", 4, &err);
    CHECK(!v && strstr(err.msg, "model.safetensors: tensor 'c': shape [3], expected [4]"), "%s", err.msg);
    v = mg_bind_vector(ck, "a", 6, &err);
    CHECK(!v && strstr(err.msg, "tensor 'a'"), "2-D is not a vector: %s", err.msg);
    v = mg_bind_array(ck, "a", 6, &err);
    CHECK(v && v[5] == 6, "array of 6");
    free(v);
    v = mg_bind_array(ck, "d", 2, &err);
    CHECK(!v && strstr(err.msg, "tensor 'd': dtype I64"), "I64 array: %s", err.msg);
    v = mg_bind_vector(ck, "missing.weight", 2, &err);
    CHECK(!v && strstr(err.msg, "tensor 'missing.weight' not found"), "%s", err.msg);
    /* plain matrices */
    mg_matrix m;
    CHECK(mg_bind_matrix(ck, "a", 2, 3, &m, &err) == 0 && m.format == MG_F32 &&
              m.scale_kind == MG_SCALE_NONE && mg_matrix_get(&m, 1, 2) == 6.0f &&
              mg_matrix_bytes(&m) == 24,
          "f32 matrix: %s", err.msg);
    CHECK(mg_bind_matrix(ck, "a", 3, 2, &m, &err) == -1 &&
              strstr(err.msg, "model.safetensors: tensor 'a': F32 shape [2, 3], expected [3, 2]"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "d", 1, 2, &m, &err) == -1 &&
              strstr(err.msg, "tensor 'd': dtype I64 cannot be used"), "%s", err.msg);
    mg_checkpoint_close(ck);
}

static void test_sharded(void) {
    char *dir = new_dir("sharded");
    spec s1[] = {{"x.a", "F32", 1, {3}, A_F32, 12}, {"x.b", "F32", 1, {2}, A_F32 + 3, 8}};
    spec s2[] = {{"y.a", "BF16", 2, {2, 2}, B_BF16, 8}};
    write_st(dir, "model-00001-of-00002.safetensors", s1, 2, NULL);
    write_st(dir, "model-00002-of-00002.safetensors", s2, 1, "{}");
    write_st(dir, "stray.safetensors", s2, 1, NULL); /* not in the index: never opened */
    write_text(dir, "model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 28}, \"weight_map\": {"
               "\"y.a\": \"model-00002-of-00002.safetensors\","
               "\"x.a\": \"model-00001-of-00002.safetensors\","
               "\"x.b\": \"model-00001-of-00002.safetensors\"}}");
    mg_error err = {{0}};
    mg_checkpoint *ck = mg_checkpoint_open(dir, &err);
    CHECK(ck != NULL, "%s", err.msg);
    if (!ck) return;
    CHECK(mg_checkpoint_shards(ck) == 2 && mg_checkpoint_count(ck) == 3, "2 shards, 3 tensors");
    const mg_tensor *ya = mg_checkpoint_find(ck, "y.a"), *xb = mg_checkpoint_find(ck, "x.b");
    CHECK(ya && strstr(mg_checkpoint_shard_path(ck, ya->shard), "model-00002-of-00002"), "y.a shard");
    CHECK(xb && ((const float *)xb->data)[1] == 5.0f, "x.b data");
    CHECK(mg_checkpoint_total_bytes(ck) == 28, "total bytes");
    mg_checkpoint_close(ck);

    /* Without an index every shard is read, and a name present in two shards is an error. */
    char *dup = new_dir("duplicate");
    write_st(dup, "a.safetensors", s2, 1, NULL);
    write_st(dup, "b.safetensors", s2, 1, NULL);
    expect_open_error(dup, "b.safetensors: tensor 'y.a'", "a.safetensors", "duplicate");
}

static void test_defective_files(void) {
    char *dir;
    float data[8] = {0};

    /* Truncated: the file ends inside the second tensor; the message names it, not the third. */
    dir = new_dir("truncated");
    spec s[] = {{"first", "F32", 1, {2}, data, 8}, {"second", "F32", 1, {4}, data, 16},
                {"third", "F32", 1, {2}, data, 8}};
    write_st(dir, "model.safetensors", s, 3, NULL);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat st;
    stat(path, &st);
    CHECK(truncate(path, st.st_size - 20) == 0, "truncate");
    expect_open_error(dir, "truncated/model.safetensors: tensor 'second'", "beyond the end of the file", NULL);

    dir = new_dir("badjson");
    write_raw(dir, "model.safetensors", "{\"a\": {\"dtype\": \"F32\",, }", data, 8);
    expect_open_error(dir, "badjson/model.safetensors: header: JSON error at byte 22: object key", NULL, NULL);

    dir = new_dir("notobject");
    write_raw(dir, "model.safetensors", "[1, 2]", NULL, 0);
    expect_open_error(dir, "notobject/model.safetensors: header is not a JSON object", NULL, NULL);

    dir = new_dir("hugeheader");
    {
        unsigned char hdr[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
        write_bytes(dir, "model.safetensors", hdr, 10, NULL, 0);
    }
    expect_open_error(dir, "hugeheader/model.safetensors: header length 65535 exceeds the file size 10",
                      NULL, NULL);

    dir = new_dir("tiny");
    write_bytes(dir, "model.safetensors", "abc", 3, NULL, 0);
    expect_open_error(dir, "tiny/model.safetensors: file is 3 bytes", NULL, NULL);

    dir = new_dir("dtype");
    write_raw(dir, "model.safetensors",
              "{\"w\":{\"dtype\":\"F12\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 8);
    expect_open_error(dir, "dtype/model.safetensors: tensor 'w': unknown dtype 'F12'", NULL, NULL);

    dir = new_dir("mismatch");
    write_raw(dir, "model.safetensors",
              "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,8]}}", data, 8);
    expect_open_error(dir, "mismatch/model.safetensors: tensor 'w': shape [2, 3] of BF16 needs 12 bytes",
                      "[0, 8] hold 8", NULL);

    dir = new_dir("overflow");
    write_raw(dir, "model.safetensors",
              "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,8]}}",
              data, 8);
    expect_open_error(dir, "tensor 'w'", "needs more than", NULL);

    dir = new_dir("negshape");
    write_raw(dir, "model.safetensors",
              "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", data, 8);
    expect_open_error(dir, "tensor 'w': shape[0] is not a non-negative integer", NULL, NULL);

    dir = new_dir("fracshape");
    write_raw(dir, "model.safetensors",
              "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", data, 8);
    expect_open_error(dir, "tensor 'w': shape[0]", NULL, NULL);

    dir = new_dir("manydims");
    write_raw(dir, "model.safetensors",
              "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", data, 8);
    expect_open_error(dir, "tensor 'w': 9 dimensions", NULL, NULL);

    dir = new_dir("overlap");
    write_raw(dir, "model.safetensors",
              "{\"p\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
              data, 16);
    expect_open_error(dir, "overlap/model.safetensors: tensor 'q'", "overlaps tensor 'p'", NULL);

    dir = new_dir("outofrange");
    write_raw(dir, "model.safetensors",
              "{\"p\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
              data, 16);
    expect_open_error(dir, "outofrange/model.safetensors: tensor 'q': data [16, 24)", "beyond the end", NULL);

    /* Every byte of the data area belongs to a tensor (a header length a few bytes off parses
     * and would shift every tensor's data). */
    dir = new_dir("gap");
    write_raw(dir, "model.safetensors",
              "{\"p\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"q\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
              data, 12);
    expect_open_error(dir, "gap/model.safetensors: data bytes [4, 8) before tensor 'q' belong to no tensor",
                      NULL, NULL);

    dir = new_dir("trailing");
    write_raw(dir, "model.safetensors",
              "{\"p\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, 12);
    expect_open_error(dir, "trailing/model.safetensors: the data area holds 12 bytes but the tensors cover 8",
                      NULL, NULL);

    dir = new_dir("reversed");
    write_raw(dir, "model.safetensors",
              "{\"p\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", data, 16);
    expect_open_error(dir, "tensor 'p': data_offsets [8, 0] end before", NULL, NULL);

    dir = new_dir("fields");
    write_raw(dir, "model.safetensors",
              "{\"p\":{\"dtype\":\"F32\",\"shape\":[2]}}", data, 8);
    expect_open_error(dir, "tensor 'p': header entry needs dtype, shape and data_offsets", NULL, NULL);

    dir = new_dir("metadata");
    write_raw(dir, "model.safetensors", "{\"__metadata__\":{\"format\":1}}", NULL, 0);
    expect_open_error(dir, "__metadata__ value 'format' is not a string", NULL, NULL);

    dir = new_dir("dupkey");
    write_raw(dir, "model.safetensors",
              "{\"p\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"p\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
              data, 16);
    expect_open_error(dir, "dupkey/model.safetensors: header: ", "duplicate key 'p'", NULL);

    dir = new_dir("nofiles");
    expect_open_error(dir, "no model.safetensors.index.json and no *.safetensors files", NULL, NULL);
    snprintf(path, sizeof path, "%s/does-not-exist", g_root);
    expect_open_error(path, "does-not-exist: No such file", NULL, NULL);
}

static void test_bad_index(void) {
    float data[2] = {1, 2};
    spec s[] = {{"w", "F32", 1, {2}, data, 8}};
    char *dir;

    dir = new_dir("idx_missing_tensor");
    write_st(dir, "s1.safetensors", s, 1, NULL);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"w\": \"s1.safetensors\", \"ghost\": \"s1.safetensors\"}}");
    expect_open_error(dir, "model.safetensors.index.json: tensor 'ghost'", "s1.safetensors", "does not contain");

    dir = new_dir("idx_wrong_shard");
    write_st(dir, "s1.safetensors", s, 1, NULL);
    write_raw(dir, "s2.safetensors", "{}", NULL, 0);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"w\": \"s2.safetensors\", \"v\": \"s1.safetensors\"}}");
    expect_open_error(dir, "index.json: tensor 'w' is listed in shard s2.safetensors but is stored in s1.safetensors",
                      NULL, NULL);

    dir = new_dir("idx_missing_shard");
    write_st(dir, "s1.safetensors", s, 1, NULL);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"w\": \"s1.safetensors\", \"lost\": \"s9.safetensors\"}}");
    expect_open_error(dir, "tensor 'lost'", "s9.safetensors", "No such file");

    const char *evil[] = {"../s1.safetensors", "sub/s1.safetensors", "/etc/passwd", "..",
                          ".hidden.safetensors", "s1.json", "a\\\\b.safetensors",
                          "x\\u0000.safetensors", ""};
    for (size_t i = 0; i < sizeof evil / sizeof *evil; i++) {
        char name[64], text[256];
        snprintf(name, sizeof name, "idx_evil_%zu", i);
        dir = new_dir(name);
        write_st(dir, "s1.safetensors", s, 1, NULL);
        snprintf(text, sizeof text, "{\"weight_map\": {\"w\": \"%s\"}}", evil[i]);
        write_text(dir, "model.safetensors.index.json", text);
        expect_open_error(dir, "model.safetensors.index.json: tensor 'w': refusing shard name", NULL, NULL);
    }

    dir = new_dir("idx_not_object");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": [\"s1.safetensors\"]}");
    expect_open_error(dir, "no \"weight_map\" object", NULL, NULL);

    dir = new_dir("idx_bad_json");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"w\": \"s1.safetensors\"");
    expect_open_error(dir, "model.safetensors.index.json: JSON error at byte", NULL, NULL);

    dir = new_dir("idx_value_type");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"w\": 3}}");
    expect_open_error(dir, "tensor 'w': weight_map value is not a file name", NULL, NULL);
}

/* ---- quantised weights --------------------------------------------------------------- */

static uint8_t e8m0(int exp2) { return (uint8_t)(exp2 + 127); }

static void test_quantised(void) {
    char *dir = new_dir("quant");
    enum { R = 130, C = 260 }; /* ragged: 2 x 3 scale blocks of 128 */
    static uint8_t fp8[R * C];
    for (int i = 0; i < R * C; i++) fp8[i] = (uint8_t)((i * 37 + 11) & 0xff);
    for (int i = 0; i < R * C; i++)
        if ((fp8[i] & 0x7f) == 0x7f) fp8[i] = 0x38; /* avoid NaN codes: 1.0 */
    float sinv[2 * 3] = {0.5f, 2.0f, 4.0f, 0.25f, 8.0f, 1.0f};
    uint16_t sinv_bf16[2 * 3];
    for (int i = 0; i < 6; i++) sinv_bf16[i] = mg_f32_to_bf16(sinv[i] * 1.5f);
    uint8_t se8[2 * 3] = {e8m0(-1), e8m0(1), e8m0(2), e8m0(-2), e8m0(3), e8m0(0)};
    enum { FR = 3, FC = 64 };
    static int8_t fp4[FR * FC / 2];
    for (int i = 0; i < FR * FC / 2; i++) fp4[i] = (int8_t)(uint8_t)(i * 29 + 3);
    uint8_t s4[FR * FC / 32] = {e8m0(0), e8m0(1), e8m0(-1), e8m0(2), e8m0(-3), e8m0(4)};
    float bad_f32[4] = {1, 1, 1, 1};
    uint8_t bad_e8[4] = {127, 127, 127, 127};
    /* compressed-tensors channel scales: one per output row, [R, 1], F32 or BF16. */
    static float rs[R];
    static uint16_t rs_bf16[R];
    for (int r = 0; r < R; r++) {
        rs[r] = ldexpf(1.0f + (float)(r % 7) / 8.0f, r % 5 - 3); /* exact in bf16 too */
        rs_bf16[r] = mg_f32_to_bf16(rs[r]);
    }
    spec s[] = {
        {"hf.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"hf.weight_scale_inv", "F32", 2, {2, 3}, sinv, sizeof sinv},
        {"ds.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"ds.scale", "F8_E8M0", 2, {2, 3}, se8, sizeof se8},
        {"ex.weight", "I8", 2, {FR, FC / 2}, fp4, sizeof fp4},
        {"ex.scale", "F8_E8M0", 2, {FR, FC / 32}, s4, sizeof s4},
        {"ux.weight", "U8", 2, {FR, FC / 2}, fp4, sizeof fp4},
        {"ux.scale", "F8_E8M0", 2, {FR, FC / 32}, s4, sizeof s4},
        {"badshape.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"badshape.weight_scale_inv", "F32", 2, {2, 2}, bad_f32, 16},
        {"baddtype.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"baddtype.scale", "U8", 2, {2, 2}, bad_e8, 4},
        {"noscale.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"both.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"both.weight_scale_inv", "F32", 2, {2, 3}, sinv, sizeof sinv},
        {"both.scale", "F8_E8M0", 2, {2, 3}, se8, sizeof se8},
        {"ct.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"ct.weight_scale", "F32", 2, {2, 2}, bad_f32, 16},
        {"ch.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"ch.weight_scale", "F32", 2, {R, 1}, rs, sizeof rs},
        {"chbf.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"chbf.weight_scale", "BF16", 2, {R, 1}, rs_bf16, sizeof rs_bf16},
        {"chvec.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"chvec.weight_scale", "F32", 1, {R}, rs, sizeof rs},
        {"chtensor.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"chtensor.weight_scale", "F32", 1, {1}, rs, 4},
        {"chboth.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"chboth.weight_scale", "F32", 2, {R, 1}, rs, sizeof rs},
        {"chboth.weight_scale_inv", "F32", 2, {2, 3}, sinv, sizeof sinv},
        {"fp4bad.weight", "I8", 2, {FR, FC / 2}, fp4, sizeof fp4},
        {"fp4bad.scale", "F8_E8M0", 2, {FR, 1}, s4, FR},
        {"fp4noscale.weight", "I8", 2, {FR, FC / 2}, fp4, sizeof fp4},
        {"hfbf.weight", "F8_E4M3", 2, {R, C}, fp8, sizeof fp8},
        {"hfbf.weight_scale_inv", "BF16", 2, {2, 3}, sinv_bf16, sizeof sinv_bf16},
    };
    write_st(dir, "model.safetensors", s, (int)(sizeof s / sizeof *s), NULL);
    mg_error err = {{0}};
    mg_checkpoint *ck = mg_checkpoint_open(dir, &err);
    CHECK(ck != NULL, "%s", err.msg);
    if (!ck) return;
    mg_matrix m;

    /* HF fine-grained FP8: value = fp8 * weight_scale_inv[r/128][c/128] (multiplied). */
    CHECK(mg_bind_matrix(ck, "hf.weight", R, C, &m, &err) == 0, "%s", err.msg);
    CHECK(m.format == MG_FP8_E4M3 && m.scale_kind == MG_SCALE_F32_BLOCK128 && m.scale_cols == 3,
          "hf fp8 descriptor");
    int bad = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float want = mg_fp8_e4m3_to_f32(fp8[r * C + c]) * sinv[(r / 128) * 3 + c / 128];
            if (mg_matrix_get(&m, r, c) != want) bad++;
        }
    CHECK(bad == 0, "hf fp8: %d wrong values", bad);
    CHECK(mg_matrix_bytes(&m) == (size_t)R * C + 6 * 4, "hf fp8 bytes");
    float row[C];
    mg_matrix_row_f32(&m, 129, row);
    CHECK(row[259] == mg_fp8_e4m3_to_f32(fp8[129 * C + 259]) * sinv[5], "row_f32 last block");

    /* The same with a BF16 weight_scale_inv (converted to an fp32 copy owned by ck). */
    CHECK(mg_bind_matrix(ck, "hfbf.weight", R, C, &m, &err) == 0, "%s", err.msg);
    CHECK(m.scale_kind == MG_SCALE_F32_BLOCK128 && m.scale != NULL, "bf16 scale_inv descriptor");
    bad = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float want = mg_fp8_e4m3_to_f32(fp8[r * C + c]) * sinv[(r / 128) * 3 + c / 128] * 1.5f;
            if (mg_matrix_get(&m, r, c) != want) bad++;
        }
    CHECK(bad == 0, "hf fp8 with bf16 scales: %d wrong values", bad);

    /* DeepSeek-V4 FP8: value = fp8 * 2^(scale-127). */
    CHECK(mg_bind_matrix(ck, "ds.weight", R, C, &m, &err) == 0, "%s", err.msg);
    CHECK(m.scale_kind == MG_SCALE_E8M0_BLOCK128 && m.scale_cols == 3, "ds fp8 descriptor");
    bad = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float want = ldexpf(mg_fp8_e4m3_to_f32(fp8[r * C + c]), se8[(r / 128) * 3 + c / 128] - 127);
            if (mg_matrix_get(&m, r, c) != want) bad++;
        }
    CHECK(bad == 0, "ds fp8: %d wrong values", bad);
    CHECK(mg_matrix_bytes(&m) == (size_t)R * C + 6, "ds fp8 bytes");

    /* compressed-tensors per-channel FP8: value = fp8 * weight_scale[r, 0], F32 or BF16. */
    const char *ch_names[2] = {"ch.weight", "chbf.weight"};
    for (int k = 0; k < 2; k++) {
        CHECK(mg_bind_matrix(ck, ch_names[k], R, C, &m, &err) == 0, "%s", err.msg);
        CHECK(m.format == MG_FP8_E4M3 && m.scale_kind == MG_SCALE_F32_ROW && m.scale_cols == 1 &&
                  m.scale != NULL, "%s descriptor", ch_names[k]);
        bad = 0;
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                float want = mg_fp8_e4m3_to_f32(fp8[r * C + c]) * rs[r];
                if (mg_matrix_get(&m, r, c) != want || mg_matrix_scale_at(&m, r, c) != rs[r]) bad++;
            }
        CHECK(bad == 0, "%s: %d wrong values", ch_names[k], bad);
        CHECK(mg_matrix_bytes(&m) == (size_t)R * C + R * 4, "%s bytes", ch_names[k]);
    }
    /* The scalar kernel applies the row scale to the row's sum: same result as dequantising. */
    {
        CHECK(mg_bind_matrix(ck, "ch.weight", R, C, &m, &err) == 0, "%s", err.msg);
        static float x[C], y[R];
        for (int c = 0; c < C; c++) x[c] = (float)((c * 13) % 11) / 8.0f - 0.6f;
        mg_kernels_scalar()->linear[MG_FP8_E4M3](&m, x, C, 1, y, R, 0, R);
        bad = 0;
        for (int r = 0; r < R; r++) {
            double want = 0, mag = 0;
            for (int c = 0; c < C; c++) {
                double p = (double)mg_fp8_e4m3_to_f32(fp8[r * C + c]) * rs[r] * x[c];
                want += p, mag += fabs(p);
            }
            if (!(fabs(y[r] - want) <= 1e-5 * mag + 1e-30)) bad++;
        }
        CHECK(bad == 0, "per-channel fp8 linear: %d wrong rows", bad);
    }

    /* Packed FP4: low nibble = even column, one e8m0 scale per 32 columns. */
    static const float mag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    const char *fp4_names[2] = {"ex.weight", "ux.weight"};
    for (int k = 0; k < 2; k++) {
        CHECK(mg_bind_matrix(ck, fp4_names[k], FR, FC, &m, &err) == 0, "%s", err.msg);
        CHECK(m.format == MG_FP4_E2M1 && m.scale_kind == MG_SCALE_E8M0_G32 && m.scale_cols == 2,
              "fp4 descriptor");
        bad = 0;
        for (int r = 0; r < FR; r++)
            for (int c = 0; c < FC; c++) {
                uint8_t byte = (uint8_t)fp4[r * FC / 2 + c / 2];
                uint8_t code = (c % 2) ? byte >> 4 : byte & 15;
                float v = (code & 8) ? -mag[code & 7] : mag[code & 7];
                float want = ldexpf(v, s4[r * 2 + c / 32] - 127);
                if (mg_matrix_get(&m, r, c) != want) bad++;
            }
        CHECK(bad == 0, "fp4 %s: %d wrong values", fp4_names[k], bad);
        CHECK(mg_matrix_bytes(&m) == (size_t)FR * FC / 2 + FR * 2, "fp4 bytes");
    }

    /* Defects: each names the tensor and the shard. */
    CHECK(mg_bind_matrix(ck, "badshape.weight", R, C, &m, &err) == -1 &&
              strstr(err.msg, "model.safetensors: tensor 'badshape.weight_scale_inv': scale of "
                              "'badshape.weight' is F32 [2, 2], expected F32 (or BF16/F16) [2, 3]"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "baddtype.weight", R, C, &m, &err) == -1 &&
              strstr(err.msg, "tensor 'baddtype.scale': scale of 'baddtype.weight' is U8 [2, 2], "
                              "expected F8_E8M0 [2, 3]"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "noscale.weight", R, C, &m, &err) == -1 &&
              strstr(err.msg, "model.safetensors: tensor 'noscale.weight': F8_E4M3 weight without a scale"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "both.weight", R, C, &m, &err) == -1 && strstr(err.msg, "ambiguous"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "ct.weight", R, C, &m, &err) == -1 &&
              strstr(err.msg, "model.safetensors: tensor 'ct.weight_scale': scale of 'ct.weight' is F32 "
                              "[2, 2], expected F32 (or BF16/F16) [130, 1]"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "chvec.weight", R, C, &m, &err) == -1 &&
              strstr(err.msg, "tensor 'chvec.weight_scale': scale of 'chvec.weight' is F32 [130], "
                              "expected F32 (or BF16/F16) [130, 1]"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "chtensor.weight", R, C, &m, &err) == -1 &&
              strstr(err.msg, "tensor 'chtensor.weight_scale': scale of 'chtensor.weight' is F32 [1], "
                              "expected F32 (or BF16/F16) [130, 1]"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "chboth.weight", R, C, &m, &err) == -1 && strstr(err.msg, "ambiguous") &&
              strstr(err.msg, "chboth.weight_scale'"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "hf.weight", C, R, &m, &err) == -1 &&
              strstr(err.msg, "tensor 'hf.weight': F8_E4M3 shape [130, 260], expected [260, 130]"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "fp4bad.weight", FR, FC, &m, &err) == -1 &&
              strstr(err.msg, "tensor 'fp4bad.scale': scale of 'fp4bad.weight' is F8_E8M0 [3, 1], "
                              "expected F8_E8M0 [3, 2]"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "fp4noscale.weight", FR, FC, &m, &err) == -1 &&
              strstr(err.msg, "tensor 'fp4noscale.weight': I8 weight needs scale tensor "
                              "'fp4noscale.scale', which is missing"),
          "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "ex.weight", FR, 40, &m, &err) == -1 &&
              strstr(err.msg, "multiple of 32"), "%s", err.msg);
    CHECK(mg_bind_matrix(ck, "ex.weight", FR, FC * 2, &m, &err) == -1 &&
              strstr(err.msg, "tensor 'ex.weight': I8 shape [3, 32], expected [3, 64] (packed FP4"),
          "%s", err.msg);
    mg_checkpoint_close(ck);
}

static void test_matrix_accessors(void) {
    CHECK(!strcmp(mg_format_name(MG_BF16), "bf16") && !strcmp(mg_format_name(MG_FP4_E2M1), "fp4_e2m1"),
          "format names");
    CHECK(!strcmp(mg_format_name(MG_FORMAT_COUNT), "unknown"), "unknown format name");
    /* Unaligned F32 data must read correctly (shards do not guarantee alignment). */
    unsigned char buf[1 + 8];
    float vals[2] = {1.25f, -7.5f};
    memcpy(buf + 1, vals, 8);
    mg_matrix m = {buf + 1, NULL, 1, 2, 0, MG_F32, MG_SCALE_NONE};
    float out[2];
    mg_matrix_row_f32(&m, 0, out);
    CHECK(out[0] == 1.25f && out[1] == -7.5f, "unaligned f32 row");
    CHECK(mg_matrix_scale_at(&m, 0, 1) == 1.0f, "unscaled scale is 1");
    uint16_t h[2] = {0x3c00, 0xc500}; /* 1, -5 */
    mg_matrix f16 = {h, NULL, 1, 2, 0, MG_F16, MG_SCALE_NONE};
    CHECK(mg_matrix_get(&f16, 0, 1) == -5.0f && mg_matrix_bytes(&f16) == 4, "f16 get");
}

static void test_experts(void) {
    mg_error err = {{0}};
    CHECK(mg_expert_store_create(0, 4, &err) == NULL && strstr(err.msg, "invalid size"), "bad size");
    mg_expert_store *s = mg_expert_store_create(2, 4, &err);
    CHECK(s != NULL, "%s", err.msg);
    if (!s) return;
    float w[4] = {1, 2, 3, 4};
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < 4; e++) {
            mg_expert x;
            memset(&x, 0, sizeof x);
            x.gate = (mg_matrix){w, NULL, 1, l * 4 + e + 1, 0, MG_F32, MG_SCALE_NONE};
            if (!(l == 1 && e == 3)) mg_expert_store_set(s, l, e, &x);
        }
    const mg_expert *out[3];
    int ids[3] = {2, 0, 3};
    CHECK(mg_expert_store_fetch(s, 0, 3, ids, out, &err) == 0, "%s", err.msg);
    CHECK(out[0]->gate.cols == 3 && out[1]->gate.cols == 1 && out[2]->gate.cols == 4, "fetched descriptors");
    CHECK(mg_expert_store_fetch(s, 1, 3, ids, out, &err) == -1 && strstr(err.msg, "expert 3 was never registered"),
          "%s", err.msg);
    int bad_id[1] = {4};
    CHECK(mg_expert_store_fetch(s, 0, 1, bad_id, out, &err) == -1 && strstr(err.msg, "out of range"), "%s", err.msg);
    CHECK(mg_expert_store_fetch(s, 2, 1, ids, out, &err) == -1 && strstr(err.msg, "layer 2"), "%s", err.msg);
    mg_expert_stats st = mg_expert_store_stats(s);
    CHECK(st.fetches == 1 && st.hits == 3 && st.misses == 0 && st.bytes_read == 0, "stats");
    mg_expert_store_free(s);
}

/* A file written by the reference implementation (Python safetensors + torch), with expected
 * dequantised values computed independently in Python.  Skipped only when Python lacks the
 * packages. */
static const char *PY_WRITER =
    "import sys, numpy as np, torch\n"
    "from safetensors.torch import save_file\n"
    "g = torch.Generator().manual_seed(0)\n"
    "d = sys.argv[1]\n"
    "w = (torch.randn(256, 384, generator=g) * 40).clamp(-440, 440)\n"
    "f8 = w.to(torch.float8_e4m3fn)\n"
    "sc = torch.randint(120, 134, (2, 3), generator=g, dtype=torch.uint8)\n"
    "sinv = torch.rand(2, 3, generator=g) + 0.5\n"
    "up = lambda s: s.repeat_interleave(128, 0).repeat_interleave(128, 1)\n"
    "deq_ds = f8.float() * torch.pow(2.0, up(sc).float() - 127)\n"
    "deq_hf = f8.float() * up(sinv)\n"
    "codes = torch.randint(0, 16, (64, 128), generator=g)\n"
    "packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)\n"
    "s4 = torch.randint(118, 136, (64, 4), generator=g, dtype=torch.uint8)\n"
    "mag = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6])\n"
    "val = mag[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)\n"
    "deq4 = val * torch.pow(2.0, s4.float() - 127).repeat_interleave(32, 1)\n"
    "bf = torch.randn(5, 7, generator=g).to(torch.bfloat16)\n"
    "h = torch.randn(9, generator=g).to(torch.float16)\n"
    "a = {'l.ds.weight': f8, 'l.ds.scale': sc.view(torch.float8_e8m0fnu),\n"
    "     'l.hf.weight': f8.clone(), 'l.hf.weight_scale_inv': sinv,\n"
    "     'l.ex.weight': packed, 'l.ex.scale': s4.view(torch.float8_e8m0fnu)}\n"
    "b = {'want.ds': deq_ds, 'want.hf': deq_hf, 'want.ex': deq4, 'bf': bf, 'want.bf': bf.float(),\n"
    "     'h': h, 'want.h': h.float(), 'ids': torch.arange(6, dtype=torch.int64)}\n"
    "save_file(a, d + '/model-00001-of-00002.safetensors', metadata={'format': 'pt'})\n"
    "save_file(b, d + '/model-00002-of-00002.safetensors')\n"
    "import json\n"
    "wm = {k: 'model-00001-of-00002.safetensors' for k in a}\n"
    "wm.update({k: 'model-00002-of-00002.safetensors' for k in b})\n"
    "json.dump({'metadata': {'total_size': 0}, 'weight_map': wm},\n"
    "          open(d + '/model.safetensors.index.json', 'w'), indent=2)\n";

static int same_as(const mg_checkpoint *ck, const mg_matrix *m, const char *want_name) {
    const mg_tensor *t = mg_checkpoint_find(ck, want_name);
    if (!t || t->dtype != MG_DT_F32 || t->nbytes != (size_t)(m->rows * m->cols) * 4) return -1;
    int bad = 0;
    for (int64_t r = 0; r < m->rows; r++)
        for (int64_t c = 0; c < m->cols; c++) {
            float want;
            memcpy(&want, (const char *)t->data + (r * m->cols + c) * 4, 4);
            if (mg_matrix_get(m, r, c) != want) bad++;
        }
    return bad;
}

static void test_reference_writer(void) {
    if (system("python3 -c 'import safetensors, torch, numpy' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP reference writer: python3 with safetensors+torch not available\n");
        return;
    }
    char *dir = new_dir("reference");
    char script[600], cmd[1400];
    snprintf(script, sizeof script, "%s/writer.py", g_root);
    write_text(g_root, "writer.py", PY_WRITER);
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s'", script, dir);
    CHECK(system(cmd) == 0, "python writer failed: %s", cmd);
    mg_error err = {{0}};
    mg_checkpoint *ck = mg_checkpoint_open(dir, &err);
    CHECK(ck != NULL, "%s", err.msg);
    if (!ck) return;
    CHECK(mg_checkpoint_count(ck) == 14 && mg_checkpoint_shards(ck) == 2, "count %zu",
          mg_checkpoint_count(ck));
    mg_matrix m;
    CHECK(mg_bind_matrix(ck, "l.ds.weight", 256, 384, &m, &err) == 0, "%s", err.msg);
    CHECK(same_as(ck, &m, "want.ds") == 0, "DeepSeek FP8 dequant differs from torch");
    CHECK(mg_bind_matrix(ck, "l.hf.weight", 256, 384, &m, &err) == 0, "%s", err.msg);
    CHECK(same_as(ck, &m, "want.hf") == 0, "HF FP8 dequant differs from torch");
    CHECK(mg_bind_matrix(ck, "l.ex.weight", 64, 128, &m, &err) == 0, "%s", err.msg);
    CHECK(same_as(ck, &m, "want.ex") == 0, "FP4 dequant differs from python");
    CHECK(mg_bind_matrix(ck, "bf", 5, 7, &m, &err) == 0 && m.format == MG_BF16, "%s", err.msg);
    CHECK(same_as(ck, &m, "want.bf") == 0, "bf16 differs");
    float *h = mg_bind_vector(ck, "h", 9, &err), *want = mg_bind_vector(ck, "want.h", 9, &err);
    CHECK(h && want && !memcmp(h, want, 36), "f16 vector differs");
    free(h);
    free(want);
    const mg_tensor *ids = mg_checkpoint_find(ck, "ids");
    CHECK(ids && ids->dtype == MG_DT_I64 && ((const int64_t *)ids->data)[5] == 5, "i64 ids");
    mg_checkpoint_close(ck);
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_root, sizeof g_root, "%s/mg_st_test_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 2;
    }
    test_single_file();
    test_sharded();
    test_defective_files();
    test_bad_index();
    test_quantised();
    test_matrix_accessors();
    test_experts();
    test_reference_writer();
    nftw(g_root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
