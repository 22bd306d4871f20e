/* The dispatch tables, built once (thread-safely, on first use) by inheritance: see tables.h.
 * The tables themselves are the only state, and they never change once built. */
#include <pthread.h>
#include <string.h>
#include "kernels/tables.h"

enum { T_SCALAR, T_AVX2, T_AVX512, T_AVX512BF16, T_NEON, T_COUNT };

static const struct {
    const char *name;
    int parent; /* index of the parent table, built before this one; -1 for the root */
    int (*override)(mg_kernels *k);
} SPEC[T_COUNT] = {
    [T_SCALAR] = {"scalar", -1, mg_kernels_override_scalar},
    [T_AVX2] = {"avx2", T_SCALAR, mg_kernels_override_avx2},
    [T_AVX512] = {"avx512", T_AVX2, mg_kernels_override_avx512},
    [T_AVX512BF16] = {"avx512bf16", T_AVX512, mg_kernels_override_avx512bf16},
    [T_NEON] = {"neon", T_SCALAR, mg_kernels_override_neon},
};

/* tables[i].name == NULL: not in this build. */
static mg_kernels tables[T_COUNT];
static pthread_once_t built = PTHREAD_ONCE_INIT;

static void build(void) {
    for (int i = 0; i < T_COUNT; i++) {
        const int p = SPEC[i].parent;
        mg_kernels k;
        memset(&k, 0, sizeof k);
        if (p >= 0) {
            if (!tables[p].name) continue; /* no parent, no table */
            k = tables[p];
            k.parent = &tables[p];
        }
        k.name = SPEC[i].name;
        if (SPEC[i].override(&k)) tables[i] = k;
    }
}

static const mg_kernels *table(int i) {
    pthread_once(&built, build);
    return tables[i].name ? &tables[i] : NULL;
}

const mg_kernels *mg_kernels_scalar(void) { return table(T_SCALAR); }
const mg_kernels *mg_kernels_avx2(void) { return table(T_AVX2); }
const mg_kernels *mg_kernels_avx512(void) { return table(T_AVX512); }
const mg_kernels *mg_kernels_avx512bf16(void) { return table(T_AVX512BF16); }
const mg_kernels *mg_kernels_neon(void) { return table(T_NEON); }
