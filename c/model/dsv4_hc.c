/* mHC weights, Sinkhorn and stream mixing (see dsv4_hc.h).  Follows transformers'
 * DeepseekV4HyperConnection / DeepseekV4HyperHead operation by operation, in fp32. */
#include <math.h>
#include <string.h>
#include "model/dsv4_hc.h"

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

void dsv4_hc_mixes(const mg_compute *c, const dsv4_hc *hc, const dsv4_hc_dims *dm, const float *X,
                   int64_t m, float *xn, float *mixes) {
    const int64_t w = dm->n_hc * dm->d;
    for (int64_t t = 0; t < m; t++) c->k->rmsnorm(xn + t * w, X + t * w, NULL, w, dm->norm_eps);
    mg_linear(c, &hc->fn, xn, m, mixes);
}

void dsv4_hc_split(const dsv4_hc *hc, const dsv4_hc_dims *dm, const float *mixes, int64_t m,
                   float *pre, float *post, float *comb) {
    const int n = dm->n_hc, mix = (2 + n) * n;
    const float eps = dm->hc_eps;
    for (int64_t t = 0; t < m; t++) {
        const float *mx = mixes + t * mix;
        float *pr = pre + t * n, *po = post + t * n, *cb = comb + t * n * n;
        for (int j = 0; j < n; j++) {
            pr[j] = sigmoidf(mx[j] * hc->scale[0] + hc->base[j]) + eps;
            po[j] = 2.0f * sigmoidf(mx[n + j] * hc->scale[1] + hc->base[n + j]);
        }
        /* row softmax + eps */
        for (int j = 0; j < n; j++) {
            float *row = cb + j * n, top = -INFINITY, sum = 0.0f;
            for (int k = 0; k < n; k++) {
                row[k] = mx[2 * n + j * n + k] * hc->scale[2] + hc->base[2 * n + j * n + k];
                if (row[k] > top) top = row[k];
            }
            for (int k = 0; k < n; k++) { row[k] = expf(row[k] - top); sum += row[k]; }
            for (int k = 0; k < n; k++) row[k] = row[k] / sum + eps;
        }
        /* column normalise, then (iters - 1) x (row, column) */
        for (int it = 0; it < dm->sinkhorn_iters; it++) {
            if (it > 0) {
                for (int j = 0; j < n; j++) {
                    float sum = 0.0f;
                    for (int k = 0; k < n; k++) sum += cb[j * n + k];
                    for (int k = 0; k < n; k++) cb[j * n + k] /= sum + eps;
                }
            }
            for (int k = 0; k < n; k++) {
                float sum = 0.0f;
                for (int j = 0; j < n; j++) sum += cb[j * n + k];
                for (int j = 0; j < n; j++) cb[j * n + k] /= sum + eps;
            }
        }
    }
}

void dsv4_hc_head_pre(const dsv4_hc *hc, const dsv4_hc_dims *dm, const float *mixes, int64_t m, float *pre) {
    const int n = dm->n_hc;
    for (int64_t t = 0; t < m; t++)
        for (int j = 0; j < n; j++)
            pre[t * n + j] = sigmoidf(mixes[t * n + j] * hc->scale[0] + hc->base[j]) + dm->hc_eps;
}

void dsv4_hc_collapse(const dsv4_hc_dims *dm, const float *X, const float *pre, int64_t m, float *out) {
    const int n = dm->n_hc;
    const int64_t d = dm->d;
    for (int64_t t = 0; t < m; t++) {
        float *o = out + t * d;
        const float *x = X + t * n * d;
        const float *p = pre + t * n;
        for (int64_t i = 0; i < d; i++) {
            float acc = 0.0f;
            for (int j = 0; j < n; j++) acc += p[j] * x[j * d + i];
            o[i] = acc;
        }
    }
}

void dsv4_hc_expand(const dsv4_hc_dims *dm, float *X, const float *o, const float *post, const float *comb,
                    int64_t m, float *tmp) {
    const int n = dm->n_hc;
    const int64_t d = dm->d;
    for (int64_t t = 0; t < m; t++) {
        float *x = X + t * n * d;
        const float *ot = o + t * d, *po = post + t * n, *cb = comb + t * n * n;
        for (int k = 0; k < n; k++) {
            float *y = tmp + k * d;
            for (int64_t i = 0; i < d; i++) {
                float acc = 0.0f;
                for (int j = 0; j < n; j++) acc += cb[j * n + k] * x[j * d + i];
                y[i] = po[k] * ot[i] + acc;
            }
        }
        memcpy(x, tmp, sizeof(float) * (size_t)(n * d));
    }
}
