/* The int8-activation GEMM (prefill with --activations int8): weight rows are decoded once per
 * call into int8 codes and per-group float factors, then multiplied with many tokens' int8 x at
 * once (kernels/avx512/q8_gemm_avx512vnni.c, avx2/q8_gemm_avxvnni.c, neon/q8_gemm_neondot.c), instead of re-decoding every row for every token
 * as the row entries do.  The arithmetic is the row entries' contract (kernels/scalar/q8_scalar.c)
 * with the per-16 integer scale k folded into the float factor:
 *     per group g of G columns (G = mg_q8_gemm_group(f), 16 or 32):
 *       y += (fac[g] * dx[g]) * (float)(sum over the group of code * qx)  -  mn[g] * sx_g
 *     fac = wd * k (exact: k is an integer of at most 8 bits, wd has at most 16 significant bits),
 *     mn  = wm (G = 32) or wmk * km (Q2_K, G = 16), sx_g = dx * (sum of the group's qx).
 * Every format whose contract has a per-16 k that can differ between a group's halves decodes
 * with G = 16; the others with G = 32.  Native FP4 (kernels/q8_fp4.h) is MXFP4's case: G = 32. */
#ifndef MG_KERNELS_Q8_GEMM_H
#define MG_KERNELS_Q8_GEMM_H

#include <stdint.h>
#include "core/formats.h"

/* Columns per group of the decoded factors. */
static inline int mg_q8_gemm_group(mg_format f) {
    switch (f) {
    case MG_Q6_K:
    case MG_Q3_K:
    case MG_Q2_K:
    case MG_IQ2_XS:
    case MG_IQ2_S:
    case MG_IQ1_M: return 16;
    default: return 32;
    }
}

/* Whether the format has mins (mn), i.e. a term against the sum of x per group. */
static inline int mg_q8_gemm_has_mins(mg_format f) {
    return f == MG_Q4_1 || f == MG_Q5_1 || f == MG_Q4_K || f == MG_Q5_K || f == MG_Q2_K;
}

/* Decodes nb consecutive blocks of format f at p (one row's): codes[nb * e] the contract's
 * integer codes in element order (all within [-128, 127]), fac[nb * e / G] and, when the format
 * has mins, mn[nb * e / G] (untouched otherwise).  Every decoder gives the scalar one's
 * (mg_scalar_q8_decode) output bit for bit. */
typedef void mg_q8_decode_fn(mg_format f, const uint8_t *p, int64_t nb, int8_t *codes, float *fac, float *mn);

/* The reference decoder, on the scalar twin's block_codes (kernels/scalar/q8_scalar.c). */
mg_q8_decode_fn mg_scalar_q8_decode;

/* Native FP4 (MG_FP4_E2M1 with MG_SCALE_E8M0_G32, kernels/q8_fp4.h), whose scales are not in the
 * blocks: ng groups of 32 columns of one row, codes at p (16 bytes a group) and the groups'
 * ue8m0 bytes at s, into codes[32 * ng] (element order) and fac[ng] (G = 32, no mins).  Every
 * decoder gives the scalar one's output bit for bit. */
typedef void mg_q8_decode_fp4_fn(const uint8_t *p, const uint8_t *s, int64_t ng, int8_t *codes, float *fac);
mg_q8_decode_fp4_fn mg_scalar_q8_decode_fp4;

/* The AVX2 decoders: kernels/avx2/q8_decode_avx2.c (the 32-element formats, the K-quants and
 * IQ4_XS) and q8_decode_iq_avx2.c (the grid formats); NULL for the formats a file does not
 * decode, or in a build without AVX2. */
mg_q8_decode_fn *mg_avx2_q8_decoder_k(mg_format f);
mg_q8_decode_fn *mg_avx2_q8_decoder_iq(mg_format f);
/* kernels/avx2/q8_fp4_avx2.c: the AVX2 native FP4 decoder; NULL in a build without AVX2. */
mg_q8_decode_fp4_fn *mg_avx2_q8_decoder_fp4(void);

/* The NEON decoders (kernels/neon/q8_decode_neon.c): every block format; NULL for the others, or
 * in a build for another architecture. */
mg_q8_decode_fn *mg_neon_q8_decoder(mg_format f);

#endif
