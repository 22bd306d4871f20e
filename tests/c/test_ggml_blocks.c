/* The ggml block-format kernels (Q8_0 ... IQ4_XS, Q4_1, Q5_1, Q2_K, Q3_K, the IQ1 / IQ2 / IQ3 grid
 * formats) of every SIMD table this build has and this CPU runs, against the scalar table (whose decoder,
 * core/ggml_blocks.h, tests/test_ggml_dequant.py checks bit for bit against gguf-py):
 *  1. y = W x on random blocks, odd row counts, 32-element rows that are not multiples of 256,
 *     token counts 1, 2, 3, 5, 13, 17, 26, row ranges [r0, r1) inside the matrix, padded x / y strides:
 *     |y - y_ref| <= 1e-5 * sum_c |w x| (fp32 reordering only), and rows outside the range
 *     untouched.
 *  2. Exactness of the dequantisation: with x one-hot (x = e_c), decode and prefill both give
 *     W[r, c] itself, equal to the scalar value.
 *  3. Prefill batching: 19 tokens in one call equal the same tokens in calls of 2, 3, 5, 9.
 * Plus rows wider than one 65536-column decode pass, and the SIMD loops' MXFP4 scale table
 * (MG_E8M0_HALF) equal to mg_ggml_e8m0_half bit for bit for all 256 bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/cpu.h"
#include "core/ggml_blocks.h"
#include "core/kernels.h"
#include "core/matrix.h"
#include "check.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float rnd_sym(void) { return (float)((rnd() >> 40) * (1.0 / 8388608.0)) - 1.0f; }

/* A random finite f16 of magnitude 2^-24 .. 2^4 (denormals included), either sign. */
static uint16_t rnd_f16_scale(void) {
    const uint16_t exp = (uint16_t)(rnd() % 20); /* biased exponent 0..19 */
    return (uint16_t)((rnd() & 0x8000u) | (uint16_t)(exp << 10) | (rnd() & 0x3ffu));
}

/* Byte offsets of the f16 scale fields of a block (-1: none). */
static void f16_fields(mg_format f, int off[2]) {
    off[0] = off[1] = -1;
    switch (f) {
    case MG_Q4_K:
    case MG_Q5_K:
    case MG_Q4_1:
    case MG_Q5_1: off[0] = 0, off[1] = 2; break;
    case MG_Q6_K: off[0] = 208; break;
    case MG_Q2_K: off[0] = 80, off[1] = 82; break;
    case MG_Q3_K: off[0] = 108; break;
    case MG_MXFP4:
    case MG_IQ1_M: break; /* IQ1_M's d: the scale words' top nibbles (random_blocks) */
    default: off[0] = 0; break;
    }
}

static void random_blocks(mg_format f, uint8_t *data, int64_t rows, int64_t cols) {
    int64_t e, b;
    mg_format_block(f, &e, &b);
    const int64_t nb = rows * cols / e;
    int off[2];
    f16_fields(f, off);
    for (int64_t i = 0; i < nb * b; i++) data[i] = (uint8_t)(rnd() >> 24);
    for (int64_t k = 0; k < nb; k++) {
        uint8_t *p = data + k * b;
        for (int j = 0; j < 2; j++)
            if (off[j] >= 0) {
                const uint16_t h = rnd_f16_scale();
                memcpy(p + off[j], &h, 2);
            }
        if (f == MG_IQ1_M) {
            const uint16_t h = rnd_f16_scale();
            for (int i = 0; i < 4; i++) {
                uint16_t w;
                memcpy(&w, p + 48 + 2 * i, 2);
                w = (uint16_t)((w & 0x0fffu) | (((h >> (4 * i)) & 15u) << 12));
                memcpy(p + 48 + 2 * i, &w, 2);
            }
        }
        if (f == MG_MXFP4) p[0] = k % 7 == 3 ? (uint8_t)(k & 1) : (uint8_t)(110 + rnd() % 30); /* incl. denormal scales */
    }
}

static const mg_format FORMATS[] = {MG_Q8_0, MG_Q4_0, MG_Q5_0, MG_Q4_K, MG_Q5_K, MG_Q6_K, MG_MXFP4, MG_IQ4_NL, MG_IQ4_XS,
                                    MG_Q4_1, MG_Q5_1, MG_Q2_K, MG_Q3_K, MG_IQ2_XXS, MG_IQ2_XS, MG_IQ2_S,
                                    MG_IQ3_XXS, MG_IQ3_S, MG_IQ1_S, MG_IQ1_M};
enum { N_FORMATS = sizeof FORMATS / sizeof *FORMATS };

typedef struct {
    mg_matrix m;
    uint8_t *data;
    float *dense; /* scalar dequantisation [rows, cols] */
} bmat;

static void make(bmat *b, mg_format f, int64_t rows, int64_t cols) {
    memset(&b->m, 0, sizeof b->m);
    b->m.format = f;
    b->m.rows = rows;
    b->m.cols = cols;
    b->m.scale_kind = MG_SCALE_NONE;
    const size_t rb = mg_matrix_row_bytes(&b->m);
    b->data = malloc((size_t)rows * rb);
    random_blocks(f, b->data, rows, cols);
    b->m.data = b->data;
    b->dense = malloc((size_t)(rows * cols) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) mg_matrix_row_f32(&b->m, r, b->dense + r * cols);
}

static void unmake(bmat *b) { free(b->data), free(b->dense); }

#define SENTINEL 1234.5f

/* 1. One matrix, one table, n_tok tokens, rows [r0, r1), strides cols + 3 and rows + 5; x random
 * in (-1, 1) times xmul.  A tiny xmul (2^-118) makes the AVX2 decoders that scale x by up to
 * 2^-24 (lane order) take their other loops: scaled, such x would be fp32 denormals. */
static void case_linear_x(const mg_kernels *k, const bmat *b, int64_t n_tok, int64_t r0, int64_t r1, float xmul) {
    const int64_t rows = b->m.rows, cols = b->m.cols, xs = cols + 3, ys = rows + 5;
    float *x = malloc((size_t)(n_tok * xs) * sizeof(float));
    float *y = malloc((size_t)(n_tok * ys) * sizeof(float));
    float *y_ref = malloc((size_t)(n_tok * ys) * sizeof(float));
    for (int64_t i = 0; i < n_tok * xs; i++) x[i] = rnd_sym() * xmul;
    for (int64_t i = 0; i < n_tok * ys; i++) y[i] = y_ref[i] = SENTINEL;
    k->linear[b->m.format](&b->m, x, xs, n_tok, y, ys, r0, r1);
    mg_kernels_scalar()->linear[b->m.format](&b->m, x, xs, n_tok, y_ref, ys, r0, r1);
    int bad = 0, untouched = 1;
    double worst = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t r = 0; r < ys; r++) {
            const float got = y[t * ys + r];
            if (r < r0 || r >= r1) {
                untouched &= got == SENTINEL;
                continue;
            }
            double exact = 0, mag = 0;
            for (int64_t c = 0; c < cols; c++) {
                const double p = (double)b->dense[r * cols + c] * (double)x[t * xs + c];
                exact += p, mag += fabs(p);
            }
            const double err = fmax(fabs(got - exact), fabs(got - (double)y_ref[t * ys + r]));
            if (!(err <= 1e-5 * mag + 1e-30 * xmul)) bad++, worst = fmax(worst, err / (mag + 1e-30 * xmul));
        }
    }
    CHECK(!bad && untouched, "%s %s %ldx%ld n_tok=%ld rows [%ld, %ld) x * %g: %d outputs off (worst err/mag %.3g), untouched %d",
          k->name, mg_format_name(b->m.format), (long)rows, (long)cols, (long)n_tok, (long)r0, (long)r1, (double)xmul, bad,
          worst, untouched);
    free(x), free(y), free(y_ref);
}
static void case_linear(const mg_kernels *k, const bmat *b, int64_t n_tok, int64_t r0, int64_t r1) {
    case_linear_x(k, b, n_tok, r0, r1, 1.0f);
}

/* 2. x = e_c: every output is one weight, exactly (decode with one token per column, prefill
 * with all columns as tokens). */
static void case_exact(const mg_kernels *k, const bmat *b) {
    const int64_t rows = b->m.rows, cols = b->m.cols;
    float *x = calloc((size_t)(cols * cols), sizeof(float));
    float *y = malloc((size_t)(cols * rows) * sizeof(float));
    for (int64_t c = 0; c < cols; c++) x[c * cols + c] = 1.0f;
    int bad_dec = 0, bad_pre = 0;
    for (int64_t c = 0; c < cols; c++) {
        k->linear[b->m.format](&b->m, x + c * cols, cols, 1, y, rows, 0, rows);
        for (int64_t r = 0; r < rows; r++) bad_dec += y[r] != b->dense[r * cols + c];
    }
    k->linear[b->m.format](&b->m, x, cols, cols, y, rows, 0, rows);
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++) bad_pre += y[c * rows + r] != b->dense[r * cols + c];
    CHECK(!bad_dec && !bad_pre, "%s %s %ldx%ld one-hot x: %d decode and %d prefill values inexact", k->name,
          mg_format_name(b->m.format), (long)rows, (long)cols, bad_dec, bad_pre);
    free(x), free(y);
}

/* 3. Outputs do not depend on how tokens are batched (n_tok >= 2: the prefill path). */
static void case_batching(const mg_kernels *k, const bmat *b) {
    static const int64_t parts[] = {2, 3, 5, 9};
    const int64_t n_tok = 19, rows = b->m.rows, cols = b->m.cols;
    float *x = malloc((size_t)(n_tok * cols) * sizeof(float));
    float *y_all = malloc((size_t)(n_tok * rows) * sizeof(float)), *y_part = malloc((size_t)(n_tok * rows) * sizeof(float));
    for (int64_t i = 0; i < n_tok * cols; i++) x[i] = rnd_sym();
    k->linear[b->m.format](&b->m, x, cols, n_tok, y_all, rows, 0, rows);
    int64_t t0 = 0;
    for (int p = 0; t0 < n_tok; p = (p + 1) % 4) {
        const int64_t n = parts[p] < n_tok - t0 ? parts[p] : n_tok - t0;
        k->linear[b->m.format](&b->m, x + t0 * cols, cols, n, y_part + t0 * rows, rows, 0, rows);
        t0 += n;
    }
    CHECK(!memcmp(y_all, y_part, (size_t)(n_tok * rows) * sizeof(float)), "%s %s batching changed outputs", k->name,
          mg_format_name(b->m.format));
    free(x), free(y_all), free(y_part);
}

/* 4. Decode outputs do not depend on how rows are grouped: the multi-row loops (up to four rows
 * per pass, sharing x's loads) give each row the bits of that row decoded alone. */
static void case_row_grouping(const mg_kernels *k, const bmat *b) {
    const int64_t rows = b->m.rows, cols = b->m.cols;
    float *x = malloc((size_t)cols * sizeof(float));
    float *y_all = malloc((size_t)rows * sizeof(float)), *y_one = malloc((size_t)rows * sizeof(float));
    for (int64_t c = 0; c < cols; c++) x[c] = rnd_sym();
    k->linear[b->m.format](&b->m, x, cols, 1, y_all, rows, 0, rows);
    for (int64_t r = 0; r < rows; r++) k->linear[b->m.format](&b->m, x, cols, 1, y_one, rows, r, r + 1);
    CHECK(!memcmp(y_all, y_one, (size_t)rows * sizeof(float)), "%s %s %ldx%ld: a row alone differs from it in a group",
          k->name, mg_format_name(b->m.format), (long)rows, (long)cols);
    free(x), free(y_all), free(y_one);
}

/* The table the SIMD MXFP4 loops read in place of mg_ggml_e8m0_half (its denormals included). */
static void case_e8m0_table(void) {
    for (int e = 0; e < 256; e++) {
        const float want = mg_ggml_e8m0_half((uint8_t)e);
        CHECK(!memcmp(&MG_E8M0_HALF[e], &want, 4), "MG_E8M0_HALF[%d] = %a, mg_ggml_e8m0_half gives %a", e,
              (double)MG_E8M0_HALF[e], (double)want);
    }
}

/* The x86 SIMD tables take every block format with their own entry (the decode and tile loops
 * of ggml_avx2.c / iq_avx2.c, and avx512's prefill), not the scalar table's: otherwise the
 * comparisons below would compare the scalar loop with itself. */
static void case_x86_entries(const mg_kernels *k) {
    if (strncmp(k->name, "avx", 3)) return;
    for (int fi = 0; fi < N_FORMATS; fi++)
        CHECK(k->linear[FORMATS[fi]] != mg_kernels_scalar()->linear[FORMATS[fi]], "%s takes %s with the scalar entry",
              k->name, mg_format_name(FORMATS[fi]));
}

int main(void) {
    case_e8m0_table();
    static const char *const names[] = {"scalar", "avx2", "avx512", "avx512bf16", "neon"};
    const mg_kernels *tables[5];
    int n = 0;
    for (int i = 0; i < 5; i++) {
        const mg_kernels *k = mg_kernels_named(names[i]);
        if (k) tables[n++] = k;
        if (k) case_x86_entries(k);
    }
    /* 13 and 26: two and three token blocks of the avx512 prefill micro-kernel (<= 12 tokens each) */
    static const int64_t toks[] = {1, 2, 3, 5, 13, 17, 26};
    static const int64_t rows_list[] = {1, 3, 17, 37};
    static const int64_t blocks32[] = {1, 3, 13, 44, 131}; /* 32 x: 44 = GLM-Air's 1408; 131: > 4096 */
    static const int64_t blocks256[] = {1, 3, 5, 17};      /* 17 x 256 = 4352 > 4096 */
    for (int fi = 0; fi < N_FORMATS; fi++) {
        const mg_format f = FORMATS[fi];
        int64_t e, bytes;
        mg_format_block(f, &e, &bytes);
        const int64_t *bl = e == 32 ? blocks32 : blocks256;
        const int nbl = e == 32 ? 5 : 4;
        for (int bi = 0; bi < nbl; bi++)
            for (int ri = 0; ri < 4; ri++) {
                bmat b;
                make(&b, f, rows_list[ri], bl[bi] * e);
                for (int k = 0; k < n; k++) {
                    if (k == 0) continue; /* the scalar table is the reference itself */
                    for (int ti = 0; ti < (int)(sizeof toks / sizeof *toks); ti++) {
                        case_linear(tables[k], &b, toks[ti], 0, b.m.rows);
                        if (b.m.rows >= 3) case_linear(tables[k], &b, toks[ti], 1, b.m.rows - 1);
                    }
                    case_linear_x(tables[k], &b, 1, 0, b.m.rows, 0x1p-118f);
                }
                /* exactness for every table, the scalar one included (its decoder vs itself) */
                if (b.m.cols <= 1408)
                    for (int k = 0; k < n; k++) case_exact(tables[k], &b);
                unmake(&b);
            }
        bmat b;
        /* rows wider than the SIMD decoders' 65536-column pass: partial sums added across passes */
        make(&b, f, 3, 65536 + 2 * e);
        for (int k = 1; k < n; k++) case_linear(tables[k], &b, 1, 0, 3), case_linear(tables[k], &b, 2, 1, 3);
        unmake(&b);
        make(&b, f, 37, e == 32 ? 544 : 512);
        for (int k = 1; k < n; k++) case_batching(tables[k], &b), case_row_grouping(tables[k], &b);
        unmake(&b);
    }
    printf("test_ggml_blocks: tables");
    for (int k = 0; k < n; k++) printf(" %s", tables[k]->name);
    printf("; %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
