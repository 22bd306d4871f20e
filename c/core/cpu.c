/* Runtime CPU feature detection: the only place that decides which kernel table runs. */
#include <stdlib.h>
#include <string.h>
#include "core/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static unsigned long long read_xcr0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* A vendor rule's value, unless the environment variable `name` is exactly 0 or 1: that
 * overrides it, for a CPU the rule misjudges and to compare both forms on one machine. */
static int vendor_rule(int by_vendor, const char *name) {
    const char *env = getenv(name);
    return env && (env[0] == '0' || env[0] == '1') && env[1] == 0 ? env[0] == '1' : by_vendor;
}

/* Whether the environment variable `name` is exactly 0: it turns off an extension the CPU has, so
 * that one machine can run (and time) the code a CPU without it runs.  Nothing turns on an
 * extension the CPU lacks. */
static int turned_off(const char *name) {
    const char *env = getenv(name);
    return env && env[0] == '0' && env[1] == 0;
}

mg_cpu_features mg_cpu_detect(void) {
    mg_cpu_features f = {0};
    unsigned int a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
    char vendor[13];
    memcpy(vendor, &b, 4), memcpy(vendor + 4, &d, 4), memcpy(vendor + 8, &c, 4), vendor[12] = 0;
    /* both vendor rules: true on every x86 vendor but AMD and Hygon (see cpu.h) */
    const int not_amd = strcmp(vendor, "AuthenticAMD") != 0 && strcmp(vendor, "HygonGenuine") != 0;
    f.denormal_assists = vendor_rule(not_amd, "MOEGATE_DENORMAL_ASSISTS");
    f.prefetch_l2 = vendor_rule(not_amd, "MOEGATE_PREFETCH_L2");
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
            f.avxvnni = f.avx2 && ((a >> 4) & 1) && !turned_off("MOEGATE_AVXVNNI");
            f.avx512bf16 = f.avx512 && ((a >> 5) & 1);
        }
    }
    return f;
}
#elif defined(__aarch64__)
#if defined(__linux__)
#include <sys/auxv.h>
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif
/* Linux's values (older libc headers lack some names; other systems never read them) */
#ifndef AT_HWCAP
#define AT_HWCAP 16
#endif
#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif

/* Whether the OS reports an optional extension: Linux through the HWCAP word `at` (AT_HWCAP or
 * AT_HWCAP2) and its bit, macOS through the sysctl `apple`; other systems: absent.  The
 * extensions' instructions fault where absent, so they are asked of the OS, never assumed from
 * the build. */
static int os_reports(unsigned long at, unsigned long bit, const char *apple) {
#if defined(__linux__)
    (void)apple;
    return (getauxval(at) & bit) != 0;
#elif defined(__APPLE__)
    (void)at, (void)bit;
    int v = 0;
    size_t n = sizeof v;
    return sysctlbyname(apple, &v, &n, NULL, 0) == 0 && v;
#else
    (void)at, (void)bit, (void)apple;
    return 0;
#endif
}

mg_cpu_features mg_cpu_detect(void) {
    mg_cpu_features f = {0};
    f.neon = 1; /* Advanced SIMD is mandatory on AArch64 */
    /* the dot product: optional from Armv8.2 (Cortex-A55/A75 on, Neoverse N1 on, Apple M1 on; not
     * Cortex-A53/A72) */
    f.neondot = os_reports(AT_HWCAP, HWCAP_ASIMDDP, "hw.optional.arm.FEAT_DotProd");
    /* the int8 matrix multiply: optional from Armv8.2, required from 8.6 (Neoverse V1/V2/N2,
     * Cortex-A510/A710/X2 on, Apple M2 on; not Neoverse N1 or Apple M1); its GEMM file is built
     * with the dot product too */
    f.neoni8mm = f.neondot && os_reports(AT_HWCAP2, HWCAP2_I8MM, "hw.optional.arm.FEAT_I8MM");
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
