/* The C tests' assertion macro and closing line ("N passed, M failed", which CI reads).
 * Each test program includes this once; CHECK counts and, on failure, says where and why. */
#ifndef MG_TEST_CHECK_H
#define MG_TEST_CHECK_H

#include <stdio.h>

static int g_pass, g_fail;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (cond) {                                                         \
            g_pass++;                                                       \
        } else {                                                            \
            g_fail++;                                                       \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
        }                                                                   \
    } while (0)

#endif
