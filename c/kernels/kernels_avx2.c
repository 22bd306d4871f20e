/* AVX2 + FMA + F16C kernels (x86-64).  Compiled with -mavx2 -mfma -mf16c; only selected at
 * run time on CPUs that have all three (c/core/cpu.c).
 *
 * Decode (n_tok == 1) streams each weight row once: a block of raw codes is widened to fp32
 * "raw" values (a power-of-two multiple of the true value, see RAW_FACTOR), dotted with x, and
 * the block's partial sum is multiplied by its scale (a per-row scale, F32_ROW, multiplies the
 * row's whole sum once); bf16, fp8 and fp4 matrices of whole 32- / 64-column steps take the
 * multi-row loops instead ("decode fast paths").  Prefill (n_tok > 1) dequantises a tile of 16
 * rows x 512 columns exactly into an fp32 buffer, column-major (a column is the 16 rows' values:
 * rows go along the vector lanes), and runs a 16-row x (up to) 6-token micro-kernel over it:
 * two tile vectors times one broadcast x value per token, so no horizontal sums, and each (row,
 * token) is a sequential fp32 sum over the chunk's columns, the same whatever the other tokens
 * of the call (outputs do not depend on batching).  The decoding cost is paid once per tile, not
 * per token; row scales are left out of the tile and multiply each output's whole sum instead.
 *
 * Raw decodings (all exact, no denormals):
 *   bf16: 16-bit left shift into fp32 bits.
 *   f16:  vcvtph2ps.
 *   fp8 e4m3: sign-extend the byte to 16 bits, shift left 7 and mask 0xBF80: an f16 whose value
 *         is v * 2^-8 (subnormals included), then vcvtph2ps.  NaN codes are not supported.
 *   fp4 e2m1: vpshufb on a 16-entry table of the values' f16 high bytes (the low bytes are
 *         zero), then vcvtph2ps: exact values.
 */
#include <math.h>
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))

/* ---- small helpers ---------------------------------------------------------------------- */

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Mask selecting the first n (0..8) lanes, for maskload/maskstore. */
INLINE __m256i lane_mask(int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), idx);
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

/* ---- raw decoders: one step of fmt_step(f) values starting at p ------------------------- */

INLINE __m256 dec_bf16x8(const uint8_t *p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

INLINE __m256 dec_f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

INLINE void dec_fp8x16(const uint8_t *p, __m256 *lo, __m256 *hi) {
    __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xBF80));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* f16 high bytes of the 16 e2m1 values (their low bytes are all zero): a vpshufb table. */
INLINE __m128i fp4_f16_lut(void) {
    return _mm_setr_epi8(0x00, 0x38, 0x3c, 0x3e, 0x40, 0x42, 0x44, 0x46,
                         (char)0x80, (char)0xb8, (char)0xbc, (char)0xbe, (char)0xc0, (char)0xc2, (char)0xc4, (char)0xc6);
}

/* 32 codes (16 bytes) to exact values in column order. */
INLINE void dec_fp4x32(const uint8_t *p, __m256 v[4]) {
    const __m128i lut = fp4_f16_lut(), m4 = _mm_set1_epi8(0x0f), zero = _mm_setzero_si128();
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, m4));
    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    __m128i i0 = _mm_unpacklo_epi8(lo, hi); /* high bytes of values 0..15 in column order */
    __m128i i1 = _mm_unpackhi_epi8(lo, hi); /* values 16..31 */
    v[0] = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, i0));
    v[1] = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, i0));
    v[2] = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, i1));
    v[3] = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, i1));
}

/* Decode one step at p into n_vec = fmt_step/8 vectors. */
INLINE void dec_step(mg_format f, const uint8_t *p, __m256 v[4]) {
    switch (f) {
    case MG_F32: v[0] = _mm256_loadu_ps((const float *)p); break;
    case MG_BF16: v[0] = dec_bf16x8(p); break;
    case MG_F16: v[0] = dec_f16x8(p); break;
    case MG_FP8_E4M3: dec_fp8x16(p, &v[0], &v[1]); break;
    default: dec_fp4x32(p, v); break;
    }
}

/* The codes of the first n columns at p copied into buf (size bytes), zero-padded: zero codes
 * decode to zeros, and an odd fp4 count keeps only its last byte's low nibble. */
INLINE void copy_tail(mg_format f, const uint8_t *p, int64_t n, uint8_t *buf, size_t size) {
    memset(buf, 0, size);
    memcpy(buf, p, col_bytes(f, n + (f == MG_FP4_E2M1 ? (n & 1) : 0)));
    if (f == MG_FP4_E2M1 && (n & 1)) buf[n / 2] &= 0x0f;
}

/* Tail step: the last n (< step) values of a block, from zero-padded copies. */
INLINE void dec_step_tail(mg_format f, const uint8_t *p, int64_t n, __m256 v[4]) {
    uint8_t buf[128] __attribute__((aligned(32)));
    copy_tail(f, p, n, buf, sizeof buf);
    dec_step(f, buf, v);
}

/* Loads n (<= 8) floats, zeros beyond. */
INLINE __m256 load_partial(const float *x, int64_t n) {
    return n >= 8 ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, lane_mask(n));
}

/* ---- decode (n_tok == 1) ---------------------------------------------------------------- */

/* Sum over columns [c, c + n) of raw(w) * x, as a vector of partial sums. */
INLINE __m256 block_dot(mg_format f, const uint8_t *row, int64_t c, int64_t n, const float *x) {
    const int64_t step = fmt_step(f), nv = step / 8;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    const int64_t end = c + n;
    __m256 v[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    if (nv == 1) {
        for (; c + 32 <= end; c += 32) {
            dec_step(f, row + col_bytes(f, c), v);
            a0 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + c), a0);
            dec_step(f, row + col_bytes(f, c + 8), v);
            a1 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + c + 8), a1);
            dec_step(f, row + col_bytes(f, c + 16), v);
            a2 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + c + 16), a2);
            dec_step(f, row + col_bytes(f, c + 24), v);
            a3 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + c + 24), a3);
        }
    }
    for (; c + step <= end; c += step) {
        dec_step(f, row + col_bytes(f, c), v);
        a0 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + c), a0);
        if (nv > 1) a1 = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x + c + 8), a1);
        if (nv > 2) {
            a2 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x + c + 16), a2);
            a3 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x + c + 24), a3);
        }
    }
    if (c < end) {
        const int64_t rem = end - c;
        dec_step_tail(f, row + col_bytes(f, c), rem, v);
        for (int64_t j = 0; j < nv && j * 8 < rem; j++) {
            __m256 xv = load_partial(x + c + j * 8, rem - j * 8);
            a0 = _mm256_fmadd_ps(v[j], xv, a0);
        }
    }
    return _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
}

/* acc += part * scale * factor, keeping the product exact-ish even when scale*factor overflows. */
INLINE __m256 apply_scale(__m256 acc, __m256 part, float s, float factor) {
    float sf = s * factor;
    if (__builtin_expect(isfinite(sf) || !isfinite(s), 1))
        return _mm256_fmadd_ps(part, _mm256_set1_ps(sf), acc);
    return _mm256_fmadd_ps(_mm256_mul_ps(part, _mm256_set1_ps(factor)), _mm256_set1_ps(s), acc);
}

/* Decode reads x in a permuted order (xp) that matches what the cheapest widening of each format
 * produces, so no shuffles are needed per weight:
 *   bf16, fp8 (per 32 columns): [even columns | odd columns]  (16-bit lanes split by shift / mask)
 *   fp4 (per 64 columns, two groups of 32 in the two 128-bit lanes): see FP4_OFFSETS. */
enum { XP_COLS = 8192 };

/* Software prefetch distance for streamed weights.  The hardware streamer does not cross 4 KiB
 * pages, and a weight row is often exactly one or two pages, so without this each row starts
 * with a burst of demand misses. */
#ifndef MG_PREFETCH_BYTES
#define MG_PREFETCH_BYTES 2048
#endif
#define PREFETCH(p) _mm_prefetch((const char *)(p) + MG_PREFETCH_BYTES, _MM_HINT_T0)

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

/* One 32-column step against permuted x: two partial-sum vectors. */
INLINE void step32_fp8(const uint8_t *p, const float *xp, __m256 *a0, __m256 *a1) {
    const __m256i m = _mm256_set1_epi16((short)0xBF80);
    PREFETCH(p);
    __m256i w = _mm256_loadu_si256((const __m256i *)p);
    /* Each 16-bit lane holds an odd column's byte (high) and an even column's (low); shifting the
     * byte to the top and arithmetic-shifting by one gives the f16 layout of v * 2^-8. */
    __m256i odd = _mm256_and_si256(_mm256_srai_epi16(w, 1), m);
    __m256i even = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 1), m);
    *a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(even)), _mm256_load_ps(xp), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(even, 1)), _mm256_load_ps(xp + 8), *a1);
    *a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(odd)), _mm256_load_ps(xp + 16), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(odd, 1)), _mm256_load_ps(xp + 24), *a1);
}

INLINE void step32_bf16(const uint8_t *p, const float *xp, __m256 *a0, __m256 *a1) {
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    PREFETCH(p);
    __m256i w0 = _mm256_loadu_si256((const __m256i *)p), w1 = _mm256_loadu_si256((const __m256i *)(p + 32));
    *a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)), _mm256_load_ps(xp), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)), _mm256_load_ps(xp + 8), *a1);
    *a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w0, hi)), _mm256_load_ps(xp + 16), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w1, hi)), _mm256_load_ps(xp + 24), *a1);
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

/* 64 fp4 columns (two groups of 32, one per 128-bit lane) against permuted x.  Each code becomes
 * the bf16 encoding of its exact value from two vpshufb tables (high and low byte; e2m1 values
 * are all normal or zero in bf16), bytes are paired into 16-bit lanes, and a 16-bit shift or
 * mask turns each pair of lanes into fp32: no conversion instructions at all.  Element i < 4 of
 * each product belongs to the first group, 4 + i to the second. */
INLINE void step64_fp4(const uint8_t *p, const float *xp, __m256 *a0, __m256 *a1) {
    const __m256i hi_tab = fp4_bf16_hi_table(), lo_tab = fp4_bf16_lo_table();
    const __m256i m4 = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi32((int)0xFFFF0000u);
    PREFETCH(p);
    __m256i b = _mm256_loadu_si256((const __m256i *)p);
    __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
    __m256i ll = _mm256_shuffle_epi8(lo_tab, lo), lh = _mm256_shuffle_epi8(hi_tab, lo);
    __m256i hl = _mm256_shuffle_epi8(lo_tab, hi), hh = _mm256_shuffle_epi8(hi_tab, hi);
    __m256i e0 = _mm256_unpacklo_epi8(ll, lh), e1 = _mm256_unpackhi_epi8(ll, lh); /* even columns */
    __m256i o0 = _mm256_unpacklo_epi8(hl, hh), o1 = _mm256_unpackhi_epi8(hl, hh); /* odd columns */
#define FP4_FMA(acc, words, k)                                                                              \
    *acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(words, 16)), _mm256_load_ps(xp + 16 * k), *acc); \
    *acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(words, top)), _mm256_load_ps(xp + 16 * k + 8), *acc);
    FP4_FMA(a0, e0, 0)
    FP4_FMA(a1, e1, 1)
    FP4_FMA(a0, o0, 2)
    FP4_FMA(a1, o1, 3)
#undef FP4_FMA
}

INLINE void step32(mg_format f, const uint8_t *row, int64_t c, const float *xp, __m256 *a0, __m256 *a1) {
    if (f == MG_FP8_E4M3) step32_fp8(row + c, xp, a0, a1);
    else step32_bf16(row + (size_t)c * 2, xp, a0, a1);
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

/* Row r over columns [c0, c0 + kc) (c0 a multiple of XP_COLS), xp holding x permuted. */
INLINE float row_dot_chunk(const mg_matrix *w, mg_format f, int64_t r, int64_t c0, int64_t kc, const float *xp,
                           const float *x) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * mg_matrix_row_bytes(w);
    const int64_t bc = block_cols(w->scale_kind);
    float sf[XP_COLS / 32];
    const int split = row_scales(w, f, r, c0, kc, bc, sf);
    const float factor = raw_factor(f);
    const int permuted = f == MG_FP8_E4M3 || f == MG_BF16 || f == MG_FP4_E2M1;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t bi = 0;
    if (f == MG_FP4_E2M1 && w->scale_kind == MG_SCALE_E8M0_G32) {
        /* Two groups per step: their scales go to the two 128-bit lanes. */
        int64_t c = c0;
        for (; c + 64 <= c0 + kc; c += 64, bi += 2) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            step64_fp4(row + c / 2, xp + (c - c0), &a0, &a1);
            const __m256 s2 = _mm256_set_m128(_mm_broadcast_ss(sf + bi + 1), _mm_broadcast_ss(sf + bi));
            if (bi & 2) acc1 = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), s2, acc1);
            else acc0 = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), s2, acc0);
        }
        for (; c < c0 + kc; c += 32, bi++) {
            const int64_t n = c0 + kc - c < 32 ? c0 + kc - c : 32;
            acc0 = _mm256_fmadd_ps(block_dot(f, row, c, n, x), _mm256_broadcast_ss(sf + bi), acc0);
        }
        return hsum8(_mm256_add_ps(acc0, acc1));
    }
    for (int64_t b = c0; b < c0 + kc; b += bc, bi++) {
        const int64_t e = b + bc < c0 + kc ? b + bc : c0 + kc;
        __m256 part;
        int64_t c = b;
        if (f == MG_FP4_E2M1) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            for (; c + 64 <= e; c += 64) step64_fp4(row + c / 2, xp + (c - c0), &a0, &a1);
            part = _mm256_add_ps(a0, a1);
        } else if (permuted) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            for (; c + 32 <= e; c += 32) step32(f, row, c, xp + (c - c0), &a0, &a1);
            part = _mm256_add_ps(a0, a1);
        } else {
            part = _mm256_setzero_ps();
        }
        if (c < e) part = _mm256_add_ps(part, block_dot(f, row, c, e - c, x));
        if (__builtin_expect(split, 0)) {
            acc0 = apply_scale(acc0, part, scale_at(w, r, b), factor);
        } else if (bi & 1) {
            acc1 = _mm256_fmadd_ps(part, _mm256_broadcast_ss(sf + bi), acc1);
        } else {
            acc0 = _mm256_fmadd_ps(part, _mm256_broadcast_ss(sf + bi), acc0);
        }
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* ---- decode fast paths: several rows per pass ------------------------------------------------
 *
 * The one-row loop above ran fp4 / fp8 at 0.30-0.37 of read bandwidth on one Zen 4 core (fp8 with
 * 128x128 block scales: 13 GB/s from L2).  The loops below take two to four rows per pass sharing
 * the x loads, start each step's partial sums afresh where a long FMA chain would bound them,
 * prefetch the same line of a later group of rows (rows_ahead) into L2, and decode fp8 without
 * vcvtph2ps (folded scales, as the AVX-512 table does): fp8 22 GB/s from L2 per core, streamed
 * 0.9+ of read bandwidth on one core (thread CPU time).  Rows per pass (group_rows), Zen 4: fp8
 * and fp4 two (four: 5% slower from L2 and 0.84 instead of 0.95 streamed; three: 0.61 streamed),
 * bf16 four (two: 50 instead of 57 GB/s from L2).  Prefetch into L2 (T1): 0.70-0.78 streamed
 * against 0.51-0.54 into L1 (T0), with 4, 8 or 16 KiB ahead alike.
 *
 * fp4 stays bound by its decoding (10.5 GB/s of codes per core from L2, about 0.35 of one core's
 * read bandwidth): per 64 codes four vpshufb, four unpacks and five shifts share the two shuffle
 * pipes with part of the eight FMAs; a single FMA chain per step, four chains, or fewer rows per
 * pass did not change that, and two other decodings were slower (8.0 GB/s each): the codes as
 * int8 in the top byte of each 32-bit lane through vcvtdq2ps, and f16 high bytes through
 * vcvtph2ps (one scale broadcast per group, no permute).  Needs whole steps (fp8, bf16: 32 columns; fp4: 64), otherwise the
 * call takes the one-row loop. */

/* Prefetch distance of the multi-row loops: the same line of a later group of rows, at least
 * MG_AVX2_MIN_AHEAD bytes on (narrow rows would otherwise prefetch too close, see the AVX-512
 * file). */
#ifndef MG_AVX2_MIN_AHEAD
#define MG_AVX2_MIN_AHEAD 8192
#endif
#ifndef MG_AVX2_ROWS_HINT
#define MG_AVX2_ROWS_HINT _MM_HINT_T1
#endif
INLINE size_t rows_ahead(size_t group) {
    return group >= MG_AVX2_MIN_AHEAD ? group : (MG_AVX2_MIN_AHEAD + group - 1) / group * group;
}
#define PREFETCH_AHEAD(p, ahead) _mm_prefetch((const char *)(p) + (ahead), MG_AVX2_ROWS_HINT)

/* fp8 in the folded form (any scale kind whose scales can be folded into x; unscaled rows fold
 * a scale of one), R (1..4) rows at once, decoded without vcvtph2ps: in each 16-bit lane an
 * arithmetic shift by 4 and the mask 0x87F0 turn a byte s.eeee.mmm (moved to the high byte) into
 * s << 15 | eeeemmm << 4, the upper half of an fp32 whose value is exactly v * 2^-120 (eeee = 0
 * lands in the fp32 denormals, still exact); a 32-bit shift or a mask then widens the lanes as for
 * bf16.  xq carries 2^120 and the block scales (fold_scales).  Per 32 columns xq is in the order
 * 4q, 4q + 2, 4q + 1, 4q + 3 (q < 8).  NaN codes are not supported, as in the other fp8 paths. */
/* One 32-column step of rows_fp8_folded for one row. */
INLINE void step_fp8_folded(const uint8_t *p, const float *xq, __m256 *a0, __m256 *a1) {
    const __m256i m = _mm256_set1_epi16((short)0x87F0), hi = _mm256_set1_epi32((int)0xFFFF0000u);
    const __m256i w = _mm256_loadu_si256((const __m256i *)p);
    const __m256i even = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 4), m);
    const __m256i odd = _mm256_and_si256(_mm256_srai_epi16(w, 4), m);
    *a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(even, 16)), _mm256_load_ps(xq), *a0);     /* 4q */
    *a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(even, hi)), _mm256_load_ps(xq + 8), *a1);  /* 4q + 2 */
    *a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(odd, 16)), _mm256_load_ps(xq + 16), *a0); /* 4q + 1 */
    *a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(odd, hi)), _mm256_load_ps(xq + 24), *a1);  /* 4q + 3 */
}

INLINE void rows_fp8_folded(const int R, const uint8_t *const *p, const float *xq, int64_t nb, size_t ahead,
                            float *out) {
    __m256 a0[4], a1[4], b0[4], b1[4];
#pragma GCC unroll 4
    for (int j = 0; j < R; j++) a0[j] = a1[j] = b0[j] = b1[j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, xq += 64) { /* one 64-byte line per row */
#pragma GCC unroll 4
        for (int j = 0; j < R; j++) {
            PREFETCH_AHEAD(p[j] + 32 * i, ahead);
            step_fp8_folded(p[j] + 32 * i, xq, &a0[j], &a1[j]);
            step_fp8_folded(p[j] + 32 * i + 32, xq + 32, &b0[j], &b1[j]);
        }
    }
    if (i < nb) { /* a last half line */
#pragma GCC unroll 4
        for (int j = 0; j < R; j++) step_fp8_folded(p[j] + 32 * i, xq, &a0[j], &a1[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < R; j++) out[j] = hsum8(_mm256_add_ps(_mm256_add_ps(a0[j], a1[j]), _mm256_add_ps(b0[j], b1[j])));
}

/* bf16 (unscaled or F32_ROW), R (1..4) rows at once sharing the xp loads; 64 bytes (32 columns,
 * xp = [even | odd] per 32, see permute_x) per step. */
INLINE void rows_bf16(const int R, const uint8_t *const *p, const float *xp, int64_t nb, size_t ahead, float *out) {
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256 a0[4], a1[4];
    #pragma GCC unroll 4
    for (int j = 0; j < R; j++) a0[j] = a1[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xp += 32) {
        const __m256 x0 = _mm256_load_ps(xp), x1 = _mm256_load_ps(xp + 8);
        const __m256 x2 = _mm256_load_ps(xp + 16), x3 = _mm256_load_ps(xp + 24);
        #pragma GCC unroll 4
        for (int j = 0; j < R; j++) {
            PREFETCH_AHEAD(p[j] + 64 * i, ahead);
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(p[j] + 64 * i));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(p[j] + 64 * i + 32));
            a0[j] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)), x0, a0[j]);
            a1[j] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)), x1, a1[j]);
            a0[j] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w0, hi)), x2, a0[j]);
            a1[j] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w1, hi)), x3, a1[j]);
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < R; j++) out[j] = hsum8(_mm256_add_ps(a0[j], a1[j]));
}

/* fp4, R (1..4) rows at once: p[j] points at the same columns of row j, s[j] at its group scales
 * as floats (s[0] == NULL: unscaled).  32 bytes (64 columns, two groups: one per 128-bit lane)
 * per step, decoded as in step64_fp4; each step's partial sums start with a multiply, so the
 * steps' chains overlap, and meet the scales [s0 x4, s1 x4] in one FMA. */
INLINE void rows_fp4(const int R, const uint8_t *const *p, const float *xp, int64_t nb, const float *const *s,
                     size_t ahead, float *out) {
    const __m256i hi_tab = fp4_bf16_hi_table(), lo_tab = fp4_bf16_lo_table();
    const __m256i m4 = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi32((int)0xFFFF0000u);
    const __m256i pair = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int j = 0; j < R; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xp += 64) {
#pragma GCC unroll 4
        for (int j = 0; j < R; j++) {
            PREFETCH_AHEAD(p[j] + 32 * i, ahead); /* twice per line: cheaper than a branch */
            const __m256i b = _mm256_loadu_si256((const __m256i *)(p[j] + 32 * i));
            const __m256i lo = _mm256_and_si256(b, m4), hn = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            const __m256i ll = _mm256_shuffle_epi8(lo_tab, lo), lh = _mm256_shuffle_epi8(hi_tab, lo);
            const __m256i hl = _mm256_shuffle_epi8(lo_tab, hn), hh = _mm256_shuffle_epi8(hi_tab, hn);
            const __m256i e0 = _mm256_unpacklo_epi8(ll, lh), e1 = _mm256_unpackhi_epi8(ll, lh); /* even columns */
            const __m256i o0 = _mm256_unpacklo_epi8(hl, hh), o1 = _mm256_unpackhi_epi8(hl, hh); /* odd columns */
            __m256 s0 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(e0, 16)), _mm256_load_ps(xp));
            __m256 s1 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(e0, top)), _mm256_load_ps(xp + 8));
            s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(e1, 16)), _mm256_load_ps(xp + 16), s0);
            s1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(e1, top)), _mm256_load_ps(xp + 24), s1);
            s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(o0, 16)), _mm256_load_ps(xp + 32), s0);
            s1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(o0, top)), _mm256_load_ps(xp + 40), s1);
            s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(o1, 16)), _mm256_load_ps(xp + 48), s0);
            s1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(o1, top)), _mm256_load_ps(xp + 56), s1);
            const __m128 two = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(s[j] + 2 * i)));
            acc[j] = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two), pair),
                                     acc[j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < R; j++) out[j] = hsum8(acc[j]);
}

/* Block-128 scale of row r, column c (fp8). */
INLINE float scale_block128(const mg_matrix *w, int64_t r, int64_t c) {
    if (w->scale_kind != MG_SCALE_F32_BLOCK128 && w->scale_kind != MG_SCALE_E8M0_BLOCK128) return 1.0f;
    return scale_at(w, r, c);
}

/* x * 256 in the order rows_fp8_folded reads it (per 32 columns: 4q, 4q + 2, 4q + 1, 4q + 3). */
INLINE void permute_x_fp8_folded(const float *x, int64_t kc, float *xo) {
    static const int order[4] = {0, 2, 1, 3};
    for (int64_t g = 0; g < kc; g += 32)
        for (int k = 0; k < 4; k++)
            for (int q = 0; q < 8; q++) xo[g + 8 * k + q] = x[g + 4 * q + order[k]] * 256.0f;
}

/* xq = xo (x * 256, permuted) times 2^(112 - k) times the scale of each 128-column block of row r
 * (one for unscaled and F32_ROW matrices), so that the rows sharing these scales run
 * rows_fp8_folded, which leaves 2^-120 in each weight; their sums are multiplied by *unfold = 2^k
 * afterwards.  k > 0 only when x * scale is too large for k = 0: unscaled and per-row-scaled fp8
 * would otherwise need |x| < 64.  Returns 0 (xq unusable) unless every xq is zero or a finite
 * normal number, which keeps each weight times x the same product as the scalar twin's (exactly
 * so for power-of-two scales).  xmax, xmin: the largest and the smallest non-zero |xo|. */
INLINE int fold_scales(const mg_matrix *w, int64_t r, int64_t c0, int64_t kc, const float *xo, float xmax, float xmin,
                       float *xq, float *unfold) {
    double amax = 0.0, amin = INFINITY;
    for (int64_t j = 0; j * 128 < kc; j++) {
        const double a = fabs((double)scale_block128(w, r, c0 + j * 128));
        if (!(a < INFINITY)) return 0; /* inf or NaN scales: the one-row loop */
        amax = a > amax ? a : amax;
        amin = a > 0.0 && a < amin ? a : amin;
    }
    const double hi = (double)xmax * amax * 0x1p112, lo = (double)xmin * amin * 0x1p112;
    const int k = hi < 0x1p126 ? 0 : ilogb(hi) - 125; /* hi * 2^-k < 2^126 */
    if (xmin < INFINITY && amin < INFINITY && !(ldexp(lo, -k) >= 0x1p-126)) return 0;
    if (!(ldexp(amax, 112 - k) < 0x1p128)) return 0; /* the factor itself must be a finite float */
    for (int64_t j = 0; j * 128 < kc; j++) { /* the factor is exact: a power-of-two multiple */
        const __m256 s = _mm256_set1_ps(ldexpf(scale_block128(w, r, c0 + j * 128), 112 - k));
        const int64_t e = (j + 1) * 128 < kc ? (j + 1) * 128 : kc;
        for (int64_t i = j * 128; i < e; i += 8) _mm256_store_ps(xq + i, _mm256_mul_ps(_mm256_load_ps(xo + i), s));
    }
    *unfold = ldexpf(1.0f, k);
    return 1;
}

/* Writes (c0 == 0) or adds the R row sums part[] times their row scales to y[r..]. */
INLINE void store_rows(const mg_matrix *w, int64_t r, int64_t n, int64_t c0, const float *part, float unfold,
                       float *y) {
    for (int64_t j = 0; j < n; j++) {
        const float v = part[j] * unfold * row_scale(w, r + j);
        y[r + j] = c0 == 0 ? v : y[r + j] + v;
    }
}

/* Rows [r, r + n) (n in 1..4) of one fast format over columns [c0, c0 + kc) against xs (permuted
 * x; fp8: xq folded for these rows, whose sums are multiplied by unfold); sfr: scratch for fp4
 * group scales.  Returns n. */
INLINE int64_t fast_rows(const mg_matrix *w, mg_format f, int64_t r, int64_t n, int64_t c0, int64_t kc,
                         const float *xs, float unfold, float *y, float (*sfr)[XP_COLS / 32]) {
    const size_t rb = mg_matrix_row_bytes(w), off = col_bytes(f, c0);
    const uint8_t *p[4];
    const float *s[4] = {NULL, NULL, NULL, NULL};
    float part[4];
    for (int64_t j = 0; j < n; j++) {
        p[j] = (const uint8_t *)w->data + (size_t)(r + j) * rb + off;
        if (f == MG_FP4_E2M1 && w->scale_kind == MG_SCALE_E8M0_G32) {
            row_scales(w, f, r + j, c0, kc, 32, sfr[j]); /* e8m0 times 1: never overflows */
            s[j] = sfr[j];
        } else if (f == MG_FP4_E2M1) {
            s[j] = sfr[4]; /* ones (linear_decode_fast) */
        }
    }
    const size_t ahead = rows_ahead((size_t)n * rb);
    /* constant R: the row loops unroll */
#define FAST_ROWS(R)                                                                   \
    if (f == MG_FP4_E2M1) rows_fp4(R, p, xs, kc / 64, s, ahead, part);                 \
    else if (f == MG_BF16) rows_bf16(R, p, xs, kc / 32, ahead, part);                  \
    else rows_fp8_folded(R, p, xs, kc / 32, ahead, part);
    switch (n) {
    case 4: FAST_ROWS(4) break;
    case 3: FAST_ROWS(3) break;
    case 2: FAST_ROWS(2) break;
    default: FAST_ROWS(1) break;
    }
#undef FAST_ROWS
    store_rows(w, r, n, c0, part, unfold, y);
    return n;
}

/* Rows per pass (Zen 4, one core: see "decode fast paths" above). */
#ifndef MG_AVX2_GROUP_BF16
#define MG_AVX2_GROUP_BF16 4
#endif
#ifndef MG_AVX2_GROUP_Q
#define MG_AVX2_GROUP_Q 2
#endif
INLINE int64_t group_rows(mg_format f) { return f == MG_BF16 ? MG_AVX2_GROUP_BF16 : MG_AVX2_GROUP_Q; }

/* Whether the multi-row loops take this matrix (x is checked separately for fp8). */
INLINE int fast_decode(const mg_matrix *w, mg_format f) {
    switch (f) {
    case MG_BF16: return w->cols % 32 == 0 && (w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_F32_ROW);
    case MG_FP8_E4M3: return w->cols % 32 == 0 && w->scale_kind != MG_SCALE_E8M0_G32;
    case MG_FP4_E2M1:
        return w->cols % 64 == 0 && (w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_F32_ROW ||
                                     w->scale_kind == MG_SCALE_E8M0_G32);
    default: return 0;
    }
}

/* Decode through the multi-row loops; returns 0 (having written nothing) when the one-row loop
 * must do it.  fp8 rows whose scales cannot be folded take the one-row loop (row_dot_chunk). */
INLINE int linear_decode_fast(const mg_matrix *w, mg_format f, const float *x, float *y, int64_t r0, int64_t r1) {
    if (!fast_decode(w, f)) return 0;
    if (f == MG_FP8_E4M3) { /* x * 256 must be exact for the whole row before any y is written */
        for (int64_t c = 0; c < w->cols; c++)
            if (!(fabsf(x[c]) < 0x1p119f || isnan(x[c]))) return 0;
    }
    float xp[XP_COLS] __attribute__((aligned(32)));
    float xq[XP_COLS] __attribute__((aligned(32))); /* fp8: xp with scales folded in */
    float sfr[5][XP_COLS / 32]; /* fp4: four rows' group scales, and ones for unscaled rows */
    const int64_t G = group_rows(f);
    for (int64_t i = 0; i < XP_COLS / 32; i++) sfr[4][i] = 1.0f;
    for (int64_t c0 = 0; c0 < w->cols; c0 += XP_COLS) {
        const int64_t kc = w->cols - c0 < XP_COLS ? w->cols - c0 : XP_COLS;
        if (f != MG_FP8_E4M3) {
            permute_x(f, x + c0, kc, xp);
            for (int64_t r = r0; r < r1;) r += fast_rows(w, f, r, r1 - r < G ? r1 - r : G, c0, kc, xp, 1.0f, y, sfr);
            continue;
        }
        permute_x_fp8_folded(x + c0, kc, xp);
        float xmax = 0.0f, xmin = INFINITY;
        for (int64_t c = 0; c < kc; c++) {
            const float a = fabsf(xp[c]);
            xmax = a > xmax ? a : xmax; /* NaN compares false: skipped */
            xmin = a > 0.0f && a < xmin ? a : xmin;
        }
        /* Scale blocks of 128 rows (unscaled and F32_ROW: one fold serves every row). */
        const int blocks = w->scale_kind == MG_SCALE_F32_BLOCK128 || w->scale_kind == MG_SCALE_E8M0_BLOCK128;
        for (int64_t r = r0; r < r1;) {
            const int64_t e = !blocks || (r / 128 + 1) * 128 >= r1 ? r1 : (r / 128 + 1) * 128;
            float unfold;
            if (!fold_scales(w, r, c0, kc, xp, xmax, xmin, xq, &unfold)) {
                permute_x(f, x + c0, kc, xq); /* the one-row loop's order, see row_dot_chunk */
                for (; r < e; r++) { /* e.g. scales too large to fold */
                    const float part = row_dot_chunk(w, f, r, c0, kc, xq, x) * row_scale(w, r);
                    y[r] = c0 == 0 ? part : y[r] + part;
                }
                continue;
            }
            while (r < e) r += fast_rows(w, f, r, e - r < G ? e - r : G, c0, kc, xq, unfold, y, sfr);
        }
    }
    return 1;
}

INLINE void linear_decode(const mg_matrix *w, mg_format f, const float *x, float *y, int64_t r0, int64_t r1) {
    if (linear_decode_fast(w, f, x, y, r0, r1)) return;
    float xp[XP_COLS] __attribute__((aligned(32)));
    for (int64_t c0 = 0; c0 < w->cols; c0 += XP_COLS) {
        const int64_t kc = w->cols - c0 < XP_COLS ? w->cols - c0 : XP_COLS;
        if (f == MG_FP8_E4M3 || f == MG_BF16 || f == MG_FP4_E2M1) permute_x(f, x + c0, kc, xp);
        for (int64_t r = r0; r < r1; r++) {
            const float part = row_dot_chunk(w, f, r, c0, kc, xp, x) * row_scale(w, r);
            y[r] = c0 == 0 ? part : y[r] + part;
        }
    }
}

/* ---- prefill (n_tok > 1) ---------------------------------------------------------------- */

/* Rows go along the vector lanes: the tile holds TILE_ROWS rows of TILE_COLS columns
 * column-major (tile[c * TILE_ROWS + i]), so one column is two ymm of 16 row values, and the
 * micro-kernel multiplies them by one broadcast x value per token.  Each (row, token) is then a
 * plain sequential sum over the columns of a chunk (no horizontal sums), its lanes already in
 * output order (y rows are contiguous), and it does not depend on the other tokens. */
enum { TILE_ROWS = 16, TILE_COLS = 512, MICRO_TOK = 6 };
/* Formats whose tiles prefetch the next chunk of their rows: a chunk of an fp8 or fp4 row is only
 * two to four cache lines, too short a stream for the hardware prefetcher, and with few tokens per
 * tile (MoE experts) the multiply-adds do not hide the misses.  Wider rows did worse with it. */
#define PREFILL_PREFETCH(f) ((f) == MG_FP4_E2M1 || (f) == MG_FP8_E4M3)

/* r[0..7] (8 rows x 8 columns) to columns: r[k] becomes column k (lane i = row i). */
INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
        r[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
    }
}

/* Scales of the tile, per scale block and row (lanes), applied to transposed columns: sc[k *
 * TILE_ROWS + i] multiplies row i of the k-th scale block of the chunk.  sc holds scale times the
 * format's power-of-two raw factor, which is one multiply equal to the two bit for bit (the factor
 * is exact) unless that product overflows; then (returns 2) sc holds the scale and fc the factor
 * (1 in lanes without overflow) for two multiplies.  Returns 0 when there is nothing to multiply
 * (sc is then not written), 1 for one multiply.  Rows past nr get harmless scales of 1. */
INLINE __m256 e8m0_lanes(__m128i b) { /* 8 e8m0 bytes to fp32, as mg_e8m0_to_f32 */
    const __m256i e = _mm256_cvtepu8_epi32(b);
    __m256i u = _mm256_slli_epi32(e, 23);
    u = _mm256_blendv_epi8(u, _mm256_set1_epi32(0x00400000), _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
    u = _mm256_blendv_epi8(u, _mm256_set1_epi32(0x7fc00000), _mm256_cmpeq_epi32(e, _mm256_set1_epi32(255)));
    return _mm256_castsi256_ps(u);
}

INLINE int tile_scales(const mg_matrix *w, mg_format f, int64_t r, int64_t nr, int64_t c0, int64_t kc,
                       float *sc, float *fc) {
    const float factor = raw_factor(f);
    if (w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_F32_ROW) {
        for (int i = 0; i < 8; i++) sc[i] = factor;
        return factor != 1.0f;
    }
    const int64_t bc = block_cols(w->scale_kind), nb = (kc + bc - 1) / bc;
    int split = 0;
    if (w->scale_kind == MG_SCALE_E8M0_G32) { /* 8 blocks of 16 rows at a time: a vector per row */
        const __m256 vf = _mm256_set1_ps(factor), inf = _mm256_set1_ps(INFINITY);
        const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        for (int64_t k0 = 0; k0 < nb && !split; k0 += 8) {
            const uint8_t *p = (const uint8_t *)w->scale + c0 / 32 + k0;
            const size_t nbytes = (size_t)(nb - k0 < 8 ? nb - k0 : 8);
            float rowsc[TILE_ROWS][8] __attribute__((aligned(32)));
            for (int64_t i = 0; i < TILE_ROWS; i++) {
                uint64_t bytes = 0x7f7f7f7f7f7f7f7full; /* 1.0 */
                if (i < nr) memcpy(&bytes, p + (r + i) * w->scale_cols, nbytes);
                const __m256 sv = e8m0_lanes(_mm_cvtsi64_si128((long long)bytes)), sf = _mm256_mul_ps(sv, vf);
                /* overflow: sf infinite while the scale is finite */
                const __m256 ov = _mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(sf, abs_mask), inf, _CMP_EQ_OQ),
                                                _mm256_cmp_ps(_mm256_and_ps(sv, abs_mask), inf, _CMP_LT_OQ));
                split |= _mm256_movemask_ps(ov);
                _mm256_store_ps(rowsc[i], sf);
            }
            for (int g = 0; g < TILE_ROWS; g += 8) {
                __m256 v[8];
                for (int i = 0; i < 8; i++) v[i] = _mm256_load_ps(rowsc[g + i]);
                transpose8(v);
                for (int64_t k = 0; k < (int64_t)nbytes; k++) _mm256_store_ps(sc + (k0 + k) * TILE_ROWS + g, v[k]);
            }
        }
        if (!split) return 1;
        split = 0; /* rare: redo below lane by lane */
    }
    for (int64_t k = 0; k < nb; k++)
        for (int64_t i = 0; i < TILE_ROWS; i++) {
            const float s = i < nr ? scale_at(w, r + i, c0 + k * bc) : 1.0f, sf = s * factor;
            const int sp = !isfinite(sf) && isfinite(s);
            sc[k * TILE_ROWS + i] = sp ? s : sf;
            fc[k * TILE_ROWS + i] = sp ? factor : 1.0f;
            split |= sp;
        }
    return split ? 2 : 1;
}

/* Columns per dequantisation step: f32 rows are transposed as fp32 (8 columns), the other formats
 * as 16-bit codes (16 columns; fp4: 32), which takes half the shuffles of transposing them after
 * widening. */
INLINE int64_t tile_step(mg_format f) { return f == MG_F32 ? 8 : (f == MG_FP4_E2M1 ? 32 : 16); }

/* 16-bit codes of one tile step of a row in column order, h[0] columns 0..15 (h[1] 16..31 for
 * fp4): bf16 bits for bf16, f16 bits for the others (fp8: the raw f16 of dec_fp8x16, value
 * times 2^-8; fp4: the exact values, as in dec_fp4x32). */
INLINE void dec16_step(mg_format f, const uint8_t *p, __m256i h[2]) {
    if (f == MG_BF16 || f == MG_F16) {
        h[0] = _mm256_loadu_si256((const __m256i *)p);
    } else if (f == MG_FP8_E4M3) {
        const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
        h[0] = _mm256_and_si256(_mm256_slli_epi16(v, 7), _mm256_set1_epi16((short)0xBF80));
    } else {
        const __m128i lut = fp4_f16_lut(), m4 = _mm_set1_epi8(0x0f);
        const __m128i b = _mm_loadu_si128((const __m128i *)p);
        const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, m4));
        const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
        h[0] = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi)), 8);
        h[1] = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_unpackhi_epi8(lo, hi)), 8);
    }
}

/* The first n (< tile_step) columns of a step, from a zero-padded copy (zero codes are zeros). */
INLINE void dec16_step_tail(mg_format f, const uint8_t *p, int64_t n, __m256i h[2]) {
    uint8_t buf[64] __attribute__((aligned(32)));
    copy_tail(f, p, n, buf, sizeof buf);
    dec16_step(f, buf, h);
}

/* h[0..7] (8 rows x 16 columns of 16-bit codes) to columns, within each 128-bit lane: h[k] becomes
 * column k in its low lane and column k + 8 in its high lane (element i = row i). */
INLINE void transpose8x16(__m256i h[8]) {
    __m256i a[8], b[8];
    for (int j = 0; j < 4; j++) {
        a[j] = _mm256_unpacklo_epi16(h[2 * j], h[2 * j + 1]);     /* cols 0-3 | 8-11, rows 2j, 2j+1 */
        a[j + 4] = _mm256_unpackhi_epi16(h[2 * j], h[2 * j + 1]); /* cols 4-7 | 12-15 */
    }
    for (int q = 0; q < 2; q++) { /* q: cols 0-3 or 4-7 (of each lane) */
        const __m256i *x = a + 4 * q;
        b[4 * q + 0] = _mm256_unpacklo_epi32(x[0], x[1]); /* rows 0-3, cols 4q+0, 4q+1 */
        b[4 * q + 1] = _mm256_unpackhi_epi32(x[0], x[1]); /* rows 0-3, cols 4q+2, 4q+3 */
        b[4 * q + 2] = _mm256_unpacklo_epi32(x[2], x[3]); /* rows 4-7 */
        b[4 * q + 3] = _mm256_unpackhi_epi32(x[2], x[3]);
    }
    for (int q = 0; q < 2; q++)
        for (int j = 0; j < 2; j++) {
            h[4 * q + 2 * j] = _mm256_unpacklo_epi64(b[4 * q + j], b[4 * q + 2 + j]);     /* col 4q+2j */
            h[4 * q + 2 * j + 1] = _mm256_unpackhi_epi64(b[4 * q + j], b[4 * q + 2 + j]); /* col 4q+2j+1 */
        }
}

/* 8 16-bit codes (one column of 8 rows) to fp32. */
INLINE __m256 widen16(mg_format f, __m128i h) {
    return f == MG_BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}

INLINE void store_col(float *o, __m256 d, int how, __m256 sv, __m256 fv) {
    if (how == 2) d = _mm256_mul_ps(d, fv);
    if (how) d = _mm256_mul_ps(d, sv);
    _mm256_store_ps(o, d);
}

/* Dequantise rows [r, r + nr) (nr <= 8) x columns [c, c + n) (n <= tile_step) into the tile
 * columns at o (row stride TILE_ROWS): decode each row, transpose, scale per lane (how, sv, fv:
 * see tile_scales). */
INLINE void dequant_group_step(mg_format f, const uint8_t *const *rows, int64_t nr, int64_t c, int64_t n,
                               int how, __m256 sv, __m256 fv, float *o) {
    const int64_t step = tile_step(f);
    if (PREFILL_PREFETCH(f) && (col_bytes(f, c) & 63) == 0) /* the same columns of the next chunk */
        for (int i = 0; i < nr; i++) _mm_prefetch((const char *)rows[i] + col_bytes(f, c + TILE_COLS), _MM_HINT_T0);
    if (f == MG_F32) {
        __m256 v[8];
        for (int i = 0; i < 8; i++)
            v[i] = i >= nr ? _mm256_setzero_ps() : load_partial((const float *)rows[i] + c, n);
        transpose8(v);
        for (int k = 0; k < n; k++) store_col(o + k * TILE_ROWS, v[k], how, sv, fv);
        return;
    }
    __m256i v[2][8];
    for (int i = 0; i < 8; i++) {
        __m256i d[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        if (i < nr) {
            if (n == step) dec16_step(f, rows[i] + col_bytes(f, c), d);
            else dec16_step_tail(f, rows[i] + col_bytes(f, c), n, d);
        }
        v[0][i] = d[0];
        v[1][i] = d[1];
    }
    for (int q = 0; q < step / 16 && q * 16 < n; q++) {
        transpose8x16(v[q]);
        for (int k = 0; k < 8; k++) {
            const int64_t j = q * 16 + k;
            if (j < n) store_col(o + j * TILE_ROWS, widen16(f, _mm256_castsi256_si128(v[q][k])), how, sv, fv);
            if (j + 8 < n) store_col(o + (j + 8) * TILE_ROWS, widen16(f, _mm256_extracti128_si256(v[q][k], 1)), how, sv, fv);
        }
    }
}

/* Dequantise rows [r, r + nr) x columns [c0, c0 + kc) of w exactly into the column-major tile
 * (rows nr..TILE_ROWS-1 are zeros), 8 rows at a time.  Scale blocks (32, 128 or 256 columns)
 * never straddle a TILE_COLS chunk. */
INLINE void dequant_tile(const mg_matrix *w, mg_format f, int64_t r, int64_t nr, int64_t c0, int64_t kc,
                         float *tile) {
    const int64_t step = tile_step(f), end = c0 + kc;
    const int64_t bc = w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_F32_ROW ? TILE_COLS : block_cols(w->scale_kind);
    const size_t rb = mg_matrix_row_bytes(w);
    float sc[TILE_COLS / 32 * TILE_ROWS] __attribute__((aligned(32))), fc[TILE_COLS / 32 * TILE_ROWS] __attribute__((aligned(32)));
    const int how = tile_scales(w, f, r, nr, c0, kc, sc, fc);
    for (int g = 0; g < TILE_ROWS; g += 8) {
        const int64_t gn = nr - g < 0 ? 0 : (nr - g < 8 ? nr - g : 8);
        const uint8_t *rows[8];
        for (int i = 0; i < 8; i++) rows[i] = (const uint8_t *)w->data + (size_t)(r + g + (i < gn ? i : 0)) * rb;
        for (int64_t b = c0; b < end; b += bc) {
            const int64_t be = b + bc < end ? b + bc : end, k = bc == TILE_COLS ? 0 : (b - c0) / bc;
            const __m256 sv = how ? _mm256_load_ps(sc + (bc == TILE_COLS ? 0 : k * TILE_ROWS + g)) : _mm256_setzero_ps();
            const __m256 fv = how == 2 ? _mm256_load_ps(fc + k * TILE_ROWS + g) : sv;
            int64_t c = b;
            float *o = tile + (c - c0) * TILE_ROWS + g;
            if (how == 0)
                for (; c + step <= be; c += step, o += step * TILE_ROWS) dequant_group_step(f, rows, gn, c, step, 0, sv, fv, o);
            else if (how == 1)
                for (; c + step <= be; c += step, o += step * TILE_ROWS) dequant_group_step(f, rows, gn, c, step, 1, sv, fv, o);
            else
                for (; c + step <= be; c += step, o += step * TILE_ROWS) dequant_group_step(f, rows, gn, c, step, 2, sv, fv, o);
            if (c < be) dequant_group_step(f, rows, gn, c, be - c, how, sv, fv, o);
        }
    }
}

/* y[t][r + i] (+)= sum over c < kc of tile[c][i] * x[t][c] for T tokens and the nr (<= 16) rows
 * of the tile: stored by the first column chunk, added by the next ones; the last one applies the
 * F32_ROW row scales (rs, NULL otherwise) to the whole sum.  Each column is two vectors of 16 row
 * values times one broadcast x value per token. */
INLINE void micro_tokens(const int T, const float *tile, const float *x, int64_t xs, int64_t kc, float *y,
                         int64_t ys, int64_t nr, int first, const __m256 *rs) {
    /* Every loop over t and h is unrolled (T is a constant here), so that the sums stay in
     * registers: indexed by a variable, GCC keeps the arrays in memory and stores them each step. */
    __m256 a[2][MICRO_TOK];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) a[0][t] = a[1][t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < kc; c++) {
        const __m256 w0 = _mm256_load_ps(tile + c * TILE_ROWS), w1 = _mm256_load_ps(tile + c * TILE_ROWS + 8);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m256 xb = _mm256_broadcast_ss(x + t * xs + c);
            a[0][t] = _mm256_fmadd_ps(w0, xb, a[0][t]);
            a[1][t] = _mm256_fmadd_ps(w1, xb, a[1][t]);
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const int64_t n = nr - 8 * h;
        const __m256i m = lane_mask(n < 0 ? 0 : n);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            float *p = y + t * ys + 8 * h;
            __m256 v = a[h][t];
            if (n >= 8) {
                if (!first) v = _mm256_add_ps(_mm256_loadu_ps(p), v);
                if (rs) v = _mm256_mul_ps(v, rs[h]);
                _mm256_storeu_ps(p, v);
            } else if (n > 0) {
                if (!first) v = _mm256_add_ps(_mm256_maskload_ps(p, m), v);
                if (rs) v = _mm256_mul_ps(v, rs[h]);
                _mm256_maskstore_ps(p, m, v);
            }
        }
    }
}

/* One function per token count, kept out of line: inlined into the tile loop, the compiler kept
 * loop-invariant values of the caller in registers and spilled an accumulator of the 6-token
 * loop to the stack (a store-to-load dependency per column, a third slower). */
#define MICRO_FN(T)                                                                                     \
    static __attribute__((noinline)) void micro_tokens##T(const float *tile, const float *x, int64_t xs, \
                                                          int64_t kc, float *y, int64_t ys, int64_t nr,   \
                                                          int first, const __m256 *rs) {                  \
        micro_tokens(T, tile, x, xs, kc, y, ys, nr, first, rs);                                          \
    }
MICRO_FN(1)
MICRO_FN(2)
MICRO_FN(3)
MICRO_FN(4)
MICRO_FN(5)
MICRO_FN(6)

/* All tokens over one tile, in blocks of at most MICRO_TOK spread evenly (so that a remainder
 * never leaves a block of one or two tokens too short to hide the FMA latency). */
INLINE void tile_tokens(const float *tile, const float *x, int64_t xs, int64_t n_tok, int64_t kc, float *y,
                        int64_t ys, int64_t nr, int first, const __m256 *rs) {
    static void (*const micro[MICRO_TOK + 1])(const float *, const float *, int64_t, int64_t, float *, int64_t,
                                              int64_t, int, const __m256 *) = {
        NULL, micro_tokens1, micro_tokens2, micro_tokens3, micro_tokens4, micro_tokens5, micro_tokens6};
    const int64_t nb = (n_tok + MICRO_TOK - 1) / MICRO_TOK, base = n_tok / nb, extra = n_tok % nb;
    int64_t t = 0;
    for (int64_t b = 0; b < nb; b++) {
        const int T = (int)(base + (b < extra));
        micro[T](tile, x + t * xs, xs, kc, y + t * ys, ys, nr, first, rs);
        t += T;
    }
}

INLINE void linear_prefill(const mg_matrix *w, mg_format f, const float *x, int64_t x_stride, int64_t n_tok,
                           float *y, int64_t y_stride, int64_t r0, int64_t r1) {
    float tile[TILE_ROWS * TILE_COLS] __attribute__((aligned(32)));
    const int64_t cols = w->cols;
    for (int64_t r = r0; r < r1; r += TILE_ROWS) {
        const int64_t nr = r1 - r < TILE_ROWS ? r1 - r : TILE_ROWS;
        __m256 rsv[2];
        if (w->scale_kind == MG_SCALE_F32_ROW) {
            float rs[TILE_ROWS] = {0};
            for (int64_t i = 0; i < nr; i++) rs[i] = row_scale(w, r + i);
            rsv[0] = _mm256_loadu_ps(rs);
            rsv[1] = _mm256_loadu_ps(rs + 8);
        }
        for (int64_t c0 = 0; c0 < cols; c0 += TILE_COLS) {
            const int64_t kc = cols - c0 < TILE_COLS ? cols - c0 : TILE_COLS;
            const int last = c0 + kc == cols;
            dequant_tile(w, f, r, nr, c0, kc, tile);
            tile_tokens(tile, x + c0, x_stride, n_tok, kc, y + r, y_stride, nr, c0 == 0,
                        last && w->scale_kind == MG_SCALE_F32_ROW ? rsv : NULL);
        }
    }
}

INLINE void linear_impl(const mg_matrix *w, mg_format f, const float *x, int64_t x_stride, int64_t n_tok,
                        float *y, int64_t y_stride, int64_t r0, int64_t r1) {
    if (n_tok == 1) {
        linear_decode(w, f, x, y, r0, r1);
    } else if (n_tok > 1) {
        linear_prefill(w, f, x, x_stride, n_tok, y, y_stride, r0, r1);
    }
}

#define LINEAR_FN(NAME, FMT)                                                                    \
    static void NAME(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, \
                     int64_t y_stride, int64_t r0, int64_t r1) {                               \
        linear_impl(w, FMT, x, x_stride, n_tok, y, y_stride, r0, r1);                          \
    }
LINEAR_FN(linear_f32, MG_F32)
LINEAR_FN(linear_bf16, MG_BF16)
LINEAR_FN(linear_f16, MG_F16)
LINEAR_FN(linear_fp8, MG_FP8_E4M3)
LINEAR_FN(linear_fp4, MG_FP4_E2M1)

/* ---- vector ops ------------------------------------------------------------------------- */

static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), a3);
    }
    for (; i < n; i += 8) {
        const int64_t k = n - i;
        a0 = _mm256_fmadd_ps(load_partial(a + i, k), load_partial(b + i, k), a0);
    }
    return hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

static void axpy_avx2(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) {
        const __m256i m = lane_mask(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_fmadd_ps(va, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m)));
    }
}

static void scale_avx2(float *y, float a, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    if (i < n) {
        const __m256i m = lane_mask(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(va, _mm256_maskload_ps(y + i, m)));
    }
}

static void rmsnorm_avx2(float *out, const float *x, const float *w, int64_t n, float eps) {
    /* Sum of squares in double, like the scalar twin, so both round to the same factor. */
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        s0 = _mm256_fmadd_pd(lo, lo, s0);
        s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    __m256d s = _mm256_add_pd(s0, s1);
    __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
    for (; i < n; i++) ss += (double)x[i] * x[i];
    const float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(out + i, v);
    }
    for (; i < n; i++) out[i] = x[i] * inv * (w ? w[i] : 1.0f);
}

/* expf for x in [-88.7, 88.7] (callers handle the ends): Cody-Waite range reduction by ln 2 and
 * a degree-6 polynomial on [-ln2/2, ln2/2]; about 1 ulp. */
INLINE __m256 exp_avx2(__m256 x) {
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693359375f), ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, ln2_hi, x);
    r = _mm256_fnmadd_ps(n, ln2_lo, r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    /* 2^n by building the exponent; n is in [-128, 128] here, so split it in two halves. */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, p1), p2);
}

INLINE __m256 swiglu8(__m256 g, __m256 u, float limit) {
    if (limit > 0.0f) {
        const __m256 lim = _mm256_set1_ps(limit), nlim = _mm256_set1_ps(-limit);
        g = _mm256_min_ps(lim, g); /* NaN in g or u passes through, as in the scalar twin */
        u = _mm256_max_ps(nlim, _mm256_min_ps(lim, u));
    }
    const __m256 neg = _mm256_sub_ps(_mm256_setzero_ps(), g);
    const __m256 hi = _mm256_set1_ps(88.72283935546875f), lo = _mm256_set1_ps(-88.0f);
    __m256 e = exp_avx2(_mm256_max_ps(lo, _mm256_min_ps(hi, neg)));
    /* exp(-g) beyond the clamp: overflow to inf (silu -> -0) or too small to change 1 + e. */
    e = _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(neg, hi, _CMP_GT_OQ));
    e = _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(neg, lo, _CMP_LT_OQ));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    return _mm256_mul_ps(silu, u);
}

static void swiglu_avx2(float *out, const float *gate, const float *up, int64_t n, float limit) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i), limit));
    if (i < n) {
        const __m256i m = lane_mask(n - i);
        __m256 r = swiglu8(_mm256_maskload_ps(gate + i, m), _mm256_maskload_ps(up + i, m), limit);
        _mm256_maskstore_ps(out + i, m, r);
    }
}

static float read_sum_avx2(const float *p, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
    }
    for (; i < n; i += 8) a0 = _mm256_add_ps(a0, load_partial(p + i, n - i));
    return hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

int mg_kernels_override_avx2(mg_kernels *k) {
    k->linear[MG_F32] = linear_f32;
    k->linear[MG_BF16] = linear_bf16;
    k->linear[MG_F16] = linear_f16;
    k->linear[MG_FP8_E4M3] = linear_fp8;
    k->linear[MG_FP4_E2M1] = linear_fp4;
    k->dot = dot_avx2;
    k->axpy = axpy_avx2;
    k->scale = scale_avx2;
    k->rmsnorm = rmsnorm_avx2;
    k->swiglu = swiglu_avx2;
    k->read_sum = read_sum_avx2;
    return 1;
}
#else
int mg_kernels_override_avx2(mg_kernels *k) { return 0; }
#endif
