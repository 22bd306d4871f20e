/* Shared by the C benchmarks in tools/ (bench_q8.c, bench_q8_ab.c): a seeded random source and
 * the calling thread's CPU clock (a busy neighbour's time slices do not count). */
#ifndef MG_TOOLS_BENCH_UTIL_H
#define MG_TOOLS_BENCH_UTIL_H

#include <stdint.h>
#include <time.h>

static uint64_t g_rng = 88172645463325252ull;
static inline uint64_t rnd(void) { /* xorshift64 */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static inline double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#endif
