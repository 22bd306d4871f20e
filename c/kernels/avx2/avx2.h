/* Shared by the AVX2 + FMA + F16C kernel files (c/kernels/avx2/<family>_avx2.c, compiled with -mavx2
 * -mfma -mf16c and selected at run time only on CPUs that have all three, c/core/cpu.c): the
 * helpers, scale readers and raw decodings every op family uses, the permuted x of the decode
 * loops, and each family's entry points, which table_avx2.c puts in the table.
 *
 * Raw decodings (all exact, no denormals):
 *   bf16: 16-bit left shift into fp32 bits.
 *   f16:  vcvtph2ps.
 *   fp8 e4m3: sign-extend the byte to 16 bits, shift left 7 and mask 0xBF80: an f16 whose value
 *         is v * 2^-8 (subnormals included), then vcvtph2ps.  NaN codes are not supported.
 *   fp4 e2m1: vpshufb on a 16-entry table of the values' f16 high bytes (the low bytes are
 *         zero), then vcvtph2ps: exact values.
 * A raw value is a power-of-two multiple of the true value (raw_factor); a block's partial sum
 * is multiplied by its scale, a per-row scale (F32_ROW) multiplies the row's whole sum once. */
#ifndef MG_KERNELS_AVX2_H
#define MG_KERNELS_AVX2_H

#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "kernels/tables.h"
#include "kernels/avx2/prefill_tile.h"

#define INLINE static inline __attribute__((always_inline))

/* ---- small helpers ---------------------------------------------------------------------- */

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The fp32 decode rows of the block formats (ggml_avx2.c, iq_avx2.c), one row at a time, prefetch
 * the cache lines of each block they read MG_AVX2_F32_AHEAD bytes on, into L2: a later row of
 * the same matrix (rows are contiguous; past its end a prefetch does nothing).  Without it a
 * Q4_K_M decode token streamed at 0.29 of the read bandwidth, half llama.cpp's speed
 * (docs/KERNELS.md). */
#ifndef MG_AVX2_F32_AHEAD
#define MG_AVX2_F32_AHEAD 8192
#endif
INLINE void mg_avx2_prefetch_ahead(const uint8_t *p, size_t n) {
    const uintptr_t a = (uintptr_t)p + MG_AVX2_F32_AHEAD, end = a + n;
    for (uintptr_t l = a & ~(uintptr_t)63; l < end; l += 64) _mm_prefetch((const char *)l, _MM_HINT_T1);
}

/* Mask selecting the first n (0..8) lanes, for maskload/maskstore. */
INLINE __m256i lane_mask(int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), idx);
}

/* 8 x 8 int32 transpose: out[s] = (in[0][s], ..., in[7][s]) (the int8 GEMMs' panels: 4 codes
 * of 8 rows per line). */
INLINE void mg_avx2_transpose8x8_epi32(__m256i r[8]) {
    __m256i t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);     /* per 128-bit lane: i0 i+1_0 i1 i+1_1 */
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]); /* i2 i+1_2 i3 i+1_3 */
    }
    for (int i = 0; i < 8; i += 4) { /* per 128-bit lane L: r[i + c] = column 4L + c of rows i..i+3 */
        r[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int c = 0; c < 4; c++) {
        t[c] = _mm256_permute2x128_si256(r[c], r[4 + c], 0x20);     /* low lanes: column c */
        t[4 + c] = _mm256_permute2x128_si256(r[c], r[4 + c], 0x31); /* high lanes: column 4 + c */
    }
    for (int s = 0; s < 8; s++) r[s] = t[s];
}

/* Values decoded per step, and the power of two the raw decoding must be multiplied by. */
INLINE int64_t fmt_step(mg_format f) {
    return f == MG_FP4_E2M1 ? 32 : (f == MG_FP8_E4M3 ? 16 : 8);
}
INLINE float raw_factor(mg_format f) {
    return f == MG_FP8_E4M3 ? 256.0f : 1.0f;
}
/* Byte offset of column c in a row (c even for fp4). */
INLINE size_t col_bytes(mg_format f, int64_t c) {
    switch (f) {
    case MG_F32: return (size_t)c * 4;
    case MG_BF16:
    case MG_F16: return (size_t)c * 2;
    case MG_FP8_E4M3: return (size_t)c;
    default: return (size_t)c / 2;
    }
}

/* Columns sharing one scale (NONE and F32_ROW: an arbitrary block, which keeps several
 * accumulators busy; a row scale is applied to the row's whole sum, see row_scale). */
INLINE int64_t block_cols(mg_scale_kind k) {
    return k == MG_SCALE_E8M0_G32 ? 32 : (k == MG_SCALE_NONE || k == MG_SCALE_F32_ROW ? 256 : 128);
}

/* MG_SCALE_F32_ROW: the scale of row r, multiplied into the row's dot product once (1 for every
 * other kind, whose scales scale_at applies per block). */
INLINE float row_scale(const mg_matrix *w, int64_t r) {
    if (w->scale_kind != MG_SCALE_F32_ROW) return 1.0f;
    float s;
    memcpy(&s, (const uint8_t *)w->scale + (size_t)r * (size_t)w->scale_cols * 4, 4);
    return s;
}

INLINE float scale_at(const mg_matrix *w, int64_t r, int64_t c) {
    switch (w->scale_kind) {
    case MG_SCALE_F32_BLOCK128: { /* memcpy: scales inside a mapped shard may be unaligned */
        float s;
        memcpy(&s, (const uint8_t *)w->scale + ((size_t)(r / 128) * (size_t)w->scale_cols + (size_t)(c / 128)) * 4, 4);
        return s;
    }
    case MG_SCALE_E8M0_BLOCK128: return mg_e8m0_to_f32(((const uint8_t *)w->scale)[(r / 128) * w->scale_cols + c / 128]);
    case MG_SCALE_E8M0_G32: return mg_e8m0_to_f32(((const uint8_t *)w->scale)[r * w->scale_cols + c / 32]);
    default: return 1.0f; /* NONE, and F32_ROW (applied per row by row_scale) */
    }
}

/* f16 high bytes of the 16 e2m1 values (their low bytes are all zero): a vpshufb table. */
INLINE __m128i fp4_f16_lut(void) {
    return _mm_setr_epi8(0x00, 0x38, 0x3c, 0x3e, 0x40, 0x42, 0x44, 0x46,
                         (char)0x80, (char)0xb8, (char)0xbc, (char)0xbe, (char)0xc0, (char)0xc2, (char)0xc4, (char)0xc6);
}

/* The codes of the first n columns at p copied into buf (size bytes), zero-padded: zero codes
 * decode to zeros, and an odd fp4 count keeps only its last byte's low nibble. */
INLINE void copy_tail(mg_format f, const uint8_t *p, int64_t n, uint8_t *buf, size_t size) {
    memset(buf, 0, size);
    memcpy(buf, p, col_bytes(f, n + (f == MG_FP4_E2M1 ? (n & 1) : 0)));
    if (f == MG_FP4_E2M1 && (n & 1)) buf[n / 2] &= 0x0f;
}

/* Loads n (<= 8) floats, zeros beyond. */
INLINE __m256 load_partial(const float *x, int64_t n) {
    return n >= 8 ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, lane_mask(n));
}

/* Decode reads x in a permuted order (xp) that matches what the cheapest widening of each format
 * produces, so no shuffles are needed per weight:
 *   bf16, fp8 (per 32 columns): [even columns | odd columns]  (16-bit lanes split by shift / mask)
 *   fp4 (per 64 columns, two groups of 32 in the two 128-bit lanes): see FP4_OFFSETS. */
enum { XP_COLS = 8192 };

/* fp4 vector v, element i < 4 (first group) reads column FP4_OFFSETS[v] + 4i, element 4 + i the
 * same column of the second group (+32). */
static const int FP4_OFFSETS[8] = {0, 2, 16, 18, 1, 3, 17, 19};

INLINE int64_t xp_span(mg_format f) { return f == MG_FP4_E2M1 ? 64 : 32; }

INLINE void permute_x(mg_format f, const float *x, int64_t kc, float *xp) {
    const int64_t span = xp_span(f);
    for (int64_t g = 0; g + span <= kc; g += span) {
        const float *xs = x + g;
        float *o = xp + g;
        if (f == MG_FP4_E2M1) {
            for (int v = 0; v < 8; v++)
                for (int i = 0; i < 4; i++) {
                    o[8 * v + i] = xs[FP4_OFFSETS[v] + 4 * i];
                    o[8 * v + 4 + i] = xs[32 + FP4_OFFSETS[v] + 4 * i];
                }
        } else {
            for (int i = 0; i < 16; i++) o[i] = xs[2 * i], o[16 + i] = xs[2 * i + 1];
        }
    }
}

/* bf16 encodings of the 16 e2m1 codes (sign bit 3), high and low byte, in both 128-bit lanes:
 * vpshufb tables for step64_fp4 and rows_fp4. */
INLINE __m256i fp4_bf16_hi_table(void) {
    return _mm256_setr_epi8(0x00, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40, (char)0x80, (char)0xbf, (char)0xbf,
                            (char)0xbf, (char)0xc0, (char)0xc0, (char)0xc0, (char)0xc0, 0x00, 0x3f, 0x3f, 0x3f, 0x40,
                            0x40, 0x40, 0x40, (char)0x80, (char)0xbf, (char)0xbf, (char)0xbf, (char)0xc0, (char)0xc0,
                            (char)0xc0, (char)0xc0);
}

INLINE __m256i fp4_bf16_lo_table(void) {
    return _mm256_setr_epi8(0x00, 0x00, (char)0x80, (char)0xc0, 0x00, 0x40, (char)0x80, (char)0xc0, 0x00, 0x00,
                            (char)0x80, (char)0xc0, 0x00, 0x40, (char)0x80, (char)0xc0, 0x00, 0x00, (char)0x80,
                            (char)0xc0, 0x00, 0x40, (char)0x80, (char)0xc0, 0x00, 0x00, (char)0x80, (char)0xc0, 0x00,
                            0x40, (char)0x80, (char)0xc0);
}

/* Scale of every block of row r in [c0, c0 + kc), times the raw factor; 1 if some product
 * overflowed (then the caller multiplies in two steps). */
INLINE int row_scales(const mg_matrix *w, mg_format f, int64_t r, int64_t c0, int64_t kc, int64_t bc, float *sf) {
    const int64_t nb = (kc + bc - 1) / bc;
    const float factor = raw_factor(f);
    int64_t i = 0;
    if (w->scale_kind == MG_SCALE_E8M0_G32 && factor == 1.0f) {
        const uint8_t *s = (const uint8_t *)w->scale + r * w->scale_cols + c0 / 32;
        const __m256i lowest = _mm256_set1_epi32(0x00400000), nan_code = _mm256_set1_epi32(255);
        for (; i + 8 <= nb; i += 8) {
            __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s + i)));
            __m256i u = _mm256_max_epi32(_mm256_slli_epi32(b, 23), lowest); /* byte 0 is 2^-127 */
            __m256 v = _mm256_or_ps(_mm256_castsi256_ps(u), _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, nan_code)));
            _mm256_storeu_ps(sf + i, v);
        }
    }
    int overflow = 0;
    for (; i < nb; i++) {
        const float s = scale_at(w, r, c0 + i * bc);
        sf[i] = s * factor;
        overflow |= !isfinite(sf[i]) && isfinite(s);
    }
    return overflow;
}


/* ---- entry points of the op families ------------------------------------------------------ */

/* decode_avx2.c: y[r] for rows [r0, r1) one row at a time; takes every matrix. */
typedef void mg_avx2_decode_fn(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1);
mg_avx2_decode_fn mg_avx2_decode_f32, mg_avx2_decode_bf16, mg_avx2_decode_f16, mg_avx2_decode_fp8,
    mg_avx2_decode_fp4;
/* The one-row loop's dot product of fp8 row r over columns [c0, c0 + kc), xp holding x permuted
 * (permute_x), before the row scale: decode_rows_avx2.c's fallback for scales it cannot fold. */
float mg_avx2_row_dot_fp8(const mg_matrix *w, int64_t r, int64_t c0, int64_t kc, const float *xp, const float *x);

/* decode_rows_avx2.c: several rows per pass; returns 0, having written nothing, for a matrix or
 * x it does not take (then decode_avx2.c's loop runs).  fp8_f16: fp8 decoded through vcvtph2ps,
 * never into fp32 denormals, for CPUs with denormal assists (mg_cpu_features). */
typedef int mg_avx2_decode_rows_fn(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1);
mg_avx2_decode_rows_fn mg_avx2_decode_rows_bf16, mg_avx2_decode_rows_fp8, mg_avx2_decode_rows_fp8_f16,
    mg_avx2_decode_rows_fp4;

/* prefill_avx2.c: n_tok > 1 tokens through fp32 tiles; takes every matrix. */
typedef void mg_avx2_prefill_fn(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y,
                                int64_t y_stride, int64_t r0, int64_t r1);
mg_avx2_prefill_fn mg_avx2_prefill_f32, mg_avx2_prefill_bf16, mg_avx2_prefill_f16, mg_avx2_prefill_fp8,
    mg_avx2_prefill_fp4;
/* Its tiles (mg_avx2_prefill_tile): kernels/avx2/prefill_tile.h. */

/* ggml_avx2.c: the ggml block formats (MG_Q8_0 ... MG_IQ1_M, scale kind none).  decode_ggml: n_tok
 * == 1, rows [r0, r1); ggml_dequant_block: the exact values of one block of format f at p into out
 * (equal to core/ggml_blocks.h's), for prefill_avx2.c's tiles (mg_avx2_prefill_ggml). */
mg_avx2_decode_fn mg_avx2_decode_ggml;
/* One row's dot product with x over nb blocks at p, before any row scale; xs: the sums of x per
 * 16 or 32 columns of the row's columns (the formats that need them, ggml_avx2.c's xs_group). */
typedef float mg_avx2_row_dot_fn(const uint8_t *p, int64_t nb, const float *x, const float *xs);
/* iq_avx2.c: the grid formats MG_IQ2_XXS ... MG_IQ1_M, for ggml_avx2.c's dispatch.  row_dot:
 * NULL for other formats (IQ1_S reads xs per 32 columns); dequant_block: one block's exact values
 * (as core/ggml_blocks.h's), 0 having written nothing for other formats. */
mg_avx2_row_dot_fn *mg_avx2_iq_row_dot(mg_format f);
int mg_avx2_iq_dequant_block(mg_format f, const uint8_t *p, float *out);
int mg_avx2_ggml_takes(mg_format f); /* the formats the two above implement (others: the parent's entry) */
void mg_avx2_ggml_dequant_block(mg_format f, const uint8_t *p, float *out);
mg_avx2_prefill_fn mg_avx2_prefill_ggml;
/* q8_avx2.c: the same formats with int8 activations (any n_tok, token by token, rows four per
 * pass: the int8 entries below take them for decode), the row loops prefetching into L2 or L1
 * (prefetch_l2: mg_cpu_features.prefetch_l2). */
void mg_avx2_linear_q8_rows(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                            int64_t r0, int64_t r1, int prefetch_l2);
/* q8_gemm_avx2.c: the int8 GEMM on vpmaddubsw, and the int8 entry that the avx2 table takes on a
 * CPU without AVX-VNNI (the GEMM from a token count per format, mg_avx2_linear_q8_rows below it,
 * prefetching as that does). */
void mg_avx2_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                     int64_t r1);
mg_linear_q8_fn mg_avx2_linear_q8_gemm(int prefetch_l2);
/* q8_act_avx2.c: activation rows quantised to int8 (core/q8_act.h), bit for bit the C one. */
mg_q8_row_fn mg_avx2_q8_quantize_row;
/* q8_gemm_avxvnni.c (compiled with AVX-VNNI as well): the int8 GEMM on ymm vpdpbusd, and the
 * int8 entry that the avx2 table takes on a CPU with AVX-VNNI (the GEMM from a measured token
 * count per format, mg_avx2_linear_q8_rows below it, prefetching as that does); NULL in a build
 * without -mavxvnni. */
void mg_avxvnni_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                        int64_t r0, int64_t r1);
mg_linear_q8_fn mg_avxvnni_linear_q8(int prefetch_l2);
/* q8_rows_avxvnni.c: mg_avx2_linear_q8_rows built with AVX-VNNI (q8_avx2.c's dot4 one vpdpbusd;
 * the same sums), the rows under that entry; absent in a build without -mavxvnni. */
void mg_avxvnni_linear_q8_rows(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                               int64_t r0, int64_t r1, int prefetch_l2);
/* q8_fp4_rows_avxvnni.c: mg_avx2_linear_q8_fp4 built with AVX-VNNI, which those rows hand FP4 to. */
void mg_avxvnni_linear_q8_fp4(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                              int64_t r0, int64_t r1, int l2);
/* q8_fp4_avx2.c: native FP4 (MG_FP4_E2M1 with ue8m0 scales per 32, kernels/q8_fp4.h) with int8
 * activations, which mg_avx2_linear_q8_rows hands over (and the int8 GEMM's FP4 decoder). */
void mg_avx2_linear_q8_fp4(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                           int64_t r0, int64_t r1, int l2);
/* q8_iq_avx2.c: the IQ grid formats' int8 rows, which mg_avx2_linear_q8_rows hands over (for the
 * formats mg_avx2_q8_iq_takes). */
int mg_avx2_q8_iq_takes(mg_format f);
void mg_avx2_linear_q8_iq(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                          int64_t r1, int l2);

/* vector_avx2.c: the vector ops of mg_kernels. */
MG_VECTOR_OPS_DECLARE(mg_avx2)

/* attn_avx2.c: the attention block products (core/kernels.h): scores two query rows x four key
 * rows per tile, values two output rows x 32 columns per tile; the softmax by a polynomial e^x. */
void mg_avx2_attn_scores(const float *q, int64_t q_stride, int m, const float *k, int64_t k_stride, int64_t n,
                         int64_t dim, float scale, float *s, int64_t s_stride);
void mg_avx2_attn_values(float *o, int64_t o_stride, int m, const float *p, int64_t p_stride, const float *v,
                         int64_t v_stride, int64_t n, int64_t dim);
void mg_avx2_softmax(float *x, int64_t n, float sink);

#endif
