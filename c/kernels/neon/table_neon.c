/* The neon table (parent: scalar, see c/kernels/tables.h): every entry is overridden.  A new op
 * family is a <family>_neon.c file whose entry points neon.h declares and whose entries are set
 * here. */
#include "kernels/tables.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include "kernels/neon/neon.h"

int mg_kernels_override_neon(mg_kernels *k) {
    k->linear[MG_F32] = mg_neon_linear_f32;
    k->linear[MG_BF16] = mg_neon_linear_bf16;
    k->linear[MG_F16] = mg_neon_linear_f16;
    k->linear[MG_FP8_E4M3] = mg_neon_linear_fp8;
    k->linear[MG_FP4_E2M1] = mg_neon_linear_fp4;
    k->dot = mg_neon_dot;
    k->axpy = mg_neon_axpy;
    k->scale = mg_neon_scale;
    k->rmsnorm = mg_neon_rmsnorm;
    k->swiglu = mg_neon_swiglu;
    k->read_sum = mg_neon_read_sum;
    return 1;
}
#else
int mg_kernels_override_neon(mg_kernels *k) { return 0; }
#endif
