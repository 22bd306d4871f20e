/* NEON kernels (arm64). */
#include "core/kernels.h"

#if defined(__aarch64__)
const mg_kernels *mg_kernels_neon(void) { return NULL; }
#else
const mg_kernels *mg_kernels_neon(void) { return NULL; }
#endif
