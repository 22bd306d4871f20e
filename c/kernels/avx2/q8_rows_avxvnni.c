/* The AVX2 int8 rows (q8_avx2.c) built a second time, with AVX-VNNI: its dot4 becomes one
 * vpdpbusd in the Q8_0, Q4_K / Q5_K, IQ4_NL and IQ4_XS rows (one instruction where AVX2 takes
 * two; the other formats' rows are the same code).  The avx2 table's int8 entry on a CPU with
 * AVX-VNNI (q8_gemm_avxvnni.c) takes these rows below its GEMM's token count.  Without
 * -mavxvnni (an old compiler) nothing is built here, and that entry does not exist either. */
#if defined(__AVXVNNI__)
#define MG_Q8_ROWS_AVXVNNI 1
#include "kernels/avx2/q8_avx2.c"
#endif
