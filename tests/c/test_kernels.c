/* Kernel tables against ground truth.
 *  0. The tables' inheritance (c/kernels/tables.h), for every table the build has: parents,
 *     no entry left empty, entries not overridden are the parent's.
 *  1. The scalar table against a double-precision dequantisation built from formats.h decoders.
 *  2. Every SIMD table this CPU runs (avx2, avx512, avx512bf16, neon: whichever the build has
 *     and mg_kernels_named accepts here) against the scalar table, for every weight format and
 *     scale kind, odd shapes, decode and prefill token counts, sub-ranges of rows and padded
 *     strides; then the vector ops (dot, axpy, scale, rmsnorm, swiglu, read_sum) and the
 *     attention block products (attn_scores, attn_values) and the softmax between them.
 * Linear tolerance: |y - y_ref| <= 1e-5 * sum_c |w[r,c] * x[t,c]| (fp32 reordering only). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/cpu.h"
#include "core/kernels.h"
#include "core/matrix.h"
#include "kernels/tables.h"

typedef struct {
    int passed, failed;
} tally;

typedef struct {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *g) {
    g->s ^= g->s << 13;
    g->s ^= g->s >> 7;
    g->s ^= g->s << 17;
    return g->s;
}
static float rng_uniform(rng *g) { return (float)((rng_next(g) >> 40) * (1.0 / 16777216.0)); } /* [0,1) */
static float rng_sym(rng *g) { return 2.0f * rng_uniform(g) - 1.0f; }

static void check(tally *t, int ok, const char *fmt_msg, const char *a, const char *b, long x1, long x2,
                  long x3, double got, double want) {
    if (ok) {
        t->passed++;
        return;
    }
    t->failed++;
    if (t->failed <= 20)
        fprintf(stderr, "FAIL %s [%s %s] %ld %ld %ld: got %.9g want %.9g\n", fmt_msg, a, b, x1, x2, x3, got, want);
}

/* ---- random matrices --------------------------------------------------------------------- */

static uint8_t random_fp8(rng *g) {
    /* One value in eight is an edge encoding: zeros, +-448, subnormals. */
    static const uint8_t edges[] = {0x00, 0x80, 0x7e, 0xfe, 0x01, 0x81, 0x07, 0x04, 0x08, 0x87};
    uint64_t v = rng_next(g);
    if ((v & 7) == 0) return edges[(v >> 8) % sizeof edges];
    uint8_t b = (uint8_t)(v >> 16);
    if ((b & 0x7f) == 0x7f) b ^= 0x01; /* no NaN codes */
    return b;
}

static uint16_t random_f16(rng *g) {
    uint16_t h = (uint16_t)rng_next(g);
    uint16_t exp = (h >> 10) & 0x1f;
    if (exp == 31) h &= (uint16_t)~0x4000u; /* no inf/NaN */
    if (exp >= 25) h &= (uint16_t)~0x2000u; /* keep magnitudes modest */
    return h;
}

typedef struct {
    mg_matrix m;
    void *data, *scale;
    double *ref; /* [rows, cols] dequantised in double */
} test_matrix;

static int64_t scale_rows_of(mg_scale_kind k, int64_t rows) {
    if (k == MG_SCALE_E8M0_G32 || k == MG_SCALE_F32_ROW) return rows;
    return k == MG_SCALE_NONE ? 0 : (rows + 127) / 128;
}

static int64_t scale_cols_of(mg_scale_kind k, int64_t cols) {
    switch (k) {
    case MG_SCALE_E8M0_G32: return cols / 32;
    case MG_SCALE_F32_ROW: return 1;
    case MG_SCALE_NONE: return 0;
    default: return (cols + 127) / 128;
    }
}

static void make_matrix(test_matrix *tm, mg_format f, mg_scale_kind k, int64_t rows, int64_t cols, rng *g) {
    memset(tm, 0, sizeof *tm);
    mg_matrix *m = &tm->m;
    m->rows = rows;
    m->cols = cols;
    m->format = f;
    m->scale_kind = k;
    size_t rb = mg_matrix_row_bytes(m), nbytes = rb * (size_t)rows;
    uint8_t *d = malloc(nbytes ? nbytes : 1); /* exact size: sanitizers catch over-reads */
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = d + (size_t)r * rb;
        for (int64_t c = 0; c < cols; c++) {
            switch (f) {
            case MG_F32: {
                float v = rng_sym(g) * 2.0f;
                memcpy(row + c * 4, &v, 4);
                break;
            }
            case MG_BF16: {
                uint16_t h = mg_f32_to_bf16(rng_sym(g) * 4.0f);
                memcpy(row + c * 2, &h, 2);
                break;
            }
            case MG_F16: {
                uint16_t h = random_f16(g);
                memcpy(row + c * 2, &h, 2);
                break;
            }
            case MG_FP8_E4M3: row[c] = random_fp8(g); break;
            case MG_FP4_E2M1:
                if (c % 2 == 0) row[c / 2] = (uint8_t)rng_next(g);
                break;
            default: break;
            }
        }
    }
    m->data = tm->data = d;
    int64_t srows = scale_rows_of(k, rows);
    m->scale_cols = scale_cols_of(k, cols);
    if (k == MG_SCALE_F32_BLOCK128 || k == MG_SCALE_F32_ROW) {
        float *s = malloc((size_t)(srows * m->scale_cols) * 4 + 1);
        for (int64_t i = 0; i < srows * m->scale_cols; i++) s[i] = ldexpf(0.5f + rng_uniform(g), -(int)(rng_next(g) % 12));
        m->scale = tm->scale = s;
    } else if (k != MG_SCALE_NONE) {
        uint8_t *s = malloc((size_t)(srows * m->scale_cols) + 1);
        for (int64_t i = 0; i < srows * m->scale_cols; i++) s[i] = (uint8_t)(112 + rng_next(g) % 20);
        m->scale = tm->scale = s;
    }
    /* Reference dequantisation straight from the formats.h decoders, in double. */
    tm->ref = malloc((size_t)(rows * cols) * sizeof(double) + 1);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = d + (size_t)r * rb;
        for (int64_t c = 0; c < cols; c++) {
            double v;
            uint16_t h;
            switch (f) {
            case MG_F32: {
                float fv;
                memcpy(&fv, row + c * 4, 4);
                v = fv;
                break;
            }
            case MG_BF16: memcpy(&h, row + c * 2, 2); v = mg_bf16_to_f32(h); break;
            case MG_F16: memcpy(&h, row + c * 2, 2); v = mg_f16_to_f32(h); break;
            case MG_FP8_E4M3: v = mg_fp8_e4m3_to_f32(row[c]); break;
            default: v = mg_fp4_e2m1_to_f32((uint8_t)((c & 1) ? row[c / 2] >> 4 : row[c / 2] & 15)); break;
            }
            double s = 1.0;
            if (k == MG_SCALE_F32_BLOCK128) s = ((const float *)m->scale)[(r / 128) * m->scale_cols + c / 128];
            if (k == MG_SCALE_E8M0_BLOCK128) s = mg_e8m0_to_f32(((const uint8_t *)m->scale)[(r / 128) * m->scale_cols + c / 128]);
            if (k == MG_SCALE_E8M0_G32) s = mg_e8m0_to_f32(((const uint8_t *)m->scale)[r * m->scale_cols + c / 32]);
            if (k == MG_SCALE_F32_ROW) s = ((const float *)m->scale)[r];
            tm->ref[r * cols + c] = v * s;
        }
    }
}

static void free_matrix(test_matrix *tm) {
    free(tm->data);
    free(tm->scale);
    free(tm->ref);
}

/* ---- linear ------------------------------------------------------------------------------ */

static const char *scale_name(mg_scale_kind k) {
    static const char *names[] = {"none", "f32_block128", "e8m0_block128", "e8m0_g32", "f32_row"};
    _Static_assert(sizeof names / sizeof *names == MG_SCALE_KIND_COUNT, "a name per scale kind");
    return names[k];
}

/* Runs k->linear over rows [0, rows) in two calls split at `split`, with padded strides, and
 * checks every output against y_ref (or the double reference when y_ref is NULL).  Returns the
 * outputs in y_out [n_tok, rows] when y_out is not NULL. */
static void run_linear(tally *t, const mg_kernels *k, const test_matrix *tm, const float *x, int64_t n_tok,
                       const float *y_ref, float *y_out) {
    const mg_matrix *m = &tm->m;
    const int64_t rows = m->rows, cols = m->cols, xs = cols + 3, ys = rows + 5;
    float *xp = malloc((size_t)(n_tok * xs) * sizeof(float));
    float *yp = malloc((size_t)(n_tok * ys) * sizeof(float));
    for (int64_t i = 0; i < n_tok; i++) {
        memcpy(xp + i * xs, x + i * cols, (size_t)cols * sizeof(float));
        for (int64_t c = cols; c < xs; c++) xp[i * xs + c] = NAN; /* padding must never be read */
    }
    for (int64_t i = 0; i < n_tok * ys; i++) yp[i] = -12345.0f;
    /* Two calls per matrix, as two pool shares would make.  From 130 rows the second starts at row
     * 126, two rows before a 128-row scale block ends: row groups must not straddle it. */
    const int64_t split = rows >= 130 ? 126 : rows > 16 ? 16 * ((rows / 2) / 16) : rows / 2;
    mg_linear_fn fn = k->linear[m->format];
    if (split > 0) fn(m, xp, xs, n_tok, yp, ys, 0, split);
    fn(m, xp, xs, n_tok, yp, ys, split, rows);
    int bad = 0;
    double worst_got = 0, worst_want = 0;
    for (int64_t i = 0; i < n_tok && !bad; i++) {
        for (int64_t r = 0; r < rows; r++) {
            double mag = 0.0, exact = 0.0;
            for (int64_t c = 0; c < cols; c++) {
                double p = tm->ref[r * cols + c] * (double)x[i * cols + c];
                exact += p;
                mag += fabs(p);
            }
            double want = y_ref ? (double)y_ref[i * rows + r] : exact;
            double got = yp[i * ys + r];
            if (!(fabs(got - want) <= 1e-5 * mag + 1e-30)) {
                bad = 1;
                worst_got = got;
                worst_want = want;
                break;
            }
            if (y_out) y_out[i * rows + r] = (float)got;
        }
        for (int64_t r = rows; r < ys && !bad; r++)
            if (yp[i * ys + r] != -12345.0f) bad = 1, worst_got = yp[i * ys + r], worst_want = -12345.0;
    }
    char what[64];
    snprintf(what, sizeof what, "linear(%s)", k->name);
    check(t, !bad, what, mg_format_name(m->format), scale_name(m->scale_kind), (long)m->rows, (long)cols,
          (long)n_tok, worst_got, worst_want);
    free(xp);
    free(yp);
}

/* Every table on one matrix: the scalar one against the double reference, then every SIMD table
 * against the scalar one. */
static void test_linear_matrix(tally *t, const mg_kernels *const *tables, int n_tables, const test_matrix *tm,
                               const int64_t *toks, int n_toks, rng *g) {
    const int64_t rows = tm->m.rows, cols = tm->m.cols;
    for (int ti = 0; ti < n_toks; ti++) {
        const int64_t n_tok = toks[ti];
        float *x = malloc((size_t)(n_tok * cols) * sizeof(float));
        float *y_scalar = malloc((size_t)(n_tok * rows) * sizeof(float));
        for (int64_t i = 0; i < n_tok * cols; i++) x[i] = rng_sym(g);
        run_linear(t, tables[0], tm, x, n_tok, NULL, y_scalar);
        for (int k = 1; k < n_tables; k++) run_linear(t, tables[k], tm, x, n_tok, y_scalar, NULL);
        free(x);
        free(y_scalar);
    }
}

static void test_linear_case(tally *t, const mg_kernels *const *tables, int n_tables, mg_format f, mg_scale_kind sk,
                             int64_t rows, int64_t cols, const int64_t *toks, int n_toks, rng *g) {
    test_matrix tm;
    make_matrix(&tm, f, sk, rows, cols, g);
    test_linear_matrix(t, tables, n_tables, &tm, toks, n_toks, g);
    free_matrix(&tm);
}

/* fp8 block scales too large to fold into x (the AVX-512 decode multiplies x by 2^120 times the
 * scale): the first 128 rows' scales are 2^20, so those rows take the unfolded loop and the rest
 * the folded one, in the same call. */
static void test_linear_fp8_unfoldable(tally *t, const mg_kernels *const *tables, int n_tables, rng *g) {
    static const int64_t toks[] = {1};
    const mg_scale_kind kinds[] = {MG_SCALE_F32_BLOCK128, MG_SCALE_E8M0_BLOCK128};
    for (int ki = 0; ki < 2; ki++) {
        test_matrix tm;
        make_matrix(&tm, MG_FP8_E4M3, kinds[ki], 257, 4160, g);
        const int64_t cols = tm.m.cols, sc = tm.m.scale_cols;
        for (int64_t j = 0; j < sc; j++) {
            double old;
            if (kinds[ki] == MG_SCALE_F32_BLOCK128) {
                float *s = (float *)tm.scale;
                old = s[j];
                s[j] = 0x1p20f;
            } else {
                uint8_t *s = (uint8_t *)tm.scale;
                old = ldexp(1.0, s[j] - 127);
                s[j] = 127 + 20;
            }
            for (int64_t r = 0; r < 128; r++)
                for (int64_t c = j * 128; c < cols && c < (j + 1) * 128; c++) tm.ref[r * cols + c] *= 0x1p20 / old;
        }
        test_linear_matrix(t, tables, n_tables, &tm, toks, 1, g);
        free_matrix(&tm);
    }
}

/* fp8 decode with activations far from 1: the AVX2 table folds x * 2^120 * scale into one vector
 * and takes 2^k back out of the row sums when that would overflow (|x| >= 64 for unscaled and
 * per-row-scaled rows), and hands a row block to the one-row loop when x spans more binades than
 * the fold can hold.  Every scale kind of fp8, whole and half 64-byte lines (4160, 4128 columns). */
static void test_linear_fp8_wide_x(tally *t, const mg_kernels *const *tables, int n_tables, rng *g) {
    static const mg_scale_kind kinds[] = {MG_SCALE_NONE, MG_SCALE_F32_BLOCK128, MG_SCALE_E8M0_BLOCK128,
                                          MG_SCALE_F32_ROW};
    static const int64_t shapes[][2] = {{257, 4160}, {6, 4128}, {3, 96}};
    static const float amps[] = {1e3f, 3e6f, 0x1p100f, -1.0f}; /* -1: a few huge and tiny values */
    for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            test_matrix tm;
            make_matrix(&tm, MG_FP8_E4M3, kinds[ki], shapes[si][0], shapes[si][1], g);
            const int64_t rows = tm.m.rows, cols = tm.m.cols;
            float *x = malloc((size_t)cols * sizeof(float)), *y = malloc((size_t)rows * sizeof(float));
            for (size_t ai = 0; ai < sizeof amps / sizeof *amps; ai++) {
                for (int64_t c = 0; c < cols; c++) x[c] = rng_sym(g) * (amps[ai] > 0 ? amps[ai] : 1.0f);
                if (amps[ai] < 0) x[1] = 0x1p90f, x[2] = 0x1p-90f; /* 180 binades: no fold holds both */
                run_linear(t, tables[0], &tm, x, 1, NULL, y);
                for (int k = 1; k < n_tables; k++) run_linear(t, tables[k], &tm, x, 1, y, NULL);
            }
            free(x), free(y);
            free_matrix(&tm);
        }
}

/* fp4 decode where x cannot ride the avx512bf16 loop's two bf16 parts (a part would be denormal,
 * which vdpbf16ps reads as zero, or overflow), so that table must hand the call to the avx512
 * loop: every x tiny (2^-118: its lo part is denormal; the result is checked relative to the
 * products alone, since run_linear's 1e-30 floor would hide a lost part), one tiny value among
 * normal ones, and an infinity (NaN or infinite like the scalar twin, never finite). */
static void test_linear_fp4_x_range(tally *t, const mg_kernels *const *tables, int n_tables, rng *g) {
    static const mg_scale_kind kinds[] = {MG_SCALE_NONE, MG_SCALE_E8M0_G32};
    for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++) {
        test_matrix tm;
        make_matrix(&tm, MG_FP4_E2M1, kinds[ki], 9, 4224, g);
        const int64_t rows = tm.m.rows, cols = tm.m.cols;
        float *x = malloc((size_t)cols * sizeof(float)), *y = malloc((size_t)rows * sizeof(float));
        for (int mode = 0; mode < 3; mode++) {
            for (int64_t c = 0; c < cols; c++) x[c] = rng_sym(g) * (mode == 0 ? 0x1p-118f : 1.0f);
            if (mode == 1) x[7] = 0x1p-110f;
            if (mode == 2) x[130] = INFINITY;
            for (int k = 0; k < n_tables; k++) {
                tables[k]->linear[MG_FP4_E2M1](&tm.m, x, cols, 1, y, rows, 0, rows);
                int ok = 1;
                for (int64_t r = 0; r < rows && ok; r++) {
                    double exact = 0.0, mag = 0.0;
                    for (int64_t c = 0; c < cols; c++) {
                        const double p = tm.ref[r * cols + c] * (double)x[c];
                        exact += p, mag += fabs(p);
                    }
                    ok = mode == 2 ? !isfinite(y[r]) : fabs(y[r] - exact) <= 1e-5 * mag;
                }
                check(t, ok, "linear fp4 x range", tables[k]->name, scale_name(kinds[ki]), (long)rows, (long)cols, mode,
                      0, 0);
            }
        }
        free(x), free(y);
        free_matrix(&tm);
    }
}

static void test_linear(tally *t, const mg_kernels *const *tables, int n_tables, rng *g) {
    static const int64_t rows_list[] = {1, 3, 17, 130, 257};
    /* 128, 4160 and 8320: the AVX-512 decode fast paths (whole 64-byte steps, a last half fp8
     * scale block, two x chunks); the others reach its fallback to the AVX2 table.  Row counts
     * leave every remainder modulo 4 after the four-row fp4 / bf16 loops (17, 130, 3, 5 and 6
     * rows: groups of 1, 2, 3 and 4 rows). */
    static const int64_t cols_list[] = {32, 96, 128, 160, 4128, 4160, 1, 7, 33, 129, 300};
    static const int64_t toks_main[] = {1, 5};
    static const int64_t toks_all[] = {1, 2, 3, 5, 8, 13, 17, 26}; /* 13, 26: several avx512 prefill blocks */
    static const int64_t shapes_all[][2] = {{17, 300}, {130, 160}, {3, 4128}, {257, 33}, {3, 8352}, {5, 8320}, {6, 4096}};
    /* the ggml block formats (MG_Q8_0 on) have their own cases: test_ggml_blocks.c */
    for (int f = 0; f < MG_Q8_0; f++) {
        for (int sk = 0; sk < MG_SCALE_KIND_COUNT; sk++) {
            for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
                for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++) {
                    int64_t cols = cols_list[ci];
                    if ((f == MG_FP4_E2M1 || sk == MG_SCALE_E8M0_G32) && cols % 32) continue;
                    test_linear_case(t, tables, n_tables, (mg_format)f, (mg_scale_kind)sk, rows_list[ri], cols,
                                     toks_main, 2, g);
                }
            for (size_t si = 0; si < sizeof shapes_all / sizeof *shapes_all; si++) {
                int64_t cols = shapes_all[si][1];
                if ((f == MG_FP4_E2M1 || sk == MG_SCALE_E8M0_G32) && cols % 32) continue;
                test_linear_case(t, tables, n_tables, (mg_format)f, (mg_scale_kind)sk, shapes_all[si][0], cols,
                                 toks_all, (int)(sizeof toks_all / sizeof *toks_all), g);
            }
        }
    }
}

/* fp8 with e8m0 scales of 2^127, whose product with the fp8 decoders' raw factor (2^8)
 * overflows although every weight (|v| < 2) stays finite: the kernels must then multiply by the
 * factor and the scale apart.  Small activations keep the products in range.  Every other scale
 * block is huge, so a call sees both cases. */
static void test_linear_fp8_huge_scale(tally *t, const mg_kernels *const *tables, int n_tables, rng *g) {
    static const mg_scale_kind kinds[] = {MG_SCALE_E8M0_BLOCK128, MG_SCALE_E8M0_G32};
    static const int64_t toks[] = {5, 2, 1};
    for (int ki = 0; ki < 4; ki++) { /* 544 columns: the AVX2 decode loops; 640: the AVX-512 ones */
        test_matrix tm;
        const int64_t rows = 257, cols = ki < 2 ? 544 : 640;
        const mg_scale_kind kind = kinds[ki % 2];
        make_matrix(&tm, MG_FP8_E4M3, kind, rows, cols, g);
        uint8_t *d = (uint8_t *)tm.data, *sc = (uint8_t *)tm.scale;
        const int64_t srows = kind == MG_SCALE_E8M0_G32 ? rows : (rows + 127) / 128;
        for (int64_t i = 0; i < srows * tm.m.scale_cols; i++)
            if (i % 2 == 0) sc[i] = 254;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                uint8_t *code = d + r * cols + c;
                *code &= 0xbf; /* exponent field <= 7: |v| < 2 */
                const int64_t si = kind == MG_SCALE_E8M0_G32 ? r * tm.m.scale_cols + c / 32
                                                                  : (r / 128) * tm.m.scale_cols + c / 128;
                tm.ref[r * cols + c] = (double)mg_fp8_e4m3_to_f32(*code) * (double)mg_e8m0_to_f32(sc[si]);
            }
        for (int ti = 0; ti < 3; ti++) {
            const int64_t n_tok = toks[ti];
            float *x = malloc((size_t)(n_tok * cols) * sizeof(float));
            float *y = malloc((size_t)(n_tok * rows) * sizeof(float));
            for (int64_t i = 0; i < n_tok * cols; i++) x[i] = rng_sym(g) * 0x1p-100f;
            run_linear(t, tables[0], &tm, x, n_tok, NULL, y);
            for (int k = 1; k < n_tables; k++) run_linear(t, tables[k], &tm, x, n_tok, y, NULL);
            free(x), free(y);
        }
        free_matrix(&tm);
    }
}

/* Prefill batching: a token's outputs must not depend on how many tokens share the call or on
 * its place among them (the engine compares logits of different prefill batchings bitwise).
 * Every SIMD table, every format and scale kind: 19 tokens in one call against the same tokens
 * in calls of 2, 3, 5 and 9 (n_tok >= 2: decode is a different path), bit for bit. */
static void test_linear_batching(tally *t, const mg_kernels *const *tables, int n_tables, rng *g) {
    static const int64_t parts[] = {2, 3, 5, 9};
    const int64_t n_tok = 19, rows = 37, cols = 544;
    for (int f = 0; f < MG_Q8_0; f++)
        for (int sk = 0; sk < MG_SCALE_KIND_COUNT; sk++) {
            test_matrix tm;
            make_matrix(&tm, (mg_format)f, (mg_scale_kind)sk, rows, cols, g);
            float *x = malloc((size_t)(n_tok * cols) * sizeof(float));
            float *y_all = malloc((size_t)(n_tok * rows) * sizeof(float));
            float *y_part = malloc((size_t)(n_tok * rows) * sizeof(float));
            for (int64_t i = 0; i < n_tok * cols; i++) x[i] = rng_sym(g);
            for (int k = 1; k < n_tables; k++) {
                mg_linear_fn fn = tables[k]->linear[f];
                fn(&tm.m, x, cols, n_tok, y_all, rows, 0, rows);
                int64_t t0 = 0;
                for (int p = 0; t0 < n_tok; p = (p + 1) % 4) { /* 2+3+5+9 = 19 */
                    const int64_t n = parts[p] < n_tok - t0 ? parts[p] : n_tok - t0;
                    fn(&tm.m, x + t0 * cols, cols, n, y_part + t0 * rows, rows, 0, rows);
                    t0 += n;
                }
                check(t, !memcmp(y_all, y_part, (size_t)(n_tok * rows) * sizeof(float)), "linear batching",
                      tables[k]->name, mg_format_name((mg_format)f), (long)sk, (long)rows, (long)cols, 0, 0);
            }
            free(x), free(y_all), free(y_part);
            free_matrix(&tm);
        }
}

/* ---- vector ops -------------------------------------------------------------------------- */

static float *rand_vec(int64_t n, float amp, rng *g) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = rng_sym(g) * amp;
    return v;
}

static void test_vector_ops(tally *t, const mg_kernels *k, const mg_kernels *ref, rng *g) {
    static const int64_t lens[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 100, 129, 1000, 4099};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        const int64_t n = lens[li];
        float *a = rand_vec(n, 3.0f, g), *b = rand_vec(n, 3.0f, g), *w = rand_vec(n, 2.0f, g);
        float *y1 = rand_vec(n, 1.0f, g), *y2 = malloc((size_t)n * sizeof(float));
        double exact = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) exact += (double)a[i] * b[i], mag += fabs((double)a[i] * b[i]);
        float d = k->dot(a, b, n);
        check(t, fabs(d - exact) <= 1e-5 * mag + 1e-30, "dot", k->name, "", (long)n, 0, 0, d, exact);

        memcpy(y2, y1, (size_t)n * sizeof(float));
        k->axpy(y1, 0.75f, a, n);
        ref->axpy(y2, 0.75f, a, n);
        int ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= fabsf(y1[i] - y2[i]) <= 1e-6f * (fabsf(y2[i]) + fabsf(0.75f * a[i])) + 1e-30f;
        check(t, ok, "axpy", k->name, "", (long)n, 0, 0, 0, 0);

        memcpy(y2, y1, (size_t)n * sizeof(float));
        k->scale(y1, -1.25f, n);
        ref->scale(y2, -1.25f, n);
        check(t, !memcmp(y1, y2, (size_t)n * sizeof(float)), "scale", k->name, "", (long)n, 0, 0, 0, 0);

        for (int weighted = 0; weighted < 2; weighted++) {
            k->rmsnorm(y1, a, weighted ? w : NULL, n, 1e-6f);
            ref->rmsnorm(y2, a, weighted ? w : NULL, n, 1e-6f);
            ok = 1;
            for (int64_t i = 0; i < n; i++) ok &= fabsf(y1[i] - y2[i]) <= 1e-6f * fabsf(y2[i]) + 1e-30f;
            check(t, ok, "rmsnorm", k->name, weighted ? "weighted" : "plain", (long)n, 0, 0, 0, 0);
        }
        memcpy(y1, a, (size_t)n * sizeof(float)); /* in place: out aliases x */
        k->rmsnorm(y1, y1, w, n, 1e-5f);
        ref->rmsnorm(y2, a, w, n, 1e-5f);
        ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= fabsf(y1[i] - y2[i]) <= 1e-6f * fabsf(y2[i]) + 1e-30f;
        check(t, ok, "rmsnorm", k->name, "in-place", (long)n, 0, 0, 0, 0);

        /* swiglu: wide gate range, with the exp overflow/underflow ends included. */
        float *gate = rand_vec(n, 30.0f, g);
        static const float ends[] = {-1e4f, -100.0f, -88.9f, -88.5f, -88.0f, -87.5f, 0.0f, -0.0f, 88.5f, 90.0f, 1e4f};
        for (size_t e = 0; e < sizeof ends / sizeof *ends && (int64_t)e < n; e++) gate[(e * 7) % n] = ends[e];
        for (int lim = 0; lim < 2; lim++) {
            const float limit = lim ? 7.0f : 0.0f;
            k->swiglu(y1, gate, b, n, limit);
            ref->swiglu(y2, gate, b, n, limit);
            ok = 1;
            for (int64_t i = 0; i < n; i++) ok &= fabsf(y1[i] - y2[i]) <= 1e-6f * fabsf(y2[i]) + 1e-37f;
            check(t, ok, "swiglu", k->name, lim ? "limit" : "nolimit", (long)n, 0, 0, 0, 0);
        }
        free(gate);

        exact = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) exact += a[i], mag += fabsf(a[i]);
        float s = k->read_sum(a, n);
        check(t, fabs(s - exact) <= 1e-5 * mag + 1e-30, "read_sum", k->name, "", (long)n, 0, 0, s, exact);
        free(a), free(b), free(w), free(y1), free(y2);
    }
}

/* The attention block products against the scalar twin, on odd head counts, key counts and
 * widths (tile tails in every direction), with row strides wider than the rows.  A table without
 * them (NULL: its caller loops over dot and axpy) is skipped.  Bit for bit: each row's results
 * those of a call with that row alone, and the values a loop of the table's own axpy (per output
 * lane the FMAs in row order), both core/kernels.h's contract. */
static void test_attn_blocks(tally *t, const mg_kernels *k, const mg_kernels *ref, rng *g) {
    if (!k->attn_scores || !k->attn_values) return;
    static const int ms[] = {1, 2, 3, 4, 5, 7, 8};
    static const int64_t ns[] = {1, 3, 4, 5, 9, 17, 32, 37};
    static const int64_t dims[] = {1, 7, 8, 13, 17, 32, 40, 64, 127, 128, 192, 200, 512};
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
                const int m = ms[mi];
                const int64_t n = ns[ni], dim = dims[di], qs = dim + 3, ks = dim + 5, ss = n + 2;
                float *q = rand_vec(m * qs, 2.0f, g), *kv = rand_vec(n * ks, 2.0f, g);
                float *s1 = rand_vec(m * ss, 1.0f, g), *s2 = malloc((size_t)(m * ss) * sizeof(float));
                memcpy(s2, s1, (size_t)(m * ss) * sizeof(float));
                k->attn_scores(q, qs, m, kv, ks, n, dim, 0.125f, s1, ss);
                ref->attn_scores(q, qs, m, kv, ks, n, dim, 0.125f, s2, ss);
                int ok = 1;
                for (int i = 0; i < m; i++)
                    for (int64_t j = 0; j < ss; j++) {
                        double mag = 0;
                        for (int64_t c = 0; j < n && c < dim; c++) mag += fabs((double)q[i * qs + c] * kv[j * ks + c]);
                        ok &= fabsf(s1[i * ss + j] - s2[i * ss + j]) <= 1e-6 * 0.125 * mag + 1e-30; /* j >= n: untouched */
                    }
                check(t, ok, "attn_scores", k->name, "", (long)m, (long)n, (long)dim, 0, 0);
                /* each row as a call of its own: bit for bit (core/kernels.h) */
                for (int i = 0; i < m; i++) k->attn_scores(q + i * qs, qs, 1, kv, ks, n, dim, 0.125f, s2 + i * ss, ss);
                check(t, !memcmp(s1, s2, (size_t)(m * ss) * sizeof(float)), "attn_scores = one row a call", k->name,
                      "", (long)m, (long)n, (long)dim, 0, 0);
                ref->attn_scores(q, qs, m, kv, ks, n, dim, 0.125f, s2, ss);

                /* values: p rows of n probabilities ss apart; outputs dim + 1 apart, their gap untouched */
                const int64_t os = dim + 1;
                float *o1 = rand_vec(m * os, 1.0f, g), *o2 = malloc((size_t)(m * os) * sizeof(float));
                float *o3 = malloc((size_t)(m * os) * sizeof(float)), *o4 = malloc((size_t)(m * os) * sizeof(float));
                memcpy(o2, o1, (size_t)(m * os) * sizeof(float));
                memcpy(o3, o1, (size_t)(m * os) * sizeof(float));
                memcpy(o4, o1, (size_t)(m * os) * sizeof(float));
                k->attn_values(o1, os, m, s2, ss, kv, ks, n, dim);
                ref->attn_values(o2, os, m, s2, ss, kv, ks, n, dim);
                ok = 1;
                for (int i = 0; i < m; i++)
                    for (int64_t c = 0; c < os; c++) {
                        double mag = fabs((double)o2[i * os + c]);
                        for (int64_t j = 0; c < dim && j < n; j++) mag += fabs((double)s2[i * ss + j] * kv[j * ks + c]);
                        ok &= fabsf(o1[i * os + c] - o2[i * os + c]) <= 1e-6 * mag + 1e-30;
                    }
                check(t, ok, "attn_values", k->name, "", (long)m, (long)n, (long)dim, 0, 0);
                /* per output lane the table's own axpy order (row order): bit for bit its loop */
                for (int i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) k->axpy(o3 + i * os, s2[i * ss + j], kv + j * ks, dim);
                check(t, !memcmp(o1, o3, (size_t)(m * os) * sizeof(float)), "attn_values = axpy loop", k->name, "",
                      (long)m, (long)n, (long)dim, 0, 0);
                for (int i = 0; i < m; i++) k->attn_values(o4 + i * os, os, 1, s2 + i * ss, ss, kv, ks, n, dim);
                check(t, !memcmp(o1, o4, (size_t)(m * os) * sizeof(float)), "attn_values = one row a call", k->name,
                      "", (long)m, (long)n, (long)dim, 0, 0);
                free(q), free(kv), free(s1), free(s2), free(o1), free(o2), free(o3), free(o4);
            }
}

/* Distance in units in the last place (of b's binade; subnormals: 2^-149). */
static double ulps(float a, float b) {
    if (a == b) return 0;
    if (isnan(a) || isnan(b) || isinf(a) || isinf(b)) return INFINITY;
    int e;
    frexpf(b, &e);
    return fabs((double)a - b) / ldexp(1.0, (e - 24 > -149 ? e - 24 : -149));
}

/* The softmax entry against expf (exp_poly.h promises 2 ulp) and against the scalar twin.  A row
 * [v] with sink 0, v <= 0, gives e^v / (1 + e^v): below -17 the sum rounds to 1 and the result is
 * the entry's e^v itself; above, e^v's error reaches the result and 1 / sum at most once more.
 * v: a sweep of [-120, 0], 0, -0, -inf, tiny magnitudes and the subnormal results (-87.3 ..
 * -103.9).  Then rows of every tail length, some -inf entries, with and without a sink, against
 * the twin (which sums in another order): within 3 ulp plus the sum's reordering, n ulp at
 * most; elements past n untouched. */
static void test_softmax(tally *t, const mg_kernels *k, const mg_kernels *ref, rng *g) {
    enum { SWEEP = 200000 };
    static const float special[] = {0.0f, -0.0f, -INFINITY, -1e-30f, -1e-45f, -1e-7f, -0.5f, -0.3465736f, -0.3465737f,
                                    -17.0f, -87.33654f, -87.33655f, -100.0f, -103.2789f, -103.9721f, -103.98f, -104.0f};
    const int n_special = (int)(sizeof special / sizeof *special);
    int ok = 1;
    double worst = 0;
    float worst_v = 0;
    for (int i = 0; i < SWEEP + n_special; i++) {
        const float v = i < n_special ? special[i] : -120.0f * rng_uniform(g);
        float x = v;
        k->softmax(&x, 1, 0.0f);
        const float want = v < -17.0f ? expf(v) : expf(v) / (1.0f + expf(v));
        const double e = ulps(x, want);
        if (e > worst) worst = e, worst_v = v;
        ok &= e <= (v < -17.0f ? 2.0 : 3.5);
    }
    check(t, ok, "softmax e^x vs expf (ulps)", k->name, "", 0, 0, 0, worst, worst_v);

    static const int64_t ns[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000};
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (int sk = 0; sk < 2; sk++) {
            const int64_t n = ns[ni];
            float *x1 = rand_vec(n + 1, 30.0f, g), *x2 = malloc((size_t)(n + 1) * sizeof(float));
            for (int64_t j = 0; j < n; j += 5) x1[j] = j % 3 == 2 ? -INFINITY : x1[j]; /* masked scores */
            if (n > 1) x1[n / 2] = 0.0f;
            memcpy(x2, x1, (size_t)(n + 1) * sizeof(float));
            const float sink = sk ? 2.0f * rng_sym(g) : -INFINITY;
            k->softmax(x1, n, sink);
            ref->softmax(x2, n, sink);
            int row_ok = x1[n] == x2[n];
            double row_worst = 0;
            for (int64_t j = 0; j < n; j++) {
                const double e = ulps(x1[j], x2[j]);
                row_worst = e > row_worst ? e : row_worst;
                row_ok &= e <= 3.5 + (double)n;
            }
            check(t, row_ok, "softmax rows (ulps)", k->name, sk ? "sink" : "", (long)n, 0, 0, row_worst, 0);
            free(x1), free(x2);
        }
}

/* ---- linear_bf16x: prefill with x rounded to bf16 (fast activations) ---------------------- */

static double bf16_round(float v) { return (double)mg_bf16_to_f32(mg_f32_to_bf16(v)); }

/* Runs k->linear_bf16x[f] over rows [0, rows) in two calls (padded strides, as run_linear) and
 * checks each output: against the double sum of weight times x rounded to bf16 (nearest even)
 * within the fp32 sums' error when the weights are exact in bf16, else bit for bit the parent's
 * fp32 entry (which the entry passes such matrices to). */
static void run_bf16x(tally *t, const mg_kernels *k, const test_matrix *tm, const float *x, int64_t n_tok) {
    const mg_matrix *m = &tm->m;
    const int64_t rows = m->rows, cols = m->cols, xs = cols + 3, ys = rows + 5;
    const int exact_w = !(m->format == MG_FP8_E4M3 && m->scale_kind == MG_SCALE_F32_BLOCK128);
    float *xp = malloc((size_t)(n_tok * xs) * sizeof(float));
    float *yp = malloc((size_t)(n_tok * ys) * sizeof(float)), *yf = malloc((size_t)(n_tok * ys) * sizeof(float));
    for (int64_t i = 0; i < n_tok; i++) {
        memcpy(xp + i * xs, x + i * cols, (size_t)cols * sizeof(float));
        for (int64_t c = cols; c < xs; c++) xp[i * xs + c] = NAN; /* padding must never be read */
    }
    for (int64_t i = 0; i < n_tok * ys; i++) yp[i] = yf[i] = -12345.0f;
    const int64_t split = rows >= 130 ? 126 : rows > 16 ? 16 * ((rows / 2) / 16) : rows / 2;
    mg_linear_fn fn = k->linear_bf16x[m->format];
    if (split > 0) fn(m, xp, xs, n_tok, yp, ys, 0, split);
    fn(m, xp, xs, n_tok, yp, ys, split, rows);
    if (!exact_w) k->parent->linear[m->format](m, xp, xs, n_tok, yf, ys, 0, rows);
    int bad = 0;
    double worst_got = 0, worst_want = 0;
    for (int64_t i = 0; i < n_tok && !bad; i++) {
        for (int64_t r = 0; r < rows && !bad; r++) {
            double mag = 0.0, exact = 0.0;
            for (int64_t c = 0; c < cols; c++) {
                const double p = tm->ref[r * cols + c] * bf16_round(x[i * cols + c]);
                exact += p;
                mag += fabs(p);
            }
            const double got = yp[i * ys + r], want = exact_w ? exact : (double)yf[i * ys + r];
            if (exact_w ? !(fabs(got - want) <= 4e-5 * mag + 1e-30) : memcmp(&yp[i * ys + r], &yf[i * ys + r], 4))
                bad = 1, worst_got = got, worst_want = want;
        }
        for (int64_t r = rows; r < ys && !bad; r++)
            if (yp[i * ys + r] != -12345.0f) bad = 1, worst_got = yp[i * ys + r], worst_want = -12345.0;
    }
    check(t, !bad, exact_w ? "linear_bf16x" : "linear_bf16x = fp32 entry", mg_format_name(m->format),
          scale_name(m->scale_kind), (long)rows, (long)cols, (long)n_tok, worst_got, worst_want);
    free(xp), free(yp), free(yf);
}

/* Every table's linear_bf16x entries: random weights of every scale kind (fp8's f32 block scales
 * are not exact in bf16 and must take the fp32 entry), odd row counts, an odd column count (the
 * last bf16 pair half empty), several 512-column tiles, token counts below, at and past the
 * micro-kernel's 12; then weights with one 1.0 per row, where y is exactly bf16(x) of that
 * column: x's rounding (to nearest even, ties included) and the column order, exactly. */
static void test_linear_bf16x(tally *t, const mg_kernels *const *tables, int n_tables, rng *g) {
    static const struct {
        mg_format f;
        mg_scale_kind k;
        int64_t rows, cols;
    } cases[] = {{MG_BF16, MG_SCALE_NONE, 37, 1376}, {MG_BF16, MG_SCALE_NONE, 33, 1375},
                 {MG_BF16, MG_SCALE_F32_ROW, 19, 520},  {MG_FP8_E4M3, MG_SCALE_NONE, 37, 1376},
                 {MG_FP8_E4M3, MG_SCALE_E8M0_BLOCK128, 130, 1152}, {MG_FP8_E4M3, MG_SCALE_F32_ROW, 21, 640},
                 {MG_FP8_E4M3, MG_SCALE_F32_BLOCK128, 37, 640}};
    static const int64_t toks[] = {2, 5, 12, 13, 25};
    int any = 0;
    for (int ti = 0; ti < n_tables; ti++) {
        const mg_kernels *k = tables[ti];
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
            if (!k->linear_bf16x[cases[ci].f]) continue;
            any = 1;
            test_matrix tm;
            make_matrix(&tm, cases[ci].f, cases[ci].k, cases[ci].rows, cases[ci].cols, g);
            for (size_t n = 0; n < sizeof toks / sizeof *toks; n++) {
                float *x = malloc((size_t)(toks[n] * tm.m.cols) * sizeof(float));
                for (int64_t i = 0; i < toks[n] * tm.m.cols; i++) x[i] = rng_sym(g) * 3.0f;
                run_bf16x(t, k, &tm, x, toks[n]);
                free(x);
            }
            free_matrix(&tm);
        }
        if (!k->linear_bf16x[MG_BF16]) continue;
        /* one 1.0 per row at column (53 r) mod cols, the last column among them */
        const int64_t rows = 23, cols = 1031, n_tok = 7;
        uint16_t *w = calloc((size_t)(rows * cols), 2);
        for (int64_t r = 0; r < rows; r++) w[r * cols + (r == rows - 1 ? cols - 1 : (53 * r) % cols)] = 0x3F80;
        const mg_matrix m = {.format = MG_BF16, .scale_kind = MG_SCALE_NONE, .rows = rows, .cols = cols, .data = w};
        float *x = malloc((size_t)(n_tok * cols) * sizeof(float)), *y = malloc((size_t)(n_tok * rows) * sizeof(float));
        for (int64_t i = 0; i < n_tok * cols; i++) {
            float v = rng_sym(g) * 5.0f;
            uint32_t u;
            memcpy(&u, &v, 4);
            if (i % 3 == 0) u = (u & 0xFFFF0000u) | 0x8000u | ((uint32_t)(i % 2) << 16); /* a tie, odd or even */
            memcpy(&x[i], &u, 4);
        }
        k->linear_bf16x[MG_BF16](&m, x, cols, n_tok, y, rows, 0, rows);
        int bad = 0;
        for (int64_t i = 0; i < n_tok; i++)
            for (int64_t r = 0; r < rows; r++) {
                const int64_t c = r == rows - 1 ? cols - 1 : (53 * r) % cols;
                bad |= y[i * rows + r] != (float)bf16_round(x[i * cols + c]);
            }
        check(t, !bad, "linear_bf16x rounds x to nearest even", k->name, "", rows, cols, n_tok, 0, 0);
        free(w), free(x), free(y);
    }
    /* the entry exists where the CPU has AVX512_BF16 (the avx512bf16 table), nowhere else */
    const mg_kernels *bf = mg_kernels_avx512bf16();
    check(t, any == (bf != NULL && bf->linear_bf16x[MG_BF16] != NULL) && !mg_kernels_scalar()->linear_bf16x[MG_BF16] &&
                 (!mg_kernels_avx512() || !mg_kernels_avx512()->linear_bf16x[MG_FP8_E4M3]),
          "linear_bf16x only in the avx512bf16 table", "", "", 0, 0, 0, 0, 0);
}

/* Every table this build has and this CPU runs: its parent is the one tables.h
 * names (avx512bf16 -> avx512 -> avx2 -> scalar; neon -> scalar), every entry is set, and an entry
 * a table does not override is its parent's (checked for avx512's dot). */
static void test_inheritance(tally *t) {
    const mg_kernels *const tables[] = {mg_kernels_scalar(), mg_kernels_avx2(), mg_kernels_avx512(),
                                        mg_kernels_avx512bf16(), mg_kernels_neon()};
    const int n_tables = (int)(sizeof tables / sizeof *tables);
    static const char *const parents[][2] = {{"avx2", "scalar"}, {"avx512", "avx2"}, {"avx512bf16", "avx512"},
                                             {"neon", "scalar"}};
    for (int k = 0; k < n_tables; k++) {
        const mg_kernels *tb = tables[k];
        if (!tb) continue; /* not in this build, or not on this CPU */
        int ok = tb->dot && tb->axpy && tb->scale && tb->rmsnorm && tb->swiglu && tb->read_sum && tb->softmax;
        for (int f = 0; f < MG_FORMAT_COUNT; f++) ok = ok && tb->linear[f];
        check(t, ok, "table entries set", tb->name, "", 0, 0, 0, 0, 0);
        const char *want = NULL;
        for (size_t i = 0; i < sizeof parents / sizeof *parents; i++)
            if (!strcmp(parents[i][0], tb->name)) want = parents[i][1];
        check(t, want ? tb->parent && !strcmp(tb->parent->name, want) : tb->parent == NULL, "table parent", tb->name,
              tb->parent ? tb->parent->name : "-", 0, 0, 0, 0, 0);
        if (!strcmp(tb->name, "avx512"))
            check(t, tb->dot == tb->parent->dot, "inherited entry", tb->name, "dot", 0, 0, 0, 0, 0);
    }
}

/* Tables are built only for a CPU that runs them (tables.h): the override functions are compiled
 * with their instruction set's flags, and on an AVX2-only CPU calling the avx512 one faulted
 * while the tables were built.  mg_kernels_build for CPUs other than this one: no features gives
 * the scalar table alone; AVX2 alone, no AVX-512 table; this CPU's features, the process's own
 * tables; and AVX-512 without VNNI keeps the avx2 int8 entries.  The int8 GEMM flag follows the
 * CPU too: the avx2 table has it with AVX-VNNI (where the build has q8_gemm_avxvnni.c's entry),
 * the avx512 table inherits it without AVX512_VNNI; the neon table has it with the dot-product
 * extension (where the build has q8_gemm_neondot.c's entry), its rows without. */
mg_linear_q8_fn mg_avxvnni_linear_q8(int prefetch_l2); /* kernels/avx2/avx2.h: NULL in a build without -mavxvnni */
mg_linear_q8_fn mg_avx2_linear_q8_gemm(int prefetch_l2); /* kernels/avx2/avx2.h: NULL in a build without AVX2 */
mg_linear_q8_fn mg_neondot_linear_q8(void); /* kernels/neon/neon.h: NULL in a build without +dotprod */
static void test_tables_follow_the_cpu(tally *t) {
    mg_kernels out[MG_KERNEL_TABLES];
    const mg_kernels *const own[MG_KERNEL_TABLES] = {mg_kernels_scalar(), mg_kernels_avx2(), mg_kernels_avx512(),
                                                     mg_kernels_avx512bf16(), mg_kernels_neon()};
    const mg_cpu_features none = {0};
    mg_kernels_build(&none, out);
    int ok = out[0].name && !strcmp(out[0].name, "scalar");
    for (int i = 1; i < MG_KERNEL_TABLES; i++) ok = ok && !out[i].name;
    check(t, ok, "tables for a CPU without SIMD", "scalar only", "", 0, 0, 0, 0, 0);

    const mg_cpu_features detected = mg_cpu_detect();
    if (detected.avx2 && detected.fma && detected.f16c) {
        mg_cpu_features avx2 = {0};
        avx2.avx2 = avx2.fma = avx2.f16c = 1;
        mg_kernels_build(&avx2, out);
        check(t, (out[1].name != NULL) == (own[1] != NULL) && !out[2].name && !out[3].name && !out[4].name,
              "tables for an AVX2-only CPU", "no avx512", "", 0, 0, 0, 0, 0);
        check(t, !out[1].name || out[1].parent == &out[0], "built parent", "avx2", "", 0, 0, 0, 0, 0);
        /* an int8 GEMM either way: without AVX-VNNI the vpmaddubsw one (q8_gemm_avx2.c) */
        check(t, !out[1].name || (out[1].linear_q8_gemm && out[1].linear_q8[MG_Q8_0] == mg_avx2_linear_q8_gemm(0)),
              "vpmaddubsw int8 GEMM without AVX-VNNI", "avx2", "", 0, 0, 0, 0, 0);
        if (detected.avxvnni && own[1] && mg_avxvnni_linear_q8(0)) {
            const mg_linear_q8_fn rows = out[1].linear_q8[MG_Q8_0];
            avx2.avxvnni = 1;
            mg_kernels_build(&avx2, out);
            check(t, out[1].linear_q8_gemm && out[1].linear_q8[MG_Q8_0] != rows, "int8 GEMM with AVX-VNNI", "avx2",
                  "", 0, 0, 0, 0, 0);
        }
    }

    if (detected.neon) {
        mg_cpu_features neon = {0};
        neon.neon = 1;
        mg_kernels_build(&neon, out);
        check(t, out[4].name && !out[4].linear_q8_gemm, "no int8 GEMM without the dot product", "neon", "", 0, 0, 0,
              0, 0);
        if (detected.neondot && mg_neondot_linear_q8()) {
            const mg_linear_q8_fn rows = out[4].linear_q8[MG_Q8_0];
            neon.neondot = 1;
            mg_kernels_build(&neon, out);
            check(t, out[4].linear_q8_gemm && out[4].linear_q8[MG_Q8_0] == mg_neondot_linear_q8() &&
                         out[4].linear_q8[MG_Q4_K] == mg_neondot_linear_q8() && rows != mg_neondot_linear_q8(),
                  "int8 GEMM with the dot product", "neon", "", 0, 0, 0, 0, 0);
        }
        check(t, !own[4] || !own[4]->linear_q8_gemm == !(detected.neondot && mg_neondot_linear_q8()),
              "int8 GEMM follows the dot product", "neon", "", 0, 0, 0, 0, 0);
    }

    mg_kernels_build(&detected, out);
    for (int i = 0; i < MG_KERNEL_TABLES; i++)
        check(t, (out[i].name != NULL) == (own[i] != NULL) && (!own[i] || !strcmp(out[i].name, own[i]->name)),
              "tables for this CPU", own[i] ? own[i]->name : "-", out[i].name ? out[i].name : "-", i, 0, 0, 0, 0);

    if (detected.avx512vnni && own[2]) {
        mg_cpu_features plain = detected;
        plain.avx512vnni = 0;
        mg_kernels_build(&plain, out);
        check(t, out[2].name && out[2].linear_q8[MG_Q8_0] == out[1].linear_q8[MG_Q8_0] &&
                     own[2]->linear_q8[MG_Q8_0] != own[1]->linear_q8[MG_Q8_0],
              "int8 entries without VNNI", "avx512", "avx2's", 0, 0, 0, 0, 0);
        /* AVX-VNNI but not AVX512_VNNI (unusual, possible): the avx2 table's ymm GEMM, flag and all */
        check(t, out[2].linear_q8_gemm && out[1].linear_q8_gemm, "int8 GEMM without AVX512_VNNI", "avx512", "avx2's",
              0, 0, 0, 0, 0);
        plain.avxvnni = 0; /* AVX-512 without any VNNI (Skylake-SP and -X): vpmaddubsw's GEMM */
        mg_kernels_build(&plain, out);
        check(t, out[2].name && out[2].linear_q8_gemm && out[2].linear_q8[MG_Q8_0] == out[1].linear_q8[MG_Q8_0] &&
                     out[1].linear_q8[MG_Q8_0] == mg_avx2_linear_q8_gemm(detected.prefetch_l2),
              "the vpmaddubsw int8 GEMM without either VNNI", "avx512", "avx2's", 0, 0, 0, 0, 0);
    }
}

/* The fp8 decode has two forms, picked by mg_cpu_features.denormal_assists: rows that decode into
 * fp32 denormals (fast where denormal inputs cost nothing) and rows through vcvtph2ps (Intel).
 * This CPU's tables run one; the tables built with the flag flipped run the other, and both must
 * agree with the scalar table on every fp8 case (random_fp8 has subnormals in every row). */
static void test_fp8_decode_variants(tally *t, const mg_kernels *const *tables, int n_tables, rng *g) {
    static mg_kernels flipped[MG_KERNEL_TABLES]; /* static: the entries' parents point into it */
    mg_cpu_features f = mg_cpu_detect();
    f.denormal_assists = !f.denormal_assists;
    mg_kernels_build(&f, flipped);
    const mg_kernels *alt[MG_KERNEL_TABLES + 1];
    int n = 0, differ = 0;
    alt[n++] = tables[0];
    for (int i = 1; i < MG_KERNEL_TABLES; i++) {
        if (!flipped[i].name) continue;
        alt[n++] = &flipped[i];
        for (int k = 1; k < n_tables; k++)
            if (!strcmp(tables[k]->name, flipped[i].name)) {
                differ += tables[k]->linear[MG_FP8_E4M3] != flipped[i].linear[MG_FP8_E4M3];
                check(t, tables[k]->linear[MG_BF16] == flipped[i].linear[MG_BF16], "only fp8 follows the flag",
                      flipped[i].name, "bf16", 0, 0, 0, 0, 0);
            }
    }
    /* x86 tables have both forms; neon decodes fp8 through f16 always */
    check(t, differ == (mg_kernels_avx2() != NULL) + (mg_kernels_avx512() != NULL) + (mg_kernels_avx512bf16() != NULL),
          "fp8 decode follows denormal_assists", "x86 tables", "", differ, 0, 0, 0, 0);
    static const int64_t one[] = {1}, toks[] = {1, 2, 5};
    const mg_scale_kind kinds[] = {MG_SCALE_NONE, MG_SCALE_F32_ROW, MG_SCALE_F32_BLOCK128, MG_SCALE_E8M0_BLOCK128};
    const int64_t shapes[][2] = {{1, 32}, {7, 96}, {130, 256}, {259, 1152}, {129, 8256}, {5, 8192 + 4096}};
    for (int ki = 0; ki < 4; ki++)
        for (int si = 0; si < 6; si++)
            test_linear_case(t, alt, n, MG_FP8_E4M3, kinds[ki], shapes[si][0], shapes[si][1], si < 3 ? toks : one,
                             si < 3 ? 3 : 1, g);
    test_linear_fp8_unfoldable(t, alt, n, g);
    test_linear_fp8_wide_x(t, alt, n, g);
    test_linear_fp8_huge_scale(t, alt, n, g);
}

int main(void) {
    tally t = {0, 0};
    rng g = {0x9e3779b97f4a7c15ull};
    const mg_kernels *tables[5];
    int n = 0;
    tables[n++] = mg_kernels_scalar();
    const char *simd[] = {"avx2", "avx512", "avx512bf16", "neon"};
    for (int i = 0; i < 4; i++) {
        const mg_kernels *k = mg_kernels_named(simd[i]);
        if (k) tables[n++] = k;
    }
    printf("tables:");
    for (int i = 0; i < n; i++) printf(" %s", tables[i]->name);
    printf("\n");
    test_inheritance(&t);
    test_tables_follow_the_cpu(&t);
    test_linear(&t, tables, n, &g);
    test_linear_fp8_unfoldable(&t, tables, n, &g);
    test_linear_fp8_wide_x(&t, tables, n, &g);
    test_linear_fp4_x_range(&t, tables, n, &g);
    test_linear_batching(&t, tables, n, &g);
    test_linear_fp8_huge_scale(&t, tables, n, &g);
    test_linear_bf16x(&t, tables, n, &g);
    test_fp8_decode_variants(&t, tables, n, &g);
    for (int i = 0; i < n; i++) test_vector_ops(&t, tables[i], tables[0], &g);
    for (int i = 0; i < n; i++) test_attn_blocks(&t, tables[i], tables[0], &g);
    for (int i = 0; i < n; i++) test_softmax(&t, tables[i], tables[0], &g);
    printf("%d passed, %d failed\n", t.passed, t.failed);
    return t.failed ? 1 : 0;
}
