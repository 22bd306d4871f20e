/* Kernel-level speed of the int8-activation entries (linear_q8) of the avx2 and avx512 tables on
 * the qwen3_moe bench model's shapes: weight GB/s on one core, thread CPU time (so a busy
 * neighbour's time slices do not count; its memory traffic still does), best of 5 timings.
 * F32=1 times the fp32 entries (linear, the default --activations f32) instead; HUGE=1 asks for
 * 2 MiB pages (MADV_HUGEPAGE), as the engine's mapping of a GGUF file mostly has on kernels with
 * large folios in the page cache.
 *   L2 / L3: one matrix read again and again (compute bound);
 *   gate / attq / atto / down: one of 16-128 matrices picked at random per call, as a decode
 *   step meets them (from memory, each call a new stream);  head: the model's output matrix
 *   (streamed; 255 MB as Q6_K, beyond a server's L3, so both heads come from memory).
 * read_sum: the avx512 table's read bandwidth over 256 MiB, the yardstick.
 *
 *   make build/tests/test_ggml_q8      # builds the objects
 *   cc -O2 -Ic tools/bench_q8.c $(find build/c -name '*.o') -lm -lpthread -o build/bench_q8
 *   build/bench_q8 [substring of the case names] [seconds per case and table]
 * Set ONLY512=1 to skip the avx2 table.  docs/KERNELS.md (int8 section) has the numbers. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include "core/cpu.h"
#include "core/kernels.h"
#include "core/matrix.h"
#include "core/q8_act.h"
#include "bench_util.h"


/* Random code bytes with sane f16 scales (d, and the K-quants' dmin) in every block. */
static void fill(mg_format f, uint8_t *d, size_t n, int64_t b) {
    for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(rnd() >> 20);
    const int off0 = f == MG_Q6_K ? 208 : f == MG_Q2_K ? 80 : f == MG_Q3_K ? 108 : 0,
              off1 = f == MG_Q4_K || f == MG_Q5_K ? 2 : f == MG_Q2_K ? 82 : -1;
    for (size_t k = 0; k < n / (size_t)b; k++) {
        const uint16_t h = (uint16_t)(0x1c00 | (rnd() & 0x3ff));
        memcpy(d + k * (size_t)b + off0, &h, 2);
        if (off1 >= 0) memcpy(d + k * (size_t)b + off1, &h, 2);
    }
}

enum { HEAD_ROWS = 151936 }; /* the qwen3_moe vocabulary */

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        mg_format f;
        int64_t rows, cols, nmat;
    } cases[] = {
        {"q4_k L2 256x2048", MG_Q4_K, 256, 2048, 1},       {"q6_k L2 256x2048", MG_Q6_K, 256, 2048, 1},
        {"q5_k L2 256x2048", MG_Q5_K, 256, 2048, 1},       {"q8_0 L2 256x2048", MG_Q8_0, 256, 2048, 1},
        {"q4_k L3 2048x2048", MG_Q4_K, 2048, 2048, 1},     {"q6_k L3 2048x2048", MG_Q6_K, 2048, 2048, 1},
        {"q8_0 L3 2048x2048", MG_Q8_0, 2048, 2048, 1},     {"q5_k L3 2048x2048", MG_Q5_K, 2048, 2048, 1},
        {"q6_k head 151936x2048", MG_Q6_K, HEAD_ROWS, 2048, 1}, {"q8_0 head 151936x2048", MG_Q8_0, HEAD_ROWS, 2048, 1},
        {"q4_k gate 256x2048 x128", MG_Q4_K, 256, 2048, 128}, {"q4_k attq 4096x2048 x16", MG_Q4_K, 4096, 2048, 16},
        {"q4_k atto 2048x4096 x16", MG_Q4_K, 2048, 4096, 16}, {"q6_k down 2048x256 x128", MG_Q6_K, 2048, 256, 128},
        {"q8_0 down 2048x256 x128", MG_Q8_0, 2048, 256, 128},
        {"q5_k gate 256x2048 x128", MG_Q5_K, 256, 2048, 128},
        {"q2_k L2 256x2048", MG_Q2_K, 256, 2048, 1},        {"q3_k L2 256x2048", MG_Q3_K, 256, 2048, 1},
        {"iq4_xs L2 256x2048", MG_IQ4_XS, 256, 2048, 1},    {"q2_k gate 256x2048 x128", MG_Q2_K, 256, 2048, 128},
        {"q3_k gate 256x2048 x128", MG_Q3_K, 256, 2048, 128}, {"iq4_xs gate 256x2048 x128", MG_IQ4_XS, 256, 2048, 128},
    };
    const char *tabs[] = {"avx2", "avx512"};
    const int f32 = getenv("F32") != NULL;
    const char *only = argc > 1 ? argv[1] : "";
    const double seconds = argc > 2 ? atof(argv[2]) : 0.3;
    enum { MAXC = 4096 };
    float *x = malloc(MAXC * sizeof(float)), *y = malloc(HEAD_ROWS * sizeof(float));
    for (int i = 0; i < MAXC; i++) x[i] = (float)((int64_t)(rnd() >> 40) - (1 << 23)) / (float)(1 << 23);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        if (*only && !strstr(cases[ci].name, only)) continue;
        int64_t e, b;
        mg_format_block(cases[ci].f, &e, &b);
        mg_matrix m;
        memset(&m, 0, sizeof m);
        m.format = cases[ci].f, m.rows = cases[ci].rows, m.cols = cases[ci].cols, m.scale_kind = MG_SCALE_NONE;
        const size_t mb = (size_t)m.rows * mg_matrix_row_bytes(&m);
        const size_t huge = (size_t)2 << 20, total = (mb * (size_t)cases[ci].nmat + huge - 1) / huge * huge;
        uint8_t *data = aligned_alloc(huge, total);
        if (getenv("HUGE")) madvise(data, total, MADV_HUGEPAGE);
        fill(m.format, data, mb * (size_t)cases[ci].nmat, b);
        void *mem = aligned_alloc(64, (mg_q8_act_bytes(1, m.cols) + 63) & ~(size_t)63);
        mg_q8_act xq;
        mg_q8_quantize(x, m.cols, 1, m.cols, mem, &xq, NULL);
        printf("%-26s", cases[ci].name);
        for (int t = 0; t < 2; t++) {
            const mg_kernels *k = mg_kernels_named(tabs[t]);
            if (!k || (t == 0 && getenv("ONLY512"))) continue;
            double best = 0;
            for (int rep = 0; rep < 5; rep++) {
                const double t0 = cpu_now();
                int64_t n = 0;
                while (cpu_now() - t0 < seconds / 5) {
                    m.data = data + mb * (rnd() % (uint64_t)cases[ci].nmat);
                    if (f32)
                        k->linear[m.format](&m, x, m.cols, 1, y, m.rows, 0, m.rows);
                    else
                        k->linear_q8[m.format](&m, &xq, 1, y, m.rows, 0, m.rows);
                    n++;
                }
                const double gbs = (double)n * (double)mb / (cpu_now() - t0) / 1e9;
                best = gbs > best ? gbs : best;
            }
            printf("  %s %6.1f GB/s", tabs[t], best);
        }
        printf("\n");
        free(data), free(mem);
    }
    const mg_kernels *k = mg_kernels_best();
    const size_t n = (size_t)256 << 20;
    float *buf = aligned_alloc(64, n);
    memset(buf, 0, n);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        const double t0 = cpu_now();
        volatile float s = k->read_sum(buf, (int64_t)(n / 4));
        (void)s;
        const double gbs = (double)n / (cpu_now() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    printf("read_sum (%s) %.1f GB/s\n", k->name, best);
    free(buf), free(x), free(y);
    return 0;
}
