/* The AVX2 rows of native FP4 under int8 activations (q8_fp4_avx2.c) built a second time, with
 * AVX-VNNI: two vpdpbusd per pair of groups and row (see that file), for q8_rows_avxvnni.c's
 * entry.  Without -mavxvnni (an old compiler) nothing is built here. */
#if defined(__AVXVNNI__)
#define MG_Q8_ROWS_AVXVNNI 1
#include "kernels/avx2/q8_fp4_avx2.c"
#endif
