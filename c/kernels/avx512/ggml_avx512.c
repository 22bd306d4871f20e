/* AVX-512 decode (n_tok == 1) for some ggml block formats (GGUF weights); the others, and
 * prefill, stay the avx2 table's (c/kernels/avx2/ggml_avx2.c, whose comment explains the plan:
 * fp32 activations, each sub-block's dot product of codes and x scaled once, K-quant mins
 * through per-32 sums of x).  What 512-bit registers add here:
 *  - 16 code bytes widened to 16 dword lanes by one vpmovzxbd / vpmovsxbd from memory, nibbles
 *    split by a mask and a shift (Q8_0, Q4_0, Q4_K, Q5_K: half the operations per weight of
 *    the AVX2 loop);
 *  - a whole 16-entry fp32 value table in one register, read by one vpermps per 16 codes with
 *    no conversion at all (IQ4_NL, IQ4_XS, MXFP4), where AVX2 needs a byte table, widening and
 *    vcvtdq2ps.
 * Scalar twin: core/ggml_blocks.h through the scalar table; tests/c/test_ggml_blocks.c. */
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "kernels/avx512/ggml_avx512.h"

/* A block of 32's 16 partial sums: values lo (elements 0-15) and hi (16-31) times x0, x1. */
INLINE __m512 dot32(__m512 lo, __m512 hi, __m512 x0, __m512 x1) { return _mm512_fmadd_ps(hi, x1, _mm512_mul_ps(lo, x0)); }

/* Blocks of 32 with an f16 scale at the block's start (Q8_0, Q4_0, IQ4_NL, Q5_0), R (1..4) rows
 * at once: as rows_k4, each row's arithmetic is the same whatever R (the even blocks into acc0,
 * the odd into acc1, the same final sum), R weight streams in flight with a prefetch `ahead` on,
 * and each x load serves the R rows.  One row streamed alone, as these formats had, left a Q8_0
 * token at 0.35 of the read bandwidth, below the AVX2 rows.  A prefetch per block (34 bytes) or
 * per pair of blocks (18 or 22) touches every line of the stream. */
INLINE void rows_32(const int R, mg_format f, const uint8_t *const *p, const float *x, int64_t nb, size_t ahead,
                    float *out) {
    const __m512 tbl = table_f32(f == MG_Q4_0 ? Q4_0_VALUES : MG_IQ4NL_VALUES);
    const size_t bytes = f == MG_Q8_0 ? 34 : f == MG_Q5_0 ? 22 : 18;
    __m512 acc0[4], acc1[4];
    for (int j = 0; j < R; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, x += 32) {
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        for (int j = 0; j < R; j++) {
            const uint8_t *b = p[j] + (size_t)i * bytes;
            if (f == MG_Q8_0 || !(i & 1)) _mm_prefetch((const char *)b + ahead, MG_AVX512_PREFETCH_HINT);
            __m512 lo, hi;
            if (f == MG_Q8_0)
                lo = _mm512_cvtepi32_ps(i8x16(b + 2)), hi = _mm512_cvtepi32_ps(i8x16(b + 18));
            else if (f == MG_Q5_0)
                q5_0_values(b, &lo, &hi);
            else
                nibble_values(b + 2, tbl, &lo, &hi);
            const __m512 part = dot32(lo, hi, x0, x1);
            if (i & 1)
                acc1[j] = _mm512_fmadd_ps(_mm512_set1_ps(f16_at(b)), part, acc1[j]);
            else
                acc0[j] = _mm512_fmadd_ps(_mm512_set1_ps(f16_at(b)), part, acc0[j]);
        }
    }
    for (int j = 0; j < R; j++) out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j]));
}
#define ROWS_Q8_0(R, ...) rows_32(R, MG_Q8_0, __VA_ARGS__)
#define ROWS_Q4_0(R, ...) rows_32(R, MG_Q4_0, __VA_ARGS__)
#define ROWS_Q5_0(R, ...) rows_32(R, MG_Q5_0, __VA_ARGS__)
#define ROWS_IQ4_NL(R, ...) rows_32(R, MG_IQ4_NL, __VA_ARGS__)

INLINE __m256 bytes_times(const uint8_t b[8], float v) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b))),
                         _mm256_set1_ps(v));
}

/* Prefetch of the bytes of one row's block `ahead` on (a later group of rows, rows_ahead). */
INLINE void prefetch_block(const uint8_t *b, size_t bytes, size_t ahead) {
    for (size_t l = 0; l < bytes; l += 64) _mm_prefetch((const char *)b + ahead + l, MG_AVX512_PREFETCH_HINT);
}

/* Q4_K / Q5_K (q5), R (1..4) rows at once (p[j]: row j's blocks): chunk c's byte l holds element l
 * of sub-blocks 2c (low nibble) and 2c + 1 (high); Q5_K's bit 2c (2c + 1) of qh[l] is their fifth
 * bit.  As rows_mxfp4: each row's arithmetic is the same whatever R (so outputs do not depend on
 * how rows are grouped), R weight streams in flight with a prefetch `ahead` on, and each x load
 * serves the R rows (one row streamed alone left a Q4_K_M token at 0.38 of the read bandwidth). */
INLINE void rows_k4(const int R, const uint8_t *const *p, const float *x, const float *xs, int64_t nb, int q5,
                    size_t ahead, float *out) {
    const size_t bytes = q5 ? 176 : 144;
    const __m512 nib = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); /* a code's value */
    __m512 acc0[4], acc1[4];
    __m256 accm[4];
    for (int j = 0; j < R; j++) acc0[j] = acc1[j] = _mm512_setzero_ps(), accm[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, x += 256, xs += 8) {
        float ds[4][8] __attribute__((aligned(32)));
        for (int j = 0; j < R; j++) {
            const uint8_t *b = p[j] + (size_t)i * bytes;
            prefetch_block(b, bytes, ahead);
            uint8_t sc[8], mn[8];
            mg_ggml_k4_scales_mins(b + 4, sc, mn);
            _mm256_store_ps(ds[j], bytes_times(sc, f16_at(b)));
            accm[j] = _mm256_fmadd_ps(bytes_times(mn, f16_at(b + 2)), _mm256_loadu_ps(xs), accm[j]);
        }
        for (int c = 0; c < 4; c++) {
            const __m512 xl0 = _mm512_loadu_ps(x + 64 * c), xl1 = _mm512_loadu_ps(x + 64 * c + 16);
            const __m512 xh0 = _mm512_loadu_ps(x + 64 * c + 32), xh1 = _mm512_loadu_ps(x + 64 * c + 48);
            for (int j = 0; j < R; j++) {
                const uint8_t *b = p[j] + (size_t)i * bytes;
                const uint8_t *qs = b + (q5 ? 48 : 16) + 32 * c, *qh = b + 16;
                __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
                for (int k = 0; k < 2; k++) {
                    const __m512i v = u8x16(qs + 16 * k);
                    __m512 fl, fu;
                    if (q5) {
                        __m512i l, u;
                        q5_k_codes(v, qh + 16 * k, c, &l, &u);
                        fl = _mm512_cvtepi32_ps(l), fu = _mm512_cvtepi32_ps(u);
                    } else { /* nibble_values' vpermps on the widened bytes */
                        fl = _mm512_permutexvar_ps(v, nib), fu = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), nib);
                    }
                    lo = _mm512_fmadd_ps(fl, k ? xl1 : xl0, lo);
                    hi = _mm512_fmadd_ps(fu, k ? xh1 : xh0, hi);
                }
                acc0[j] = _mm512_fmadd_ps(_mm512_set1_ps(ds[j][2 * c]), lo, acc0[j]);
                acc1[j] = _mm512_fmadd_ps(_mm512_set1_ps(ds[j][2 * c + 1]), hi, acc1[j]);
            }
        }
    }
    for (int j = 0; j < R; j++) {
        const __m256 m = accm[j];
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j])) - (m[0] + m[1] + m[2] + m[3] + m[4] + m[5] + m[6] + m[7]);
    }
}

/* IQ4_XS: 8 sub-blocks of 32 (16 nibble bytes each) with scales d * (s - 32); R (1..4) rows at
 * once, as rows_32. */
INLINE void rows_iq4_xs(const int R, const uint8_t *const *p, const float *x, int64_t nb, size_t ahead, float *out) {
    const __m512 tbl = table_f32(MG_IQ4NL_VALUES);
    __m512 acc0[4], acc1[4];
    for (int j = 0; j < R; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, x += 256) {
        float ds[4][8];
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p[r] + (size_t)i * 136;
            prefetch_block(b, 136, ahead);
            const float d = f16_at(b);
            uint16_t sh;
            memcpy(&sh, b + 2, 2);
            for (int j = 0; j < 8; j++)
                ds[r][j] = d * (float)((((b[4 + j / 2] >> (4 * (j & 1))) & 15) | (((sh >> (2 * j)) & 3) << 4)) - 32);
        }
        for (int j = 0; j < 8; j++) {
            const __m512 x0 = _mm512_loadu_ps(x + 32 * j), x1 = _mm512_loadu_ps(x + 32 * j + 16);
            for (int r = 0; r < R; r++) {
                __m512 lo, hi;
                nibble_values(p[r] + (size_t)i * 136 + 8 + 16 * j, tbl, &lo, &hi);
                const __m512 part = dot32(lo, hi, x0, x1);
                if (j & 1)
                    acc1[r] = _mm512_fmadd_ps(_mm512_set1_ps(ds[r][j]), part, acc1[r]);
                else
                    acc0[r] = _mm512_fmadd_ps(_mm512_set1_ps(ds[r][j]), part, acc0[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
}

/* Q6_K, R (1..4) rows at once, as rows_k4: per half h, ql bytes l (A, elements l and 64 + l) and
 * 32 + l (B, elements 32 + l and 96 + l), qh byte l holding the top 2 bits of elements l, 32 + l,
 * 64 + l, 96 + l; each byte widened once to a dword lane.  A scale per 16 elements, one per
 * vector: the block's 16 products d * sc in one vector (the same single rounding as one at a
 * time), broadcast from memory. */
INLINE void rows_q6_k(const int R, const uint8_t *const *p, const float *x, int64_t nb, size_t ahead, float *out) {
    const __m512i m4 = _mm512_set1_epi32(15), m30 = _mm512_set1_epi32(0x30), k32 = _mm512_set1_epi32(32);
    __m512 acc0[4], acc1[4];
    for (int j = 0; j < R; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, x += 256) {
        float ds[4][16] __attribute__((aligned(64)));
        for (int j = 0; j < R; j++) {
            const uint8_t *b = p[j] + (size_t)i * 210;
            prefetch_block(b, 210, ahead);
            _mm512_store_ps(ds[j], _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 208)),
                                                 _mm512_cvtepi32_ps(i8x16(b + 192))));
        }
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 2; k++) {
                __m512 xv[4];
                for (int g = 0; g < 4; g++) xv[g] = _mm512_loadu_ps(x + 128 * h + 32 * g + 16 * k);
                for (int j = 0; j < R; j++) {
                    const uint8_t *b = p[j] + (size_t)i * 210;
                    const __m512i qa = u8x16(b + 64 * h + 16 * k), qb = u8x16(b + 64 * h + 32 + 16 * k);
                    const __m512i qh = u8x16(b + 128 + 32 * h + 16 * k);
                    const __m512i v[4] = {
                        _mm512_or_si512(_mm512_and_si512(qa, m4), _mm512_and_si512(_mm512_slli_epi32(qh, 4), m30)),
                        _mm512_or_si512(_mm512_and_si512(qb, m4), _mm512_and_si512(_mm512_slli_epi32(qh, 2), m30)),
                        _mm512_or_si512(_mm512_srli_epi32(qa, 4), _mm512_and_si512(qh, m30)),
                        _mm512_or_si512(_mm512_srli_epi32(qb, 4), _mm512_and_si512(_mm512_srli_epi32(qh, 2), m30))};
                    for (int g = 0; g < 4; g++) { /* elements 128h + 32g + 16k .. + 16: scale 8h + 2g + k */
                        const __m512 part = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(v[g], k32)), xv[g]);
                        const __m512 sv = _mm512_set1_ps(ds[j][8 * h + 2 * g + k]);
                        if (g & 1)
                            acc1[j] = _mm512_fmadd_ps(sv, part, acc1[j]);
                        else
                            acc0[j] = _mm512_fmadd_ps(sv, part, acc0[j]);
                    }
                }
            }
    }
    for (int j = 0; j < R; j++) out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j]));
}

/* MXFP4, R (1..4) rows at once, as rows_32 (each row's arithmetic the same whatever R; R weight
 * streams in flight, each x load shared by the R rows, a prefetch `ahead` on: one row streamed
 * alone ran at 0.3-0.7 of the read bandwidth, DeepSeek-V4 GGUF experts, 1 thread).  The scale
 * is read from MG_E8M0_HALF. */
INLINE void rows_mxfp4(const int R, const uint8_t *const *p, const float *x, int64_t nb, size_t ahead, float *out) {
    const __m512 tbl = table_f32(MG_MXFP4_VALUES2);
    __m512 a0[4], a1[4];
    for (int j = 0; j < R; j++) a0[j] = a1[j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, x += 64) {
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        const __m512 x2 = _mm512_loadu_ps(x + 32), x3 = _mm512_loadu_ps(x + 48);
        for (int j = 0; j < R; j++) {
            const uint8_t *b = p[j] + 17 * i;
            _mm_prefetch((const char *)b + ahead, MG_AVX512_PREFETCH_HINT);
            __m512 el, eh, ol, oh;
            nibble_values(b + 1, tbl, &el, &eh);
            nibble_values(b + 18, tbl, &ol, &oh);
            const __m512 e = dot32(el, eh, x0, x1), o = dot32(ol, oh, x2, x3);
            a0[j] = _mm512_fmadd_ps(_mm512_set1_ps(MG_E8M0_HALF[b[0]]), e, a0[j]);
            a1[j] = _mm512_fmadd_ps(_mm512_set1_ps(MG_E8M0_HALF[b[17]]), o, a1[j]);
        }
    }
    if (i < nb) { /* an odd last block: an even index, so acc0 as in rows_32 */
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        for (int j = 0; j < R; j++) {
            const uint8_t *b = p[j] + 17 * i;
            __m512 el, eh;
            nibble_values(b + 1, tbl, &el, &eh);
            const __m512 e = dot32(el, eh, x0, x1);
            a0[j] = _mm512_fmadd_ps(_mm512_set1_ps(MG_E8M0_HALF[b[0]]), e, a0[j]);
        }
    }
    for (int j = 0; j < R; j++) out[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
}

/* Columns per pass: the per-32 sums of x of one pass fit a stack array. */
enum { GGML_PASS_COLS = 65536 };

int mg_avx512_decode_ggml(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1) {
    const mg_format f = w->format;
    if (!(mg_format_is_ggml_block(f) && f <= MG_IQ4_XS)) return 0; /* the newer formats: the parent's */
    int64_t e, bytes;
    mg_format_block(f, &e, &bytes);
    const int mins = f == MG_Q4_K || f == MG_Q5_K;
    const size_t rb = mg_matrix_row_bytes(w);
    float xs[GGML_PASS_COLS / 32] __attribute__((aligned(64)));
    for (int64_t c0 = 0; c0 < w->cols; c0 += GGML_PASS_COLS) {
        const int64_t kc = w->cols - c0 < GGML_PASS_COLS ? w->cols - c0 : GGML_PASS_COLS;
        if (mins)
            for (int64_t g = 0; g < kc / 32; g++) {
                const float *xg = x + c0 + 32 * g;
                xs[g] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(xg), _mm512_loadu_ps(xg + 16)));
            }
        for (int64_t r = r0, n; r < r1; r += n) {
            const uint8_t *p = (const uint8_t *)w->data + (size_t)r * rb + (size_t)(c0 / e * bytes);
            const int64_t nb = kc / e;
            n = r1 - r < 4 ? r1 - r : 4; /* up to four rows per pass */
            const uint8_t *ps[4];
            float parts[4];
            for (int64_t j = 0; j < n; j++) ps[j] = p + (size_t)j * rb;
            switch (f) {
            case MG_MXFP4: MG_ROWS_CALL(n, rb, parts, rows_mxfp4, ps, x + c0, nb); break;
            case MG_Q6_K: MG_ROWS_CALL(n, rb, parts, rows_q6_k, ps, x + c0, nb); break;
            case MG_Q4_K:
            case MG_Q5_K: MG_ROWS_CALL(n, rb, parts, rows_k4, ps, x + c0, xs, nb, f == MG_Q5_K); break;
            case MG_IQ4_XS: MG_ROWS_CALL(n, rb, parts, rows_iq4_xs, ps, x + c0, nb); break;
            case MG_Q8_0: MG_ROWS_CALL(n, rb, parts, ROWS_Q8_0, ps, x + c0, nb); break;
            case MG_Q4_0: MG_ROWS_CALL(n, rb, parts, ROWS_Q4_0, ps, x + c0, nb); break;
            case MG_Q5_0: MG_ROWS_CALL(n, rb, parts, ROWS_Q5_0, ps, x + c0, nb); break;
            default: MG_ROWS_CALL(n, rb, parts, ROWS_IQ4_NL, ps, x + c0, nb); break;
            }
            for (int64_t j = 0; j < n; j++) y[r + j] = c0 == 0 ? parts[j] : y[r + j] + parts[j];
        }
    }
    return 1;
}
#endif
