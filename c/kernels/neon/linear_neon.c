/* NEON kernels (arm64): the same table as kernels_scalar.c, which is their reference twin.
 *
 * Weight decoding works on groups of 16 columns (four float32x4 vectors).  16 divides both
 * scale block sizes (32 and 128), so one scale multiplies a whole group; only the last,
 * partial group of a row goes through the scalar decoders of formats.h.
 *   bf16  shift left by 16.
 *   f16   vcvt (exact).
 *   fp8   e4m3 bits are moved into an f16 (sign to bit 15, exponent+mantissa to bits 7..13),
 *         converted exactly, and multiplied by 2^8 (the bias difference 15 - 7), which is folded
 *         into the scale.  f16 subnormals cover e4m3 subnormals exactly.  A group holding the NaN
 *         code (S.1111.111) is decoded by the scalar twin instead.
 *   fp4   e2m1 values (0, 0.5 ... 6) are f16 numbers whose low byte is zero: a 16-entry byte
 *         table (vqtbl1q_u8) gives the high byte, a zip with zeros makes the f16 bits.
 * Quantised values are multiplied by their block scale before the FMA, as the scalar twin does;
 * a per-row scale (MG_SCALE_F32_ROW) multiplies the row's dot product once, also as it does. */
#include "kernels/tables.h"
#include "kernels/tables.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include "kernels/neon/neon.h"

/* Prefill dequantises ROW_TILE rows of CHUNK columns at a time (32 KB, about L1) and runs every
 * token through them, so each token's activations are read once per ROW_TILE rows.  CHUNK is a
 * multiple of 128 so that chunks start on scale-block boundaries. */
enum { GROUP = 16, ROW_TILE = 4, CHUNK = 2048 };

/* ---- element and scale helpers (scalar, for tails and NaN groups) ---------------------------- */

ALWAYS_INLINE float value_at(mg_format fmt, const uint8_t *row, int64_t c) {
    uint16_t h;
    float f;
    switch (fmt) {
    case MG_F32: memcpy(&f, row + 4 * c, 4); return f;
    case MG_BF16: memcpy(&h, row + 2 * c, 2); return mg_bf16_to_f32(h);
    case MG_F16: memcpy(&h, row + 2 * c, 2); return mg_f16_to_f32(h);
    case MG_FP8_E4M3: return mg_fp8_e4m3_to_f32(row[c]);
    case MG_FP4_E2M1: return mg_fp4_e2m1_to_f32((c & 1) ? row[c / 2] >> 4 : row[c / 2] & 0xf);
    default: return 0.0f;
    }
}

/* Columns that share one scale: the whole row when unscaled. */
static int64_t scale_block_len(const mg_matrix *w) {
    switch (w->scale_kind) {
    case MG_SCALE_F32_BLOCK128:
    case MG_SCALE_E8M0_BLOCK128: return 128;
    case MG_SCALE_E8M0_G32: return 32;
    default: return w->cols > 0 ? w->cols : 1;
    }
}

/* Whether scale_of differs per block; F32_ROW instead scales each row's dot product once. */
static int block_scaled(const mg_matrix *w) {
    return w->scale_kind != MG_SCALE_NONE && w->scale_kind != MG_SCALE_F32_ROW;
}

/* MG_SCALE_F32_ROW: the scale of row r (1 for every other kind). */
static float row_scale(const mg_matrix *w, int64_t r) {
    if (w->scale_kind != MG_SCALE_F32_ROW) return 1.0f;
    float f;
    memcpy(&f, (const uint8_t *)w->scale + (size_t)r * (size_t)w->scale_cols * 4, 4);
    return f;
}

/* The scale of block containing column c in row r (1 for F32_ROW, see row_scale). */
static float scale_of(const mg_matrix *w, int64_t r, int64_t c) {
    switch (w->scale_kind) {
    case MG_SCALE_F32_BLOCK128: {
        float f;
        memcpy(&f, (const uint8_t *)w->scale + 4 * ((r / 128) * w->scale_cols + c / 128), 4);
        return f;
    }
    case MG_SCALE_E8M0_BLOCK128:
        return mg_e8m0_to_f32(((const uint8_t *)w->scale)[(r / 128) * w->scale_cols + c / 128]);
    case MG_SCALE_E8M0_G32: return mg_e8m0_to_f32(((const uint8_t *)w->scale)[r * w->scale_cols + c / 32]);
    default: return 1.0f;
    }
}

/* ---- group decoders: 16 columns starting at c (a multiple of 16) into v[0..3] --------------- */

ALWAYS_INLINE void f16x8_to_f32(uint16x8_t h, float32x4_t *lo, float32x4_t *hi) {
    *lo = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
    *hi = vcvt_high_f32_f16(vreinterpretq_f16_u16(h));
}

/* e4m3 byte -> f16 bits of (value / 2^8). */
ALWAYS_INLINE uint16x8_t fp8_to_f16_bits(uint8x8_t b) {
    uint16x8_t wide = vmovl_u8(b);
    uint16x8_t mag = vshlq_n_u16(vandq_u16(wide, vdupq_n_u16(0x7f)), 7);
    uint16x8_t sign = vshlq_n_u16(vandq_u16(wide, vdupq_n_u16(0x80)), 8);
    return vorrq_u16(mag, sign);
}

/* Returns 0 when the group cannot be decoded by the vector path (fp8 NaN code present). */
ALWAYS_INLINE int decode16(mg_format fmt, const uint8_t *row, int64_t c, float32x4_t v[4]) {
    switch (fmt) {
    case MG_F32: { /* byte loads: weights inside a mapped shard need not be 4-byte aligned */
        const uint8_t *p = row + 4 * c;
        v[0] = vreinterpretq_f32_u8(vld1q_u8(p));
        v[1] = vreinterpretq_f32_u8(vld1q_u8(p + 16));
        v[2] = vreinterpretq_f32_u8(vld1q_u8(p + 32));
        v[3] = vreinterpretq_f32_u8(vld1q_u8(p + 48));
        return 1;
    }
    case MG_BF16: {
        const uint8_t *p = row + 2 * c;
        uint16x8_t a = vreinterpretq_u16_u8(vld1q_u8(p)), b = vreinterpretq_u16_u8(vld1q_u8(p + 16));
        v[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(a), 16));
        v[1] = vreinterpretq_f32_u32(vshll_high_n_u16(a, 16));
        v[2] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16));
        v[3] = vreinterpretq_f32_u32(vshll_high_n_u16(b, 16));
        return 1;
    }
    case MG_F16: {
        const uint8_t *p = row + 2 * c;
        f16x8_to_f32(vreinterpretq_u16_u8(vld1q_u8(p)), &v[0], &v[1]);
        f16x8_to_f32(vreinterpretq_u16_u8(vld1q_u8(p + 16)), &v[2], &v[3]);
        return 1;
    }
    case MG_FP8_E4M3: {
        uint8x16_t b = vld1q_u8(row + c);
        /* NaN is 0x7f / 0xff: (b & 0x7f) == 0x7f */
        if (vmaxvq_u8(vceqq_u8(vandq_u8(b, vdupq_n_u8(0x7f)), vdupq_n_u8(0x7f)))) return 0;
        f16x8_to_f32(fp8_to_f16_bits(vget_low_u8(b)), &v[0], &v[1]);
        f16x8_to_f32(fp8_to_f16_bits(vget_high_u8(b)), &v[2], &v[3]);
        return 1;
    }
    case MG_FP4_E2M1: {
        /* High bytes of the f16 encodings of 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives. */
        static const uint8_t f16_hi[16] = {0x00, 0x38, 0x3c, 0x3e, 0x40, 0x42, 0x44, 0x46,
                                           0x80, 0xb8, 0xbc, 0xbe, 0xc0, 0xc2, 0xc4, 0xc6};
        uint8x8_t packed = vld1_u8(row + c / 2);
        uint8x8_t lo = vand_u8(packed, vdup_n_u8(0xf)), hi = vshr_n_u8(packed, 4);
        /* column order: low nibble of byte j is column 2j, high nibble column 2j + 1 */
        uint8x16_t codes = vcombine_u8(vzip1_u8(lo, hi), vzip2_u8(lo, hi));
        uint8x16_t top = vqtbl1q_u8(vld1q_u8(f16_hi), codes);
        uint8x16_t zero = vdupq_n_u8(0);
        f16x8_to_f32(vreinterpretq_u16_u8(vzip1q_u8(zero, top)), &v[0], &v[1]);
        f16x8_to_f32(vreinterpretq_u16_u8(vzip2q_u8(zero, top)), &v[2], &v[3]);
        return 1;
    }
    default: return 0;
    }
}

/* What the vector decoders' output must be multiplied by, besides the scale. */
ALWAYS_INLINE float format_factor(mg_format fmt) { return fmt == MG_FP8_E4M3 ? 256.0f : 1.0f; }

/* ---- linear ---------------------------------------------------------------------------------- */

/* v (raw decodings: the values over the format's factor) times the block's scale sv, which is
 * the scale times the factor, or (split) the scale alone, the factor then applied first. */
ALWAYS_INLINE void scale_raw(float32x4_t v[4], float32x4_t sv, int split, mg_format fmt) {
    for (int k = 0; k < 4; k++) {
        if (split) v[k] = vmulq_f32(v[k], vdupq_n_f32(format_factor(fmt)));
        v[k] = vmulq_f32(v[k], sv);
    }
}

/* Decode: y = row r of W . x, decoding and multiplying in one pass. */
ALWAYS_INLINE float row_dot(mg_format fmt, const mg_matrix *w, int64_t r, const float *x) {
    const int64_t cols = w->cols, block = scale_block_len(w);
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * mg_matrix_row_bytes(w);
    const int scaled = block_scaled(w);
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    float tail = 0.0f;
    for (int64_t b0 = 0; b0 < cols; b0 += block) {
        const int64_t b1 = b0 + block < cols ? b0 + block : cols;
        const float s = scaled ? scale_of(w, r, b0) : 1.0f;
        /* s times the raw factor can overflow where the weights do not (e8m0 2^127 with fp8's
         * 2^8): then the factor and the scale multiply apart. */
        const int split = !isfinite(s * format_factor(fmt)) && isfinite(s);
        const float32x4_t sv = vdupq_n_f32(split ? s : s * format_factor(fmt));
        int64_t c = b0;
        for (; c + GROUP <= b1; c += GROUP) {
            float32x4_t v[4];
            if (!decode16(fmt, row, c, v)) {
                for (int64_t k = c; k < c + GROUP; k++) tail += value_at(fmt, row, k) * s * x[k];
                continue;
            }
            if (scaled || fmt == MG_FP8_E4M3) scale_raw(v, sv, split, fmt);
            acc0 = vfmaq_f32(acc0, v[0], vld1q_f32(x + c));
            acc1 = vfmaq_f32(acc1, v[1], vld1q_f32(x + c + 4));
            acc2 = vfmaq_f32(acc2, v[2], vld1q_f32(x + c + 8));
            acc3 = vfmaq_f32(acc3, v[3], vld1q_f32(x + c + 12));
        }
        for (; c < b1; c++) tail += value_at(fmt, row, c) * s * x[c];
    }
    return (hsum4(acc0, acc1, acc2, acc3) + tail) * row_scale(w, r);
}

/* Prefill: dequantise columns [c0, c1) of row r (c0 a multiple of the scale block) into out. */
ALWAYS_INLINE void row_dequant(mg_format fmt, const mg_matrix *w, int64_t r, int64_t c0, int64_t c1,
                               float *out) {
    if (mg_format_is_ggml_block(fmt)) { /* whole blocks: CHUNK is a multiple of 256 */
        int64_t e, bytes;
        mg_format_block(w->format, &e, &bytes);
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * mg_matrix_row_bytes(w);
        for (int64_t c = c0; c < c1; c += e) mg_neon_ggml_dequant_block(w->format, row + (size_t)(c / e * bytes), out + (c - c0));
        return;
    }
    const int64_t block = scale_block_len(w);
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * mg_matrix_row_bytes(w);
    const int scaled = block_scaled(w);
    for (int64_t b0 = c0; b0 < c1; b0 += block) {
        const int64_t b1 = b0 + block < c1 ? b0 + block : c1;
        const float s = scaled ? scale_of(w, r, b0) : 1.0f;
        /* s times the raw factor can overflow where the weights do not (e8m0 2^127 with fp8's
         * 2^8): then the factor and the scale multiply apart. */
        const int split = !isfinite(s * format_factor(fmt)) && isfinite(s);
        const float32x4_t sv = vdupq_n_f32(split ? s : s * format_factor(fmt));
        int64_t c = b0;
        for (; c + GROUP <= b1; c += GROUP) {
            float32x4_t v[4];
            float *o = out + (c - c0);
            if (!decode16(fmt, row, c, v)) {
                for (int64_t k = c; k < c + GROUP; k++) out[k - c0] = value_at(fmt, row, k) * s;
                continue;
            }
            if (scaled || fmt == MG_FP8_E4M3) scale_raw(v, sv, split, fmt);
            vst1q_f32(o, v[0]);
            vst1q_f32(o + 4, v[1]);
            vst1q_f32(o + 8, v[2]);
            vst1q_f32(o + 12, v[3]);
        }
        for (; c < b1; c++) out[c - c0] = value_at(fmt, row, c) * s;
    }
}

/* d[i] = dot(rows + i * CHUNK, x, n) for the ROW_TILE rows of a prefill tile: x is loaded once. */
static void dot_tile(const float *rows, const float *x, int64_t n, float d[ROW_TILE]) {
    const float *w0 = rows, *w1 = rows + CHUNK, *w2 = rows + 2 * CHUNK, *w3 = rows + 3 * CHUNK;
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float32x4_t xa = vld1q_f32(x + i), xb = vld1q_f32(x + i + 4);
        a0 = vfmaq_f32(a0, vld1q_f32(w0 + i), xa);
        a1 = vfmaq_f32(a1, vld1q_f32(w1 + i), xa);
        a2 = vfmaq_f32(a2, vld1q_f32(w2 + i), xa);
        a3 = vfmaq_f32(a3, vld1q_f32(w3 + i), xa);
        b0 = vfmaq_f32(b0, vld1q_f32(w0 + i + 4), xb);
        b1 = vfmaq_f32(b1, vld1q_f32(w1 + i + 4), xb);
        b2 = vfmaq_f32(b2, vld1q_f32(w2 + i + 4), xb);
        b3 = vfmaq_f32(b3, vld1q_f32(w3 + i + 4), xb);
    }
    d[0] = vaddvq_f32(vaddq_f32(a0, b0));
    d[1] = vaddvq_f32(vaddq_f32(a1, b1));
    d[2] = vaddvq_f32(vaddq_f32(a2, b2));
    d[3] = vaddvq_f32(vaddq_f32(a3, b3));
    for (; i < n; i++) {
        d[0] += w0[i] * x[i];
        d[1] += w1[i] * x[i];
        d[2] += w2[i] * x[i];
        d[3] += w3[i] * x[i];
    }
}

ALWAYS_INLINE void linear_impl(mg_format fmt, const mg_matrix *w, const float *x, int64_t x_stride,
                               int64_t n_tok, float *y, int64_t y_stride, int64_t r0, int64_t r1) {
    if (n_tok == 1 && mg_format_is_ggml_block(fmt)) {
        mg_neon_decode_ggml(w, x, y, r0, r1);
        return;
    }
    if (n_tok == 1) {
        for (int64_t r = r0; r < r1; r++) y[r] = row_dot(fmt, w, r, x);
        return;
    }
    /* Each row chunk is decoded once and used for every token. */
    float buf[ROW_TILE * CHUNK];
    for (int64_t r = r0; r < r1; r += ROW_TILE) {
        const int64_t nr = r1 - r < ROW_TILE ? r1 - r : ROW_TILE;
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t i = 0; i < nr; i++) y[t * y_stride + r + i] = 0.0f;
        for (int64_t c0 = 0; c0 < w->cols; c0 += CHUNK) {
            const int64_t len = w->cols - c0 < CHUNK ? w->cols - c0 : CHUNK;
            for (int64_t i = 0; i < nr; i++) row_dequant(fmt, w, r + i, c0, c0 + len, buf + i * CHUNK);
            for (int64_t t = 0; t < n_tok; t++) {
                const float *xt = x + t * x_stride + c0;
                float *yt = y + t * y_stride + r;
                float d[ROW_TILE];
                if (nr == ROW_TILE) {
                    dot_tile(buf, xt, len, d);
                } else {
                    for (int64_t i = 0; i < nr; i++) d[i] = mg_neon_dot(buf + i * CHUNK, xt, len);
                }
                for (int64_t i = 0; i < nr; i++) yt[i] += d[i] * row_scale(w, r + i); /* buf is unscaled */
            }
        }
    }
}

#define LINEAR_FOR(name, fmt)                                                                      \
    void name(const mg_matrix *w, const float *x, int64_t xs, int64_t n_tok, float *y,            \
                     int64_t ys, int64_t r0, int64_t r1) {                                         \
        linear_impl(fmt, w, x, xs, n_tok, y, ys, r0, r1);                                          \
    }
LINEAR_FOR(mg_neon_linear_f32, MG_F32)
LINEAR_FOR(mg_neon_linear_bf16, MG_BF16)
LINEAR_FOR(mg_neon_linear_f16, MG_F16)
LINEAR_FOR(mg_neon_linear_fp8, MG_FP8_E4M3)
LINEAR_FOR(mg_neon_linear_fp4, MG_FP4_E2M1)
LINEAR_FOR(mg_neon_linear_ggml, MG_Q8_0) /* every ggml block format: the block paths read w->format */
#undef LINEAR_FOR
#endif
