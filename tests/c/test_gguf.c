/* Tests for the GGUF reader (c/io/gguf.c; format: docs/reference/gguf.md §1).  Files are built
 * byte by byte here, written into a fresh mkdtemp() folder, and each corruption must give its
 * own error, naming the key or tensor, without a crash (the Makefile's sanitize target runs
 * this file under ASan and UBSan too). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/ggml_blocks.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "check.h"

static char g_root[256];

/* ---- a growable byte buffer with little-endian writers ----------------------------------- */

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (!n) return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) exit(2);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_le(buf *b, uint64_t v, int n) {
    unsigned char t[8];
    for (int i = 0; i < n; i++) t[i] = (unsigned char)(v >> (8 * i));
    put(b, t, (size_t)n);
}

static void put_u32(buf *b, uint32_t v) { put_le(b, v, 4); }
static void put_u64(buf *b, uint64_t v) { put_le(b, v, 8); }
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void patch_u32(buf *b, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) b->p[at + i] = (unsigned char)(v >> (8 * i));
}
static void patch_u64(buf *b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; i++) b->p[at + i] = (unsigned char)(v >> (8 * i));
}

/* ---- a file description, built into bytes ---------------------------------------------- */

typedef struct tdesc {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    int64_t offset; /* < 0: the correct padded offset */
} tdesc;

typedef struct fdesc {
    uint32_t version;
    uint32_t alignment;  /* 0: no general.alignment key */
    buf extra_kv;        /* appended after the standard keys */
    int n_extra_kv;
    tdesc t[4];
    int nt;
    /* where interesting fields landed, for patching */
    size_t at_n_tensors, at_n_kv, at_tensor_type[4], at_tensor_dim0[4], at_str_len;
    size_t data_offset, tensor_end; /* end of the last tensor's bytes */
} fdesc;

static uint64_t type_nbytes(uint32_t type, const uint64_t *ne, uint32_t nd) {
    const mg_ggml_type *ty = mg_ggml_type_info(type);
    uint64_t bs = ty ? ty->block_size : 1, ts = ty ? ty->type_size : 1;
    uint64_t rows = 1;
    for (uint32_t i = 1; i < nd && i < 4; i++) rows *= ne[i];
    return ne[0] / bs * ts * rows;
}

static void build(fdesc *d, buf *out) {
    out->n = 0;
    put(out, "GGUF", 4);
    put_u32(out, d->version);
    d->at_n_tensors = out->n;
    put_u64(out, (uint64_t)d->nt);
    d->at_n_kv = out->n;
    put_u64(out, (uint64_t)(2 + (d->alignment ? 1 : 0) + d->n_extra_kv));
    put_str(out, "general.architecture");
    put_u32(out, MG_GGUF_STRING);
    d->at_str_len = out->n;
    put_str(out, "qwen3moe");
    put_str(out, "qwen3moe.block_count");
    put_u32(out, MG_GGUF_U32);
    put_u32(out, 2);
    if (d->alignment) {
        put_str(out, "general.alignment");
        put_u32(out, MG_GGUF_U32);
        put_u32(out, d->alignment);
    }
    if (d->extra_kv.n) put(out, d->extra_kv.p, d->extra_kv.n);
    uint64_t a = d->alignment ? d->alignment : 32, off = 0;
    uint64_t offs[4];
    for (int i = 0; i < d->nt; i++) {
        tdesc *t = &d->t[i];
        put_str(out, t->name);
        put_u32(out, t->n_dims);
        d->at_tensor_dim0[i] = out->n;
        for (uint32_t k = 0; k < t->n_dims; k++) put_u64(out, k < 4 ? t->ne[k] : 1);
        d->at_tensor_type[i] = out->n;
        put_u32(out, t->type);
        offs[i] = t->offset >= 0 ? (uint64_t)t->offset : off;
        put_u64(out, offs[i]);
        uint64_t nb = type_nbytes(t->type, t->ne, t->n_dims);
        off = offs[i] + nb + (a - nb % a) % a;
    }
    while (out->n % a) put(out, "", 1);
    d->data_offset = out->n;
    d->tensor_end = out->n;
    for (int i = 0; i < d->nt; i++) {
        tdesc *t = &d->t[i];
        uint64_t nb = type_nbytes(t->type, t->ne, t->n_dims);
        while (out->n < d->data_offset + offs[i]) put(out, "", 1);
        for (uint64_t k = 0; k < nb; k++) {
            unsigned char v = (unsigned char)(i * 31 + k);
            put(out, &v, 1);
        }
        if (out->n > d->tensor_end) d->tensor_end = out->n;
        while (out->n % a) put(out, "", 1);
    }
}

/* A small valid file: three tensors of three types and shapes. */
static void base(fdesc *d) {
    memset(d, 0, sizeof *d);
    d->version = 3;
    d->nt = 3;
    d->t[0] = (tdesc){"token_embd.weight", 2, {64, 3, 1, 1}, 8 /* Q8_0 */, -1};
    d->t[1] = (tdesc){"blk.0.ffn_gate_exps.weight", 3, {256, 2, 4, 1}, 12 /* Q4_K */, -1};
    d->t[2] = (tdesc){"output_norm.weight", 1, {5, 1, 1, 1}, 0 /* F32 */, -1};
}

static const char *write_file(const char *name, const buf *b, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_root, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(b->p, 1, n, f) != n)) exit(2);
    fclose(f);
    return path;
}

/* Opens the first n bytes of b; expects failure with every `want` fragment in the message. */
static void expect_error_n(const char *label, const buf *b, size_t n, const char *want1,
                           const char *want2) {
    mg_error err = {{0}};
    const char *path = write_file(label, b, n);
    mg_gguf *g = mg_gguf_open(path, &err);
    CHECK(!g, "%s: opened a corrupt file", label);
    mg_gguf_close(g);
    CHECK(strstr(err.msg, label) != NULL, "%s: message does not name the file: %s", label, err.msg);
    CHECK(want1 == NULL || strstr(err.msg, want1), "%s: message lacks '%s': %s", label, want1, err.msg);
    CHECK(want2 == NULL || strstr(err.msg, want2), "%s: message lacks '%s': %s", label, want2, err.msg);
}

static void expect_error(const char *label, const buf *b, const char *w1, const char *w2) {
    expect_error_n(label, b, b->n, w1, w2);
}

static void free_desc(fdesc *d) { free(d->extra_kv.p); }

/* ---- tests ----------------------------------------------------------------------------- */

static void test_valid(void) {
    fdesc d;
    buf b = {0};
    base(&d);
    /* every value type, including arrays of numbers, bools and strings */
    buf *e = &d.extra_kv;
    put_str(e, "t.u8"); put_u32(e, MG_GGUF_U8); put_le(e, 200, 1);
    put_str(e, "t.i8"); put_u32(e, MG_GGUF_I8); put_le(e, (uint8_t)-5, 1);
    put_str(e, "t.u16"); put_u32(e, MG_GGUF_U16); put_le(e, 65000, 2);
    put_str(e, "t.i16"); put_u32(e, MG_GGUF_I16); put_le(e, (uint16_t)-300, 2);
    put_str(e, "t.i32"); put_u32(e, MG_GGUF_I32); put_le(e, (uint32_t)-70000, 4);
    put_str(e, "t.u64"); put_u32(e, MG_GGUF_U64); put_u64(e, UINT64_MAX);
    put_str(e, "t.i64"); put_u32(e, MG_GGUF_I64); put_u64(e, (uint64_t)INT64_MIN);
    float f = 0.25f;
    uint32_t fb;
    memcpy(&fb, &f, 4);
    put_str(e, "t.f32"); put_u32(e, MG_GGUF_F32); put_u32(e, fb);
    double dv = -1e300;
    uint64_t db;
    memcpy(&db, &dv, 8);
    put_str(e, "t.f64"); put_u32(e, MG_GGUF_F64); put_u64(e, db);
    put_str(e, "t.bool"); put_u32(e, MG_GGUF_BOOL); put_le(e, 1, 1);
    put_str(e, "t.ai32"); put_u32(e, MG_GGUF_ARRAY); put_u32(e, MG_GGUF_I32); put_u64(e, 3);
    put_le(e, 1, 4); put_le(e, (uint32_t)-2, 4); put_le(e, 3, 4);
    put_str(e, "t.astr"); put_u32(e, MG_GGUF_ARRAY); put_u32(e, MG_GGUF_STRING); put_u64(e, 3);
    put_str(e, "a"); put_str(e, ""); put_str(e, "Ġhello");
    put_str(e, "t.aempty"); put_u32(e, MG_GGUF_ARRAY); put_u32(e, MG_GGUF_F32); put_u64(e, 0);
    d.n_extra_kv = 13;
    build(&d, &b);
    mg_error err = {{0}};
    mg_gguf *g = mg_gguf_open(write_file("valid.gguf", &b, b.n), &err);
    CHECK(g != NULL, "valid file refused: %s", err.msg);
    if (!g) goto out;
    CHECK(mg_gguf_version(g) == 3 && mg_gguf_alignment(g) == 32, "version/alignment");
    CHECK(mg_gguf_kv_count(g) == 15, "kv count %zu", mg_gguf_kv_count(g));
    CHECK(mg_gguf_tensor_count(g) == 3, "tensor count");
    CHECK(mg_gguf_data_offset(g) == d.data_offset, "data offset %llu vs %zu",
          (unsigned long long)mg_gguf_data_offset(g), d.data_offset);
    size_t len = 0;
    const char *arch = mg_gguf_get_string(g, "general.architecture", &len, &err);
    CHECK(arch && len == 8 && !memcmp(arch, "qwen3moe", 8), "architecture");
    int64_t iv;
    uint64_t uv;
    double fv;
    int bv;
    CHECK(!mg_gguf_get_int(g, "qwen3moe.block_count", &iv, &err) && iv == 2, "block_count");
    CHECK(!mg_gguf_kv_int(mg_gguf_find_kv(g, "t.u8"), &iv) && iv == 200, "u8");
    CHECK(!mg_gguf_kv_int(mg_gguf_find_kv(g, "t.i8"), &iv) && iv == -5, "i8");
    CHECK(!mg_gguf_kv_int(mg_gguf_find_kv(g, "t.u16"), &iv) && iv == 65000, "u16");
    CHECK(!mg_gguf_kv_int(mg_gguf_find_kv(g, "t.i16"), &iv) && iv == -300, "i16");
    CHECK(!mg_gguf_kv_int(mg_gguf_find_kv(g, "t.i32"), &iv) && iv == -70000, "i32");
    CHECK(mg_gguf_kv_int(mg_gguf_find_kv(g, "t.u64"), &iv) == -1, "u64 max does not fit int64");
    CHECK(!mg_gguf_kv_uint(mg_gguf_find_kv(g, "t.u64"), &uv) && uv == UINT64_MAX, "u64");
    CHECK(!mg_gguf_kv_int(mg_gguf_find_kv(g, "t.i64"), &iv) && iv == INT64_MIN, "i64");
    CHECK(mg_gguf_kv_uint(mg_gguf_find_kv(g, "t.i8"), &uv) == -1, "negative is not a uint");
    CHECK(!mg_gguf_kv_float(mg_gguf_find_kv(g, "t.f32"), &fv) && fv == 0.25, "f32");
    CHECK(!mg_gguf_kv_float(mg_gguf_find_kv(g, "t.f64"), &fv) && fv == -1e300, "f64");
    CHECK(mg_gguf_kv_float(mg_gguf_find_kv(g, "t.u8"), &fv) == -1, "an integer is not a float");
    CHECK(!mg_gguf_kv_bool(mg_gguf_find_kv(g, "t.bool"), &bv) && bv == 1, "bool");
    const mg_gguf_kv *ai = mg_gguf_find_kv(g, "t.ai32");
    CHECK(ai && ai->type == MG_GGUF_ARRAY && ai->elem_type == MG_GGUF_I32 && ai->count == 3,
          "i32 array header");
    CHECK(!mg_gguf_kv_int_at(ai, 1, &iv) && iv == -2, "i32 array element");
    CHECK(mg_gguf_kv_int_at(ai, 3, &iv) == -1, "index past the end");
    CHECK(mg_gguf_kv_int(ai, &iv) == -1, "an array is not a scalar");
    const mg_gguf_kv *as = mg_gguf_find_kv(g, "t.astr");
    const char *s2 = mg_gguf_kv_string_at(as, 2, &len);
    CHECK(s2 && len == strlen("Ġhello") && !memcmp(s2, "Ġhello", len), "string array element 2");
    CHECK(mg_gguf_kv_string_at(as, 1, &len) && len == 0, "empty string element");
    CHECK(mg_gguf_find_kv(g, "t.aempty")->count == 0, "empty array");
    CHECK(mg_gguf_get_float(g, "t.u8", &fv, &err) == -1 && strstr(err.msg, "'t.u8' is u8"),
          "typed getter names the key and the type: %s", err.msg);
    CHECK(mg_gguf_get_int(g, "nope", &iv, &err) == -1 && strstr(err.msg, "'nope' not found"),
          "missing key: %s", err.msg);
    CHECK(mg_gguf_find_kv(g, "nope") == NULL && mg_gguf_find_tensor(g, "nope") == NULL, "absent");

    const mg_gguf_tensor *t = mg_gguf_find_tensor(g, "blk.0.ffn_gate_exps.weight");
    CHECK(t && t == mg_gguf_tensor_at(g, 1), "lookup by name");
    if (t) {
        CHECK(t->type == 12 && t->n_dims == 3 && t->ne[0] == 256 && t->ne[1] == 2 &&
              t->ne[2] == 4 && t->ne[3] == 1, "dims in ggml order");
        CHECK(t->row_bytes == 144 && t->nbytes == 144 * 8, "Q4_K sizes %llu",
              (unsigned long long)t->nbytes);
        /* Q8_0 64x3: 2 blocks of 34 bytes per row = 204 bytes, padded to 224 */
        CHECK(t->offset == 224 && t->file_offset == d.data_offset + 224, "offset %llu",
              (unsigned long long)t->offset);
        CHECK(!memcmp(t->data, b.p + t->file_offset, (size_t)t->nbytes), "data pointer");
        uint64_t so = 0, sn = 0;
        /* expert 3 of [256, 2, 4]: 2 rows of 144 bytes each, after 3 such experts */
        CHECK(!mg_gguf_tensor_slice(t, 3, &so, &sn) && sn == 288 && so == t->file_offset + 3 * 288,
              "expert slice %llu+%llu", (unsigned long long)so, (unsigned long long)sn);
        CHECK(mg_gguf_tensor_slice(t, 4, &so, &sn) == -1 && mg_gguf_tensor_slice(t, -1, &so, &sn) == -1,
              "slice out of range");
    }
    const mg_gguf_tensor *t2 = mg_gguf_tensor_at(g, 2);
    CHECK(t2 && t2->nbytes == 20 && t2->offset == 224 + 1152, "F32 tensor");
    mg_gguf_close(g);
out:
    free(b.p);
    free_desc(&d);
}

static void test_type_table(void) {
    static const char *const supported[] = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0",
                                            "Q4_K", "Q5_K", "Q6_K", "MXFP4", "IQ4_NL", "IQ4_XS",
                                            "Q4_1", "Q5_1", "Q2_K", "Q3_K", "IQ2_XXS", "IQ2_XS",
                                            "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"};
    int n_sup = 0;
    for (uint32_t id = 0; id < mg_ggml_type_id_end(); id++) {
        const mg_ggml_type *ty = mg_ggml_type_info(id);
        if (!ty) continue;
        n_sup += ty->supported;
        int listed = 0;
        for (size_t i = 0; i < sizeof supported / sizeof *supported; i++)
            listed |= !strcmp(supported[i], ty->name);
        CHECK(listed == ty->supported, "%s: supported flag %d", ty->name, ty->supported);
    }
    CHECK(n_sup == 23, "23 supported types, got %d", n_sup);
    static const uint32_t removed[] = {4, 5, 31, 32, 33, 36, 37, 38};
    for (size_t i = 0; i < sizeof removed / sizeof *removed; i++)
        CHECK(mg_ggml_type_info(removed[i]) == NULL, "removed id %u is unknown", removed[i]);
    const mg_ggml_type *q4k = mg_ggml_type_info(12), *mx = mg_ggml_type_info(39);
    CHECK(q4k && !strcmp(q4k->name, "Q4_K") && q4k->block_size == 256 && q4k->type_size == 144,
          "Q4_K");
    CHECK(mx && !strcmp(mx->name, "MXFP4") && mx->block_size == 32 && mx->type_size == 17, "MXFP4");
    CHECK(mg_ggml_foreign_type_name(144) && !strcmp(mg_ggml_foreign_type_name(144), "IQ4_KS"),
          "ik type name");
    CHECK(mg_ggml_foreign_type_name(12) == NULL, "mainline ids are not foreign");
}

static void test_corruptions(void) {
    fdesc d;
    buf b = {0};

    base(&d);
    build(&d, &b);
    b.p[0] = 'X';
    expect_error("bad_magic", &b, "not a GGUF file", NULL);

    base(&d);
    build(&d, &b);
    expect_error_n("tiny", &b, 3, "not a GGUF file", NULL);
    expect_error_n("header_only_magic", &b, 6, "truncated", "version");

    base(&d);
    d.version = 1;
    build(&d, &b);
    expect_error("v1", &b, "version 1", NULL);

    base(&d);
    d.version = 4;
    build(&d, &b);
    expect_error("v4", &b, "unsupported GGUF version 4", NULL);

    base(&d);
    d.version = 2; /* v2 has the same layout as v3 */
    build(&d, &b);
    {
        mg_error err;
        mg_gguf *g = mg_gguf_open(write_file("v2.gguf", &b, b.n), &err);
        CHECK(g && mg_gguf_version(g) == 2, "v2 accepted: %s", g ? "" : err.msg);
        mg_gguf_close(g);
    }

    base(&d);
    d.version = 0x03000000; /* version 3 written big-endian */
    build(&d, &b);
    expect_error("big_endian", &b, "big-endian", NULL);

    base(&d);
    build(&d, &b);
    patch_u64(&b, d.at_n_tensors, (uint64_t)1 << 40);
    expect_error("huge_tensor_count", &b, "tensors cannot fit", NULL);

    base(&d);
    build(&d, &b);
    patch_u64(&b, d.at_n_kv, UINT64_MAX);
    expect_error("huge_kv_count", &b, "metadata entries cannot fit", NULL);

    base(&d);
    build(&d, &b);
    patch_u64(&b, d.at_n_kv, 40); /* plausible, but the entries run into the tensor infos */
    expect_error("kv_count_too_big", &b, NULL, NULL);

    base(&d);
    build(&d, &b);
    patch_u64(&b, d.at_str_len, (uint64_t)1 << 31);
    expect_error("string_over_1gib", &b, "exceeds the 1 GiB limit", NULL);

    base(&d);
    build(&d, &b);
    patch_u64(&b, d.at_str_len, 1000000);
    expect_error("string_past_eof", &b, "truncated", "general.architecture");

    base(&d);
    put_str(&d.extra_kv, "nested");
    put_u32(&d.extra_kv, MG_GGUF_ARRAY);
    put_u32(&d.extra_kv, MG_GGUF_ARRAY);
    put_u64(&d.extra_kv, 1);
    put_u32(&d.extra_kv, MG_GGUF_U8);
    put_u64(&d.extra_kv, 1);
    put_le(&d.extra_kv, 7, 1);
    d.n_extra_kv = 1;
    build(&d, &b);
    expect_error("nested_array", &b, "'nested'", "array of arrays");
    free_desc(&d);

    base(&d);
    put_str(&d.extra_kv, "big.array");
    put_u32(&d.extra_kv, MG_GGUF_ARRAY);
    put_u32(&d.extra_kv, MG_GGUF_U64);
    put_u64(&d.extra_kv, (uint64_t)1 << 31);
    d.n_extra_kv = 1;
    build(&d, &b);
    expect_error("array_over_limit", &b, "'big.array'", "2^30");
    free_desc(&d);

    base(&d);
    put_str(&d.extra_kv, "long.array");
    put_u32(&d.extra_kv, MG_GGUF_ARRAY);
    put_u32(&d.extra_kv, MG_GGUF_STRING);
    put_u64(&d.extra_kv, 1000000); /* fits the 2^30 bound, not the file */
    d.n_extra_kv = 1;
    build(&d, &b);
    expect_error("string_array_past_eof", &b, "'long.array'", "truncated");
    free_desc(&d);

    base(&d);
    put_u64(&d.extra_kv, 3);
    put(&d.extra_kv, "a\0b", 3);
    put_u32(&d.extra_kv, MG_GGUF_U8);
    put_le(&d.extra_kv, 1, 1);
    d.n_extra_kv = 1;
    build(&d, &b);
    expect_error("nul_in_key", &b, "metadata key #2", "contains a NUL byte");
    free_desc(&d);

    base(&d);
    put_str(&d.extra_kv, "bad.type");
    put_u32(&d.extra_kv, 13);
    put_u32(&d.extra_kv, 0);
    d.n_extra_kv = 1;
    build(&d, &b);
    expect_error("unknown_value_type", &b, "'bad.type'", "unknown value type 13");
    free_desc(&d);

    base(&d);
    put_str(&d.extra_kv, "bad.bool");
    put_u32(&d.extra_kv, MG_GGUF_BOOL);
    put_le(&d.extra_kv, 2, 1);
    d.n_extra_kv = 1;
    build(&d, &b);
    expect_error("bad_bool", &b, "'bad.bool'", "neither 0 nor 1");
    free_desc(&d);

    base(&d);
    put_str(&d.extra_kv, "qwen3moe.block_count");
    put_u32(&d.extra_kv, MG_GGUF_U32);
    put_u32(&d.extra_kv, 3);
    d.n_extra_kv = 1;
    build(&d, &b);
    expect_error("duplicate_key", &b, "'qwen3moe.block_count'", "duplicate key");
    free_desc(&d);

    base(&d);
    d.t[2].name = "token_embd.weight";
    build(&d, &b);
    expect_error("duplicate_tensor", &b, "'token_embd.weight'", "duplicate tensor name");

    base(&d);
    d.t[2].name = "a_name_of_sixty_four_bytes_is_one_too_many_for_ggml_0123456789ab";
    build(&d, &b);
    expect_error("long_name", &b, "name of 64 bytes", NULL);

    base(&d);
    d.t[1].n_dims = 5;
    build(&d, &b);
    expect_error("five_dims", &b, "'blk.0.ffn_gate_exps.weight'", "n_dims 5");

    base(&d);
    d.t[1].n_dims = 0;
    build(&d, &b);
    expect_error("zero_dims", &b, "'blk.0.ffn_gate_exps.weight'", "n_dims 0");

    base(&d);
    d.t[2].ne[0] = 0;
    build(&d, &b);
    expect_error("zero_dim", &b, "'output_norm.weight'", "dim 0 is 0");

    base(&d);
    build(&d, &b);
    patch_u64(&b, d.at_tensor_dim0[2], (uint64_t)1 << 63);
    expect_error("negative_dim", &b, "'output_norm.weight'", "must be 1..");

    base(&d);
    d.t[2].n_dims = 4;
    d.t[2].ne[0] = (uint64_t)1 << 20;
    d.t[2].ne[1] = (uint64_t)1 << 20;
    d.t[2].ne[2] = (uint64_t)1 << 20;
    d.t[2].ne[3] = (uint64_t)1 << 20;
    d.t[2].offset = 0; /* the builder must not try to write 2^80 bytes */
    d.nt = 3;
    {
        /* build the header only: the tensor's data could not be written anyway */
        tdesc big = d.t[2];
        d.t[2] = (tdesc){"output_norm.weight", 1, {5, 1, 1, 1}, 0, -1};
        build(&d, &b);
        size_t at = d.at_tensor_dim0[2];
        buf h = {0};
        put(&h, b.p, at);
        for (int k = 0; k < 4; k++) put_u64(&h, big.ne[k]);
        put_u32(&h, 0);
        put_u64(&h, 0);
        /* n_dims sits just before dim 0 */
        patch_u32(&h, at - 4, 4);
        while (h.n % 32) put(&h, "", 1);
        expect_error("overflow_dims", &h, "'output_norm.weight'", "overflows");
        free(h.p);
    }

    base(&d);
    d.t[0].type = 4; /* Q4_2, removed */
    build(&d, &b);
    expect_error("removed_type", &b, "'token_embd.weight'", "unknown or removed ggml type 4");

    base(&d);
    d.t[0].type = 99;
    build(&d, &b);
    expect_error("unknown_type", &b, "'token_embd.weight'", "ggml type 99");

    base(&d);
    build(&d, &b);
    patch_u32(&b, d.at_tensor_type[1], 144);
    expect_error("ik_type", &b, "'blk.0.ffn_gate_exps.weight'", "144 (IQ4_KS) exists only in ik_llama.cpp");

    base(&d);
    d.t[1].ne[0] = 128; /* not a multiple of Q4_K's 256 */
    build(&d, &b);
    expect_error("row_not_block_multiple", &b, "'blk.0.ffn_gate_exps.weight'", "block size 256");

    base(&d);
    d.alignment = 24;
    build(&d, &b); /* the builder pads to 24, harmless: the alignment is refused first */
    expect_error("alignment_not_pow2", &b, "general.alignment", "not a power of two");

    base(&d);
    put_str(&d.extra_kv, "general.alignment");
    put_u32(&d.extra_kv, MG_GGUF_I32);
    put_u32(&d.extra_kv, 64);
    d.n_extra_kv = 1;
    build(&d, &b);
    expect_error("alignment_signed", &b, "general.alignment", "is i32, expected u32");
    free_desc(&d);

    base(&d);
    d.alignment = 64; /* a valid non-default alignment */
    build(&d, &b);
    {
        mg_error err;
        mg_gguf *g = mg_gguf_open(write_file("align64.gguf", &b, b.n), &err);
        CHECK(g && mg_gguf_alignment(g) == 64 && mg_gguf_data_offset(g) % 64 == 0 &&
              mg_gguf_tensor_at(g, 1)->offset == 256, "alignment 64: %s", g ? "" : err.msg);
        mg_gguf_close(g);
    }

    base(&d);
    d.t[1].offset = 240; /* 16 past the correct 224: misaligned */
    build(&d, &b);
    expect_error("misaligned_offset", &b, "'blk.0.ffn_gate_exps.weight'", "not a multiple of the alignment");

    base(&d);
    d.t[1].offset = 192; /* inside token_embd's 204 bytes */
    build(&d, &b);
    expect_error("overlap", &b, "'blk.0.ffn_gate_exps.weight'", "overlaps tensor 'token_embd.weight'");

    base(&d);
    d.t[1].offset = 256; /* a gap llama.cpp refuses too */
    build(&d, &b);
    expect_error("gap", &b, "'blk.0.ffn_gate_exps.weight'", "expected 224");

    base(&d);
    d.t[2].offset = (int64_t)1 << 40;
    d.nt = 3;
    {
        tdesc keep = d.t[2];
        d.t[2].offset = -1;
        build(&d, &b);
        patch_u64(&b, d.at_tensor_type[2] + 4, (uint64_t)keep.offset);
        expect_error("offset_past_eof", &b, "'output_norm.weight'", "past the end of the file");
    }

    /* truncation at every byte: always an error, never a crash */
    base(&d);
    build(&d, &b);
    int all_refused = 1;
    for (size_t n = 0; n < d.tensor_end; n++) {
        mg_error err = {{0}};
        mg_gguf *g = mg_gguf_open(write_file("trunc", &b, n), &err);
        if (g || !err.msg[0]) all_refused = 0;
        mg_gguf_close(g);
    }
    CHECK(all_refused, "every truncation before the last tensor's end is refused");
    expect_error_n("trunc_in_data", &b, d.tensor_end - 1, "'output_norm.weight'", "past the end");
    {
        mg_error err;
        mg_gguf *g = mg_gguf_open(write_file("no_trailing_pad", &b, d.tensor_end), &err);
        CHECK(g != NULL, "the last tensor's padding is optional: %s", g ? "" : err.msg);
        mg_gguf_close(g);
    }

    /* every single flipped bit in the header: an error or a valid file, never a crash */
    int opened = 0, refused = 0;
    for (size_t at = 0; at < d.data_offset; at++)
        for (int bit = 0; bit < 8; bit++) {
            b.p[at] ^= (unsigned char)(1u << bit);
            mg_error err = {{0}};
            mg_gguf *g = mg_gguf_open(write_file("flip", &b, b.n), &err);
            if (g) opened++;
            else if (err.msg[0]) refused++;
            mg_gguf_close(g);
            b.p[at] ^= (unsigned char)(1u << bit);
        }
    CHECK(opened + refused == (int)d.data_offset * 8 && refused > opened,
          "bit flips: %d opened, %d refused", opened, refused);

    free(b.p);
}

static void test_missing_file(void) {
    mg_error err;
    char path[512];
    snprintf(path, sizeof path, "%s/absent.gguf", g_root);
    CHECK(mg_gguf_open(path, &err) == NULL && strstr(err.msg, "cannot open"), "%s", err.msg);
    CHECK(mg_gguf_open(g_root, &err) == NULL && strstr(err.msg, "not a regular file"), "%s", err.msg);
    buf b = {0};
    put(&b, "", 0);
    CHECK(mg_gguf_open(write_file("empty.gguf", &b, 0), &err) == NULL &&
          strstr(err.msg, "not a GGUF file"), "%s", err.msg);
}

/* ---- the file as a checkpoint (c/io/gguf_checkpoint.c) ----------------------------------- */

static void add_u16_kv(fdesc *d, const char *key, uint16_t v) {
    put_str(&d->extra_kv, key);
    put_u32(&d->extra_kv, MG_GGUF_U16);
    put_le(&d->extra_kv, v, 2);
    d->n_extra_kv++;
}

static void test_checkpoint(void) {
    fdesc d;
    base(&d);
    buf b = {0};
    build(&d, &b);
    mg_error err = {{0}};
    mg_checkpoint *ck = mg_checkpoint_open(write_file("ck.gguf", &b, b.n), &err);
    CHECK(ck != NULL, "open: %s", err.msg);
    if (!ck) return;
    CHECK(mg_checkpoint_is_gguf(ck) && mg_checkpoint_shards(ck) == 1, "one GGUF part");
    const mg_tensor *e = mg_checkpoint_find(ck, "model.embed_tokens.weight");
    CHECK(e && e->dtype == MG_DT_GGML && e->ggml_type == 8 && e->ndim == 2 && e->shape[0] == 3 &&
          e->shape[1] == 64 && !strcmp(e->stored_name, "token_embd.weight"), "embedding as [rows, cols] Q8_0");
    const mg_tensor *n = mg_checkpoint_find(ck, "model.norm.weight");
    CHECK(n && n->dtype == MG_DT_F32 && n->ndim == 1 && n->shape[0] == 5, "norm as F32 [5]");
    CHECK(!mg_checkpoint_find(ck, "blk.0.ffn_gate_exps.weight"), "the stacked tensor is cut into experts");
    /* Expert E of ne {256, 2, 4} Q4_K: 2 rows of 144 bytes at offset + E * 288. */
    for (int x = 0; x < 4; x++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.0.mlp.experts.%d.gate_proj.weight", x);
        const mg_tensor *t = mg_checkpoint_find(ck, name);
        CHECK(t && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 256 && t->nbytes == 288, "%s", name);
        if (!t) continue;
        uint64_t want_off = d.data_offset + (type_nbytes(8, d.t[0].ne, 2) + 31) / 32 * 32 /* token_embd */ +
                            (uint64_t)x * 288;
        CHECK(t->file_offset == want_off, "%s at %llu, expected %llu", name,
              (unsigned long long)t->file_offset, (unsigned long long)want_off);
        CHECK(!memcmp(t->data, b.p + want_off, 288), "%s: data is the file's slice", name);
        CHECK(!strcmp(t->stored_name, "blk.0.ffn_gate_exps.weight"), "%s: stored name", name);
        mg_matrix m;
        CHECK(mg_bind_matrix(ck, name, 2, 256, &m, &err) == 0 && m.format == MG_Q4_K &&
              m.scale_kind == MG_SCALE_NONE && m.data == t->data, "%s binds as Q4_K: %s", name, err.msg);
    }
    float *v = mg_bind_vector(ck, "model.norm.weight", 5, &err);
    CHECK(v != NULL, "norm binds: %s", err.msg);
    free(v);
    /* A block-format tensor read whole (llama-quantize quantises DeepSeek-V4's compressor position
     * biases): the block decoder's values; a count that is not the tensor's names it and its type. */
    float *a = mg_bind_array(ck, "model.embed_tokens.weight", 192, &err);
    CHECK(a != NULL, "a Q8_0 tensor read whole: %s", err.msg);
    if (a && e) {
        float want[192];
        for (int k = 0; k < 6; k++) mg_ggml_block_q8_0((const uint8_t *)e->data + 34 * k, want + 32 * k);
        CHECK(!memcmp(a, want, sizeof want), "Q8_0 array values are the blocks' values");
    }
    free(a);
    CHECK(mg_bind_array(ck, "model.embed_tokens.weight", 160, &err) == NULL &&
          strstr(err.msg, "token_embd.weight") && strstr(err.msg, "Q8_0") && strstr(err.msg, "expected 160"),
          "%s", err.msg);
    mg_matrix m;
    CHECK(mg_bind_matrix(ck, "model.layers.0.self_attn.q_proj.weight", 4, 64, &m, &err) &&
          strstr(err.msg, "blk.0.attn_q.weight") && strstr(err.msg, "not found"), "%s", err.msg);
    mg_checkpoint_close(ck);

    /* A type outside the kernels' set is refused when bound, by GGUF name and type name. */
    d.t[1].type = 34; /* TQ1_0 (ternary): 256 elements in 54 bytes */
    build(&d, &b);
    ck = mg_checkpoint_open(write_file("tq1.gguf", &b, b.n), &err);
    CHECK(ck != NULL, "open: %s", err.msg);
    if (ck) {
        CHECK(mg_bind_matrix(ck, "model.layers.0.mlp.experts.1.gate_proj.weight", 2, 256, &m, &err) &&
              strstr(err.msg, "blk.0.ffn_gate_exps.weight") && strstr(err.msg, "TQ1_0") &&
              strstr(err.msg, "not supported") && strstr(err.msg, "Q4_K"), "%s", err.msg);
        mg_checkpoint_close(ck);
    }
    free_desc(&d);

    /* A split set: the first part names the count; a missing part is named; a complete set
     * holds both parts' tensors. */
    base(&d);
    d.nt = 2;
    add_u16_kv(&d, "split.no", 0);
    add_u16_kv(&d, "split.count", 2);
    build(&d, &b);
    const char *first = write_file("s-00001-of-00002.gguf", &b, b.n);
    char first_path[512];
    snprintf(first_path, sizeof first_path, "%s", first);
    CHECK(mg_checkpoint_open(first_path, &err) == NULL && strstr(err.msg, "split part 2 of 2 is missing") &&
          strstr(err.msg, "s-00002-of-00002.gguf"), "%s", err.msg);
    free_desc(&d);
    base(&d);
    d.nt = 1;
    d.t[0] = (tdesc){"output.weight", 2, {32, 3, 1, 1}, 0, -1};
    add_u16_kv(&d, "split.no", 1);
    add_u16_kv(&d, "split.count", 2);
    build(&d, &b);
    write_file("s-00002-of-00002.gguf", &b, b.n);
    ck = mg_checkpoint_open(first_path, &err);
    CHECK(ck && mg_checkpoint_shards(ck) == 2, "split set: %s", err.msg);
    if (ck) {
        const mg_tensor *h = mg_checkpoint_find(ck, "lm_head.weight");
        CHECK(h && h->shard == 1 && h->dtype == MG_DT_F32 && h->shape[0] == 3 && h->shape[1] == 32,
              "output in part 2");
        CHECK(mg_checkpoint_shard_fd(ck, 1) >= 0, "part 2's descriptor for the expert reads");
        mg_checkpoint_close(ck);
    }
    snprintf(first_path, sizeof first_path, "%s/s-00002-of-00002.gguf", g_root);
    CHECK(mg_checkpoint_open(first_path, &err) == NULL && strstr(err.msg, "open the first part"), "%s", err.msg);
    free_desc(&d);
    free(b.p);
}

int main(void) {
    snprintf(g_root, sizeof g_root, "/tmp/mg_test_gguf_XXXXXX");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 2;
    }
    test_valid();
    test_type_table();
    test_corruptions();
    test_missing_file();
    test_checkpoint();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_root);
    printf("test_gguf: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
