/* Native FP4 (MG_FP4_E2M1 with ue8m0 scales per 32: DeepSeek-V4's experts) under int8
 * activations (kernels/q8_fp4.h), in every table this build has and this CPU runs:
 *  1. The GEMM's decoders (kernels/q8_gemm.h): the scalar one gives back the dequantised
 *     weights (fac * code, exactly: the values are e2m1 * 2^k), and the AVX2 one equals it bit
 *     for bit, on 1 to 17 groups.
 *  2. Each table's linear_q8 entry against the scalar twin on random code bytes and random scale
 *     bytes (the denormal bytes 0 and 1 included), odd row counts (and counts leaving 0-3 rows
 *     after groups of four), odd group counts (a last group without a partner), a scale stride
 *     wider than cols / 32 (row slices of a wider scale table), row ranges inside the matrix,
 *     padded y strides, token counts 1, 2, 3, 5 (the rows) and 12, 25 (the int8 GEMM's token
 *     tiles over several panels and column chunks), rows wider than the kernels' stack copy of
 *     x (8192 columns): |y - y_twin| <= 1e-5 * sum_c |w_c xq_c| (the same exact integer sums
 *     and factors, another order of fp32 additions); rows outside the range untouched.  The
 *     twin against the fp32 entry on the unquantised x: within the quantisation bound
 *     sum_c |w_c| |x_c - xq_c| (+ 1e-5 * mag).
 *  3. A scale byte 255 (ue8m0's NaN) makes its row's result NaN in every table, as on fp32
 *     (also where x's scale would keep 2^127, the byte's plain reading, finite).
 *  4. The dispatch: mg_linear_q8_applies takes FP4 with ue8m0 scales per 32, and not FP4 without
 *     scales, FP8 or f32; mg_linear_multi and mg_linear_jobs under act_int8 run the int8 entry
 *     for FP4 (bit for bit the entry on the quantised x) next to an FP8 matrix on its fp32
 *     entry (bit for bit), and the fp32 entries with act_int8 clear. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/cpu.h"
#include "core/kernels.h"
#include "core/linear.h"
#include "core/matrix.h"
#include "core/q8_act.h"
#include "model/blocks.h"
#include "kernels/q8_gemm.h"
#include "check.h"
#include "prefetch_flipped.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float rnd_sym(void) { return (float)((rnd() >> 40) * (1.0 / 8388608.0)) - 1.0f; }

typedef struct {
    mg_matrix m;
    uint8_t *data, *scale;
    float *dense; /* [rows, cols] dequantised (the fp32 path's values) */
} fmat;

/* rows x cols (a multiple of 32) random FP4 with a scale row stride of cols / 32 + pad bytes;
 * scale bytes 110..139 with some 0 and 1 (the denormal factors) */
static void make(fmat *b, int64_t rows, int64_t cols, int64_t pad) {
    memset(&b->m, 0, sizeof b->m);
    const int64_t sc = cols / 32 + pad;
    b->data = malloc((size_t)(rows * cols / 2));
    b->scale = malloc((size_t)(rows * sc));
    for (int64_t i = 0; i < rows * cols / 2; i++) b->data[i] = (uint8_t)(rnd() >> 24);
    for (int64_t i = 0; i < rows * sc; i++) b->scale[i] = i % 11 == 4 ? (uint8_t)(i & 1) : (uint8_t)(110 + rnd() % 30);
    b->m = (mg_matrix){b->data, b->scale, rows, cols, sc, MG_FP4_E2M1, MG_SCALE_E8M0_G32};
    b->dense = malloc((size_t)(rows * cols) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) mg_matrix_row_f32(&b->m, r, b->dense + r * cols);
}

static void unmake(fmat *b) { free(b->data), free(b->scale), free(b->dense); }

static void *quantize(const float *x, int64_t n_tok, int64_t cols, mg_q8_act *xq) {
    void *mem = aligned_alloc(64, (mg_q8_act_bytes(n_tok, cols) + 63) & ~(size_t)63);
    mg_q8_quantize(x, cols, n_tok, cols, mem, xq, NULL);
    return mem;
}

#define SENTINEL 1234.5f

/* 1. The decoders. */
static void case_decoders(void) {
    static const int64_t counts[] = {1, 2, 3, 7, 17};
    for (int ci = 0; ci < 5; ci++) {
        const int64_t ng = counts[ci], cols = 32 * ng;
        fmat b;
        make(&b, 1, cols, 0);
        int8_t *codes = malloc((size_t)cols), *codes2 = malloc((size_t)cols);
        float *fac = malloc((size_t)ng * 4), *fac2 = malloc((size_t)ng * 4);
        mg_scalar_q8_decode_fp4(b.data, b.scale, ng, codes, fac);
        int bad = 0;
        for (int64_t c = 0; c < cols; c++) bad += (double)fac[c / 32] * codes[c] != (double)b.dense[c];
        CHECK(!bad, "scalar fp4 decoder ng=%ld: %d weights differ from the dequantised ones", (long)ng, bad);
#if defined(__x86_64__)
        mg_q8_decode_fp4_fn *dec = mg_kernels_named("avx2") ? mg_avx2_q8_decoder_fp4() : NULL;
        if (dec) {
            memset(codes2, 0x55, (size_t)cols);
            for (int64_t g = 0; g < ng; g++) fac2[g] = -1.0f;
            dec(b.data, b.scale, ng, codes2, fac2);
            CHECK(!memcmp(codes, codes2, (size_t)cols) && !memcmp(fac, fac2, (size_t)ng * 4),
                  "avx2 fp4 decoder ng=%ld differs from the scalar one", (long)ng);
        }
#endif
        free(codes), free(codes2), free(fac), free(fac2);
        unmake(&b);
    }
}

/* 2. One table's linear_q8 on n_tok tokens, rows [r0, r1). */
static void case_linear(const mg_kernels *k, const fmat *b, int64_t n_tok, int64_t r0, int64_t r1) {
    const int64_t rows = b->m.rows, cols = b->m.cols, ys = rows + 5;
    float *x = malloc((size_t)(n_tok * cols) * sizeof(float));
    float *y = malloc((size_t)(n_tok * ys) * sizeof(float)), *y_ref = malloc((size_t)(n_tok * ys) * sizeof(float));
    float *y_f32 = malloc((size_t)(n_tok * ys) * sizeof(float));
    for (int64_t i = 0; i < n_tok * cols; i++) x[i] = rnd_sym() * (i % 97 == 5 ? 20.0f : 1.0f); /* some outliers */
    mg_q8_act xq;
    void *mem = quantize(x, n_tok, cols, &xq);
    for (int64_t i = 0; i < n_tok * ys; i++) y[i] = y_ref[i] = SENTINEL;
    k->linear_q8[MG_FP4_E2M1](&b->m, &xq, n_tok, y, ys, r0, r1);
    mg_kernels_scalar()->linear_q8[MG_FP4_E2M1](&b->m, &xq, n_tok, y_ref, ys, r0, r1);
    mg_kernels_scalar()->linear[MG_FP4_E2M1](&b->m, x, cols, n_tok, y_f32, ys, r0, r1);
    int bad = 0, bad_f32 = 0, untouched = 1;
    double worst = 0, worst_f32 = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < ys; r++) {
            const float got = y[t * ys + r];
            if (r < r0 || r >= r1) {
                untouched &= got == SENTINEL;
                continue;
            }
            double mag = 0, qerr = 0;
            for (int64_t c = 0; c < cols; c++) {
                const double xh = (double)xq.d[t * cols / 32 + c / 32] * (double)xq.q[t * cols + c];
                mag += fabs((double)b->dense[r * cols + c]) * fabs(xh);
                qerr += fabs((double)b->dense[r * cols + c]) * fabs((double)x[t * cols + c] - xh);
            }
            const double err = fabs((double)got - (double)y_ref[t * ys + r]);
            if (!(err <= 1e-5 * mag + 1e-30)) bad++, worst = fmax(worst, err / (mag + 1e-30));
            const double err32 = fabs((double)got - (double)y_f32[t * ys + r]);
            if (!(err32 <= qerr + 1e-5 * mag + 1e-30)) bad_f32++, worst_f32 = fmax(worst_f32, err32 / (qerr + 1e-30));
        }
    CHECK(!bad && !bad_f32 && untouched,
          "%s fp4 %ldx%ld (scale stride %ld) n_tok=%ld rows [%ld, %ld): %d off the scalar twin (worst err/mag "
          "%.3g), %d off fp32 beyond the quantisation bound (worst err/bound %.3g), untouched %d",
          k->name, (long)rows, (long)cols, (long)b->m.scale_cols, (long)n_tok, (long)r0, (long)r1, bad, worst,
          bad_f32, worst_f32, untouched);
    free(mem), free(x), free(y), free(y_ref), free(y_f32);
}

/* 3. A NaN scale byte. */
static void case_nan(const mg_kernels *k) {
    fmat b;
    make(&b, 9, 320, 0);
    b.scale[3 * 10 + 7] = 255; /* row 3, group 7 */
    float x[3 * 320], y[3 * 9];
    /* x tiny in group 7, so that 2^127 (what the byte would give read as a plain exponent) times
     * its scale stays finite: a kernel without the NaN case gives a finite row */
    for (int i = 0; i < 3 * 320; i++) x[i] = rnd_sym() * (i % 320 / 32 == 7 ? 1e-30f : 1.0f);
    mg_q8_act xq;
    for (int n_tok = 1; n_tok <= 3; n_tok++) { /* 3: the GEMM's decoders too */
        void *mem = quantize(x, n_tok, 320, &xq);
        k->linear_q8[MG_FP4_E2M1](&b.m, &xq, n_tok, y, 9, 0, 9);
        int ok = 1;
        for (int t = 0; t < n_tok; t++)
            for (int r = 0; r < 9; r++) ok &= (r == 3) == (isnan(y[t * 9 + r]) != 0);
        CHECK(ok, "%s: a scale byte 255 (n_tok %d) makes exactly its row NaN", k->name, n_tok);
        free(mem);
    }
    unmake(&b);
}

/* 4. The dispatch through the pool. */
static void case_dispatch(const mg_kernels *k, mg_pool *pool) {
    fmat a;
    make(&a, 45, 512, 2);
    /* an FP8 matrix with ue8m0 scales per 128 x 128 (DeepSeek-V4's other weights) */
    uint8_t *f8 = malloc(29 * 512), f8s[4] = {126, 127, 128, 125};
    for (int i = 0; i < 29 * 512; i++) f8[i] = (uint8_t)(rnd() >> 24) & 0xf7; /* no NaN codes */
    const mg_matrix e = {f8, f8s, 29, 512, 4, MG_FP8_E4M3, MG_SCALE_E8M0_BLOCK128};
    mg_matrix unscaled = a.m; /* FP4 without scales: no int8 path */
    unscaled.scale = NULL, unscaled.scale_kind = MG_SCALE_NONE;
    mg_compute c = {pool, k, NULL, 1};
    CHECK(mg_linear_q8_applies(&c, &a.m, 1) && mg_linear_q8_applies(&c, &a.m, 3) == (k->linear_q8_gemm != 0) &&
              !mg_linear_q8_applies(&c, &e, 1) && !mg_linear_q8_applies(&c, &unscaled, 1),
          "%s: the int8 path applies to the wrong matrices or token counts", k->name);
    CHECK(mg_matrix_has_q8_path(&a.m) && !mg_matrix_has_q8_path(&e) && !mg_matrix_has_q8_path(&unscaled),
          "mg_matrix_has_q8_path");
    const int64_t T = k->linear_q8_gemm ? 4 : 1;
    float x[4 * 512], x2[4 * 512];
    for (int i = 0; i < 4 * 512; i++) x[i] = rnd_sym(), x2[i] = rnd_sym();
    mg_q8_act xq;
    void *mem = quantize(x, T, 512, &xq);
    float want_a[4 * 45], want_e[4 * 29], ya[4 * 45], ye[4 * 29];
    k->linear_q8[MG_FP4_E2M1](&a.m, &xq, T, want_a, 45, 0, 45);
    /* fp8 has no int8 path: fp32 x, or with several tokens x rounded to bf16 where the table has
     * that prefill (linear_bf16x, the avx512bf16 table) */
    const mg_linear_fn fp8_entry = T > 1 && k->linear_bf16x[MG_FP8_E4M3] ? k->linear_bf16x[MG_FP8_E4M3] : k->linear[MG_FP8_E4M3];
    fp8_entry(&e, x, 512, T, want_e, 29, 0, 29);
    const mg_matrix *ws[2] = {&e, &a.m};
    float *ys[2] = {ye, ya};
    mg_linear_multi(&c, 2, ws, x, T, ys);
    CHECK(!memcmp(ya, want_a, (size_t)T * 45 * 4) && !memcmp(ye, want_e, (size_t)T * 29 * 4),
          "%s: mg_linear_multi with int8 activations: fp4 on the int8 entry, fp8 on its float entry", k->name);
    /* jobs: a on x2 (gate), e on x, a on x2 again */
    float want_a2[4 * 45], ya2[4 * 45];
    free(mem);
    mem = quantize(x2, T, 512, &xq);
    k->linear_q8[MG_FP4_E2M1](&a.m, &xq, T, want_a2, 45, 0, 45);
    const mg_linear_job jobs[3] = {{&a.m, x2, 512, ya, 45, T}, {&e, x, 512, ye, 29, T}, {&a.m, x2, 512, ya2, 45, T}};
    mg_linear_jobs(&c, 3, jobs);
    CHECK(!memcmp(ya, want_a2, (size_t)T * 45 * 4) && !memcmp(ya2, want_a2, (size_t)T * 45 * 4) &&
              !memcmp(ye, want_e, (size_t)T * 29 * 4),
          "%s: mg_linear_jobs with int8 activations: fp4 on the int8 entry, fp8 on its float entry", k->name);
    /* flag clear: the fp32 entries, bit for bit */
    c.act_int8 = 0;
    k->linear[MG_FP4_E2M1](&a.m, x, 512, T, want_a, 45, 0, 45);
    k->linear[MG_FP8_E4M3](&e, x, 512, T, want_e, 29, 0, 29);
    mg_linear_multi(&c, 2, ws, x, T, ys);
    CHECK(!memcmp(ya, want_a, (size_t)T * 45 * 4) && !memcmp(ye, want_e, (size_t)T * 29 * 4),
          "%s: act_int8 = 0 does not run the fp32 entries", k->name);
    free(mem), free(f8);
    unmake(&a);
}

int main(void) {
    static const char *const names[] = {"scalar", "avx2", "avx512", "avx512bf16", "neon"};
    const mg_kernels *tables[7 + MG_KERNEL_TABLES];
    int n = 0;
    for (int i = 0; i < 5; i++) {
        const mg_kernels *k = mg_kernels_named(names[i]);
        if (k) tables[n++] = k;
    }
    n = add_prefetch_flipped(tables, n, MG_FP4_E2M1); /* every case below runs both prefetch targets */
    n = add_avx2_without_vnni(tables, n);              /* and the AVX2 rows as built for AVX2 alone */
    case_decoders();
    for (int k = 0; k < n; k++)
        CHECK(tables[k]->linear_q8[MG_FP4_E2M1] && !tables[k]->linear_q8[MG_FP8_E4M3] &&
                  !tables[k]->linear_q8[MG_BF16] && !tables[k]->linear_q8[MG_F32],
              "%s: linear_q8 set for fp4, not for fp8 / bf16 / f32", tables[k]->name);
    static const int64_t toks[] = {1, 2, 3, 5};
    static const int64_t rows_list[] = {1, 3, 6, 17, 37};
    static const int64_t groups[] = {1, 2, 3, 6, 8, 13, 44, 131};
    for (int gi = 0; gi < 8; gi++)
        for (int ri = 0; ri < 5; ri++) {
            fmat b;
            make(&b, rows_list[ri], 32 * groups[gi], ri & 1 ? 3 : 0);
            for (int k = 0; k < n; k++) /* k = 0: the scalar twin against fp32 */
                for (int ti = 0; ti < 4; ti++) {
                    case_linear(tables[k], &b, toks[ti], 0, b.m.rows);
                    if (b.m.rows >= 3) case_linear(tables[k], &b, toks[ti], 1, b.m.rows - 1);
                }
            unmake(&b);
        }
    /* rows wider than the stack copy of x (passes of 8192 columns), the last pass with an odd
     * group count; four rows and one left over */
    static const int64_t widths[2] = {16384 + 256, 8192 + 96};
    for (int wi = 0; wi < 2; wi++) {
        fmat b;
        make(&b, 5, widths[wi], 1);
        for (int k = 1; k < n; k++) case_linear(tables[k], &b, 1, 0, 5), case_linear(tables[k], &b, 2, 1, 5);
        unmake(&b);
    }
    /* the GEMM's token tiles (12; 25 as tiles of 8-9) over several panels and column chunks
     * (1024) with a partial last one, from a row range that starts inside a panel */
    fmat b;
    make(&b, 37, 1376, 2);
    for (int k = 1; k < n; k++) case_linear(tables[k], &b, 12, 0, 37), case_linear(tables[k], &b, 25, 3, 37);
    unmake(&b);
    for (int k = 0; k < n; k++) case_nan(tables[k]);
    mg_error err = {0};
    mg_pool *pool = mg_pool_create(2, &err);
    CHECK(pool != NULL, "pool: %s", err.msg);
    for (int k = 0; pool && k < n; k++) case_dispatch(tables[k], pool);
    if (pool) mg_pool_destroy(pool);
    printf("test_q8_fp4: tables");
    for (int k = 0; k < n; k++) printf(" %s", tables[k]->name);
    printf("; %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
