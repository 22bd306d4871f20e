/* The avx512bf16 table (parent: avx512, see c/kernels/tables.h): fp4 decode by vdpbf16ps where x
 * splits into two bf16 parts (decode_rows_avx512bf16.c), and the fast activations' prefill of bf16
 * and fp8 weights with x rounded to bf16 (prefill_avx512bf16.c); everything else is the parent's. */
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512BF16__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "kernels/avx512bf16/avx512bf16.h"

static void linear_fp4(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y,
                       int64_t y_stride, int64_t r0, int64_t r1) {
    if (n_tok == 1 && mg_avx512bf16_decode_fp4(w, x, y, r0, r1)) return;
    mg_kernels_avx512bf16()->parent->linear[MG_FP4_E2M1](w, x, x_stride, n_tok, y, y_stride, r0, r1);
}

/* Everything else is the parent's (avx512). */
int mg_kernels_override_avx512bf16(mg_kernels *k, const mg_cpu_features *f) {
    k->linear[MG_FP4_E2M1] = linear_fp4;
    k->linear_bf16x[MG_BF16] = mg_avx512bf16_prefill_bf16x;
    k->linear_bf16x[MG_FP8_E4M3] = mg_avx512bf16_prefill_bf16x;
    return 1;
}
#else
int mg_kernels_override_avx512bf16(mg_kernels *k, const mg_cpu_features *f) { return 0; }
#endif
