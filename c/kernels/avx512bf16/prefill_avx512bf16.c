/* Prefill (n_tok > 1) with x rounded to bf16, for the fast activations path (`--activations
 * int8`) on weights that are exact in bf16: BF16, and FP8 unscaled, with power-of-two block
 * scales (e8m0) or with row scales.  Rounding x is the only approximation (relative 2^-9 per
 * element, a quarter of the int8 path's per-block quantisation step at best); the weights, their
 * products and the fp32 sums are exact or as in the fp32 tiles.
 *
 * Why: prefill of these formats runs the fp32 tiles at the FMA peak (prefill_avx512.c), and
 * vdpbf16ps does two multiply-adds per 32-bit lane in the issue slot of one FMA.  The tiles are
 * prefill_avx2.c's exact fp32 tiles (16 rows x 512 columns, column-major), turned into bf16 pairs
 * (lane i of pair p = row i's columns 2p, 2p + 1): an exact value's low 16 bits are zero, so a
 * shift and a mask give its bf16.  The micro-kernel is prefill_avx512.c's (two tiles x up to 12
 * tokens), one pair of columns per step. */
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512BF16__) && defined(__FMA__) && defined(__F16C__)
#include <stdlib.h>
#include "kernels/avx512/avx512.h"
#include "kernels/avx2/prefill_tile.h" /* the tile shape, shared with the fp32 tiles */
#include "kernels/avx512bf16/avx512bf16.h"

enum { TR = MG_PREFILL_TILE_ROWS, TC = MG_PREFILL_TILE_COLS, TP = TC / 2, MICRO_TOK = 12 };

static int takes(const mg_matrix *w) {
    if (w->format == MG_BF16) return w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_F32_ROW;
    if (w->format == MG_FP8_E4M3)
        return w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_E8M0_BLOCK128 ||
               w->scale_kind == MG_SCALE_F32_ROW;
    return 0;
}

/* 32 columns of one row as 16 bf16 pairs (lane j: columns 2j, 2j + 1), exactly: bf16 rows are
 * the pairs as stored; an fp8 byte s.eeee.mmm, sign-extended to 16 bits, becomes by a shift and
 * the mask 0xBF80 the f16 of its value times 2^-8 (subnormals included), vcvtph2ps its fp32 (a
 * normal number: an fp32 denormal here would cost Intel cores a microcode assist per multiply,
 * see mg_cpu_features.denormal_assists), and one multiply by 256 and one by the block's scale
 * the weight (s: 1 for unscaled and row-scaled weights, whose row scale multiplies the sums).
 * vcvtne2ps2bf16 of two exact vectors of 16 columns is then the pairs of the 32, in order. */
INLINE __m512i row_pairs_fp8(const uint8_t *p, __m512 s) {
    const __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p)), 7),
                                       _mm512_set1_epi16((short)0xBF80));
    const __m512 fa = _mm512_cvtph_ps(_mm512_castsi512_si256(h)), fb = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    const __m512 k = _mm512_set1_ps(256.0f);
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_mul_ps(fb, k), s), _mm512_mul_ps(_mm512_mul_ps(fa, k), s));
}

/* Rows [r, r + nr) (nr <= 16; lanes past nr repeat the last row) x columns [c0, c0 + kc) of w as
 * bf16 pairs: pairs[p] lane i = row r + i's columns c0 + 2p, c0 + 2p + 1; an odd kc's last pair
 * has a zero high half.  Each row's columns first, in one sequential run (16 rows read 32
 * columns at a time, 16 short interleaved runs, were slower), then 16 x 16 transposes. */
static void tile_pairs(const mg_matrix *w, int64_t r, int64_t nr, int64_t c0, int64_t kc, __m512i *pairs) {
    const size_t rb = mg_matrix_row_bytes(w);
    const int fp8 = w->format == MG_FP8_E4M3, block = fp8 && w->scale_kind == MG_SCALE_E8M0_BLOCK128;
    __m512i buf[TR][TP / 16]; /* row-major: row i's pairs, 16 per vector */
    for (int i = 0; i < TR; i++) { /* each row's bytes in one sequential run */
        const int64_t ri = r + (i < nr ? i : nr - 1);
        const uint8_t *row = (const uint8_t *)w->data + (size_t)ri * rb;
        for (int64_t j = 0; j < kc; j += 32) {
            const int64_t n = kc - j < 32 ? kc - j : 32, c = c0 + j;
            /* a row range may start anywhere, so the 16 rows can straddle a 128-row scale block */
            const __m512 s = _mm512_set1_ps(
                block ? mg_e8m0_to_f32(((const uint8_t *)w->scale)[(size_t)(ri / 128) * (size_t)w->scale_cols + (size_t)(c / 128)])
                      : 1.0f);
            if (n == 32) {
                buf[i][j / 32] = fp8 ? row_pairs_fp8(row + c, s) : _mm512_loadu_si512(row + 2 * c);
            } else { /* the last, partial step: through a zero-padded copy of the row's columns */
                uint8_t tmp[64] = {0};
                memcpy(tmp, row + (fp8 ? (size_t)c : 2 * (size_t)c), (size_t)(fp8 ? n : 2 * n));
                buf[i][j / 32] = fp8 ? row_pairs_fp8(tmp, s) : _mm512_loadu_si512(tmp);
            }
        }
    }
    for (int64_t j = 0; j < kc; j += 32) {
        __m512 v[16];
        for (int i = 0; i < TR; i++) v[i] = _mm512_castsi512_ps(buf[i][j / 32]);
        transpose16_ps(v);
        const int64_t n = kc - j < 32 ? kc - j : 32;
        for (int q = 0; q < (n + 1) / 2; q++) pairs[j / 2 + q] = _mm512_castps_si512(v[q]);
    }
}

/* y[t][r + 16h + i] (+)= sum over pairs of tile_h's pair . x[t]'s pair, for T tokens and H (1, 2)
 * tiles; xb: token t's pairs at xb[t * xs + p]; np pairs.  As prefill_avx512.c's micro. */
static inline __attribute__((always_inline)) void micro(const int H, const int T, const __m512i *t0, const __m512i *t1,
                                                        const uint32_t *xb, int64_t xs, int64_t np, float *y, int64_t ys,
                                                        int64_t nr, int first, const __m512 *rs) {
    __m512 a[2][MICRO_TOK];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) a[0][t] = a[1][t] = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        const __m512bh w0 = (__m512bh)_mm512_load_si512(t0 + p);
        const __m512bh w1 = H == 2 ? (__m512bh)_mm512_load_si512(t1 + p) : w0;
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xb[t * xs + p]);
            a[0][t] = _mm512_dpbf16_ps(a[0][t], w0, xv);
            if (H == 2) a[1][t] = _mm512_dpbf16_ps(a[1][t], w1, xv);
        }
    }
    prefill_store(H, T, a, y, ys, nr, first, rs);
}

typedef void micro_fn(const __m512i *t0, const __m512i *t1, const uint32_t *xb, int64_t xs, int64_t np, float *y,
                      int64_t ys, int64_t nr, int first, const __m512 *rs);

/* One out-of-line function per (tiles, tokens), as in prefill_avx512.c. */
#define MICRO_FN(H, T)                                                                                          \
    static __attribute__((noinline)) void micro_bh_##H##_##T(const __m512i *t0, const __m512i *t1,               \
                                                             const uint32_t *xb, int64_t xs, int64_t np, float *y, \
                                                             int64_t ys, int64_t nr, int first, const __m512 *rs) { \
        micro(H, T, t0, t1, xb, xs, np, y, ys, nr, first, rs);                                                  \
    }
#define MICRO_FNS(H)                                                                                             \
    MICRO_FN(H, 1) MICRO_FN(H, 2) MICRO_FN(H, 3) MICRO_FN(H, 4) MICRO_FN(H, 5) MICRO_FN(H, 6) MICRO_FN(H, 7)    \
        MICRO_FN(H, 8) MICRO_FN(H, 9) MICRO_FN(H, 10) MICRO_FN(H, 11) MICRO_FN(H, 12)
MICRO_FNS(1)
MICRO_FNS(2)
#define MICRO_TABLE(H)                                                                                          \
    {NULL, micro_bh_##H##_1, micro_bh_##H##_2, micro_bh_##H##_3, micro_bh_##H##_4, micro_bh_##H##_5,              \
     micro_bh_##H##_6, micro_bh_##H##_7, micro_bh_##H##_8, micro_bh_##H##_9, micro_bh_##H##_10,                  \
     micro_bh_##H##_11, micro_bh_##H##_12}
static micro_fn *const MICRO[2][MICRO_TOK + 1] = {MICRO_TABLE(1), MICRO_TABLE(2)};

/* x's rows rounded to bf16 (nearest even), as pairs: xb[t * xs + p] = bf16(x[t][2p]) |
 * bf16(x[t][2p + 1]) << 16, xs = ceil(cols / 2); an odd last column pairs with zero. */
static void x_pairs(const float *x, int64_t x_stride, int64_t n_tok, int64_t cols, uint32_t *xb, int64_t xs) {
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * x_stride;
        uint16_t *o = (uint16_t *)(xb + t * xs);
        int64_t c = 0;
        for (; c + 16 <= cols; c += 16) _mm256_storeu_si256((__m256i *)(o + c), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(xt + c)));
        if (c < cols) {
            const __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
            _mm256_mask_storeu_epi16(o + c, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, xt + c)));
        }
        if (cols & 1) o[cols] = 0;
    }
}

void mg_avx512bf16_prefill_bf16x(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y,
                                 int64_t y_stride, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols, xs = (cols + 1) / 2;
    uint32_t *xb = takes(w) ? aligned_alloc(64, (((size_t)n_tok * (size_t)xs * 4) + 63) / 64 * 64) : NULL;
    if (!xb) { /* not exact in bf16, or no memory for x's pairs: the exact fp32 tiles need none */
        mg_kernels_avx512bf16()->parent->linear[w->format](w, x, x_stride, n_tok, y, y_stride, r0, r1);
        return;
    }
    x_pairs(x, x_stride, n_tok, cols, xb, xs);
    __m512i pairs[2][TP];
    const int64_t nb = (n_tok + MICRO_TOK - 1) / MICRO_TOK, base = n_tok / nb, extra = n_tok % nb;
    for (int64_t r = r0; r < r1; r += 2 * TR) {
        const int64_t nr = r1 - r < 2 * TR ? r1 - r : 2 * TR;
        const int H = nr > TR ? 2 : 1;
        __m512 rsv[2];
        if (w->scale_kind == MG_SCALE_F32_ROW) prefill_row_scales(w, r, nr, rsv);
        for (int64_t c0 = 0; c0 < cols; c0 += TC) {
            const int64_t kc = cols - c0 < TC ? cols - c0 : TC, np = (kc + 1) / 2;
            tile_pairs(w, r, H == 2 ? TR : nr, c0, kc, pairs[0]);
            if (H == 2) tile_pairs(w, r + TR, nr - TR, c0, kc, pairs[1]);
            const __m512 *rs = c0 + kc == cols && w->scale_kind == MG_SCALE_F32_ROW ? rsv : NULL;
            for (int64_t b = 0, t = 0; b < nb; b++) { /* tokens in even blocks of at most MICRO_TOK */
                const int T = (int)(base + (b < extra));
                MICRO[H - 1][T](pairs[0], pairs[1], xb + t * xs + c0 / 2, xs, np, y + t * y_stride + r, y_stride, nr,
                                c0 == 0, rs);
                t += T;
            }
        }
    }
    free(xb);
}
#endif
