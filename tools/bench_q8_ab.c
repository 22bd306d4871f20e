/* One table's int8-activation entries (linear_q8) against another build of them, interleaved:
 * weight GB/s on one core for matrices of a real model's shapes, read from L2 (a slice of the
 * matrix read again and again: compute bound) and streamed (copies of the whole matrix filling
 * > 256 MiB, a new copy per call: every byte from memory, as decode meets a layer's weights).
 * Thread CPU time (a busy neighbour's time slices do not count; its memory traffic does); each
 * repetition times `old` then `new` (the order alternating) and read_sum over 256 MiB, the
 * yardstick; printed: the medians over the repetitions of each, and new/old = the median of
 * the repetitions' ratios (a pair timed back to back shares the machine's load of the moment).
 *
 * `new` is the table named by TABLE (default avx2); `old` is old_linear_q8, linked in from an
 * object of another tree (missing: only `new` is timed).  To compare against the AVX2 code of
 * another commit (2651dee: before the AVX2 int8 rows):
 *
 *   make build/tests/test_ggml_q8                  # builds this tree's objects
 *   mkdir -p build/old && git archive 2651dee c | tar -x -C build/old
 *   cc -std=c11 -O3 -fno-math-errno -mavx2 -mfma -mf16c -Ibuild/old/c \
 *      -Dmg_avx2_linear_q8=old_linear_q8 -Dmg_avx2_decode_ggml=old_decode_ggml \
 *      -Dmg_avx2_ggml_dequant_block=old_dequant_block \
 *      -c build/old/c/kernels/avx2/ggml_avx2.c -o build/old/ggml_avx2.o
 *   cc -O2 -Ic tools/bench_q8_ab.c build/old/ggml_avx2.o $(find build/c -name '*.o') -lm -lpthread \
 *      -o build/bench_q8_ab
 *   nice -n 10 build/bench_q8_ab [substring of the case names] [repetitions] [seconds per timing]
 *
 * docs/KERNELS.md (AVX2 int8 rows) has the numbers. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/cpu.h"
#include "core/kernels.h"
#include "core/matrix.h"
#include "core/q8_act.h"
#include "bench_util.h"

/* Weak: absent unless an old object is linked in. */
void old_linear_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                   int64_t r1) __attribute__((weak));


/* Random code bytes with sane f16 scales (d, and Q4_K / Q5_K's dmin) and e8m0 bytes. */
static void fill(mg_format f, uint8_t *d, size_t n, int64_t b) {
    for (size_t i = 0; i + 8 <= n; i += 8) {
        const uint64_t v = rnd();
        memcpy(d + i, &v, 8);
    }
    const int off0 = f == MG_Q6_K ? 208 : f == MG_MXFP4 ? -1 : 0, off1 = f == MG_Q4_K || f == MG_Q5_K ? 2 : -1;
    for (size_t k = 0; k < n / (size_t)b; k++) {
        const uint16_t h = (uint16_t)(0x1c00 | (rnd() & 0x3ff));
        if (off0 >= 0) memcpy(d + k * (size_t)b + off0, &h, 2);
        if (off1 >= 0) memcpy(d + k * (size_t)b + off1, &h, 2);
        if (f == MG_MXFP4) d[k * (size_t)b] = (uint8_t)(118 + rnd() % 16);
    }
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef void q8_fn(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                   int64_t r1);

/* GB/s of fn over `seconds` of thread CPU time, calling it on copy (i mod copies) of mb bytes
 * (the clock read once per MiB of calls: it costs about as much as a small call). */
static double timed(q8_fn *fn, mg_matrix *m, const uint8_t *data, size_t mb, int64_t copies, int64_t rows,
                    const mg_q8_act *xq, float *y, double seconds, int64_t *next) {
    const int64_t batch = mb >= (1 << 20) ? 1 : (int64_t)((1 << 20) / mb);
    const double t0 = cpu_now();
    int64_t n = 0;
    double t;
    do {
        for (int64_t j = 0; j < batch; j++, n++) {
            m->data = data + mb * (size_t)(*next % copies);
            *next += 1;
            fn(m, xq, 1, y, rows, 0, rows);
        }
    } while ((t = cpu_now() - t0) < seconds);
    return (double)n * (double)mb / t / 1e9;
}

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        mg_format f;
    } formats[] = {{"q8_0", MG_Q8_0}, {"q4_k", MG_Q4_K}, {"q6_k", MG_Q6_K}, {"mxfp4", MG_MXFP4}, {"q4_0", MG_Q4_0},
                   {"q5_0", MG_Q5_0}, {"q5_k", MG_Q5_K}, {"iq4_nl", MG_IQ4_NL}, {"iq4_xs", MG_IQ4_XS}};
    static const int64_t shapes[][2] = {{2048, 4096}, {4096, 768}};
    const char *only = argc > 1 ? argv[1] : "";
    const int reps = argc > 2 ? atoi(argv[2]) : 5;
    const double seconds = argc > 3 ? atof(argv[3]) : 0.15;
    const char *table = getenv("TABLE") ? getenv("TABLE") : "avx2";
    const mg_kernels *k = mg_kernels_named(table);
    if (!k) {
        fprintf(stderr, "no table %s on this CPU\n", table);
        return 1;
    }
    enum { MAXC = 4096, L2_BYTES = 256 << 10 };
    const size_t stream_bytes = (size_t)320 << 20, yard_bytes = (size_t)256 << 20;
    float *x = malloc(MAXC * sizeof(float)), *y = malloc(8192 * sizeof(float));
    for (int i = 0; i < MAXC; i++) x[i] = (float)((int64_t)(rnd() >> 40) - (1 << 23)) / (float)(1 << 23);
    float *yard = aligned_alloc(64, yard_bytes);
    memset(yard, 0, yard_bytes);
    double *t_old = malloc((size_t)reps * sizeof(double)), *t_new = malloc((size_t)reps * sizeof(double));
    double *t_rd = malloc((size_t)reps * sizeof(double)), *ratio = malloc((size_t)reps * sizeof(double));
    double rd_all[256];
    int n_rd = 0;
    printf("table %s against %s; GB/s of weights, median of %d, thread CPU time\n", table,
           old_linear_q8 ? "old_linear_q8" : "(none)", reps);
    printf("%-28s %8s %8s %7s %9s\n", "case", "old", "new", "new/old", "read_sum");
    for (size_t fi = 0; fi < sizeof formats / sizeof *formats; fi++)
        for (size_t si = 0; si < 2; si++)
            for (int stream = 0; stream < 2; stream++) {
                char name[64];
                snprintf(name, sizeof name, "%s %ldx%ld %s", formats[fi].name, (long)shapes[si][0], (long)shapes[si][1],
                         stream ? "stream" : "L2");
                if (*only && !strstr(name, only)) continue;
                mg_matrix m;
                memset(&m, 0, sizeof m);
                m.format = formats[fi].f, m.cols = shapes[si][1], m.scale_kind = MG_SCALE_NONE;
                int64_t e, b;
                mg_format_block(m.format, &e, &b);
                const size_t rb = mg_matrix_row_bytes(&m);
                /* L2: the rows of the shape that fit 256 KiB, a multiple of 4 */
                m.rows = stream ? shapes[si][0] : (int64_t)(L2_BYTES / rb) / 4 * 4;
                if (m.rows > shapes[si][0]) m.rows = shapes[si][0];
                const size_t mb = (size_t)m.rows * rb;
                const int64_t copies = stream ? (int64_t)((stream_bytes + mb - 1) / mb) : 1;
                uint8_t *data = aligned_alloc(64, (mb * (size_t)copies + 63) / 64 * 64);
                fill(m.format, data, mb * (size_t)copies, b);
                void *mem = aligned_alloc(64, (mg_q8_act_bytes(1, m.cols) + 63) & ~(size_t)63);
                mg_q8_act xq;
                mg_q8_quantize(x, m.cols, 1, m.cols, mem, &xq, NULL);
                int64_t next = 0;
                for (int r = 0; r < reps; r++) {
                    const int old_first = r & 1;
                    for (int j = 0; j < 2; j++) {
                        const int is_old = j == 0 ? old_first : !old_first;
                        if (is_old && !old_linear_q8) continue;
                        const double g = timed(is_old ? old_linear_q8 : k->linear_q8[m.format], &m, data, mb, copies,
                                               m.rows, &xq, y, seconds, &next);
                        (is_old ? t_old : t_new)[r] = g;
                    }
                    ratio[r] = old_linear_q8 ? t_new[r] / t_old[r] : 0;
                    const double t0 = cpu_now();
                    volatile float s = k->read_sum(yard, (int64_t)(yard_bytes / 4));
                    (void)s;
                    t_rd[r] = (double)yard_bytes / (cpu_now() - t0) / 1e9;
                    if (n_rd < 256) rd_all[n_rd++] = t_rd[r];
                }
                const double mo = old_linear_q8 ? median(t_old, reps) : 0, mn = median(t_new, reps);
                printf("%-28s %8.1f %8.1f %7.2f %9.1f   (%ld rows, %.2f MiB x %ld)\n", name, mo, mn, median(ratio, reps),
                       median(t_rd, reps), (long)m.rows, (double)mb / (1 << 20), (long)copies);
                fflush(stdout);
                free(data), free(mem);
            }
    if (n_rd) printf("read_sum (%s, 256 MiB) median over the run %.1f GB/s\n", table, median(rd_all, n_rd));
    free(yard), free(x), free(y), free(t_old), free(t_new), free(t_rd), free(ratio);
    return 0;
}
