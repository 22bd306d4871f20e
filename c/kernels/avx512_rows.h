/* Shared by the AVX-512 kernel files (kernels_avx512.c, kernels_avx512bf16.c): the x chunking,
 * prefetch distances and scale readers of the multi-row decode loops.  Include only from files
 * compiled with the AVX-512 F/BW/VL/DQ flags. */
#ifndef MG_AVX512_ROWS_H
#define MG_AVX512_ROWS_H

#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "core/kernels.h"

#define INLINE static inline __attribute__((always_inline))

/* Columns of x permuted per call chunk; a multiple of every step and scale block. */
enum { XP_COLS = 8192 };

/* Software prefetch of streamed weights, in bytes ahead of the current step.  Rows are often one
 * or two 4 KiB pages and the hardware streamer stops at page ends.  Into L2 (T1), 2 KiB ahead:
 * on a Sapphire-Rapids-class Xeon this beat T0 (which competes with the demand loads for L1 fill
 * buffers) and 1, 4 and 8 KiB, and prefetching only the heads of pages, by 5-20% for fp4/fp8. */
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

INLINE float e8m0_to_f32(uint8_t b) {
    if (b == 255) return NAN;
    uint32_t u = b ? (uint32_t)b << 23 : 0x00400000u; /* 2^-127 is a denormal */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

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
    for (; i < n; i++) sf[i] = e8m0_to_f32(s[i]);
}

/* Prefetch distance of the multi-row loops: the same line of a later group of rows, at least
 * MG_AVX512_MIN_AHEAD bytes on.  One group ahead is too close for narrow rows: fp8 with 1024
 * columns (DeepSeek-V4's wq_b) streamed 12.5 GB/s on one Zen 4 core at 2 KiB (two rows) and
 * 19 GB/s at 8 KiB; 16 KiB gave no more. */
#ifndef MG_AVX512_MIN_AHEAD
#define MG_AVX512_MIN_AHEAD 8192
#endif
INLINE size_t rows_ahead(size_t group) {
    return group >= MG_AVX512_MIN_AHEAD ? group : (MG_AVX512_MIN_AHEAD + group - 1) / group * group;
}

#endif
