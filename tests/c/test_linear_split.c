/* Threaded linear layers (core/linear.c): the cost-balanced split covers every row of every
 * matrix exactly once with 16-row boundaries, for any share count; mg_linear_multi over
 * matrices of different formats equals one mg_linear per matrix; the traffic counter adds the
 * bytes of every matrix of a dispatch once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/cpu.h"
#include "core/linear.h"

#include "check.h"

typedef struct {
    int *hits[8];   /* per matrix, per row */
    int bad_align;
    const mg_matrix *const *ws;
} cover_ctx;

static void mark(void *ctx, int i, int64_t r0, int64_t r1) {
    cover_ctx *c = ctx;
    if (r0 % 16 || (r1 % 16 && r1 != c->ws[i]->rows)) c->bad_align++;
    for (int64_t r = r0; r < r1; r++) c->hits[i][r]++;
}

static void test_cover(void) {
    /* rows chosen to hit odd tails; formats with different row costs */
    const int64_t rows[5] = {1, 17, 300, 4096, 130};
    const int64_t cols[5] = {64, 4096, 1024, 2048, 96};
    const mg_format fmts[5] = {MG_F32, MG_FP4_E2M1, MG_BF16, MG_FP8_E4M3, MG_F16};
    mg_matrix m[5];
    const mg_matrix *ws[5];
    for (int i = 0; i < 5; i++) {
        memset(&m[i], 0, sizeof m[i]);
        m[i].rows = rows[i];
        m[i].cols = cols[i];
        m[i].format = fmts[i];
        ws[i] = &m[i];
    }
    for (int n = 1; n <= 5; n++) {
        for (int64_t n_tok = 1; n_tok <= 64; n_tok *= 8) {
            int64_t cost[5], total = 0;
            for (int i = 0; i < n; i++) {
                cost[i] = mg_linear_row_cost(ws[i], n_tok);
                total += rows[i] * cost[i];
            }
            for (int shares = 1; shares <= 7; shares++) {
                cover_ctx c = {{0}, 0, ws};
                for (int i = 0; i < n; i++) c.hits[i] = calloc((size_t)rows[i], sizeof(int));
                for (int s = 0; s < shares; s++) mg_cost_split(n, ws, cost, total, s, shares, mark, &c);
                int wrong = 0;
                for (int i = 0; i < n; i++)
                    for (int64_t r = 0; r < rows[i]; r++) wrong += c.hits[i][r] != 1;
                CHECK(wrong == 0, "%d matrices, n_tok %lld, %d shares: %d rows not covered exactly once", n,
                      (long long)n_tok, shares, wrong);
                CHECK(c.bad_align == 0, "%d matrices, %d shares: boundary off a 16-row multiple", n, shares);
                for (int i = 0; i < n; i++) free(c.hits[i]);
            }
        }
    }
}

/* Cost ranks the work of a row: more bytes or more tokens never make a row cheaper. */
static void test_cost_monotone(void) {
    mg_matrix a = {0}, b = {0};
    a.cols = b.cols = 4096;
    a.format = MG_FP4_E2M1;
    b.format = MG_BF16;
    CHECK(mg_linear_row_cost(&a, 1) < mg_linear_row_cost(&b, 1), "fp4 row should cost less than bf16");
    CHECK(mg_linear_row_cost(&a, 1) < mg_linear_row_cost(&a, 8), "more tokens should cost more");
}

static void fill(mg_matrix *m, void *buf, int64_t rows, int64_t cols, mg_format f, unsigned seed) {
    memset(m, 0, sizeof *m);
    m->rows = rows;
    m->cols = cols;
    m->format = f;
    m->scale_kind = MG_SCALE_NONE;
    m->data = buf;
    srand(seed);
    if (f == MG_F32) {
        float *p = buf;
        for (int64_t i = 0; i < rows * cols; i++) p[i] = (float)(rand() % 200 - 100) / 64.0f;
    } else { /* bf16: the high half of a small float */
        uint16_t *p = buf;
        for (int64_t i = 0; i < rows * cols; i++) {
            float v = (float)(rand() % 200 - 100) / 64.0f;
            uint32_t u;
            memcpy(&u, &v, 4);
            p[i] = (uint16_t)(u >> 16);
        }
    }
}

static void test_multi_equals_single(void) {
    mg_error err;
    mg_pool *pool = mg_pool_create(3, &err);
    CHECK(pool != NULL, "pool: %s", err.msg);
    if (!pool) return;
    mg_traffic traffic = {0, 0};
    mg_compute c = {pool, mg_kernels_best(), &traffic, 0};
    const int64_t cols = 96, r1 = 70, r2 = 33;
    float *w1 = malloc(sizeof(float) * r1 * cols);
    uint16_t *w2 = malloc(sizeof(uint16_t) * r2 * cols);
    float x[2 * 96], y1[2 * 70], y2[2 * 33], z1[2 * 70], z2[2 * 33];
    mg_matrix m1, m2;
    fill(&m1, w1, r1, cols, MG_F32, 1);
    fill(&m2, w2, r2, cols, MG_BF16, 2);
    for (int i = 0; i < 2 * cols; i++) x[i] = (float)(i % 13 - 6) / 8.0f;
    for (int64_t n_tok = 1; n_tok <= 2; n_tok++) {
        const mg_matrix *ws[2] = {&m1, &m2};
        float *ys[2] = {y1, y2};
        traffic.weight_bytes = traffic.dispatches = 0;
        mg_linear_multi(&c, 2, ws, x, n_tok, ys);
        CHECK(traffic.dispatches == 1 && traffic.weight_bytes == mg_matrix_bytes(&m1) + mg_matrix_bytes(&m2),
              "traffic: %llu dispatches, %llu bytes", (unsigned long long)traffic.dispatches,
              (unsigned long long)traffic.weight_bytes);
        mg_linear(&c, &m1, x, n_tok, z1);
        mg_linear(&c, &m2, x, n_tok, z2);
        CHECK(memcmp(y1, z1, sizeof(float) * (size_t)(n_tok * r1)) == 0, "multi != single (f32), n_tok %lld",
              (long long)n_tok);
        CHECK(memcmp(y2, z2, sizeof(float) * (size_t)(n_tok * r2)) == 0, "multi != single (bf16), n_tok %lld",
              (long long)n_tok);
    }
    c.traffic = NULL;
    const mg_matrix *one = &m1;
    float *yy = y1;
    mg_linear_multi(&c, 1, &one, x, 1, &yy); /* no counter: must not crash */
    CHECK(traffic.dispatches == 3, "counter moved without being attached");
    free(w1);
    free(w2);
    mg_pool_destroy(pool);
}

int main(void) {
    test_cover();
    test_cost_monotone();
    test_multi_equals_single();
    printf("test_linear_split: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
