/* The monotonic wall clock, in seconds: what the expert store's and the MoE's time splits use. */
#ifndef MG_CLOCK_H
#define MG_CLOCK_H

#include <time.h>

static inline double mg_wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
