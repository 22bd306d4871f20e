/* How the dispatch tables are built (c/kernels/tables.c), the one inheritance mechanism of the
 * kernels: every instruction set's table starts as a copy of its parent's table and overrides
 * the entries it implements; everything else is inherited.  The tree:
 *
 *     scalar -> avx2 -> avx512 -> avx512bf16
 *     scalar -> neon
 *
 * Each instruction set has one override function below (in its table_<isa>.c), which writes
 * that set's entries into the table being built and returns 1, or returns 0 when this build
 * does not contain it (the file compiled as its stub: another architecture, or a compiler
 * without the flags); the table and its descendants then do not exist.  The scalar table is
 * the root: its function writes every entry.
 *
 * A table is built only on a CPU that runs its instructions (mg_kernels_build): the override
 * functions are compiled with their set's flags, so the compiler may use those instructions
 * even in the copying they do, and calling one elsewhere would fault as the tables are built
 * (which an AVX2-only CPU once did, before any kernel ran).
 *
 * An overriding entry that takes only some of its cases (the AVX-512 decode loops take whole
 * cache lines of certain scale kinds; avx512bf16 takes fp4 whose x splits into bf16 parts)
 * hands the others to the same entry of its table's parent (mg_kernels.parent), so a case
 * always runs the most specialised code that accepts it.  The int8-activation entries
 * (linear_q8) inherit the same way; the exceptions to "a table's entries depend only on the
 * build": the avx2 table takes its int8 GEMM only on a CPU with AVX-VNNI (table_avx2.c), the
 * avx512 table the VNNI entries only on a CPU with AVX512_VNNI (table_avx512.c), the neon table
 * its int8 GEMM only on a CPU with the dot-product extension (table_neon.c).
 * Include only from c/kernels and the C tests. */
#ifndef MG_KERNELS_TABLES_H
#define MG_KERNELS_TABLES_H

#include "core/cpu.h"
#include "core/kernels.h"

/* The vector ops as a family file exports them (P##_dot, P##_axpy, ...): their declarations, and
 * the table entries set to them. */
#define MG_VECTOR_OPS_DECLARE(P)                                                   \
    float P##_dot(const float *a, const float *b, int64_t n);                      \
    void P##_axpy(float *y, float a, const float *x, int64_t n);                   \
    void P##_scale(float *y, float a, int64_t n);                                  \
    void P##_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps); \
    void P##_swiglu(float *out, const float *gate, const float *up, int64_t n, float limit); \
    float P##_read_sum(const float *p, int64_t n);
#define MG_VECTOR_OPS_SET(k, P)                                                        \
    ((k)->dot = P##_dot, (k)->axpy = P##_axpy, (k)->scale = P##_scale, (k)->rmsnorm = P##_rmsnorm, \
     (k)->swiglu = P##_swiglu, (k)->read_sum = P##_read_sum)

/* The linear entries of every format set to P##_f32, P##_bf16, P##_f16, P##_fp8, P##_fp4. */
#define MG_LINEAR_SET(k, P)                                                                      \
    ((k)->linear[MG_F32] = P##_f32, (k)->linear[MG_BF16] = P##_bf16, (k)->linear[MG_F16] = P##_f16, \
     (k)->linear[MG_FP8_E4M3] = P##_fp8, (k)->linear[MG_FP4_E2M1] = P##_fp4)

/* f: the CPU the table is built for (only ever one that runs the set's instructions). */
int mg_kernels_override_scalar(mg_kernels *k, const mg_cpu_features *f);
int mg_kernels_override_avx2(mg_kernels *k, const mg_cpu_features *f);
int mg_kernels_override_avx512(mg_kernels *k, const mg_cpu_features *f);
int mg_kernels_override_avx512bf16(mg_kernels *k, const mg_cpu_features *f);
int mg_kernels_override_neon(mg_kernels *k, const mg_cpu_features *f);

/* The tables, in tables.c's order (scalar, avx2, avx512, avx512bf16, neon). */
enum { MG_KERNEL_TABLES = 5 };

/* Builds every table that this build contains and a CPU with features f runs into out[]
 * (out[i].name == NULL: no such table); parents point into out.  The process's own tables are
 * this, once, for mg_cpu_detect(); the C tests call it for CPUs they are not running on. */
void mg_kernels_build(const mg_cpu_features *f, mg_kernels out[MG_KERNEL_TABLES]);

#endif
