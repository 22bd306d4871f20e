/* The int8-activation path (core/q8_act.h, the linear_q8 entries) of every table this build has
 * and this CPU runs:
 *  1. The quantiser: codes in [-127, 127], |x - d * q| <= d / 2 (rounding to nearest), s = d *
 *     sum(q), all-zero blocks give d = 0, a NaN makes the block's scale NaN.
 *  2. Each SIMD table's linear_q8 against the scalar twin on random blocks, odd row counts (and
 *     counts leaving 0-3 rows after groups of four), odd block counts, rows not multiples of
 *     256, token counts 1, 2, 3, 5 (and 8, 12, 25: the int8 GEMMs' token tiles; on arm64 the
 *     NEON GEMM also called directly at 1 and 4), row ranges inside the matrix, padded y
 *     strides, rows wider than a kernel's stack copy of x (8192 columns, also with an odd last
 *     pass): |y - y_scalar|
 *     <= 1e-5 * mag, mag = sum_c |w_c xq_c| (+ 2 |min_c| |xq_c| for Q4_K / Q5_K / Q2_K (dmin*m)
 *     and Q4_1 / Q5_1 (m), whose mins are a separate sum): both compute the same exact integer
 *     sums and the same float factors (up to the VNNI loops' and the GEMMs' per-16 factors
 *     d*k*dx, one more rounding), and differ otherwise only in the order of the fp32 additions.  Rows
 *     outside the range stay untouched.  The avx2 table's rows do not depend on the row range
 *     at all (bit for bit: each row is reduced alone, whether in a group of four or not).
 *  3. Against the fp32 path (the linear entry on the unquantised x): |y_q8 - y_f32| <=
 *     sum_c |w_c| |x_c - xq_c| + 1e-5 * mag: the quantisation bound.
 *  4. The dispatch (core/linear.c, model/blocks.c): with act_int8 set, mg_linear_multi and
 *     mg_linear_jobs run the int8 entry for block formats (bit-equal to calling it on the
 *     quantised x) and the fp32 entry for other formats; with it clear, the fp32 entry.  Also
 *     from a second thread that then exits (its scratch is freed with it: the sanitizer build
 *     reports a leak otherwise).  Several tokens take the int8 entry only in a table with an int8
 *     GEMM (linear_q8_gemm): on arm64, the neon table on a CPU with the dot product.
 *  5. The int8 GEMM's block decoders (below). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/cpu.h"
#include "core/ggml_blocks.h"
#include "core/kernels.h"
#include "core/linear.h"
#include "core/matrix.h"
#include "core/q8_act.h"
#include "model/blocks.h"
#include "kernels/q8_gemm.h"
#include "kernels/q8_gemm_driver.h"

/* kernels/neon/neon.h (arm64 only): the int8 GEMMs on sdot and on smmla and the entries that take
 * them; NULL in a build without the dot product (the int8 matrix multiply) */
void mg_neondot_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                        int64_t r0, int64_t r1);
mg_linear_q8_fn mg_neondot_linear_q8(void);
void mg_neoni8mm_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1);
mg_linear_q8_fn mg_neoni8mm_linear_q8(void);
#include "check.h"
#include "prefetch_flipped.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float rnd_sym(void) { return (float)((rnd() >> 40) * (1.0 / 8388608.0)) - 1.0f; }

/* Random finite f16 scales (2^-24 .. 2^4, denormals included), random code bytes, and MXFP4
 * scales including the denormal bytes 0 and 1. */
static void random_blocks(mg_format f, uint8_t *data, int64_t rows, int64_t cols) {
    int64_t e, b;
    mg_format_block(f, &e, &b);
    const int64_t nb = rows * cols / e;
    /* the f16 fields: d (or MXFP4's e8m0 byte, set below; IQ1_M's d is spread over 4 nibbles)
     * and the min or dmin; the grid formats' d is at 0 */
    const int off0 = f == MG_Q6_K ? 208 : f == MG_Q2_K ? 80 : f == MG_Q3_K ? 108 : f == MG_MXFP4 ? -1 : 0;
    const int off1 = f == MG_Q4_K || f == MG_Q5_K || f == MG_Q4_1 || f == MG_Q5_1 ? 2 : f == MG_Q2_K ? 82 : -1;
    for (int64_t i = 0; i < nb * b; i++) data[i] = (uint8_t)(rnd() >> 24);
    for (int64_t k = 0; k < nb; k++) {
        uint8_t *p = data + k * b;
        const int offs[2] = {off0, off1};
        for (int j = 0; j < 2; j++)
            if (offs[j] >= 0) {
                const uint16_t h = (uint16_t)((rnd() & 0x8000u) | (uint16_t)((rnd() % 20) << 10) | (rnd() & 0x3ffu));
                if (f == MG_IQ1_M) { /* d in the top nibbles of the 4 scale words at 48 (nibble i in word i) */
                    for (int i = 0; i < 4; i++) p[49 + 2 * i] = (uint8_t)((p[49 + 2 * i] & 0x0f) | (((h >> (4 * i)) & 15) << 4));
                } else {
                    memcpy(p + offs[j], &h, 2);
                }
            }
        if (f == MG_MXFP4) p[0] = k % 7 == 3 ? (uint8_t)(k & 1) : (uint8_t)(110 + rnd() % 30);
    }
}

static const mg_format FORMATS[] = {MG_Q8_0,  MG_Q4_0,    MG_Q5_0,   MG_Q4_K,   MG_Q5_K,    MG_Q6_K,
                                    MG_MXFP4, MG_IQ4_NL,  MG_IQ4_XS, MG_Q4_1,   MG_Q5_1,    MG_Q2_K,
                                    MG_Q3_K,  MG_IQ2_XXS, MG_IQ2_XS, MG_IQ2_S,  MG_IQ3_XXS, MG_IQ3_S,
                                    MG_IQ1_S, MG_IQ1_M};
enum { N_FORMATS = sizeof FORMATS / sizeof *FORMATS };

typedef struct {
    mg_matrix m;
    uint8_t *data;
    float *dense; /* [rows, cols] dequantised */
    float *mins;  /* [rows, cols] the column's min term per unit of x, |dmin * m| (Q4_K, Q5_K,
                   * Q2_K) or |m| (Q4_1, Q5_1), else 0 */
} bmat;

/* |the min| that column c of a row at row meets (a separate sum in the kernels), 0 if none. */
static float min_term(mg_format f, const uint8_t *row, int64_t c) {
    int64_t e, bytes;
    mg_format_block(f, &e, &bytes);
    const uint8_t *blk = row + (size_t)(c / e * bytes);
    switch (f) {
    case MG_Q4_K:
    case MG_Q5_K: {
        uint8_t sc, m;
        mg_ggml_k4_scale_min(blk + 4, (int)(c % 256 / 32), &sc, &m);
        return fabsf(mg_ggml_f16_at(blk + 2) * (float)m);
    }
    case MG_Q4_1:
    case MG_Q5_1: return fabsf(mg_ggml_f16_at(blk + 2));
    case MG_Q2_K: return fabsf(mg_ggml_f16_at(blk + 82) * (float)(blk[c % 256 / 16] >> 4));
    default: return 0.0f;
    }
}

static void make(bmat *b, mg_format f, int64_t rows, int64_t cols) {
    memset(&b->m, 0, sizeof b->m);
    b->m.format = f, b->m.rows = rows, b->m.cols = cols, b->m.scale_kind = MG_SCALE_NONE;
    const size_t rb = mg_matrix_row_bytes(&b->m);
    b->data = malloc((size_t)rows * rb);
    random_blocks(f, b->data, rows, cols);
    b->m.data = b->data;
    b->dense = malloc((size_t)(rows * cols) * sizeof(float));
    b->mins = calloc((size_t)(rows * cols), sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        mg_matrix_row_f32(&b->m, r, b->dense + r * cols);
        for (int64_t c = 0; c < cols; c++) b->mins[r * cols + c] = min_term(f, b->data + (size_t)r * rb, c);
    }
}

static void unmake(bmat *b) { free(b->data), free(b->dense), free(b->mins); }

#define SENTINEL 1234.5f

/* 1. The quantiser. */
static void case_quantize(void) {
    enum { N = 32 * 7 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = rnd_sym() * (i < 64 ? 1e-3f : i < 128 ? 30.0f : 1.0f);
    for (int i = 160; i < 192; i++) x[i] = 0.0f;             /* an all-zero block */
    x[200] = 0.5f * 127.0f / 127.0f, x[201] = -x[200];         /* exact codes */
    int8_t q[N];
    float d[N / 32], s[N / 32];
    mg_q8_quantize_row(x, N, q, d, s);
    int bad = 0;
    for (int g = 0; g < N / 32; g++) {
        int sum = 0;
        for (int i = 32 * g; i < 32 * g + 32; i++) {
            bad += q[i] < -127 || fabsf(x[i] - d[g] * (float)q[i]) > 0.5f * d[g] * (1.0f + 1e-5f);
            sum += q[i];
        }
        bad += s[g] != d[g] * (float)sum;
    }
    CHECK(!bad, "quantiser: %d codes / sums off", bad);
    CHECK(d[5] == 0.0f && q[170] == 0 && s[5] == 0.0f, "quantiser: all-zero block gives d %g", (double)d[5]);
    x[7] = NAN;
    mg_q8_quantize_row(x, N, q, d, s);
    CHECK(isnan(d[0]) && !isnan(d[1]), "quantiser: a NaN makes (only) its block's scale NaN");
}

/* 1b. Each table's q8_quantize_row gives the C quantiser's bits: random rows of several scales,
 * all-zero blocks, denormals, values whose scaled code is a tie (k + 0.5: rounding to even), an
 * element at exactly amax, and NaN / inf blocks. */
static void case_quantize_table(const mg_kernels *k) {
    enum { N = 32 * 40 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = rnd_sym() * (i % 5 == 0 ? 1e-3f : i % 7 == 0 ? 3e4f : 1.0f);
    for (int i = 64; i < 96; i++) x[i] = 0.0f;
    for (int i = 96; i < 128; i++) x[i] = rnd_sym() * 1e-40f; /* denormals */
    for (int i = 128; i < 160; i++) x[i] = (float)((i % 11) - 5) + 0.5f; /* amax 5.5: x * 127 / 5.5 */
    for (int i = 160; i < 192; i++) x[i] = 0.5f * (float)(i - 176); /* amax 8: codes 127 * j / 16 */
    x[200] = NAN, x[260] = INFINITY, x[300] = -INFINITY;
    int8_t q[N], q2[N];
    float d[N / 32], s[N / 32], d2[N / 32], s2[N / 32];
    mg_q8_quantize_row(x, N, q, d, s);
    memset(q2, 0x55, sizeof q2);
    k->q8_quantize_row(x, N, q2, d2, s2);
    int bad = 0;
    for (int g = 0; g < N / 32; g++) {
        bad += memcmp(q + 32 * g, q2 + 32 * g, 32) != 0;
        bad += isnan(d[g]) ? !isnan(d2[g]) || !isnan(s2[g]) : memcmp(&d[g], &d2[g], 4) || memcmp(&s[g], &s2[g], 4);
    }
    CHECK(!bad, "%s: q8_quantize_row differs from the C quantiser in %d blocks", k->name, bad);
}

/* 2 and 3: one table's linear_q8 on n_tok tokens, rows [r0, r1). */
static void case_linear(const mg_kernels *k, const bmat *b, int64_t n_tok, int64_t r0, int64_t r1) {
    const int64_t rows = b->m.rows, cols = b->m.cols, ys = rows + 5;
    float *x = malloc((size_t)(n_tok * cols) * sizeof(float));
    float *y = malloc((size_t)(n_tok * ys) * sizeof(float)), *y_ref = malloc((size_t)(n_tok * ys) * sizeof(float));
    float *y_f32 = malloc((size_t)(n_tok * ys) * sizeof(float));
    for (int64_t i = 0; i < n_tok * cols; i++) x[i] = rnd_sym() * (i % 97 == 5 ? 20.0f : 1.0f); /* some outliers */
    void *mem = aligned_alloc(64, (mg_q8_act_bytes(n_tok, cols) + 63) & ~(size_t)63);
    mg_q8_act xq;
    mg_q8_quantize(x, cols, n_tok, cols, mem, &xq, NULL);
    for (int64_t i = 0; i < n_tok * ys; i++) y[i] = y_ref[i] = SENTINEL;
    k->linear_q8[b->m.format](&b->m, &xq, n_tok, y, ys, r0, r1);
    mg_kernels_scalar()->linear_q8[b->m.format](&b->m, &xq, n_tok, y_ref, ys, r0, r1);
    mg_kernels_scalar()->linear[b->m.format](&b->m, x, cols, n_tok, y_f32, ys, r0, r1);
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
                mag += (fabs((double)b->dense[r * cols + c]) + 2.0 * b->mins[r * cols + c]) * fabs(xh);
                qerr += fabs((double)b->dense[r * cols + c]) * fabs((double)x[t * cols + c] - xh);
            }
            const double err = fabs((double)got - (double)y_ref[t * ys + r]);
            if (!(err <= 1e-5 * mag + 1e-30)) bad++, worst = fmax(worst, err / (mag + 1e-30));
            const double err32 = fabs((double)got - (double)y_f32[t * ys + r]);
            if (!(err32 <= qerr + 1e-5 * mag + 1e-30)) bad_f32++, worst_f32 = fmax(worst_f32, err32 / (qerr + 1e-30));
        }
    CHECK(!bad && !bad_f32 && untouched,
          "%s %s %ldx%ld n_tok=%ld rows [%ld, %ld): %d off the scalar twin (worst err/mag %.3g), %d off fp32 beyond "
          "the quantisation bound (worst err/bound %.3g), untouched %d",
          k->name, mg_format_name(b->m.format), (long)rows, (long)cols, (long)n_tok, (long)r0, (long)r1, bad, worst,
          bad_f32, worst_f32, untouched);
    free(mem), free(x), free(y), free(y_ref), free(y_f32);
}

/* 2b. The avx2 loops reduce every row alone, in the same order in a group of four rows as
 * alone: a row's result is bit for bit the same whatever row range it is computed in (so
 * whatever the thread split). */
static void case_range_independent(const mg_kernels *k) {
    int bad = 0;
    for (int fi = 0; fi < N_FORMATS; fi++) {
        bmat b;
        make(&b, FORMATS[fi], 11, 512);
        float x[512], y[11], y1[11];
        for (int i = 0; i < 512; i++) x[i] = rnd_sym();
        void *mem = aligned_alloc(64, mg_q8_act_bytes(1, 512) + 64);
        mg_q8_act xq;
        mg_q8_quantize(x, 512, 1, 512, mem, &xq, NULL);
        k->linear_q8[b.m.format](&b.m, &xq, 1, y, 11, 0, 11);
        for (int64_t r = 0; r < 11; r++) k->linear_q8[b.m.format](&b.m, &xq, 1, y1, 11, r, r + 1);
        bad += memcmp(y, y1, sizeof y) != 0;
        free(mem);
        unmake(&b);
    }
    CHECK(!bad, "%s: %d formats give rows that depend on the row range", k->name, bad);
}

/* 4. The dispatch through the pool. */
static void case_dispatch(const mg_kernels *k, mg_pool *pool) {
    bmat a, b;
    make(&a, MG_Q4_K, 45, 512);
    make(&b, MG_Q8_0, 29, 512);
    mg_matrix f = {0};
    float *fw = malloc(23 * 512 * sizeof(float));
    for (int i = 0; i < 23 * 512; i++) fw[i] = rnd_sym();
    f.format = MG_F32, f.rows = 23, f.cols = 512, f.data = fw, f.scale_kind = MG_SCALE_NONE;
    float x[512], x2[512];
    for (int i = 0; i < 512; i++) x[i] = rnd_sym(), x2[i] = rnd_sym();
    void *mem = aligned_alloc(64, mg_q8_act_bytes(1, 512) + 64);
    mg_q8_act xq;
    mg_q8_quantize(x, 512, 1, 512, mem, &xq, NULL);
    float want_a[45], want_b[29], want_f[23], ya[45], yb[29], yf[23];
    k->linear_q8[MG_Q4_K](&a.m, &xq, 1, want_a, 45, 0, 45);
    k->linear_q8[MG_Q8_0](&b.m, &xq, 1, want_b, 29, 0, 29);
    k->linear[MG_F32](&f, x, 512, 1, want_f, 23, 0, 23);
    mg_compute c = {pool, k, NULL, 1};
    const mg_matrix *ws[3] = {&a.m, &f, &b.m};
    float *ys[3] = {ya, yf, yb};
    mg_linear_multi(&c, 3, ws, x, 1, ys);
    CHECK(!memcmp(ya, want_a, sizeof ya) && !memcmp(yb, want_b, sizeof yb) && !memcmp(yf, want_f, sizeof yf),
          "%s: mg_linear_multi with int8 activations differs from the entries", k->name);
    /* jobs with two different inputs (x for a, x2 for b; the same x for a twice) */
    float want_b2[29], ya2[45];
    mg_q8_quantize(x2, 512, 1, 512, mem, &xq, NULL);
    k->linear_q8[MG_Q8_0](&b.m, &xq, 1, want_b2, 29, 0, 29);
    const mg_linear_job jobs[4] = {{&a.m, x, 512, ya, 45, 1}, {&b.m, x2, 512, yb, 29, 1}, {&f, x, 512, yf, 23, 1},
                                   {&a.m, x, 512, ya2, 45, 1}};
    mg_linear_jobs(&c, 4, jobs);
    CHECK(!memcmp(ya, want_a, sizeof ya) && !memcmp(ya2, want_a, sizeof ya) && !memcmp(yb, want_b2, sizeof yb) &&
              !memcmp(yf, want_f, sizeof yf),
          "%s: mg_linear_jobs with int8 activations differs from the entries", k->name);
    /* several tokens: the int8 entry only in a table with an int8 GEMM (linear_q8_gemm) */
    CHECK(mg_linear_q8_applies(&c, &a.m, 3) == (k->linear_q8_gemm != 0) && mg_linear_q8_applies(&c, &a.m, 1) &&
              !mg_linear_q8_applies(&c, &f, 1),
          "%s: the int8 path applies to the wrong token counts or formats", k->name);
    /* flag clear: the fp32 entries, bit for bit */
    c.act_int8 = 0;
    k->linear[MG_Q4_K](&a.m, x, 512, 1, want_a, 45, 0, 45);
    mg_linear_multi(&c, 3, ws, x, 1, ys);
    CHECK(!memcmp(ya, want_a, sizeof ya), "%s: act_int8 = 0 does not run the fp32 entry", k->name);
    free(mem), free(fw);
    unmake(&a), unmake(&b);
}

/* 5. The int8 GEMM's block decoders (kernels/q8_gemm.h): the scalar one gives back the
 * dequantised weights (fac * code - mn per group, to fp32 rounding), and every SIMD one this
 * build has (AVX2 where the CPU runs it; NEON on arm64) equals it bit for bit on random blocks, 1
 * to 17 of them.  The NEON decoders must cover every format (the GEMM's lookup takes them), and
 * the lookup must return them. */
static int decoder_matches(const char *isa, mg_q8_decode_fn *dec, mg_format f, const uint8_t *data, int64_t nb,
                           const int8_t *codes, const float *fac, const float *mn) {
    int64_t e, bytes;
    mg_format_block(f, &e, &bytes);
    const int64_t cols = nb * e, ng = cols / mg_q8_gemm_group(f);
    int8_t *codes2 = malloc((size_t)cols);
    float *fac2 = malloc((size_t)ng * 4), *mn2 = calloc((size_t)ng, 4);
    memset(codes2, 0x55, (size_t)cols);
    for (int64_t g = 0; g < ng; g++) fac2[g] = -1.0f;
    dec(f, data, nb, codes2, fac2, mn2);
    const int ok = !memcmp(codes, codes2, (size_t)cols) && !memcmp(fac, fac2, (size_t)ng * 4) &&
                   (!mg_q8_gemm_has_mins(f) || !memcmp(mn, mn2, (size_t)ng * 4));
    CHECK(ok, "%s q8 decoder %s nb=%ld differs from the scalar one", isa, mg_format_name(f), (long)nb);
    free(codes2), free(fac2), free(mn2);
    return ok;
}

static void case_decoders(int have_avx2) {
    static const int64_t counts[] = {1, 2, 3, 7, 17};
    int simd_checked = 0;
    for (int fi = 0; fi < N_FORMATS; fi++) {
        const mg_format f = FORMATS[fi];
        int64_t e, bytes;
        mg_format_block(f, &e, &bytes);
        const int G = mg_q8_gemm_group(f);
        for (int ci = 0; ci < 5; ci++) {
            const int64_t nb = counts[ci], cols = nb * e, ng = cols / G;
            bmat b;
            make(&b, f, 1, cols);
            int8_t *codes = malloc((size_t)cols);
            float *fac = malloc((size_t)ng * 4), *mn = calloc((size_t)ng, 4);
            mg_scalar_q8_decode(f, b.data, nb, codes, fac, mn);
            int bad = 0, nonzero = 0;
            for (int64_t c = 0; c < cols; c++) {
                const double w = (double)fac[c / G] * codes[c] - (double)mn[c / G];
                bad += !(fabs(w - (double)b.dense[c]) <= 1e-6 * (fabs((double)b.dense[c]) + 2.0 * b.mins[c]) + 1e-30);
                nonzero += codes[c] != 0;
            }
            CHECK(!bad, "scalar q8 decoder %s nb=%ld: %d weights differ from the dequantised ones",
                  mg_format_name(f), (long)nb, bad);
            CHECK(nonzero > cols / 4, "q8 decoders %s nb=%ld: random blocks with only %d nonzero codes",
                  mg_format_name(f), (long)nb, nonzero);
#if defined(__x86_64__)
            mg_q8_decode_fn *dec = have_avx2 ? mg_avx2_q8_decoder_k(f) : NULL;
            if (have_avx2 && !dec) dec = mg_avx2_q8_decoder_iq(f);
            if (dec) simd_checked += decoder_matches("avx2", dec, f, b.data, nb, codes, fac, mn);
#elif defined(__aarch64__)
            mg_q8_decode_fn *dec = mg_neon_q8_decoder(f);
            CHECK(dec && mg_q8_gemm_decoder(f) == dec, "neon q8 decoder %s: %s", mg_format_name(f),
                  dec ? "not the GEMM's lookup" : "missing");
            if (dec) simd_checked += decoder_matches("neon", dec, f, b.data, nb, codes, fac, mn);
#endif
            free(codes), free(fac), free(mn);
            unmake(&b);
        }
    }
    printf("test_ggml_q8: %d SIMD block decodes equal to the scalar decoder\n", simd_checked);
}

typedef struct {
    const mg_kernels *k;
    mg_pool *pool;
} thread_arg;

static void *dispatch_thread(void *p) {
    const thread_arg *a = p;
    case_dispatch(a->k, a->pool);
    return NULL;
}

int main(void) {
    static const char *const names[] = {"scalar", "avx2", "avx512", "avx512bf16", "neon"};
    const mg_kernels *tables[7 + MG_KERNEL_TABLES];
    int n = 0;
    for (int i = 0; i < 5; i++) {
        const mg_kernels *k = mg_kernels_named(names[i]);
        if (k) tables[n++] = k;
    }
    n = add_prefetch_flipped(tables, n, MG_Q4_K); /* every case below runs both prefetch targets */
    n = add_avx2_without_vnni(tables, n);         /* and the AVX2 rows as built for AVX2 alone */
    case_quantize();
    case_decoders(mg_kernels_named("avx2") != NULL);
    for (int k = 0; k < n; k++) {
        case_quantize_table(tables[k]);
        for (int f = 0; f < MG_FORMAT_COUNT; f++)
            CHECK(!tables[k]->linear_q8[f] == !mg_format_has_q8_path((mg_format)f), "%s: linear_q8[%s] %s",
                  tables[k]->name, mg_format_name((mg_format)f), tables[k]->linear_q8[f] ? "set" : "missing");
    }
    static const int64_t toks[] = {1, 2, 3, 5};
    /* row counts and inner ranges leave 0-3 rows after the groups of four of the SIMD loops */
    static const int64_t rows_list[] = {1, 3, 6, 17, 37};
    static const int64_t blocks32[] = {1, 3, 13, 44, 131};
    static const int64_t blocks256[] = {1, 3, 5, 17};
    for (int fi = 0; fi < N_FORMATS; fi++) {
        const mg_format f = FORMATS[fi];
        int64_t e, bytes;
        mg_format_block(f, &e, &bytes);
        const int64_t *bl = e == 32 ? blocks32 : blocks256;
        const int nbl = e == 32 ? 5 : 4;
        for (int bi = 0; bi < nbl; bi++)
            for (int ri = 0; ri < 5; ri++) {
                bmat b;
                make(&b, f, rows_list[ri], bl[bi] * e);
                for (int k = 0; k < n; k++) /* k = 0: the scalar twin against fp32 (case 3) */
                    for (int ti = 0; ti < 4; ti++) {
                        case_linear(tables[k], &b, toks[ti], 0, b.m.rows);
                        if (b.m.rows >= 3) case_linear(tables[k], &b, toks[ti], 1, b.m.rows - 1);
                    }
                unmake(&b);
            }
    }
    for (int k = 0; k < n; k++)
        if (!strcmp(tables[k]->name, "avx2")) case_range_independent(tables[k]);
    /* rows wider than a kernel's stack copy of x (the VNNI and AVX2 loops prepare x in passes of
     * 8192 columns), in a group of four rows and one left over; for the 32-element formats also
     * a last pass of an odd number of blocks (the AVX2 loops take them two at a time) */
    for (int fi = 0; fi < N_FORMATS; fi++) {
        int64_t e, bytes;
        mg_format_block(FORMATS[fi], &e, &bytes);
        const int64_t widths[2] = {16384 + 256, 8192 + 96};
        for (int wi = 0; wi < (e == 32 ? 2 : 1); wi++) {
            bmat b;
            make(&b, FORMATS[fi], 5, widths[wi]);
            for (int k = 1; k < n; k++) case_linear(tables[k], &b, 1, 0, 5), case_linear(tables[k], &b, 2, 1, 5);
            unmake(&b);
        }
    }
    /* the GEMM's token tiles (12 tokens; 25 as three of 8-9 on AVX-512, five of 5 with tiles of
     * at most 6; 8 as two of 4: a full vector of 4 tokens' x codes on NEON) over several 16-row
     * (8-row) panels and column chunks (1024) with a partial last one, from row ranges that start
     * inside a panel.  On arm64 with the dot product, each GEMM this CPU runs is also called
     * directly (a copy of the neon table whose int8 entries are mg_neondot_gemm_q8, or
     * mg_neoni8mm_gemm_q8 with the int8 matrix multiply), so that the one the table does not take
     * is checked too: at 1 and 4 tokens, below the entry's threshold (tiles of 1 and of exactly 4
     * tokens), and at 12 and 5 (sdot: tiles of 6 and 5; smmla: of 4, and 2 + 3 with an odd last
     * pair). */
    mg_kernels gemm_only[2] = {{0}, {0}};
#if defined(__aarch64__)
    const mg_kernels *neon = mg_kernels_named("neon");
    const mg_linear_q8_fn gemms[2] = {mg_neondot_linear_q8() ? mg_neondot_gemm_q8 : NULL,
                                      mg_neoni8mm_linear_q8() && mg_cpu_detect().neoni8mm ? mg_neoni8mm_gemm_q8 : NULL};
    for (int gi = 0; gi < 2; gi++)
        if (neon && neon->linear_q8_gemm && gemms[gi]) {
            gemm_only[gi] = *neon;
            gemm_only[gi].name = gi ? "smmla GEMM" : "sdot GEMM";
            for (int f = 0; f < MG_FORMAT_COUNT; f++)
                if (gemm_only[gi].linear_q8[f]) gemm_only[gi].linear_q8[f] = gemms[gi];
        }
#endif
    for (int fi = 0; fi < N_FORMATS; fi++) {
        int64_t e, bytes;
        mg_format_block(FORMATS[fi], &e, &bytes);
        bmat b;
        make(&b, FORMATS[fi], 37, e == 32 ? 1376 : 1280);
        for (int k = 1; k < n; k++)
            case_linear(tables[k], &b, 12, 0, 37), case_linear(tables[k], &b, 25, 3, 37),
                case_linear(tables[k], &b, 8, 1, 36);
        for (int gi = 0; gi < 2; gi++)
            if (gemm_only[gi].name)
                case_linear(&gemm_only[gi], &b, 1, 0, 37), case_linear(&gemm_only[gi], &b, 4, 5, 31),
                    case_linear(&gemm_only[gi], &b, 12, 2, 37), case_linear(&gemm_only[gi], &b, 5, 0, 29);
        unmake(&b);
    }
    mg_error err = {0};
    mg_pool *pool = mg_pool_create(2, &err);
    CHECK(pool != NULL, "pool: %s", err.msg);
    for (int k = 0; pool && k < n; k++) case_dispatch(tables[k], pool);
    if (pool) {
        thread_arg arg = {tables[n - 1], pool};
        pthread_t th;
        CHECK(!pthread_create(&th, NULL, dispatch_thread, &arg), "pthread_create");
        pthread_join(th, NULL);
    }
    if (pool) mg_pool_destroy(pool);
    printf("test_ggml_q8: tables");
    for (int k = 0; k < n; k++) printf(" %s%s", tables[k]->name, tables[k]->linear_q8_gemm ? " (int8 GEMM)" : "");
    printf("; %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
