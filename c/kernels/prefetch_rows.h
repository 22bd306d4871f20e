/* The software prefetch of the int8-activation row loops (kernels/avx2/q8_*.c,
 * kernels/avx512/q8_*.c): each step of a loop over R interleaved rows prefetches as many bytes of
 * the group of rows ahead as it reads of its own, because the hardware prefetcher follows R
 * interleaved streams badly (docs/KERNELS.md).  Where to: L1 on AMD's cores, L2 on Intel's, whose
 * L1 fill buffers a burst of 9-14 L1 prefetches per step holds from the demand loads
 * (mg_cpu_features.prefetch_l2; the entries pass it down in their prepared x). */
#ifndef MG_KERNELS_PREFETCH_ROWS_H
#define MG_KERNELS_PREFETCH_ROWS_H

#include <stddef.h>

/* Every 64-byte line of [p, p + n), into L2 (l2) or L1; the branch is loop invariant. */
static inline __attribute__((always_inline)) void mg_prefetch_rows(const void *p, size_t n, int l2) {
    const char *c = (const char *)p;
    if (l2)
        for (size_t l = 0; l < n; l += 64) __builtin_prefetch(c + l, 0, 2);
    else
        for (size_t l = 0; l < n; l += 64) __builtin_prefetch(c + l, 0, 3);
}

#endif
