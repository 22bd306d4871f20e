/* What the two ymm int8 GEMMs share (q8_gemm_avxvnni.c, q8_gemm_avx2.c: panels of 8 rows,
 * one int32 lane per row): T tokens' float accumulators of a panel's rows, loaded from y and
 * stored back (nr < 8 rows through masks), and the end of a group, where the group's exact int32
 * sums s become floats, times the rows' factors and the token's dx, minus the mins' term
 * (kernels/q8_gemm.h); and the driver's rows entry.  Include after kernels/q8_gemm_driver.h and kernels/avx2/avx2.h. */
#ifndef MG_KERNELS_AVX2_Q8_TILE_AVX2_H
#define MG_KERNELS_AVX2_Q8_TILE_AVX2_H

/* The driver's rows entry (mg_q8_gemm_isa.rows_entry: one token at a time, after a failed
 * allocation): the AVX2 rows. */
static void mg_avx2_gemm_rows_entry(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                                    int64_t r0, int64_t r1) {
    mg_avx2_linear_q8_rows(w, xq, n_tok, y, y_stride, r0, r1, 0);
}

/* acc[t] = y[t][0 .. nr) (first: zeros). */
INLINE void mg_avx2_tile_load(const int T, __m256 *acc, const float *y, int64_t y_stride, int nr, int first) {
    const __m256i m = lane_mask(nr);
    for (int t = 0; t < T; t++)
        acc[t] = first ? _mm256_setzero_ps() : nr == 8 ? _mm256_loadu_ps(y + t * y_stride)
                                                       : _mm256_maskload_ps(y + t * y_stride, m);
}

/* acc[t] += (fac * dx) * (float)s[t] - mn * sx for group g of the tile x (mn, sx: with mins). */
INLINE void mg_avx2_tile_group(const int T, __m256 *acc, const __m256i *s, const float *fac, const float *mn,
                               const mg_q8_tile_x *x, int64_t g, int mins) {
    const __m256 f = _mm256_load_ps(fac);
    for (int t = 0; t < T; t++)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(f, _mm256_set1_ps(x->dx[g * T + t])), acc[t]);
    if (mins) {
        const __m256 mv = _mm256_load_ps(mn);
        for (int t = 0; t < T; t++) acc[t] = _mm256_fnmadd_ps(mv, _mm256_set1_ps(x->sx[g * T + t]), acc[t]);
    }
}

/* y[t][0 .. nr) = acc[t]. */
INLINE void mg_avx2_tile_store(const int T, const __m256 *acc, float *y, int64_t y_stride, int nr) {
    const __m256i m = lane_mask(nr);
    for (int t = 0; t < T; t++) {
        if (nr == 8)
            _mm256_storeu_ps(y + t * y_stride, acc[t]);
        else
            _mm256_maskstore_ps(y + t * y_stride, m, acc[t]);
    }
}

#endif
