/* The scalar table: the root of every other (c/kernels/tables.h). */
#include "kernels/scalar/scalar.h"

/* The root table: every entry (c/kernels/tables.h). */
int mg_kernels_override_scalar(mg_kernels *k) {
    for (int f = 0; f < MG_FORMAT_COUNT; f++) k->linear[f] = mg_scalar_linear;
    k->dot = mg_scalar_dot;
    k->axpy = mg_scalar_axpy;
    k->scale = mg_scalar_scale;
    k->rmsnorm = mg_scalar_rmsnorm;
    k->swiglu = mg_scalar_swiglu;
    k->read_sum = mg_scalar_read_sum;
    return 1;
}
