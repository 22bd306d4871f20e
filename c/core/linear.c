/* Threaded linear layers: output rows are split over the pool's shares by estimated cost. */
#include <stdlib.h>
#include "core/linear.h"

/* Token counts up to which the int8 path runs: any with an int8 GEMM; else decode only (entries
 * that loop over the tokens of each row lose to prefill's fp32 tiles, which decode each weight
 * row once for many tokens). */
int mg_linear_q8_applies(const mg_compute *c, const mg_matrix *w, int64_t n_tok) {
    return c->act_int8 && mg_matrix_has_q8_path(w) && c->k->linear_q8[w->format] && n_tok >= 1 &&
           (n_tok == 1 || c->k->linear_q8_gemm) && w->cols % MG_Q8_BLOCK == 0;
}

void *mg_q8_buffer(size_t bytes) { return aligned_alloc(64, ((bytes ? bytes : 1) + 63) & ~(size_t)63); }

void mg_linear_rows(const mg_kernels *k, int act_int8, const mg_matrix *w, const float *x, int64_t x_stride,
                    const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0, int64_t r1) {
    if (xq)
        k->linear_q8[w->format](w, xq, n_tok, y, y_stride, r0, r1);
    else if (act_int8 && n_tok > 1 && k->linear_bf16x[w->format])
        k->linear_bf16x[w->format](w, x, x_stride, n_tok, y, y_stride, r0, r1);
    else
        k->linear[w->format](w, x, x_stride, n_tok, y, y_stride, r0, r1);
}

void mg_traffic_add(const mg_compute *c, uint64_t bytes) {
    if (!c->traffic) return;
    __atomic_fetch_add(&c->traffic->weight_bytes, bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->traffic->dispatches, 1, __ATOMIC_RELAXED);
}

int64_t mg_linear_row_cost(const mg_matrix *w, int64_t n_tok) {
    /* Bytes streamed per row (values; scales are <= 1/16 of them) plus the multiply-adds.  At
     * decode the first term dominates for wide formats and the second makes up for the extra
     * decoding work of packed ones (fp4 costs about as much per weight as fp8 on AVX2). */
    return (int64_t)mg_matrix_row_bytes(w) + w->cols * (n_tok > 0 ? n_tok : 1);
}

/* First row of a matrix whose cost starts at `base` that begins at or after the global cost
 * point C, rounded up to 16 rows.  Every share computes boundaries the same way, so the ranges
 * tile the rows exactly. */
static int64_t row_at(int64_t rows, int64_t rc, int64_t base, int64_t C) {
    if (C <= base) return 0;
    int64_t r = (C - base + rc - 1) / rc;
    r = (r + 15) / 16 * 16;
    return r < rows ? r : rows;
}

void mg_cost_split(int n, const mg_matrix *const *ws, const int64_t *row_cost, int64_t total, int share,
                   int n_shares, void (*run)(void *ctx, int i, int64_t r0, int64_t r1), void *ctx) {
    const int64_t c0 = total * share / n_shares;
    const int64_t c1 = share == n_shares - 1 ? total : total * (share + 1) / n_shares;
    int64_t base = 0;
    for (int i = 0; i < n && base < c1; i++) {
        const int64_t rows = ws[i]->rows, cost = rows * row_cost[i];
        if (cost > 0 && base + cost > c0) {
            int64_t r0 = row_at(rows, row_cost[i], base, c0);
            int64_t r1 = share == n_shares - 1 ? rows : row_at(rows, row_cost[i], base, c1);
            if (r0 < r1) run(ctx, i, r0, r1);
        }
        base += cost;
    }
}

#define MULTI_MAX 16

typedef struct {
    const mg_kernels *k;
    int act_int8;
    int n;
    const mg_matrix *const *ws;
    const float *x;
    const mg_q8_act *xq; /* x quantised (int8 activations), NULL: fp32 */
    int64_t n_tok;
    float *const *ys;
    int64_t cost[MULTI_MAX];
    int64_t total;
} linear_job;

static void linear_rows(void *ctx, int i, int64_t r0, int64_t r1) {
    const linear_job *job = ctx;
    const mg_matrix *w = job->ws[i];
    /* one quantised x serves the call; each matrix takes it only if it has an int8 path (FP4 with
     * other scales, FP8 and the float formats next to block formats keep fp32) */
    mg_linear_rows(job->k, job->act_int8, w, job->x, w->cols,
                   job->xq && mg_matrix_has_q8_path(w) && job->k->linear_q8[w->format] ? job->xq : NULL, job->n_tok,
                   job->ys[i], w->rows, r0, r1);
}

/* Each share takes an equal part of the summed cost of all matrices, so that q, k and v (or
 * gate and up, or matrices of different formats) are balanced together in one dispatch. */
static void linear_task(void *ctx, int share, int n_shares) {
    const linear_job *job = ctx;
    mg_cost_split(job->n, job->ws, job->cost, job->total, share, n_shares, linear_rows, ctx);
}

void mg_linear_multi(const mg_compute *c, int n, const mg_matrix *const *ws, const float *x,
                     int64_t n_tok, float *const *ys) {
    for (int b = 0; b < n; b += MULTI_MAX) { /* more than MULTI_MAX matrices: several dispatches */
        linear_job job = {c->k, c->act_int8, n - b < MULTI_MAX ? n - b : MULTI_MAX, ws + b, x, NULL, n_tok, ys + b, {0}, 0};
        for (int i = 0; i < job.n; i++) {
            job.cost[i] = mg_linear_row_cost(ws[b + i], n_tok);
            job.total += ws[b + i]->rows * job.cost[i];
        }
        if (job.total <= 0) continue;
        /* int8 activations: x quantised once, here, before the rows are split over the pool
         * (all matrices of the call read the same x, so one quantisation serves them all). */
        mg_q8_act xq;
        void *mem = NULL;
        int q8 = 0;
        for (int i = 0; i < job.n; i++) q8 |= mg_linear_q8_applies(c, ws[b + i], n_tok);
        if (q8 && (mem = mg_q8_buffer(mg_q8_act_bytes(n_tok, ws[b]->cols)))) {
            mg_q8_quantize(x, ws[b]->cols, n_tok, ws[b]->cols, mem, &xq, c->k->q8_quantize_row);
            job.xq = &xq;
        }
        if (c->traffic) {
            uint64_t bytes = 0;
            for (int i = 0; i < job.n; i++) bytes += mg_matrix_bytes(ws[b + i]);
            mg_traffic_add(c, bytes);
        }
        mg_pool_run(c->pool, linear_task, &job);
        free(mem);
    }
}

void mg_linear(const mg_compute *c, const mg_matrix *w, const float *x, int64_t n_tok, float *y) {
    mg_linear_multi(c, 1, &w, x, n_tok, &y);
}
