/* AVX2 + FMA + F16C kernels (x86-64).  Compiled with -mavx2 -mfma -mf16c; only selected at
 * run time on CPUs that have all three (c/core/cpu.c). */
#include "core/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* Filled in by the SIMD kernels work; until then the scalar twin serves. */
const mg_kernels *mg_kernels_avx2(void) { return NULL; }
#else
const mg_kernels *mg_kernels_avx2(void) { return NULL; }
#endif
