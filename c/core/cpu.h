/* Runtime CPU feature detection and kernel-table selection. */
#ifndef MG_CPU_H
#define MG_CPU_H

#include "kernels.h"

typedef struct mg_cpu_features {
    int avx2, fma, f16c, avx512f, neon;
    /* F, BW, VL and DQ together, with ZMM and opmask state enabled by the OS (XCR0 bits 5-7). */
    int avx512;
    /* AVX512_BF16 (vdpbf16ps) on top of avx512: the avx512bf16 table runs */
    int avx512bf16;
    /* AVX512_VNNI (vpdpbusd) on top of avx512: the avx512 table's int8-activation entries */
    int avx512vnni;
    /* AVX-VNNI (the VEX, ymm vpdpbusd; Intel client CPUs from Alder Lake) on top of avx2: the
     * avx2 table's int8 rows and GEMM.  MOEGATE_AVXVNNI=0 turns it off, to run and time on this
     * CPU the avx2 table of an AVX2-only one (Zen 3, Skylake to Comet Lake) */
    int avxvnni;
    /* The dot-product extension (sdot / udot, FEAT_DotProd; Linux HWCAP_ASIMDDP) on top of neon:
     * the neon table's int8 GEMM */
    int neondot;
    /* The int8 matrix multiply (smmla, FEAT_I8MM; Linux HWCAP2_I8MM) on top of neondot: that GEMM
     * on smmla */
    int neoni8mm;
    /* A vector multiply with a denormal input takes a microcode assist (x86 cores other than AMD's
     * and Hygon's: on a Sapphire Rapids-class Intel core about 40 ns per instruction, 63x slower
     * with one denormal per 16 inputs; AMD Zen and the arm64 cores run them at full speed).  The
     * fp8 decode then avoids its fp32-denormal decoding (decode_rows_avx2.c, decode_rows_avx512.c). */
    int denormal_assists;
    /* The int8-activation row loops (the q8_* files) prefetch the rows ahead into L2 rather than
     * L1 (x86 cores other than AMD's and Hygon's).  On a Sapphire Rapids-class Intel core their
     * bursts of 9-14 L1 prefetches per step held the fill buffers the demand loads need: into L2,
     * Q4_K_M int8 decode ran 11-19 % faster (against llama.cpp 1.15 -> 1.45); on Zen 4 L1 was the
     * faster one (docs/KERNELS.md). */
    int prefetch_l2;
} mg_cpu_features;

mg_cpu_features mg_cpu_detect(void);

/* The fastest table this CPU can run. */
const mg_kernels *mg_kernels_best(void);

/* A table by name ("scalar", "avx2", "avx512", "avx512bf16", "neon"); NULL if unknown or this CPU cannot run
 * it.  "avx2" and "avx512" stay selectable on CPUs
 * that have more. */
const mg_kernels *mg_kernels_named(const char *name);

#endif
