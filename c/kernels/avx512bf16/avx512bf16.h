/* Entry points of the avx512bf16 kernel files (c/kernels/avx512bf16/<family>_avx512bf16.c),
 * which table_avx512bf16.c puts in the table.  Include only from files compiled with the
 * avx512bf16 flags, after kernels/avx512/avx512.h. */
#ifndef MG_KERNELS_AVX512BF16_H
#define MG_KERNELS_AVX512BF16_H

/* decode_rows_avx512bf16.c: fp4 decode (n_tok == 1) of rows [r0, r1) by vdpbf16ps; returns 0,
 * having written nothing, for a matrix or x it does not take. */
int mg_avx512bf16_decode_fp4(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1);

/* prefill_avx512bf16.c: prefill (n_tok > 1) with x rounded to bf16 (the linear_bf16x entry of
 * BF16 and FP8); matrices whose weights are not exact in bf16 go to the parent's fp32 entry. */
void mg_avx512bf16_prefill_bf16x(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y,
                                 int64_t y_stride, int64_t r0, int64_t r1);

#endif
