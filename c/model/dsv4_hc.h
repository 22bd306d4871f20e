/* DeepSeek-V4 manifold-constrained hyper-connections (mHC): the residual of a token is n_hc
 * streams of d values.  Each sub-block (attention, MoE) reads a weighted collapse of the
 * streams and writes back through a post weight plus a Sinkhorn-balanced stream mix; the model
 * ends with a collapse of its own (hc_head).  Spec: dsv4-arch.md §4.2, §4.7. */
#ifndef MG_DSV4_HC_H
#define MG_DSV4_HC_H

#include <stdint.h>
#include "core/linear.h"

typedef struct dsv4_hc {
    mg_matrix fn;   /* [mix, n_hc * d] F32; mix = (2 + n_hc) * n_hc (sub-block) or n_hc (head) */
    float *base;    /* [mix] */
    float *scale;   /* [3] (sub-block) or [1] (head) */
} dsv4_hc;

typedef struct dsv4_hc_dims {
    int n_hc, sinkhorn_iters;
    int64_t d;
    float norm_eps, hc_eps;
} dsv4_hc_dims;

/* mixes[t] = fn . (X[t] / rms(X[t])) for m tokens; X rows are n_hc*d floats; xn >= m*n_hc*d. */
void dsv4_hc_mixes(const mg_compute *c, const dsv4_hc *hc, const dsv4_hc_dims *dm, const float *X,
                   int64_t m, float *xn, float *mixes);

/* From a sub-block's mixes [m, mix]: pre [m, n_hc], post [m, n_hc], comb [m, n_hc * n_hc]
 * (row j = input stream, column k = output stream), Sinkhorn-normalised. */
void dsv4_hc_split(const dsv4_hc *hc, const dsv4_hc_dims *dm, const float *mixes, int64_t m,
                   float *pre, float *post, float *comb);

/* The head's pre weights [m, n_hc] from its mixes [m, n_hc]. */
void dsv4_hc_head_pre(const dsv4_hc *hc, const dsv4_hc_dims *dm, const float *mixes, int64_t m, float *pre);

/* out[t] = sum_j pre[t, j] * X[t, j] (the block input). */
void dsv4_hc_collapse(const dsv4_hc_dims *dm, const float *X, const float *pre, int64_t m, float *out);

/* X[t, k] = post[t, k] * o[t] + sum_j comb[t, j, k] * X[t, j], in place; tmp >= n_hc*d floats. */
void dsv4_hc_expand(const dsv4_hc_dims *dm, float *X, const float *o, const float *post, const float *comb,
                    int64_t m, float *tmp);

#endif
