/* Threaded linear layers: output rows are split over the pool's workers. */
#include "core/linear.h"

typedef struct {
    const mg_kernels *k;
    int n;
    const mg_matrix *const *ws;
    const float *x;
    int64_t n_tok;
    float *const *ys;
    int64_t total_rows;
} linear_job;

/* Each worker takes an equal share of the concatenated rows of all matrices, so that q, k and v
 * (or gate and up) are balanced together in one dispatch. */
static void linear_task(void *ctx, int worker, int n_workers) {
    const linear_job *job = ctx;
    int64_t begin, end;
    mg_split_range(job->total_rows, 16, worker, n_workers, &begin, &end);
    int64_t base = 0;
    for (int i = 0; i < job->n && begin < end; i++) {
        const mg_matrix *w = job->ws[i];
        int64_t lo = begin > base ? begin - base : 0;
        int64_t hi = end - base < w->rows ? end - base : w->rows;
        if (lo < hi)
            job->k->linear[w->format](w, job->x, w->cols, job->n_tok, job->ys[i], w->rows, lo, hi);
        base += w->rows;
    }
}

void mg_linear_multi(const mg_compute *c, int n, const mg_matrix *const *ws, const float *x,
                     int64_t n_tok, float *const *ys) {
    linear_job job = {c->k, n, ws, x, n_tok, ys, 0};
    for (int i = 0; i < n; i++) job.total_rows += ws[i]->rows;
    mg_pool_run(c->pool, linear_task, &job);
}

void mg_linear(const mg_compute *c, const mg_matrix *w, const float *x, int64_t n_tok, float *y) {
    mg_linear_multi(c, 1, &w, x, n_tok, &y);
}
