/* Entry points of the avx512bf16 kernel files (c/kernels/avx512bf16/<family>_avx512bf16.c),
 * which table_avx512bf16.c puts in the table.  Include only from files compiled with the
 * avx512bf16 flags, after kernels/avx512/avx512.h. */
#ifndef MG_KERNELS_AVX512BF16_H
#define MG_KERNELS_AVX512BF16_H

/* decode_rows_avx512bf16.c: fp4 decode (n_tok == 1) of rows [r0, r1) by vdpbf16ps; returns 0,
 * having written nothing, for a matrix or x it does not take. */
int mg_avx512bf16_decode_fp4(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1);

#endif
