/* Threaded linear layers: Y[n_tok, rows] = X[n_tok, cols] . W^T, rows split over the pool. */
#ifndef MG_LINEAR_H
#define MG_LINEAR_H

#include "kernels.h"
#include "threadpool.h"

typedef struct mg_compute {
    mg_pool *pool;
    const mg_kernels *k;
} mg_compute;

/* x: [n_tok, w->cols] contiguous; y: [n_tok, w->rows] contiguous. */
void mg_linear(const mg_compute *c, const mg_matrix *w, const float *x, int64_t n_tok, float *y);

/* Several matrices reading the same input, in one pool dispatch (e.g. q, k, v or gate, up).
 * ys[i] is [n_tok, ws[i]->rows]. */
void mg_linear_multi(const mg_compute *c, int n, const mg_matrix *const *ws, const float *x,
                     int64_t n_tok, float *const *ys);

#endif
