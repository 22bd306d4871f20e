/* A persistent pool of worker threads.  mg_pool_run() hands one task to every thread
 * (the caller is worker 0) and returns when all are done.  Idle workers spin briefly, then
 * sleep on a condition variable, so a busy neighbour process does not starve decode. */
#ifndef MG_THREADPOOL_H
#define MG_THREADPOOL_H

#include <stdint.h>
#include "status.h"

typedef struct mg_pool mg_pool;
typedef void (*mg_pool_task)(void *ctx, int worker, int n_workers);

/* n_threads counts the caller; n_threads <= 0 means all online cores. */
mg_pool *mg_pool_create(int n_threads, mg_error *err);
void mg_pool_destroy(mg_pool *pool);
int mg_pool_threads(const mg_pool *pool);
void mg_pool_run(mg_pool *pool, mg_pool_task task, void *ctx);

/* Even split of [0, n) for worker w of nw, in units of `align` (the last part takes the rest). */
void mg_split_range(int64_t n, int64_t align, int w, int nw, int64_t *begin, int64_t *end);

#endif
