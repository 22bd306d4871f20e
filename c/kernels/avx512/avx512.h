/* Shared by the AVX-512 kernel files (c/kernels/avx512/<family>_avx512.c and the avx512bf16
 * ones built on them): the x chunking, prefetch distances and scale readers of the decode loops,
 * and each family's entry points, which table_avx512.c puts in the table.  Include only from
 * files compiled with the AVX-512 F/BW/VL/DQ flags. */
#ifndef MG_KERNELS_AVX512_H
#define MG_KERNELS_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "kernels/tables.h"

#define INLINE static inline __attribute__((always_inline))

/* Columns of x permuted per call chunk; a multiple of every step and scale block. */
enum { XP_COLS = 8192 };

/* Software prefetch of streamed weights, in bytes ahead of the current step.  Rows are often one
 * or two 4 KiB pages and the hardware streamer stops at page ends.  Into L2 (T1): into L1 (T0)
 * the prefetches compete with the demand loads for fill buffers.  The distance is the best
 * measured (docs/KERNELS.md). */
#ifndef MG_AVX512_PREFETCH_BYTES
#define MG_AVX512_PREFETCH_BYTES 2048
#endif
#ifndef MG_AVX512_PREFETCH_HINT
#define MG_AVX512_PREFETCH_HINT _MM_HINT_T1
#endif
#if MG_AVX512_PREFETCH_BYTES > 0
#define PREFETCH(p) _mm_prefetch((const char *)(p) + MG_AVX512_PREFETCH_BYTES, MG_AVX512_PREFETCH_HINT)
#else
#define PREFETCH(p) ((void)(p))
#endif

/* MG_SCALE_F32_ROW: the scale of row r, multiplied into the row's dot product once (1 otherwise). */
INLINE float row_scale(const mg_matrix *w, int64_t r) {
    if (w->scale_kind != MG_SCALE_F32_ROW) return 1.0f;
    float s;
    memcpy(&s, (const uint8_t *)w->scale + (size_t)r * (size_t)w->scale_cols * 4, 4);
    return s;
}

/* e8m0 group scales of row r, groups [g0, g0 + n), as floats (n a multiple of 4, <= 256). */
INLINE void row_scales_g32(const mg_matrix *w, int64_t r, int64_t g0, int64_t n, float *sf) {
    const uint8_t *s = (const uint8_t *)w->scale + r * w->scale_cols + g0;
    const __m512i lowest = _mm512_set1_epi32(0x00400000), nan_code = _mm512_set1_epi32(255);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        __m512i u = _mm512_max_epi32(_mm512_slli_epi32(b, 23), lowest); /* byte 0 is 2^-127 */
        u = _mm512_mask_mov_epi32(u, _mm512_cmpeq_epi32_mask(b, nan_code), _mm512_set1_epi32(0x7fc00000));
        _mm512_storeu_ps(sf + i, _mm512_castsi512_ps(u));
    }
    for (; i < n; i++) sf[i] = mg_e8m0_to_f32(s[i]);
}

/* Prefetch distance of the multi-row loops: the same line of a later group of rows, at least
 * MG_AVX512_MIN_AHEAD bytes on.  One group ahead is too close for narrow rows (fp8 with 1024
 * columns, DeepSeek-V4's wq_b: docs/KERNELS.md). */
#ifndef MG_AVX512_MIN_AHEAD
#define MG_AVX512_MIN_AHEAD 8192
#endif
/* bf16 decode goes one row per pass up to this many columns per chunk (x: 16 KiB of fp32, in L1
 * beside the stream), four rows per pass above (rows_bf16). */
#ifndef MG_AVX512_BF16_ONE_ROW_COLS
#define MG_AVX512_BF16_ONE_ROW_COLS 4096
#endif
INLINE size_t rows_ahead(size_t group) {
    return group >= MG_AVX512_MIN_AHEAD ? group : (MG_AVX512_MIN_AHEAD + group - 1) / group * group;
}

/* Line i (64 bytes) of a row at p, prefetching the line `ahead` bytes on (see rows_ahead). */
INLINE __m512i load_line(const uint8_t *p, int64_t i, size_t ahead) {
    _mm_prefetch((const char *)p + 64 * i + ahead, MG_AVX512_PREFETCH_HINT);
    return _mm512_loadu_si512(p + 64 * i);
}

/* The group scales of fp4 line i as the vector [s0 x4, s1 x4, s2 x4, s3 x4] (s[4i..4i+3]), which
 * matches the line's partial sums: their lanes 4g..4g+3 hold the line's group g. */
INLINE __m512 fp4_line_scales(const float *s, int64_t i) {
    const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(quad, _mm512_castps128_ps512(_mm_loadu_ps(s + 4 * i)));
}

/* p[j] = row r + j's bytes from byte offset off, for j < n. */
INLINE void row_ptrs(const mg_matrix *w, int64_t r, int64_t n, size_t off, const uint8_t **p) {
    const size_t rb = mg_matrix_row_bytes(w);
    for (int64_t j = 0; j < n; j++) p[j] = (const uint8_t *)w->data + (size_t)(r + j) * rb + off;
}

/* The F32_ROW scales of a prefill pass's rows [r, r + nr) (nr <= 32) as two vectors (rows past
 * nr: 0), for prefill_store. */
INLINE void prefill_row_scales(const mg_matrix *w, int64_t r, int64_t nr, __m512 rsv[2]) {
    float rs[32] = {0};
    for (int64_t i = 0; i < nr; i++) rs[i] = row_scale(w, r + i);
    rsv[0] = _mm512_loadu_ps(rs);
    rsv[1] = _mm512_loadu_ps(rs + 16);
}

/* The prefill micro-kernels' sums (prefill_avx512.c, avx512bf16/prefill_avx512bf16.c): a[h][t]
 * holds rows 16h .. 16h + 15 of token t; y[t * ys + 16h + i] gets them (first column chunk) or
 * adds them, rows past nr untouched, and the last chunk multiplies the F32_ROW row scales rs
 * (NULL otherwise) into the whole sum. */
INLINE void prefill_store(const int H, const int T, __m512 (*a)[12], float *y, int64_t ys, int64_t nr, int first,
                          const __m512 *rs) {
#pragma GCC unroll 2
    for (int h = 0; h < H; h++) {
        const int64_t n = nr - 16 * h;
        const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            float *q = y + t * ys + 16 * h;
            __m512 v = a[h][t];
            if (!first) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, q), v);
            if (rs) v = _mm512_mul_ps(v, rs[h]);
            _mm512_mask_storeu_ps(q, m, v);
        }
    }
}

/* r[0..15] (16 rows x 16 columns) to columns: r[j] becomes column j (lane i = row i).  The prefill
 * tiles' transpose (prefill_avx512.c, avx512bf16/prefill_avx512bf16.c). */
INLINE void transpose16_ps(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) { /* per 128-bit lane: rows 2i, 2i+1 interleaved, columns 0-1 | 2-3 */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + k], 128-bit lane L: column 4L + k of rows 4i .. 4i + 3 */
        r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    __m512 o[16];
    for (int k = 0; k < 4; k++) { /* column 4L + k: lane L of r[k], r[4 + k], r[8 + k], r[12 + k] */
        const __m512 ab_lo = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x44), ab_hi = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xEE);
        const __m512 cd_lo = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x44);
        const __m512 cd_hi = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xEE);
        o[k] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0x88);
        o[4 + k] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0xDD);
        o[8 + k] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0x88);
        o[12 + k] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0xDD);
    }
    for (int j = 0; j < 16; j++) r[j] = o[j];
}

/* Runs the R-row loop ROWS(R, <args>, ahead, part) with R the constant n (1..4), so that its row
 * loops unroll, and ahead = rows_ahead(R row strides of rb bytes). */
#define MG_ROWS_CALL(n, rb, part, ROWS, ...)                                        \
    do {                                                                            \
        switch (n) {                                                                \
        case 4: ROWS(4, __VA_ARGS__, rows_ahead(4 * (rb)), part); break;            \
        case 3: ROWS(3, __VA_ARGS__, rows_ahead(3 * (rb)), part); break;            \
        case 2: ROWS(2, __VA_ARGS__, rows_ahead(2 * (rb)), part); break;            \
        default: ROWS(1, __VA_ARGS__, rows_ahead(rb), part); break;                 \
        }                                                                           \
    } while (0)

/* fp4 rows [r, r + n) over columns [c0, c0 + kc): row j's codes at p[j] and, for e8m0 group
 * scales, its scales as floats in sfr[j] with s[j] = sfr[j] (unscaled: every s[j] NULL). */
INLINE void fp4_row_group(const mg_matrix *w, int64_t r, int64_t n, int64_t c0, int64_t kc, const uint8_t **p,
                          const float **s, float (*sfr)[XP_COLS / 32]) {
    row_ptrs(w, r, n, (size_t)c0 / 2, p);
    for (int64_t j = 0; j < n; j++) {
        s[j] = NULL;
        if (w->scale_kind == MG_SCALE_E8M0_G32) {
            row_scales_g32(w, r + j, c0 / 32, kc / 32, sfr[j]);
            s[j] = sfr[j];
        }
    }
}

/* Rows [r, r + n)'s partial sums over the chunk starting at column c0, times their F32_ROW
 * scales: written to y (first chunk) or added. */
INLINE void store_row_parts(const mg_matrix *w, int64_t r, int64_t n, int64_t c0, const float *part, float *y) {
    for (int64_t j = 0; j < n; j++) {
        const float v = part[j] * row_scale(w, r + j);
        y[r + j] = c0 == 0 ? v : y[r + j] + v;
    }
}

/* fp4 rows [r, r + n) (n in 1..4) over columns [c0, c0 + kc) through the R-row loop ROWS(R, p, xs,
 * nb, s, ahead, part) against x prepared as XT (permuted floats, or bf16 parts); adds to y (c0 > 0)
 * or writes it.  sfr: scratch for the rows' group scales.  Returns n.  A macro because each table
 * has its own loop and x form. */
#define MG_FP4_ROWS_FN(NAME, ROWS, XT)                                                                   \
    INLINE int64_t NAME(const mg_matrix *w, int64_t r, int64_t n, int64_t c0, int64_t kc, const XT *xs, \
                        float *y, float (*sfr)[XP_COLS / 32]) {                                          \
        const size_t rb = mg_matrix_row_bytes(w);                                                         \
        const uint8_t *p[4];                                                                              \
        const float *s[4];                                                                                \
        float part[4];                                                                                    \
        fp4_row_group(w, r, n, c0, kc, p, s, sfr);                                                        \
        MG_ROWS_CALL(n, rb, part, ROWS, p, xs, kc / 128, s);                                              \
        store_row_parts(w, r, n, c0, part, y);                                                            \
        return n;                                                                                         \
    }

INLINE float scale_block128(const mg_matrix *w, int64_t r, int64_t c) {
    const size_t at = (size_t)(r / 128) * (size_t)w->scale_cols + (size_t)(c / 128);
    if (w->scale_kind == MG_SCALE_F32_BLOCK128) { /* memcpy: scales inside a mapped shard may be unaligned */
        float s;
        memcpy(&s, (const uint8_t *)w->scale + at * 4, 4);
        return s;
    }
    return mg_e8m0_to_f32(((const uint8_t *)w->scale)[at]);
}

/* Q3_K's 16 scales minus 32 (12 bytes at s, mg_ggml_q3_k_scale) as bytes: the low nibbles are
 * bytes 0-7 then their high nibbles; the top 2 bits of scale 4j + b are bits 2j.. of byte
 * 8 + b, so dword lane j of those 4 bytes shifted right by 2j holds them in byte b.  Reads the
 * 12 bytes only (the block may end the matrix). */
INLINE __m128i q3_k_scales(const uint8_t *s) {
    uint32_t c;
    memcpy(&c, s + 8, 4);
    const __m128i a = _mm_loadl_epi64((const __m128i *)s);
    const __m128i lo = _mm_and_si128(_mm_unpacklo_epi64(a, _mm_srli_epi16(a, 4)), _mm_set1_epi8(15));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)c), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

/* ---- entry points of the op families ------------------------------------------------------ */

/* decode_avx512.c: decode (n_tok == 1) of rows [r0, r1); returns 0, having written nothing, for
 * a matrix or x it does not take (then the parent table's entry runs). */
typedef int mg_avx512_decode_fn(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1);
mg_avx512_decode_fn mg_avx512_decode_f32, mg_avx512_decode_bf16, mg_avx512_decode_f16, mg_avx512_decode_fp8,
    mg_avx512_decode_fp4;
/* fp8 never decoded into fp32 denormals (decode_rows_avx512.c: rows_fp8_folded with f16), for CPUs with denormal assists. */
mg_avx512_decode_fn mg_avx512_decode_fp8_f16;
/* ggml_avx512.c: the ggml block formats it takes (Q8_0, Q4_0, Q4_K, Q5_K, IQ4_NL, IQ4_XS, MXFP4);
 * returns 0 for the others (the parent's entry runs). */
mg_avx512_decode_fn mg_avx512_decode_ggml;

/* decode_rows_avx512.c: the four-row loops decode_avx512.c runs, over columns [c0, c0 + kc) of
 * rows [r, r + n) (n in 1..4); each writes (c0 == 0) or adds its rows' sums and returns n. */
int64_t mg_avx512_bf16_rows(const mg_matrix *w, int64_t r, int64_t n, int64_t c0, int64_t kc, const float *xp,
                            float *y);
int64_t mg_avx512_fp4_rows(const mg_matrix *w, int64_t r, int64_t n, int64_t c0, int64_t kc, const float *xp,
                           float *y, float (*sfr)[XP_COLS / 32]);
/* fp8 rows inside one 128-row scale block, against xq folded for that block (f16: through
 * vcvtph2ps, x in decode_avx512.c's permute_x order): */
int64_t mg_avx512_fp8_folded_rows(const mg_matrix *w, int f16, int64_t r, int64_t n, int64_t c0, int64_t kc,
                                  const float *xq, float *y);
/* x * 256 in the folded loop's order, and the fold of a row block's scales into it, times 2^bias
 * (112 for the folded loop, 0 for the f16 one; returns 0 when the products would leave the normal
 * range: then the block takes the one-row loop). */
void mg_avx512_permute_x_fp8_folded(const float *x, int64_t kc, float *xo);
int mg_avx512_fold_block_scales(const mg_matrix *w, int bias, int64_t r, int64_t c0, int64_t kc, const float *xo,
                                float xmax, float xmin, float *xq);

/* prefill_avx512.c: n_tok > 1 tokens, every format: prefill_avx2.c's tiles under 512-bit FMAs. */
void mg_avx512_prefill(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride,
                       int64_t r0, int64_t r1);

/* q8_avx512vnni.c (compiled with AVX512_VNNI): the int8-activation entry of every ggml block
 * format and of native FP4, its row loops prefetching into L2 or L1 (prefetch_l2:
 * mg_cpu_features.prefetch_l2), NULL when the compiler could not build it; the CPU check is the
 * table's. */
mg_linear_q8_fn mg_avx512vnni_linear_q8(int prefetch_l2);
/* q8_gemm_avx512vnni.c (compiled with AVX512_VNNI; called by the entry above for several
 * tokens): the int8 GEMM of kernels/q8_gemm.h, any block format and native FP4. */
void mg_avx512vnni_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                           int64_t r0, int64_t r1);
/* q8_fp4_avx512vnni.c (compiled with AVX512_VNNI; called by the entry above only): native FP4's
 * int8 rows (MG_FP4_E2M1 with ue8m0 scales per 32, kernels/q8_fp4.h). */
void mg_avx512vnni_linear_q8_fp4(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                                 int64_t r0, int64_t r1, int l2);
/* q8_iq_avx512vnni.c (compiled with AVX512_VNNI; called by the entry above only): the IQ grid
 * formats' int8 rows, for the formats mg_avx512vnni_q8_iq_takes. */
int mg_avx512vnni_q8_iq_takes(mg_format f);
void mg_avx512vnni_linear_q8_iq(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                                int64_t r0, int64_t r1, int l2);

/* vector_avx512.c */
float mg_avx512_read_sum(const float *p, int64_t n);

/* attn_avx512.c: the attention block products (core/kernels.h): scores in tiles of 4 query rows x
 * 4 key rows, values in tiles of 4 output rows x 64 columns, the values bit for bit the avx2 ones;
 * and the softmax between them (the avx2 one's polynomial at zmm width). */
void mg_avx512_attn_scores(const float *q, int64_t q_stride, int m, const float *k, int64_t k_stride, int64_t n,
                           int64_t dim, float scale, float *s, int64_t s_stride);
void mg_avx512_attn_values(float *o, int64_t o_stride, int m, const float *p, int64_t p_stride, const float *v,
                           int64_t v_stride, int64_t n, int64_t dim);
void mg_avx512_softmax(float *x, int64_t n, float sink);

#endif
