/* Threaded linear layers: Y[n_tok, rows] = X[n_tok, cols] . W^T, rows split over the pool. */
#ifndef MG_LINEAR_H
#define MG_LINEAR_H

#include "kernels.h"
#include "threadpool.h"

/* Weight traffic of the linear layers, counted per dispatch when mg_compute.traffic is set
 * (updated with relaxed atomic adds: a nested dispatch may run inside a pool task; plain
 * fields so that C++ code can include this header).  weight_bytes counts values + scales of
 * every matrix of a dispatch once (a prefill chunk reads each row once for all its tokens).
 * Not counted: embedding rows, KV cache, activations. */
typedef struct mg_traffic {
    uint64_t weight_bytes;
    uint64_t dispatches;   /* pool runs issued by mg_linear* / mg_linear_jobs */
} mg_traffic;

typedef struct mg_compute {
    mg_pool *pool;
    const mg_kernels *k;
    mg_traffic *traffic; /* NULL: not counted */
    /* Opt-in int8 activations (core/q8_act.h): 0 keeps fp32 activations everywhere (logits
     * equal transformers' on dequantised weights); 1 quantises each input row once per call and
     * runs k->linear_q8 for the matrices that have a path there (mg_matrix_has_q8_path: the
     * ggml block formats, and FP4 with ue8m0 scales per 32). */
    int act_int8;
} mg_compute;

/* Adds one dispatch that reads `bytes` of weights (no-op when c->traffic is NULL). */
void mg_traffic_add(const mg_compute *c, uint64_t bytes);

/* Whether a call with n_tok tokens runs w through k->linear_q8 (act_int8 set, an int8 path for w
 * (mg_matrix_has_q8_path) with an entry for its format, and n_tok within the int8 path's range:
 * see linear.c). */
int mg_linear_q8_applies(const mg_compute *c, const mg_matrix *w, int64_t n_tok);

/* A buffer for the quantised inputs of one call (at least `bytes`, 64-byte aligned; free() it
 * after the call's dispatch), NULL when out of memory: the caller then keeps fp32 activations.
 * Owned by the call, not cached per thread: a decode step's few KB of activations cost one
 * malloc per linear call, nothing next to the weights it streams, and no state outlives it. */
void *mg_q8_buffer(size_t bytes);

/* Rows [r0, r1) of one matrix with the entry the inputs select: k->linear_q8 on xq when xq is
 * not NULL; else, with fast activations (act_int8) and several tokens, k->linear_bf16x where the
 * format has one; else k->linear on x.  The one place that chooses between them. */
void mg_linear_rows(const mg_kernels *k, int act_int8, const mg_matrix *w, const float *x, int64_t x_stride,
                    const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0, int64_t r1);

/* x: [n_tok, w->cols] contiguous; y: [n_tok, w->rows] contiguous. */
void mg_linear(const mg_compute *c, const mg_matrix *w, const float *x, int64_t n_tok, float *y);

/* Several matrices reading the same input, in one pool dispatch (e.g. q, k, v or gate, up).
 * ys[i] is [n_tok, ws[i]->rows]. */
void mg_linear_multi(const mg_compute *c, int n, const mg_matrix *const *ws, const float *x,
                     int64_t n_tok, float *const *ys);

/* Estimated cost of one output row of w for n_tok tokens (bytes streamed + multiply-adds): the
 * unit in which work is balanced over the pool. */
int64_t mg_linear_row_cost(const mg_matrix *w, int64_t n_tok);

/* The share `share` of n_shares of rows of n matrices (row_cost[i] per row of ws[i], total =
 * sum of rows * row_cost): calls run(ctx, i, r0, r1) for each non-empty row range, boundaries on
 * 16-row multiples.  All shares together cover every row of every matrix exactly once. */
void mg_cost_split(int n, const mg_matrix *const *ws, const int64_t *row_cost, int64_t total, int share,
                   int n_shares, void (*run)(void *ctx, int i, int64_t r0, int64_t r1), void *ctx);

#endif
