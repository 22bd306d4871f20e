/* Runtime CPU feature detection: the only place that decides which kernel table runs. */
#include <string.h>
#include "core/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static unsigned long long read_xcr0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

mg_cpu_features mg_cpu_detect(void) {
    mg_cpu_features f = {0};
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    f.fma = (c >> 12) & 1;
    f.f16c = (c >> 29) & 1;
    /* The OS must save YMM state (XCR0 bits 1 and 2) for AVX registers to be usable. */
    int ymm_ok = osxsave && avx && ((read_xcr0() & 6) == 6);
    if (!ymm_ok) { f.fma = f.f16c = 0; return f; }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f.avx2 = (b >> 5) & 1;
        /* ZMM state: opmask, ZMM0-15 upper halves and ZMM16-31 (XCR0 bits 5-7) besides YMM. */
        const int zmm_ok = (read_xcr0() & 0xe6) == 0xe6;
        f.avx512f = ((b >> 16) & 1) && zmm_ok;
        f.avx512 = f.avx512f && ((b >> 17) & 1) /* DQ */ && ((b >> 30) & 1) /* BW */ && ((b >> 31) & 1) /* VL */;
        f.avx512vnni = f.avx512 && ((c >> 11) & 1);
        /* subleaf 1 (a: the highest subleaf): EAX bit 4 AVX-VNNI (YMM state, checked above), bit 5 AVX512_BF16 */
        if (a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) {
            f.avxvnni = f.avx2 && ((a >> 4) & 1);
            f.avx512bf16 = f.avx512 && ((a >> 5) & 1);
        }
    }
    return f;
}
#elif defined(__aarch64__)
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20) /* the kernel's value; older libc headers lack the name */
#endif
#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif

/* The dot-product extension: optional from Armv8.2 (Cortex-A55/A75 on, Neoverse N1 on, Apple
 * M1 on; not Cortex-A53/A72), and its instructions fault where absent, so it is asked of the OS,
 * never assumed from the build.  Other systems: reported absent. */
static int has_dotprod(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
    int v = 0;
    size_t n = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &n, NULL, 0) == 0 && v;
#else
    return 0;
#endif
}

/* The int8 matrix multiply: optional from Armv8.2, required from 8.6 (Neoverse V1/V2/N2,
 * Cortex-A510/A710/X2 on, Apple M2 on; not Neoverse N1 or Apple M1); asked of the OS, as the dot
 * product is. */
static int has_i8mm(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
#elif defined(__APPLE__)
    int v = 0;
    size_t n = sizeof v;
    return sysctlbyname("hw.optional.arm.FEAT_I8MM", &v, &n, NULL, 0) == 0 && v;
#else
    return 0;
#endif
}

mg_cpu_features mg_cpu_detect(void) {
    mg_cpu_features f = {0};
    f.neon = 1; /* Advanced SIMD is mandatory on AArch64 */
    f.neondot = has_dotprod();
    f.neoni8mm = f.neondot && has_i8mm(); /* the GEMM file is built with both */
    return f;
}
#else
mg_cpu_features mg_cpu_detect(void) {
    mg_cpu_features f = {0};
    return f;
}
#endif

/* Every table, fastest first. */
static const mg_kernels *(*const TABLES[])(void) = {mg_kernels_avx512bf16, mg_kernels_avx512, mg_kernels_avx2,
                                                   mg_kernels_neon, mg_kernels_scalar};

/* The tables exist only where this CPU runs them and all their ancestors (tables.c). */
const mg_kernels *mg_kernels_named(const char *name) {
    if (!name) name = "scalar";
    for (size_t i = 0; i < sizeof TABLES / sizeof *TABLES; i++) {
        const mg_kernels *k = TABLES[i]();
        if (k && !strcmp(k->name, name)) return k;
    }
    return NULL;
}

const mg_kernels *mg_kernels_best(void) {
    for (size_t i = 0; i < sizeof TABLES / sizeof *TABLES; i++) {
        const mg_kernels *k = TABLES[i]();
        if (k) return k;
    }
    return mg_kernels_scalar();
}
