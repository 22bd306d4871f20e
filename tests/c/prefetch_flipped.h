/* The kernel tables built again with mg_cpu_features.prefetch_l2 flipped: the int8 row loops'
 * other prefetch target (kernels/prefetch_rows.h), which this CPU does not take, so that the
 * int8 tests run both; and the avx2 table of a CPU without AVX-VNNI.  Include after check.h. */
#ifndef MG_TEST_PREFETCH_FLIPPED_H
#define MG_TEST_PREFETCH_FLIPPED_H

#include <string.h>
#include "core/cpu.h"
#include "kernels/tables.h"

mg_linear_q8_fn mg_avx2_linear_q8_gemm(int prefetch_l2); /* kernels/avx2/avx2.h: NULL in a build without AVX2 */

/* Appends to tables[n..] (room for MG_KERNEL_TABLES more) the flipped tables whose int8 entry of
 * format f differs from the detected table's of the same name, and returns the new count.  On
 * x86 every SIMD table's int8 entries (its own or inherited: a GEMM's entry over the q8_* rows)
 * take the flag, so each must differ; on arm64 none has it. */
static int add_prefetch_flipped(const mg_kernels **tables, int n, mg_format f) {
    static mg_kernels flipped[MG_KERNEL_TABLES]; /* static: the entries' parents point into it */
    static char names[MG_KERNEL_TABLES][48];
    mg_cpu_features c = mg_cpu_detect();
    c.prefetch_l2 = !c.prefetch_l2;
    mg_kernels_build(&c, flipped);
    const int n0 = n;
    int x86_simd = 0;
    for (int i = 1; i < MG_KERNEL_TABLES; i++) {
        if (!flipped[i].name) continue;
        x86_simd += strcmp(flipped[i].name, "neon") != 0;
        for (int k = 0; k < n0; k++)
            if (!strcmp(tables[k]->name, flipped[i].name) && tables[k]->linear_q8[f] != flipped[i].linear_q8[f]) {
                snprintf(names[i], sizeof names[i], "%s (prefetch into %s)", flipped[i].name,
                         c.prefetch_l2 ? "L2" : "L1");
                flipped[i].name = names[i];
                tables[n++] = &flipped[i];
            }
    }
    CHECK(n - n0 == x86_simd, "%d of %d x86 SIMD tables have int8 entries that follow prefetch_l2", n - n0, x86_simd);
    return n;
}

/* Appends the avx2 table of a CPU without AVX-VNNI, with either prefetch target (its int8
 * entries the vpmaddubsw GEMM of q8_gemm_avx2.c over the AVX2 rows, q8_avx2.c and q8_fp4_avx2.c
 * as built for AVX2), where this CPU has AVX-VNNI and so takes the vpdpbusd GEMM and the rows'
 * AVX-VNNI build (q8_*rows_avxvnni.c); returns the new count (room for 2 more). */
static int add_avx2_without_vnni(const mg_kernels **tables, int n) {
    static mg_kernels plain[2][MG_KERNEL_TABLES]; /* static: the entries' parents point into it */
    const mg_cpu_features detected = mg_cpu_detect();
    if (!detected.avxvnni || !mg_kernels_named("avx2")) return n;
    for (int l2 = 0; l2 < 2; l2++) {
        mg_cpu_features c = {0};
        c.avx2 = c.fma = c.f16c = 1, c.prefetch_l2 = l2;
        mg_kernels_build(&c, plain[l2]);
        plain[l2][1].name = l2 ? "avx2 without AVX-VNNI (prefetch into L2)" : "avx2 without AVX-VNNI (prefetch into L1)";
        CHECK(plain[l2][1].linear_q8_gemm && plain[l2][1].linear_q8[MG_Q4_K] == mg_avx2_linear_q8_gemm(l2),
              "%s: the vpmaddubsw GEMM's entry", plain[l2][1].name);
        tables[n++] = &plain[l2][1];
    }
    return n;
}

#endif
