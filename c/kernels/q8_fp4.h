/* Native FP4 under int8 activations (core/q8_act.h): MG_FP4_E2M1 with MG_SCALE_E8M0_G32, as
 * DeepSeek-V4's safetensors store the routed experts, is GGUF's MXFP4 block (32 e2m1 codes and
 * one ue8m0 scale) with two differences of layout:
 *  - the scale bytes live apart, in w->scale: group g of row r (columns 32g .. 32g + 31) is
 *    scaled by scale[r * scale_cols + g];
 *  - the group's 16 code bytes hold the columns in pairs, element 2i in the low nibble of byte
 *    i and 2i + 1 in the high one (MXFP4 has element i low, i + 16 high).
 * So it takes MXFP4's int8 contract (kernels/scalar/q8_scalar.c): code = twice the e2m1 value
 * (MG_MXFP4_VALUES2, the exact integers -12 .. 12), k = 1, wm = 0, wd = half the scale, 2^(e-128)
 * (exact: MG_E8M0_HALF, denormal for e = 0, 1), except that e = 255, ue8m0's NaN, gives NaN as
 * on the fp32 path (mg_e8m0_to_f32), where GGUF's MXFP4 reads 2^127.  Group g of a row at data
 * p (cols / 2 bytes) and scales s: codes at p + 16g, scale s[g].
 *
 * The AVX2 rows (avx2/q8_fp4_avx2.c) take x in the pair layout below, so that the nibbles
 * need no interleaving: per 64 columns (groups g, g + 1) the 16 even columns of g, the 16 even
 * of g + 1, the 16 odd of g, the 16 odd of g + 1.  A 32-byte load of the weights then has, as
 * low nibbles, exactly the first half of that and, as high nibbles, the second; an odd last
 * group gets zeros for its partner.  The AVX-512 rows (avx512/q8_fp4_avx512vnni.c) take the
 * same idea four groups wide (their quad_x). */
#ifndef MG_KERNELS_Q8_FP4_H
#define MG_KERNELS_Q8_FP4_H

#include <math.h>
#include <stdint.h>
#include "core/ggml_blocks.h"
#include "core/matrix.h"

/* wd of the contract: half of the group's ue8m0 scale e (NaN for e = 255). */
static inline float mg_q8_fp4_wd(uint8_t e) { return e == 255 ? NAN : MG_E8M0_HALF[e]; }

#if defined(__AVX2__)
#include <immintrin.h>

/* kc columns (a multiple of 32) of x's codes q into xp in the pair layout (kc rounded up to 64
 * bytes: an odd last group's partner is zeros). */
static inline void mg_q8_fp4_pair_x(const int8_t *q, int64_t kc, int8_t *xp) {
    /* per 128-bit lane (16 columns): the 8 even columns, then the 8 odd */
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                                           12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (int64_t c = 0; c < kc; c += 64) {
        /* one group as [its 16 even columns | its 16 odd]: quadwords (e0 o0 e1 o1) -> (e0 e1 o0 o1) */
        const __m256i a = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(q + c)), split), 0xd8);
        const __m256i b = kc - c >= 64 ? _mm256_permute4x64_epi64(_mm256_shuffle_epi8(
                                             _mm256_loadu_si256((const __m256i *)(q + c + 32)), split), 0xd8)
                                       : _mm256_setzero_si256();
        _mm256_storeu_si256((__m256i *)(xp + c), _mm256_permute2x128_si256(a, b, 0x20));      /* even g | even g+1 */
        _mm256_storeu_si256((__m256i *)(xp + c + 32), _mm256_permute2x128_si256(a, b, 0x31)); /* odd g | odd g+1 */
    }
}
#endif

#endif
