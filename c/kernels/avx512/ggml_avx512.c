/* AVX-512 decode (n_tok == 1) for some ggml block formats (GGUF weights); the others, and
 * prefill, stay the avx2 table's (c/kernels/avx2/ggml_avx2.c, whose comment explains the plan:
 * fp32 activations, each sub-block's dot product of codes and x scaled once, K-quant mins
 * through per-32 sums of x).  What 512-bit registers add here:
 *  - the 256-element blocks (Q4_K, Q5_K, Q6_K, IQ4_XS, Q2_K, Q3_K): 64 code bytes as 16 dword
 *    lanes, each shifted in place, against x arranged once per call in that lane order
 *    (lane_order): no widening, and no conversion where a table gives the values;
 *  - the blocks of 32 (17-34 bytes, which do not fit 64-byte lanes): 16 code bytes widened to
 *    16 dword lanes by one vpmovzxbd / vpmovsxbd from memory, nibbles split by a mask and a
 *    shift (Q8_0, Q4_0: half the operations per weight of the AVX2 loop);
 *  - a whole 16-entry fp32 value table in one register, read by one vpermps per 16 codes with
 *    no conversion at all (IQ4_NL, IQ4_XS, MXFP4, Q4_K, Q2_K, Q3_K), where AVX2 needs a byte
 *    table, widening and vcvtdq2ps.
 * Scalar twin: core/ggml_blocks.h through the scalar table; tests/c/test_ggml_blocks.c. */
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "kernels/avx512/ggml_avx512.h"

/* A block of 32's 16 partial sums: values lo (elements 0-15) and hi (16-31) times x0, x1. */
INLINE __m512 dot32(__m512 lo, __m512 hi, __m512 x0, __m512 x1) { return _mm512_fmadd_ps(hi, x1, _mm512_mul_ps(lo, x0)); }

/* The f16 scales at the start of n (1..16) blocks `bytes` apart from b, as floats into s (and,
 * when m is not NULL, the f16 mins that follow them into m): one masked gather (4 bytes a block:
 * the scale and two more bytes, inside the block) and one conversion per 16 blocks, where each
 * block took a scalar load, a vcvtph2ps and a broadcast. */
INLINE void block_scales16(const uint8_t *b, __m512i offsets, int n, float *s, float *m) {
    const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), (__mmask16)((1u << n) - 1), offsets, b, 1);
    _mm512_store_ps(s, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));
    if (m) _mm512_store_ps(m, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))));
}

/* Blocks of 32 with an f16 scale at the block's start (Q8_0, Q4_0, IQ4_NL, Q5_0; Q4_1 and Q5_1
 * with an f16 min after it), R (1..4) rows at once: as rows_k4, each row's arithmetic is the same
 * whatever R (the even blocks into acc0, the odd into acc1, the same final sum), R weight streams
 * in flight with a prefetch `ahead` on, and each x load serves the R rows.  One row streamed
 * alone, as these formats had, left a Q8_0 token at 0.35 of the read bandwidth, below the AVX2
 * rows.  A prefetch per block (34 bytes) or per pair of blocks (18-24) touches every line of the
 * stream.  The scales of 16 blocks at a time come from block_scales16 and are broadcast from
 * memory.  The fifth bits of Q5_0 and Q5_1 are mask registers (nibble5_values); the mins of Q4_1
 * and Q5_1 are m * (sum of the block's x), the sum shared by the R rows. */
INLINE void rows_32(const int R, mg_format f, const uint8_t *const *p, const float *x, int64_t nb, size_t ahead,
                    float *out) {
    const int with_min = f == MG_Q4_1 || f == MG_Q5_1;
    const __m512 tbl = nibble_table(f);
    const size_t bytes = f == MG_Q8_0 ? 34 : f == MG_Q5_0 ? 22 : f == MG_Q4_1 ? 20 : f == MG_Q5_1 ? 24 : 18;
    const size_t qs = mg_ggml_qs_at(f);
    const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)bytes));
    float scales[4][16] __attribute__((aligned(64))), mins[4][16] __attribute__((aligned(64)));
    __m512 acc0[4], acc1[4], accm[4];
    for (int j = 0; j < R; j++) acc0[j] = acc1[j] = accm[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, x += 32) {
        if (!(i & 15))
            for (int j = 0; j < R; j++)
                block_scales16(p[j] + (size_t)i * bytes, offsets, nb - i < 16 ? (int)(nb - i) : 16, scales[j],
                               with_min ? mins[j] : NULL);
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        const __m512 xsum = with_min ? _mm512_add_ps(x0, x1) : x0;
        for (int j = 0; j < R; j++) {
            const uint8_t *b = p[j] + (size_t)i * bytes;
            if (f == MG_Q8_0 || !(i & 1)) _mm_prefetch((const char *)b + ahead, MG_AVX512_PREFETCH_HINT);
            __m512 lo, hi;
            if (f == MG_Q8_0) {
                lo = _mm512_cvtepi32_ps(i8x16(b + 2)), hi = _mm512_cvtepi32_ps(i8x16(b + 18));
            } else if (f == MG_Q5_0 || f == MG_Q5_1) {
                uint32_t qh;
                memcpy(&qh, b + qs - 4, 4);
                nibble5_values(b + qs, qh, tbl, &lo, &hi);
            } else {
                nibble_values(b + qs, tbl, &lo, &hi);
            }
            const __m512 part = dot32(lo, hi, x0, x1), d = _mm512_set1_ps(scales[j][i & 15]);
            if (i & 1)
                acc1[j] = _mm512_fmadd_ps(d, part, acc1[j]);
            else
                acc0[j] = _mm512_fmadd_ps(d, part, acc0[j]);
            if (with_min) accm[j] = _mm512_fmadd_ps(_mm512_set1_ps(mins[j][i & 15]), xsum, accm[j]);
        }
    }
    for (int j = 0; j < R; j++)
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j])) + (with_min ? _mm512_reduce_add_ps(accm[j]) : 0.0f);
}
#define ROWS_Q8_0(R, ...) rows_32(R, MG_Q8_0, __VA_ARGS__)
#define ROWS_Q4_0(R, ...) rows_32(R, MG_Q4_0, __VA_ARGS__)
#define ROWS_Q5_0(R, ...) rows_32(R, MG_Q5_0, __VA_ARGS__)
#define ROWS_IQ4_NL(R, ...) rows_32(R, MG_IQ4_NL, __VA_ARGS__)
#define ROWS_Q4_1(R, ...) rows_32(R, MG_Q4_1, __VA_ARGS__)
#define ROWS_Q5_1(R, ...) rows_32(R, MG_Q5_1, __VA_ARGS__)

INLINE __m256 bytes_times(const uint8_t b[8], float v) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b))),
                         _mm256_set1_ps(v));
}

/* The halves of a block (g or h: the 128 elements of one 64-byte code vector) fully unrolled:
 * each shift and factor lane map is then a constant.  gcc, left to itself, kept some of these
 * loops rolled: unrolled, Q5_K ran 1.1x and Q4_K 1.05x the weight GB/s in L2 (docs/KERNELS.md). */
#define UNROLL2 _Pragma("GCC unroll 2")

/* Prefetch of the bytes of one row's block `ahead` on (a later group of rows, rows_ahead). */
INLINE void prefetch_block(const uint8_t *b, size_t bytes, size_t ahead) {
    for (size_t l = 0; l < bytes; l += 64) _mm_prefetch((const char *)b + ahead + l, MG_AVX512_PREFETCH_HINT);
}

/* 64 code bytes at p in a register: an empty asm keeps the compiler from folding the load into
 * each of the eight shifts that read it, since a 64-byte load at a block's offset mostly spans
 * two cache lines, and eight such split loads cost more than the shifts. */
INLINE __m512i codes64(const uint8_t *p) {
    __m512i v = _mm512_loadu_si512((const void *)p);
    __asm__("" : "+v"(v));
    return v;
}

/* x in the lane order of rows_k4, rows_q6_k, rows_iq4_xs, rows_q2_k and rows_q3_k, arranged once per call
 * and read by every row: those loops take 64 code bytes as 16 dword lanes and shift each dword
 * in place, so lane j of their vector (n, b) (n: a byte's nibble, or its 2-bit field, b: the
 * byte of the dword) holds the code of element
 *     64 nn g + n * n_stride + (j / 8) * lane_stride + (j % 8 / 4) * pair + 4 * (j % 4) + b
 * of the group g of 64 nn elements (nn fields per byte); xp holds, for each g, n in 0..nn-1 and
 * b in 0..3, those 16 elements of x.  (nn, n_stride, lane_stride, pair): Q4_K and Q5_K
 * (2, 32, 64, 16), Q6_K (2, 64, 32, 16), IQ4_XS (2, 16, 64, 32), Q2_K and Q3_K (4, 32, 128, 16). */
INLINE void lane_order(const float *x, int64_t cols, int nn, int n_stride, int lane_stride, int pair, float *xp) {
    for (int b = 0; b < 4; b++) {
        const __m512i idx = _mm512_setr_epi32(b, 4 + b, 8 + b, 12 + b, 16 + b, 20 + b, 24 + b, 28 + b, b, 4 + b,
                                              8 + b, 12 + b, 16 + b, 20 + b, 24 + b, 28 + b);
        for (int64_t g = 0; g < cols; g += 64 * nn)
            for (int n = 0; n < nn; n++) {
                const float *w = x + g + n * n_stride, *u = w + lane_stride;
                const __m512 lo = _mm512_permutex2var_ps(_mm512_loadu_ps(w), idx, _mm512_loadu_ps(w + pair));
                const __m512 hi = _mm512_permutex2var_ps(_mm512_loadu_ps(u), idx, _mm512_loadu_ps(u + pair));
                _mm512_storeu_ps(xp + g + 16 * (4 * n + b), _mm512_mask_blend_ps(0xff00, lo, hi));
            }
    }
}

/* The factors of a lane-order vector: lane j takes ds[first + runs[j]], where runs maps lanes to
 * their sub-blocks (or scales) within the group. */
INLINE __m512 lane_factors(__m512 ds, __m512i runs, int first) {
    return _mm512_permutexvar_ps(_mm512_add_epi32(runs, _mm512_set1_epi32(first)), ds);
}
#define HALVES_2APART _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2)
#define RUNS_OF_4 _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
#define PAIRS_8APART _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 8, 8, 8, 8, 9, 9, 9, 9)

/* Q4_K / Q5_K (q5), R (1..4) rows at once (p[j]: row j's blocks): chunk c's byte l holds element l
 * of sub-blocks 2c (low nibble) and 2c + 1 (high); Q5_K's bit s of qh[l] is the fifth bit of
 * element l of sub-block s.  As rows_q6_k: the 64 bytes of chunks 2g and 2g + 1 are taken as 16
 * dwords, so lane j of vector (n, b) (a shift by 8 b + 4 n) holds the code of element
 * 64 (j / 8) + 32 n + 4 (j % 8) + b of the group (x in lane_order), of sub-block
 * 4g + 2 (j / 8) + n for every b: the four products b go into one vector, then one FMA with their
 * factors d * sc, and the mins go through the per-32 sums of x.
 *  - Q4_K: vpermps from the table 0..15 reads an index's low 4 bits, so the shifted dword is the
 *    index as it is;
 *  - Q5_K: qh as the dwords [qh >> 4g, qh >> (4g + 2)] (the fifth bits of sub-blocks 4g, 4g + 1 in
 *    lanes 0-7, of 4g + 2, 4g + 3 in lanes 8-15, at bits 0 and 1 of each byte); one vpternlogd per
 *    nibble puts every byte's 5-bit code in its bits 0-4, and vpermt2ps from the table 0..31 in
 *    two registers reads an index's low 5 bits.
 * No widening and no conversion: against the loops that widened 16 code bytes at a time, Q4_K
 * 1.05x and Q5_K 1.45x the weight GB/s in L2 on a Sapphire Rapids-class core (docs/KERNELS.md).
 * Each row's arithmetic is the same whatever R (outputs do not depend on how rows are grouped),
 * R weight streams in flight with a prefetch `ahead` on, and each x load serves the R rows. */
INLINE void rows_k4(const int R, const uint8_t *const *p, const float *xp, const float *xs, int64_t nb, int q5,
                    size_t ahead, float *out) {
    const size_t bytes = q5 ? 176 : 144, qs = q5 ? 48 : 16;
    const __m512i nibbles = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), /* a code's value */
        values16 = _mm512_add_ps(values, _mm512_set1_ps(16));
    __m512 acc0[4], acc1[4];
    __m256 accm[4];
    for (int j = 0; j < R; j++) acc0[j] = acc1[j] = _mm512_setzero_ps(), accm[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xp += 256, xs += 8) {
        __m512 ds[4];
        for (int j = 0; j < R; j++) {
            const uint8_t *b = p[j] + (size_t)i * bytes;
            prefetch_block(b, bytes, ahead);
            uint8_t sc[8], mn[8];
            mg_ggml_k4_scales_mins(b + 4, sc, mn);
            ds[j] = _mm512_castps256_ps512(bytes_times(sc, f16_at(b)));
            accm[j] = _mm256_fmadd_ps(bytes_times(mn, f16_at(b + 2)), _mm256_loadu_ps(xs), accm[j]);
        }
        UNROLL2 for (int g = 0; g < 2; g++) {
            __m512 xv[8];
            for (int v = 0; v < 8; v++) xv[v] = _mm512_loadu_ps(xp + 128 * g + 16 * v);
            for (int j = 0; j < R; j++) {
                const uint8_t *b = p[j] + (size_t)i * bytes;
                const __m512i ql = codes64(b + qs + 64 * g);
                __m512i codes[2] = {ql, _mm512_srli_epi32(ql, 4)};
                if (q5) {
                    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
                    const __m512i top = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi32(qh, 4 * g)),
                                                           _mm256_srli_epi32(qh, 4 * g + 2), 1);
                    codes[0] = _mm512_ternarylogic_epi32(nibbles, codes[0], _mm512_slli_epi32(top, 4), 0xca);
                    codes[1] = _mm512_ternarylogic_epi32(nibbles, codes[1], _mm512_slli_epi32(top, 3), 0xca);
                }
                for (int n = 0; n < 2; n++) {
                    __m512 part = _mm512_setzero_ps();
                    for (int k = 0; k < 4; k++) {
                        const __m512i c = k ? _mm512_srli_epi32(codes[n], 8 * k) : codes[n];
                        const __m512 v = q5 ? _mm512_permutex2var_ps(values, c, values16) : _mm512_permutexvar_ps(c, values);
                        part = k ? _mm512_fmadd_ps(v, xv[4 * n + k], part) : _mm512_mul_ps(v, xv[4 * n]);
                    }
                    const __m512 f = lane_factors(ds[j], HALVES_2APART, 4 * g + n);
                    if (n)
                        acc1[j] = _mm512_fmadd_ps(f, part, acc1[j]);
                    else
                        acc0[j] = _mm512_fmadd_ps(f, part, acc0[j]);
                }
            }
        }
    }
    for (int j = 0; j < R; j++) {
        const __m256 m = accm[j];
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j])) - (m[0] + m[1] + m[2] + m[3] + m[4] + m[5] + m[6] + m[7]);
    }
}

/* IQ4_XS: 8 sub-blocks of 32 (16 nibble bytes each: element l the low nibble of byte l, 16 + l
 * its high nibble) with scales d * (s - 32); R (1..4) rows at once.  As rows_k4: the 64 bytes
 * of sub-blocks 4g .. 4g + 3 as 16 dwords shifted in place, lane j of vector (n, b) the code of
 * element 32 (j / 4) + 16 n + 4 (j % 4) + b of the group (x in lane_order), made fp32 by vpermps
 * from the value table.  Both nibbles of a lane belong to sub-block 4g + j / 4, so all eight
 * products of a group go into one vector and one FMA with its factors finishes them.  Each row's
 * arithmetic the same whatever R. */
INLINE void rows_iq4_xs(const int R, const uint8_t *const *p, const float *xp, int64_t nb, size_t ahead, float *out) {
    const __m512 tbl = table_f32(MG_IQ4NL_VALUES);
    const __m256i sl_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), sh_shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    __m512 acc0[4], acc1[4];
    for (int j = 0; j < R; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xp += 256) {
        __m512 ds[4];
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p[r] + (size_t)i * 136;
            prefetch_block(b, 136, ahead);
            /* sub-block j's 6-bit scale: bits 4j..4j+3 of the u32 scales_l, bits 2j, 2j + 1 of
             * the u16 scales_h on top; lane j of a vector, shifted by vpsrlvd */
            uint32_t lo, hi;
            memcpy(&lo, b + 4, 4);
            memcpy(&hi, b + 2, 4); /* scales_h in the low half (the rest is shifted out or masked) */
            const __m256i sl = _mm256_srlv_epi32(_mm256_set1_epi32((int)lo), sl_shift),
                          shv = _mm256_srlv_epi32(_mm256_set1_epi32((int)hi), sh_shift);
            const __m256i sc = _mm256_or_si256(_mm256_and_si256(sl, _mm256_set1_epi32(15)),
                                               _mm256_slli_epi32(_mm256_and_si256(shv, _mm256_set1_epi32(3)), 4));
            ds[r] = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(f16_at(b)),
                                                         _mm256_cvtepi32_ps(_mm256_sub_epi32(sc, _mm256_set1_epi32(32)))));
        }
        UNROLL2 for (int g = 0; g < 2; g++) {
            __m512 xv[8];
            for (int v = 0; v < 8; v++) xv[v] = _mm512_loadu_ps(xp + 128 * g + 16 * v);
            for (int r = 0; r < R; r++) {
                const __m512i q = codes64(p[r] + (size_t)i * 136 + 8 + 64 * g), codes[2] = {q, _mm512_srli_epi32(q, 4)};
                __m512 part = _mm512_setzero_ps();
                for (int n = 0; n < 2; n++)
                    for (int k = 0; k < 4; k++) {
                        const __m512 v = _mm512_permutexvar_ps(k ? _mm512_srli_epi32(codes[n], 8 * k) : codes[n], tbl);
                        part = n || k ? _mm512_fmadd_ps(v, xv[4 * n + k], part) : _mm512_mul_ps(v, xv[0]);
                    }
                const __m512 fac = lane_factors(ds[r], RUNS_OF_4, 4 * g);
                if (g)
                    acc1[r] = _mm512_fmadd_ps(fac, part, acc1[r]);
                else
                    acc0[r] = _mm512_fmadd_ps(fac, part, acc0[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
}

/* Q6_K, R (1..4) rows at once: per half h, ql byte l holds the low 4 bits of elements l (low
 * nibble) and 64 + l (high), ql byte 32 + l those of 32 + l and 96 + l; qh byte l the top 2 bits
 * of l, 32 + l, 64 + l, 96 + l (bits 0-1, 2-3, 4-5, 6-7).  The half's 64 ql bytes are taken as
 * 16 dwords, its 32 qh bytes as the dwords [qh, qh >> 2] (so that lanes 8-15, the ql bytes
 * 32 + l, find their elements' top bits where lanes 0-7 do).  One vpternlogd per nibble n puts
 * every byte's whole 6-bit code in its bits 0-5; then per byte b one vpternlogd that sets those
 * 6 bits, where they are (bits 8b..8b+5), under the exponent of 2^(23 - 8b), and one
 * subtraction of 2^(23 - 8b) + 32 give code - 32 exactly (byte 3, whose bits overlap the
 * exponent, shifted down first): no widening, no conversion, one shift per 64 weights where
 * there were three.  Lane j of vector (n, b) belongs to element
 * 64 n + 32 (j / 8) + 4 (j % 8) + b of the half (x in lane_order) and to scale 8 h + 4 n + j / 4
 * for every b, so the four products b go into one vector, then one FMA with their factors d * sc
 * (the block's 16 products in one vector: the scalar's rounding).  As rows_k4 otherwise: each row's arithmetic
 * the same whatever R, R weight streams with a prefetch `ahead` on, each x load shared by the R
 * rows.  Against the loop that widened 16 code bytes at a time (three vpmovzxbd, four
 * conversions and four subtractions per 64 weights), 1.6x the weight GB/s in L2 and 1.3x from
 * memory on a Sapphire Rapids-class core (docs/KERNELS.md). */
INLINE void rows_q6_k(const int R, const uint8_t *const *p, const float *xp, int64_t nb, size_t ahead, float *out) {
    const __m512i nibbles = _mm512_set1_epi32(0x0f0f0f0f);
    /* for k = 0, 1, 2: bits 8k..8k+5, the exponent of 2^(23 - 8k), and 2^(23 - 8k) + 32 */
    const __m512i low6[3] = {_mm512_set1_epi32(63), _mm512_set1_epi32(63 << 8), _mm512_set1_epi32(63 << 16)},
                  exponent[3] = {_mm512_set1_epi32(150 << 23), _mm512_set1_epi32(142 << 23), _mm512_set1_epi32(134 << 23)};
    const __m512 bias[3] = {_mm512_set1_ps(8388608.0f + 32.0f), _mm512_set1_ps(32768.0f + 32.0f), _mm512_set1_ps(128.0f + 32.0f)};
    __m512 acc0[4], acc1[4];
    for (int j = 0; j < R; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xp += 256) {
        __m512 ds[4];
        for (int j = 0; j < R; j++) {
            const uint8_t *b = p[j] + (size_t)i * 210;
            prefetch_block(b, 210, ahead);
            ds[j] = _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 208)), _mm512_cvtepi32_ps(i8x16(b + 192)));
        }
        UNROLL2 for (int h = 0; h < 2; h++) {
            __m512 xv[8];
            for (int v = 0; v < 8; v++) xv[v] = _mm512_loadu_ps(xp + 128 * h + 16 * v);
            for (int j = 0; j < R; j++) {
                const uint8_t *b = p[j] + (size_t)i * 210;
                const __m512i ql = codes64(b + 64 * h);
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
                const __m512i top = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi32(qh, 2), 1);
                /* each byte's two codes: bits 0-3 from ql's nibble n, 4-5 from top's bits 4n..4n+1 */
                const __m512i codes[2] = {_mm512_ternarylogic_epi32(nibbles, ql, _mm512_slli_epi32(top, 4), 0xca),
                                          _mm512_ternarylogic_epi32(nibbles, _mm512_srli_epi32(ql, 4), top, 0xca)};
                for (int n = 0; n < 2; n++) {
                    __m512 part = _mm512_setzero_ps();
                    for (int k = 0; k < 4; k++) {
                        /* byte k's 6 bits where they are (bits 8k..8k+5, inside the mantissa for
                         * k < 3) under the exponent of 2^(23 - 8k): the float 2^(23 - 8k) + code,
                         * minus 2^(23 - 8k) + 32; byte 3 shifted down first, as its bits overlap
                         * the exponent */
                        const int at = k < 3 ? k : 0;
                        const __m512i c = k < 3 ? codes[n] : _mm512_srli_epi32(codes[n], 24);
                        const __m512 v = _mm512_sub_ps(
                            _mm512_castsi512_ps(_mm512_ternarylogic_epi32(c, low6[at], exponent[at], 0xea)), bias[at]);
                        part = k ? _mm512_fmadd_ps(v, xv[4 * n + k], part) : _mm512_mul_ps(v, xv[4 * n]);
                    }
                    const __m512 f = lane_factors(ds[j], RUNS_OF_4, 8 * h + 4 * n);
                    if (n)
                        acc1[j] = _mm512_fmadd_ps(f, part, acc1[j]);
                    else
                        acc0[j] = _mm512_fmadd_ps(f, part, acc0[j]);
                }
            }
        }
    }
    for (int j = 0; j < R; j++) out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j]));
}

/* Q2_K and Q3_K: bits 2s, 2s + 1 of qs byte 32h + l are the low 2 bits of element 128h + 32s + l;
 * Q3_K's bit 4h + s of hmask byte l is its third (clear: minus 4).  As rows_k4: the 64 qs bytes
 * are taken as 16 dwords, so lane j of vector (s, b) (a shift by 2s + 8b) holds the code of
 * element 128 (j / 8) + 32 s + 4 (j % 8) + b (x in lane_order) of sub-block
 * 8 (j / 8) + 2 s + (j % 8) / 4 for every b: four products b into one vector, then one FMA with
 * their factors d * sc.  vpermps reads an index's low 4 bits, so the shifted dword indexes a
 * table as it is (Q2_K: i & 3).  Against the avx2 rows these formats took (widened bytes, a
 * conversion per 8 codes), no widening and no conversion (docs/KERNELS.md).  Each row's
 * arithmetic is the same whatever R, R weight streams in flight with a prefetch `ahead` on, each
 * x load serves the R rows. */
/* The products of one vector group s of a row: the four vectors b of the shifted dword codes
 * (a shift by first + 8b) through tbl, times x's vectors xv[0..3], summed. */
INLINE __m512 k23_part(__m512i codes, int first, __m512 tbl, const __m512 *xv) {
    __m512 part = _mm512_mul_ps(_mm512_permutexvar_ps(first ? _mm512_srli_epi32(codes, first) : codes, tbl), xv[0]);
    for (int k = 1; k < 4; k++) part = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(codes, first + 8 * k), tbl), xv[k], part);
    return part;
}

/* Q2_K, R (1..4) rows at once (layout above); the mins dmin * m of the 16 sub-blocks go
 * through x's sums per 16 columns (xs). */
INLINE void rows_q2_k(const int R, const uint8_t *const *p, const float *xp, const float *xs, int64_t nb, size_t ahead,
                      float *out) {
    const __m512 tbl = _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3); /* i & 3 */
    __m512 acc0[4], acc1[4], accm[4];
    for (int j = 0; j < R; j++) acc0[j] = acc1[j] = accm[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xp += 256, xs += 16) {
        __m512 ds[4];
        for (int j = 0; j < R; j++) {
            const uint8_t *b = p[j] + (size_t)i * 84;
            prefetch_block(b, 84, ahead);
            const __m512i sc = u8x16(b); /* scales[16]: the low nibble d's factor, the high nibble the min's */
            ds[j] = _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 80)), _mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(15))));
            const __m512 m = _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 82)), _mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4)));
            accm[j] = _mm512_fmadd_ps(m, _mm512_loadu_ps(xs), accm[j]);
        }
        UNROLL2 for (int g = 0; g < 2; g++) { /* s = 2g, 2g + 1 */
            __m512 xv[8];
            for (int v = 0; v < 8; v++) xv[v] = _mm512_loadu_ps(xp + 128 * g + 16 * v);
            for (int j = 0; j < R; j++) {
                const __m512i q = codes64(p[j] + (size_t)i * 84 + 16);
                acc0[j] = _mm512_fmadd_ps(lane_factors(ds[j], PAIRS_8APART, 4 * g), k23_part(q, 4 * g, tbl, xv), acc0[j]);
                acc1[j] = _mm512_fmadd_ps(lane_factors(ds[j], PAIRS_8APART, 4 * g + 2), k23_part(q, 4 * g + 2, tbl, xv + 4),
                                          acc1[j]);
            }
        }
    }
    for (int j = 0; j < R; j++) out[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[j], acc1[j])) - _mm512_reduce_add_ps(accm[j]);
}

/* Q3_K, R (1..4) rows at once (layout above): hmask as the dwords [hm, hm >> 4] (lanes 8-15,
 * half 1, find their bits where lanes 0-7 find half 0's), moved to bit 2 of every byte and
 * merged under the 2-bit fields of qs >> 2s by one vpternlogd per s; then the table
 * (i & 7) - 4, whose bit 3 is don't-care. */
INLINE void rows_q3_k(const int R, const uint8_t *const *p, const float *xp, int64_t nb, size_t ahead, float *out) {
    const __m512i low2 = _mm512_set1_epi32(0x03030303);
    const __m512 tbl = _mm512_setr_ps(-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3);
    __m512 acc0[4], acc1[4];
    for (int j = 0; j < R; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xp += 256) {
        __m512 ds[4];
        for (int j = 0; j < R; j++) {
            const uint8_t *b = p[j] + (size_t)i * 110;
            prefetch_block(b, 110, ahead);
            ds[j] = _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 108)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q3_k_scales(b + 96))));
        }
        UNROLL2 for (int g = 0; g < 2; g++) { /* s = 2g, 2g + 1 */
            __m512 xv[8];
            for (int v = 0; v < 8; v++) xv[v] = _mm512_loadu_ps(xp + 128 * g + 16 * v);
            for (int j = 0; j < R; j++) {
                const uint8_t *b = p[j] + (size_t)i * 110;
                const __m512i q = codes64(b + 32);
                const __m256i hm = _mm256_loadu_si256((const __m256i *)b);
                const __m512i top = _mm512_inserti64x4(_mm512_castsi256_si512(hm), _mm256_srli_epi32(hm, 4), 1);
                /* bits 0-1 from qs >> 2s, bit 2 from top's bit s: s = 2g (shift top left 2 or
                 * right 0), s = 2g + 1 (left 1 or right 1) */
                const __m512i c0 = _mm512_ternarylogic_epi32(low2, g ? _mm512_srli_epi32(q, 4) : q,
                                                             g ? top : _mm512_slli_epi32(top, 2), 0xca);
                const __m512i c1 = _mm512_ternarylogic_epi32(low2, _mm512_srli_epi32(q, 4 * g + 2),
                                                             g ? _mm512_srli_epi32(top, 1) : _mm512_slli_epi32(top, 1), 0xca);
                acc0[j] = _mm512_fmadd_ps(lane_factors(ds[j], PAIRS_8APART, 4 * g), k23_part(c0, 0, tbl, xv), acc0[j]);
                acc1[j] = _mm512_fmadd_ps(lane_factors(ds[j], PAIRS_8APART, 4 * g + 2), k23_part(c1, 0, tbl, xv + 4), acc1[j]);
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

/* Columns per pass: the per-32 sums of x of one pass fit a stack array, and so does x in
 * lane_order for Q4_K, Q5_K, Q6_K, IQ4_XS, Q2_K and Q3_K (and Q2_K's sums per 16). */
enum { GGML_PASS_COLS = 65536, LANE_PASS_COLS = 8192 };

int mg_avx512_decode_ggml(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1) {
    const mg_format f = w->format;
    const int k23 = f == MG_Q2_K || f == MG_Q3_K;
    if (!(mg_format_is_ggml_block(f) && (f <= MG_Q5_1 || k23))) return 0; /* the others: the parent's */
    int64_t e, bytes;
    mg_format_block(f, &e, &bytes);
    const int mins = f == MG_Q4_K || f == MG_Q5_K, lanes = mins || k23 || f == MG_Q6_K || f == MG_IQ4_XS;
    const int64_t pass = lanes ? LANE_PASS_COLS : GGML_PASS_COLS;
    const size_t rb = mg_matrix_row_bytes(w);
    float xs[GGML_PASS_COLS / 32] __attribute__((aligned(64)));
    float xp[LANE_PASS_COLS] __attribute__((aligned(64)));
    for (int64_t c0 = 0; c0 < w->cols; c0 += pass) {
        const int64_t kc = w->cols - c0 < pass ? w->cols - c0 : pass;
        if (mins)
            for (int64_t g = 0; g < kc / 32; g++) {
                const float *xg = x + c0 + 32 * g;
                xs[g] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(xg), _mm512_loadu_ps(xg + 16)));
            }
        if (f == MG_Q2_K) /* its mins: per 16 */
            for (int64_t g = 0; g < kc / 16; g++) xs[g] = _mm512_reduce_add_ps(_mm512_loadu_ps(x + c0 + 16 * g));
        if (lanes) { /* (n_stride, lane_stride, pair): see lane_order */
            if (f == MG_Q6_K)
                lane_order(x + c0, kc, 2, 64, 32, 16, xp);
            else if (f == MG_IQ4_XS)
                lane_order(x + c0, kc, 2, 16, 64, 32, xp);
            else if (k23)
                lane_order(x + c0, kc, 4, 32, 128, 16, xp);
            else
                lane_order(x + c0, kc, 2, 32, 64, 16, xp);
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
            case MG_Q6_K: MG_ROWS_CALL(n, rb, parts, rows_q6_k, ps, xp, nb); break;
            case MG_Q4_K:
            case MG_Q5_K: MG_ROWS_CALL(n, rb, parts, rows_k4, ps, xp, xs, nb, f == MG_Q5_K); break;
            case MG_IQ4_XS: MG_ROWS_CALL(n, rb, parts, rows_iq4_xs, ps, xp, nb); break;
            case MG_Q2_K: MG_ROWS_CALL(n, rb, parts, rows_q2_k, ps, xp, xs, nb); break;
            case MG_Q3_K: MG_ROWS_CALL(n, rb, parts, rows_q3_k, ps, xp, nb); break;
            case MG_Q8_0: MG_ROWS_CALL(n, rb, parts, ROWS_Q8_0, ps, x + c0, nb); break;
            case MG_Q4_0: MG_ROWS_CALL(n, rb, parts, ROWS_Q4_0, ps, x + c0, nb); break;
            case MG_Q5_0: MG_ROWS_CALL(n, rb, parts, ROWS_Q5_0, ps, x + c0, nb); break;
            case MG_Q4_1: MG_ROWS_CALL(n, rb, parts, ROWS_Q4_1, ps, x + c0, nb); break;
            case MG_Q5_1: MG_ROWS_CALL(n, rb, parts, ROWS_Q5_1, ps, x + c0, nb); break;
            default: MG_ROWS_CALL(n, rb, parts, ROWS_IQ4_NL, ps, x + c0, nb); break;
            }
            for (int64_t j = 0; j < n; j++) y[r + j] = c0 == 0 ? parts[j] : y[r + j] + parts[j];
        }
    }
    return 1;
}
#endif
