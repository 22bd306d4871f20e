/* AVX-512 prefill (n_tok > 1): prefill_avx2.c's exact fp32 tiles (16 rows x 512 columns,
 * column-major, built by mg_avx2_prefill_tile) under a micro-kernel of 512-bit FMAs.  A tile column
 * is one zmm of 16 row values; two tiles side by side (32 rows) times up to MICRO_TOK broadcast x
 * values: 2 x MICRO_TOK accumulators, 2 column loads and MICRO_TOK broadcasts per 2 x MICRO_TOK
 * FMAs.  Why: on a core with full-width 512-bit FMA units (Zen 5, Xeon) a zmm FMA does twice the
 * work of the avx2 tile's ymm FMA in the same issue slot, and the avx2 kernel already ran at the
 * ymm peak (docs/KERNELS.md, "Prefill").
 *
 * Each (row, token) is the same sequential fp32 sum over the columns of each 512-column chunk as
 * in the avx2 tile (chunks added to y in column order, F32_ROW row scales applied to the whole sum
 * last): the two tables give the same bits, and outputs do not depend on how tokens are batched.
 * Scalar twin: the scalar table's prefill (kernels/scalar/linear_scalar.c); tests/c/test_kernels.c
 * and tests/c/test_ggml_blocks.c compare them on odd shapes and token counts. */
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "kernels/avx2/prefill_tile.h"

enum { TR = MG_PREFILL_TILE_ROWS, TC = MG_PREFILL_TILE_COLS, MICRO_TOK = 12 };

/* y[t][r + 16h + i] (+)= sum over c < kc of tile_h[c][i] * x[t][c] for T tokens and H (1, 2)
 * tiles: stored by the first column chunk, added by the next ones; the last one multiplies the
 * F32_ROW row scales (rs, NULL otherwise) into the whole sum. */
INLINE void micro(const int H, const int T, const float *t0, const float *t1, const float *x, int64_t xs, int64_t kc,
                  float *y, int64_t ys, int64_t nr, int first, const __m512 *rs) {
    /* All loops over h and t unroll (H and T are constants here) so the sums stay in registers. */
    __m512 a[2][MICRO_TOK];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) a[0][t] = a[1][t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < kc; c++) {
        const __m512 w0 = _mm512_load_ps(t0 + c * TR);
        const __m512 w1 = H == 2 ? _mm512_load_ps(t1 + c * TR) : w0;
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            const __m512 xb = _mm512_set1_ps(x[t * xs + c]);
            a[0][t] = _mm512_fmadd_ps(w0, xb, a[0][t]);
            if (H == 2) a[1][t] = _mm512_fmadd_ps(w1, xb, a[1][t]);
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < H; h++) {
        const int64_t n = nr - 16 * h;
        const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            float *p = y + t * ys + 16 * h;
            __m512 v = a[h][t];
            if (!first) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, p), v);
            if (rs) v = _mm512_mul_ps(v, rs[h]);
            _mm512_mask_storeu_ps(p, m, v);
        }
    }
}

typedef void micro_fn(const float *t0, const float *t1, const float *x, int64_t xs, int64_t kc, float *y, int64_t ys,
                      int64_t nr, int first, const __m512 *rs);

/* One out-of-line function per (tiles, tokens), as in prefill_avx2.c: inlined into the tile
 * loop, the compiler keeps the caller's invariants in registers and spills accumulators. */
#define MICRO_FN(H, T)                                                                                         \
    static __attribute__((noinline)) void micro_##H##_##T(const float *t0, const float *t1, const float *x,    \
                                                          int64_t xs, int64_t kc, float *y, int64_t ys,       \
                                                          int64_t nr, int first, const __m512 *rs) {           \
        micro(H, T, t0, t1, x, xs, kc, y, ys, nr, first, rs);                                                  \
    }
#define MICRO_FNS(H)                                                                                             \
    MICRO_FN(H, 1) MICRO_FN(H, 2) MICRO_FN(H, 3) MICRO_FN(H, 4) MICRO_FN(H, 5) MICRO_FN(H, 6) MICRO_FN(H, 7)    \
        MICRO_FN(H, 8) MICRO_FN(H, 9) MICRO_FN(H, 10) MICRO_FN(H, 11) MICRO_FN(H, 12)
MICRO_FNS(1)
MICRO_FNS(2)
#define MICRO_TABLE(H)                                                                                           \
    {NULL, micro_##H##_1, micro_##H##_2, micro_##H##_3, micro_##H##_4, micro_##H##_5, micro_##H##_6,           \
     micro_##H##_7, micro_##H##_8, micro_##H##_9, micro_##H##_10, micro_##H##_11, micro_##H##_12}
static micro_fn *const MICRO[2][MICRO_TOK + 1] = {MICRO_TABLE(1), MICRO_TABLE(2)};

/* All tokens over one pair of tiles, in blocks of at most MICRO_TOK spread evenly (a remainder
 * never leaves a block of one or two tokens, too few chains to hide the FMA latency). */
INLINE void tile_tokens(int H, const float *t0, const float *t1, const float *x, int64_t xs, int64_t n_tok,
                        int64_t kc, float *y, int64_t ys, int64_t nr, int first, const __m512 *rs) {
    const int64_t nb = (n_tok + MICRO_TOK - 1) / MICRO_TOK, base = n_tok / nb, extra = n_tok % nb;
    int64_t t = 0;
    for (int64_t b = 0; b < nb; b++) {
        const int T = (int)(base + (b < extra));
        MICRO[H - 1][T](t0, t1, x + t * xs, xs, kc, y + t * ys, ys, nr, first, rs);
        t += T;
    }
}

void mg_avx512_prefill(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride,
                       int64_t r0, int64_t r1) {
    float tile[2][TR * TC] __attribute__((aligned(64)));
    const int64_t cols = w->cols;
    for (int64_t r = r0; r < r1; r += 2 * TR) {
        const int64_t nr = r1 - r < 2 * TR ? r1 - r : 2 * TR;
        const int H = nr > TR ? 2 : 1;
        __m512 rsv[2];
        if (w->scale_kind == MG_SCALE_F32_ROW) {
            float rs[2 * TR] = {0};
            for (int64_t i = 0; i < nr; i++) rs[i] = row_scale(w, r + i);
            rsv[0] = _mm512_loadu_ps(rs);
            rsv[1] = _mm512_loadu_ps(rs + TR);
        }
        for (int64_t c0 = 0; c0 < cols; c0 += TC) {
            const int64_t kc = cols - c0 < TC ? cols - c0 : TC;
            mg_avx2_prefill_tile(w, r, H == 2 ? TR : nr, c0, kc, tile[0]);
            if (H == 2) mg_avx2_prefill_tile(w, r + TR, nr - TR, c0, kc, tile[1]);
            tile_tokens(H, tile[0], tile[1], x + c0, x_stride, n_tok, kc, y + r, y_stride, nr, c0 == 0,
                        c0 + kc == cols && w->scale_kind == MG_SCALE_F32_ROW ? rsv : NULL);
        }
    }
}
#endif
