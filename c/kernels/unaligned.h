/* Loads of little-endian fields at any byte address (GGUF blocks start anywhere, so a field is
 * read through memcpy, which compilers turn into one plain load).  The results are widened to
 * 64 bits so callers can shift several rows' fields into one word. */
#ifndef MG_KERNELS_UNALIGNED_H
#define MG_KERNELS_UNALIGNED_H

#include <stdint.h>
#include <string.h>

static inline __attribute__((always_inline)) uint64_t mg_ld16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline __attribute__((always_inline)) uint64_t mg_ld32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline __attribute__((always_inline)) uint64_t mg_ld64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

#endif
