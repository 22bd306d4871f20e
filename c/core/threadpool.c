/* Placeholder pool: runs every task on the caller.  The real spin-then-sleep pool replaces
 * this file; the interface (threadpool.h) stays. */
#include <stdlib.h>
#include <unistd.h>
#include "core/threadpool.h"

struct mg_pool {
    int n_threads;
};

mg_pool *mg_pool_create(int n_threads, mg_error *err) {
    mg_pool *p = calloc(1, sizeof *p);
    if (!p) { mg_fail(err, "out of memory creating the thread pool"); return NULL; }
    p->n_threads = 1;
    (void)n_threads;
    return p;
}

void mg_pool_destroy(mg_pool *pool) { free(pool); }

int mg_pool_threads(const mg_pool *pool) { return pool->n_threads; }

void mg_pool_run(mg_pool *pool, mg_pool_task task, void *ctx) { task(ctx, 0, 1); (void)pool; }

void mg_split_range(int64_t n, int64_t align, int w, int nw, int64_t *begin, int64_t *end) {
    if (align < 1) align = 1;
    int64_t units = (n + align - 1) / align;
    int64_t b = units * w / nw, e = units * (w + 1) / nw;
    *begin = b * align < n ? b * align : n;
    *end = e * align < n ? e * align : n;
}
