/* NEON block decoders of the int8 GEMM (kernels/q8_gemm.h): one row's blocks as int8 codes in
 * element order, a float factor per group of G columns and (Q4_1, Q5_1, Q4_K, Q5_K, Q2_K) the
 * mins, each bit for bit mg_scalar_q8_decode's (checked by tests/c/test_ggml_q8.c under qemu).
 *
 * Codes: the same int8x16 code registers as the NEON fp32 and int8 rows (kernels/neon/ggml_codes.h,
 * kernels/neon/iq_codes.h), stored instead of dotted.  They are the contract's codes already:
 * signed codes (Q4_0 -8.., Q5_0 -16.., Q6_K -32.., Q3_K -4.., the value tables, the grid entries
 * with their signs, IQ1's 8g +- 1) and unsigned ones (Q4_1, Q5_1, Q4_K, Q5_K 0..31, Q2_K 0..3)
 * alike fit int8.
 *
 * Factors: the scalar twin computes fac = wd * k and mn = wm (or wmk * km); every product here
 * is exact (an f16 d times an integer of at most 8 bits, or a power of two), so computing it as
 * the rows do (d * sc, d * (0.5 + s) * 0.25, ...) gives the same float, and the tests hold it to
 * the twin's bits.  They are scalar per block: at most 16 per 256 codes.
 *
 * Compiled for the arm64 baseline (no dot product needed here); the GEMM that calls them
 * (q8_gemm_neondot.c) finds them through kernels/q8_gemm_driver.h's lookup. */
#include "kernels/tables.h"
#include "kernels/q8_gemm.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include "kernels/neon/neon.h"
#include "kernels/neon/ggml_codes.h"
#include "kernels/neon/iq_codes.h"

ALWAYS_INLINE void store32(int8_t *out, codes32 c) {
    vst1q_s8(out, c.v[0]);
    vst1q_s8(out + 16, c.v[1]);
}

/* ---- the 32-element formats: one group per block ------------------------------------------ */

/* nb blocks of a 32-element format (f a constant after inlining): codes and factor per block;
 * Q4_1 / Q5_1: mn = -m (the scalar negation: -0 for +0 too). */
ALWAYS_INLINE void small_blocks(const mg_format f, const uint8_t *p, int64_t nb, int8_t *codes, float *fac,
                                float *mn) {
    for (int64_t i = 0; i < nb; i++, codes += 32) {
        switch (f) {
        case MG_Q8_0: store32(codes, codes_q8_0(p)), fac[i] = f16_at(p), p += 34; break;
        case MG_Q4_0: store32(codes, nib_lut(p + 2, Q4_0_VALUES)), fac[i] = f16_at(p), p += 18; break;
        case MG_IQ4_NL: store32(codes, nib_lut(p + 2, MG_IQ4NL_VALUES)), fac[i] = f16_at(p), p += 18; break;
        case MG_MXFP4: store32(codes, nib_lut(p + 1, MG_MXFP4_VALUES2)), fac[i] = MG_E8M0_HALF[p[0]], p += 17; break;
        case MG_Q5_0: store32(codes, codes_q5_0(p)), fac[i] = f16_at(p), p += 22; break;
        case MG_Q4_1: store32(codes, nib_u(p + 4)), fac[i] = f16_at(p), mn[i] = -f16_at(p + 2), p += 20; break;
        default: /* Q5_1 */
            store32(codes, codes_q5_u(p + 4, p + 8)), fac[i] = f16_at(p), mn[i] = -f16_at(p + 2), p += 24;
            break;
        }
    }
}

/* ---- the 256-element formats: one block at a time ------------------------------------------ */

/* Q4_K / Q5_K: G = 32; fac = d * sc_j, mn = dmin * m_j (k4_scales: the rows' exact products). */
ALWAYS_INLINE void block_k4(const int q5, const uint8_t *p, int8_t *codes, float *fac, float *mn) {
    const uint8_t *qs = p + (q5 ? 48 : 16), *qh = q5 ? p + 16 : NULL;
    for (int j = 0; j < 8; j++) store32(codes + 32 * j, codes_k4(qs, qh, j));
    k4_scales(p + 4, f16_at(p), f16_at(p + 2), fac, mn);
}

/* Q6_K: G = 16; fac = d * the int8 scale of each 16. */
ALWAYS_INLINE void block_q6_k(const uint8_t *p, int8_t *codes, float *fac) {
    for (int h = 0; h < 2; h++)
        for (int g = 0; g < 4; g++) store32(codes + 128 * h + 32 * g, codes_q6_k(p, h, g));
    const float d = f16_at(p + 208);
    for (int i = 0; i < 16; i++) fac[i] = d * (float)(int8_t)p[192 + i];
}

/* Q2_K: G = 16; fac = d * the scale nibble, mn = dmin * the min nibble (q2_k_scales). */
ALWAYS_INLINE void block_q2_k(const uint8_t *p, int8_t *codes, float *fac, float *mn) {
    for (int g = 0; g < 8; g++) store32(codes + 32 * g, codes_q2_k(p, g));
    q2_k_scales(p, fac, mn);
}

/* Q3_K: G = 16; fac = d * the signed 6-bit scale. */
ALWAYS_INLINE void block_q3_k(const uint8_t *p, int8_t *codes, float *fac) {
    for (int g = 0; g < 8; g++) store32(codes + 32 * g, codes_q3_k(p, g));
    const float d = f16_at(p + 108);
    int k[16];
    q3_k_scales(p, k);
    for (int i = 0; i < 16; i++) fac[i] = d * (float)k[i];
}

/* IQ4_XS: G = 32; fac = d * (s - 32) (iq4_xs_scales). */
ALWAYS_INLINE void block_iq4_xs(const uint8_t *p, int8_t *codes, float *fac) {
    for (int j = 0; j < 8; j++) store32(codes + 32 * j, nib_lut(p + 8 + 16 * j, MG_IQ4NL_VALUES));
    iq4_xs_scales(p, f16_at(p), fac);
}

/* The grid formats: iq_codes' factors are the contract's wd * k (see the header comment) per 16;
 * G = 16 keeps both halves' (IQ2_XS, IQ2_S, IQ1_M), G = 32 one (the halves' are equal). */
ALWAYS_INLINE void block_iq(const mg_format f, const uint8_t *p, int8_t *codes, float *fac) {
    const float d = iq_d(f, p);
    const int g16 = mg_q8_gemm_group(f) == 16;
    for (int ib = 0; ib < 8; ib++) {
        float s[2];
        store32(codes + 32 * ib, iq_codes(f, p, d, ib, s));
        if (g16)
            fac[2 * ib] = s[0], fac[2 * ib + 1] = s[1];
        else
            fac[ib] = s[0];
    }
}

/* ---- the decoders (mg_q8_decode_fn): f fixed per function, so each inlines its own path ----- */

#define SMALL(NAME, F)                                                                                        \
    static void dec_##NAME(mg_format f, const uint8_t *p, int64_t nb, int8_t *codes, float *fac, float *mn) { \
        small_blocks(F, p, nb, codes, fac, mn);                                                               \
    }
SMALL(q8_0, MG_Q8_0)
SMALL(q4_0, MG_Q4_0)
SMALL(q5_0, MG_Q5_0)
SMALL(q4_1, MG_Q4_1)
SMALL(q5_1, MG_Q5_1)
SMALL(iq4_nl, MG_IQ4_NL)
SMALL(mxfp4, MG_MXFP4)

/* BYTES and PER factors per block; CALL decodes block i (b = its bytes, c = its codes, fa = its
 * factors; its mins mn + PER * i, named only by the formats that have them). */
#define LARGE(NAME, BYTES, PER, CALL)                                                                         \
    static void dec_##NAME(mg_format f, const uint8_t *p, int64_t nb, int8_t *codes, float *fac, float *mn) { \
        for (int64_t i = 0; i < nb; i++) {                                                                    \
            const uint8_t *b = p + i * BYTES;                                                                 \
            int8_t *c = codes + 256 * i;                                                                      \
            float *fa = fac + PER * i;                                                                        \
            CALL;                                                                                             \
        }                                                                                                     \
    }
LARGE(q4_k, 144, 8, block_k4(0, b, c, fa, mn + 8 * i))
LARGE(q5_k, 176, 8, block_k4(1, b, c, fa, mn + 8 * i))
LARGE(q6_k, 210, 16, block_q6_k(b, c, fa))
LARGE(q3_k, 110, 16, block_q3_k(b, c, fa))
LARGE(q2_k, 84, 16, block_q2_k(b, c, fa, mn + 16 * i))
LARGE(iq4_xs, 136, 8, block_iq4_xs(b, c, fa))
LARGE(iq2_xxs, 66, 8, block_iq(MG_IQ2_XXS, b, c, fa))
LARGE(iq2_xs, 74, 16, block_iq(MG_IQ2_XS, b, c, fa))
LARGE(iq2_s, 82, 16, block_iq(MG_IQ2_S, b, c, fa))
LARGE(iq3_xxs, 98, 8, block_iq(MG_IQ3_XXS, b, c, fa))
LARGE(iq3_s, 110, 8, block_iq(MG_IQ3_S, b, c, fa))
LARGE(iq1_s, 50, 8, block_iq(MG_IQ1_S, b, c, fa))
LARGE(iq1_m, 56, 16, block_iq(MG_IQ1_M, b, c, fa))

mg_q8_decode_fn *mg_neon_q8_decoder(mg_format f) {
    switch (f) {
    case MG_Q8_0: return dec_q8_0;
    case MG_Q4_0: return dec_q4_0;
    case MG_Q5_0: return dec_q5_0;
    case MG_Q4_1: return dec_q4_1;
    case MG_Q5_1: return dec_q5_1;
    case MG_IQ4_NL: return dec_iq4_nl;
    case MG_MXFP4: return dec_mxfp4;
    case MG_IQ4_XS: return dec_iq4_xs;
    case MG_Q4_K: return dec_q4_k;
    case MG_Q5_K: return dec_q5_k;
    case MG_Q6_K: return dec_q6_k;
    case MG_Q3_K: return dec_q3_k;
    case MG_Q2_K: return dec_q2_k;
    case MG_IQ2_XXS: return dec_iq2_xxs;
    case MG_IQ2_XS: return dec_iq2_xs;
    case MG_IQ2_S: return dec_iq2_s;
    case MG_IQ3_XXS: return dec_iq3_xxs;
    case MG_IQ3_S: return dec_iq3_s;
    case MG_IQ1_S: return dec_iq1_s;
    case MG_IQ1_M: return dec_iq1_m;
    default: return NULL;
    }
}
#else
mg_q8_decode_fn *mg_neon_q8_decoder(mg_format f) { return NULL; }
#endif
