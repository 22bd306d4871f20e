/* The dispatch tables, built once (thread-safely, on first use) by inheritance: see tables.h.
 * The tables themselves are the only state, and they never change once built. */
#include <pthread.h>
#include <string.h>
#include "kernels/tables.h"

enum { T_SCALAR, T_AVX2, T_AVX512, T_AVX512BF16, T_NEON, T_COUNT };
_Static_assert((int)T_COUNT == (int)MG_KERNEL_TABLES, "tables.h's count");

static const struct {
    const char *name;
    int parent; /* index of the parent table, built before this one; -1 for the root */
    int (*override)(mg_kernels *k, const mg_cpu_features *f);
} SPEC[T_COUNT] = {
    [T_SCALAR] = {"scalar", -1, mg_kernels_override_scalar},
    [T_AVX2] = {"avx2", T_SCALAR, mg_kernels_override_avx2},
    [T_AVX512] = {"avx512", T_AVX2, mg_kernels_override_avx512},
    [T_AVX512BF16] = {"avx512bf16", T_AVX512, mg_kernels_override_avx512bf16},
    [T_NEON] = {"neon", T_SCALAR, mg_kernels_override_neon},
};

/* Whether a CPU with features f runs the instructions table i adds to its parent's. */
static int cpu_runs(int i, const mg_cpu_features *f) {
    switch (i) {
    case T_SCALAR: return 1;
    case T_AVX2: return f->avx2 && f->fma && f->f16c;
    case T_AVX512: return f->avx512;
    case T_AVX512BF16: return f->avx512bf16;
    case T_NEON: return f->neon;
    default: return 0;
    }
}

void mg_kernels_build(const mg_cpu_features *f, mg_kernels out[MG_KERNEL_TABLES]) {
    memset(out, 0, sizeof(mg_kernels) * T_COUNT);
    for (int i = 0; i < T_COUNT; i++) {
        const int p = SPEC[i].parent;
        if (!cpu_runs(i, f)) continue; /* its override function may not even be called here */
        mg_kernels k;
        memset(&k, 0, sizeof k);
        if (p >= 0) {
            if (!out[p].name) continue; /* no parent, no table */
            k = out[p];
            k.parent = &out[p];
        }
        k.name = SPEC[i].name;
        if (SPEC[i].override(&k, f)) out[i] = k;
    }
}

/* tables[i].name == NULL: not in this build, or not on this CPU. */
static mg_kernels tables[T_COUNT];
static pthread_once_t built = PTHREAD_ONCE_INIT;

static void build(void) {
    const mg_cpu_features f = mg_cpu_detect();
    mg_kernels_build(&f, tables);
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
