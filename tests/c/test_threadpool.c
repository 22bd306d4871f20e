/* Thread pool tests: every worker runs exactly once per run, the caller sees the workers'
 * writes, rapid runs, the sleep/wake paths, nested and concurrent runs, create/destroy loops,
 * mg_split_range coverage, and that worker threads (not only the caller, which may run shares
 * no worker has claimed yet) take part.  Also prints the measured per-run hand-off cost (not asserted:
 * it depends on the machine and its load).  Meant to pass under -fsanitize=thread and =address. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "core/threadpool.h"

#include "check.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static mg_pool *make_pool(int n) {
    mg_error err = {{0}};
    mg_pool *p = mg_pool_create(n, &err);
    if (!p) fprintf(stderr, "mg_pool_create(%d): %s\n", n, err.msg);
    return p;
}

/* ---- every worker exactly once, with the right n_workers ------------------------------------ */

typedef struct {
    _Atomic int calls[64];
    _Atomic int bad_nw;
    int expect_nw;
} count_ctx;

static void count_task(void *ctx_, int worker, int n_workers) {
    count_ctx *c = ctx_;
    if (n_workers != c->expect_nw || worker < 0 || worker >= n_workers) atomic_fetch_add(&c->bad_nw, 1);
    else atomic_fetch_add(&c->calls[worker], 1);
}

static void test_each_worker_once(int n_threads, int runs) {
    mg_pool *p = make_pool(n_threads);
    CHECK(p != NULL, "create %d", n_threads);
    if (!p) return;
    CHECK(mg_pool_threads(p) == n_threads, "threads %d != %d", mg_pool_threads(p), n_threads);
    count_ctx c;
    memset(&c, 0, sizeof c);
    c.expect_nw = n_threads;
    int wrong = 0;
    for (int r = 0; r < runs; r++) {
        mg_pool_run(p, count_task, &c);
        /* Right after each run (not only at the end): the run must not return early. */
        for (int w = 0; w < n_threads; w++)
            if (atomic_load(&c.calls[w]) != r + 1) wrong++;
    }
    CHECK(wrong == 0, "pool %d: %d (run, worker) counts off after returning", n_threads, wrong);
    CHECK(atomic_load(&c.bad_nw) == 0, "pool %d: task saw a wrong (worker, n_workers)", n_threads);
    mg_pool_destroy(p);
}

/* ---- worker threads really take part: share 0 (always the caller) holds until every other
 * share has started, so those shares must be running on other threads ------------------------ */

typedef struct {
    _Atomic int started;
    _Atomic int timed_out;
    _Atomic int on_caller_thread; /* shares other than 0 run by the caller: must stay 0 */
    pthread_t caller;
} barrier_ctx;

static void barrier_task(void *ctx_, int worker, int n_workers) {
    barrier_ctx *c = ctx_;
    if (worker != 0) {
        if (pthread_equal(pthread_self(), c->caller)) atomic_fetch_add(&c->on_caller_thread, 1);
        atomic_fetch_add(&c->started, 1);
        return;
    }
    if (!pthread_equal(pthread_self(), c->caller)) atomic_fetch_add(&c->on_caller_thread, 1000);
    double deadline = now_s() + 5.0;
    while (atomic_load(&c->started) < n_workers - 1)
        if (now_s() > deadline) { atomic_fetch_add(&c->timed_out, 1); return; }
}

static void test_workers_participate(int n_threads, int runs) {
    mg_pool *p = make_pool(n_threads);
    if (!p) { CHECK(0, "create"); return; }
    int bad = 0;
    for (int r = 0; r < runs && !bad; r++) {
        barrier_ctx c;
        memset(&c, 0, sizeof c);
        c.caller = pthread_self();
        if (r % 100 == 99) sleep_us(1000); /* now and then from sleeping workers */
        mg_pool_run(p, barrier_task, &c);
        if (atomic_load(&c.timed_out) || atomic_load(&c.on_caller_thread) ||
            atomic_load(&c.started) != n_threads - 1)
            bad++;
    }
    CHECK(bad == 0, "pool %d: shares 1.. were not run by the worker threads", n_threads);
    mg_pool_destroy(p);
}

/* ---- plain (non-atomic) writes by workers are visible to the caller -------------------------- */

typedef struct {
    int64_t n;
    int64_t *data;
    int64_t round;
} fill_ctx;

static void fill_task(void *ctx_, int worker, int n_workers) {
    fill_ctx *c = ctx_;
    int64_t b, e;
    mg_split_range(c->n, 8, worker, n_workers, &b, &e);
    for (int64_t i = b; i < e; i++) c->data[i] = i * 3 + c->round;
}

static void test_visibility(int n_threads) {
    mg_pool *p = make_pool(n_threads);
    if (!p) { CHECK(0, "create"); return; }
    fill_ctx c = {1003, calloc(1003, sizeof(int64_t)), 0};
    int bad = 0;
    for (int r = 0; r < 300; r++) {
        c.round = r;
        mg_pool_run(p, fill_task, &c);
        for (int64_t i = 0; i < c.n; i++)
            if (c.data[i] != i * 3 + r) bad++;
    }
    CHECK(bad == 0, "pool %d: %d stale values after run", n_threads, bad);
    free(c.data);
    mg_pool_destroy(p);
}

/* ---- sleep paths: workers asleep when a run arrives; caller asleep while a worker is slow ---- */

typedef struct {
    _Atomic int sum;
    int slow_worker; /* this worker sleeps first (-1: none) */
    long slow_us;
} slow_ctx;

static void slow_task(void *ctx_, int worker, int n_workers) {
    slow_ctx *c = ctx_;
    (void)n_workers;
    if (worker == c->slow_worker) sleep_us(c->slow_us);
    atomic_fetch_add(&c->sum, worker + 1);
}

static void test_sleep_paths(int n_threads) {
    mg_pool *p = make_pool(n_threads);
    if (!p) { CHECK(0, "create"); return; }
    int expect = n_threads * (n_threads + 1) / 2, bad = 0;
    for (int r = 0; r < 20; r++) {
        sleep_us(2000); /* well past the spin budget: every worker is asleep on the condvar */
        slow_ctx c = {0, -1, 0};
        mg_pool_run(p, slow_task, &c);
        if (atomic_load(&c.sum) != expect) bad++;
    }
    CHECK(bad == 0, "pool %d: %d runs from sleeping workers lost work", n_threads, bad);
    bad = 0;
    for (int r = 0; r < 20; r++) {
        slow_ctx c = {0, 1 + r % (n_threads - 1), 1500}; /* caller outwaits its spin and sleeps */
        mg_pool_run(p, slow_task, &c);
        if (atomic_load(&c.sum) != expect) bad++;
    }
    CHECK(bad == 0, "pool %d: %d runs returned before a slow worker finished", n_threads, bad);
    mg_pool_destroy(p);
}

/* ---- a task that itself calls mg_pool_run on the same pool runs the inner task inline ------- */

typedef struct {
    mg_pool *pool;
    _Atomic int outer, inner, inner_bad;
} nest_ctx;

static void nest_inner(void *ctx_, int worker, int n_workers) {
    nest_ctx *c = ctx_;
    if (worker != 0 || n_workers != 1) atomic_fetch_add(&c->inner_bad, 1);
    atomic_fetch_add(&c->inner, 1);
}

static void nest_outer(void *ctx_, int worker, int n_workers) {
    nest_ctx *c = ctx_;
    (void)worker;
    (void)n_workers;
    atomic_fetch_add(&c->outer, 1);
    mg_pool_run(c->pool, nest_inner, c);
}

static void test_nested(void) {
    mg_pool *p = make_pool(3);
    if (!p) { CHECK(0, "create"); return; }
    nest_ctx c;
    memset(&c, 0, sizeof c);
    c.pool = p;
    for (int r = 0; r < 50; r++) mg_pool_run(p, nest_outer, &c);
    CHECK(atomic_load(&c.outer) == 150 && atomic_load(&c.inner) == 150 && atomic_load(&c.inner_bad) == 0,
          "nested runs: outer %d inner %d bad %d", atomic_load(&c.outer), atomic_load(&c.inner),
          atomic_load(&c.inner_bad));
    mg_pool_destroy(p);
}

/* ---- two threads calling mg_pool_run on one pool at once: both complete their work ---------- */

typedef struct {
    mg_pool *pool;
    int runs;
    int bad;
} caller_arg;

static void *concurrent_caller(void *arg_) {
    caller_arg *a = arg_;
    int64_t data[257];
    for (int r = 0; r < a->runs; r++) {
        fill_ctx c = {257, data, r};
        mg_pool_run(a->pool, fill_task, &c);
        for (int64_t i = 0; i < 257; i++)
            if (data[i] != i * 3 + r) a->bad++;
    }
    return NULL;
}

static void test_concurrent_callers(void) {
    mg_pool *p = make_pool(3);
    if (!p) { CHECK(0, "create"); return; }
    caller_arg a[2] = {{p, 500, 0}, {p, 500, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, concurrent_caller, &a[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECK(a[0].bad == 0 && a[1].bad == 0, "concurrent callers: %d / %d wrong values", a[0].bad, a[1].bad);
    mg_pool_destroy(p);
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

static void test_create_destroy_loops(void) {
    int failures = 0;
    for (int i = 0; i < 100; i++) { /* destroy before workers ever ran a task */
        mg_pool *p = make_pool(2 + i % 3);
        if (!p) { failures++; continue; }
        mg_pool_destroy(p);
    }
    for (int i = 0; i < 100; i++) { /* run once, then destroy while workers are still spinning */
        mg_pool *p = make_pool(2 + i % 3);
        if (!p) { failures++; continue; }
        count_ctx c;
        memset(&c, 0, sizeof c);
        c.expect_nw = 2 + i % 3;
        mg_pool_run(p, count_task, &c);
        for (int w = 0; w < c.expect_nw; w++)
            if (atomic_load(&c.calls[w]) != 1) failures++;
        mg_pool_destroy(p);
    }
    CHECK(failures == 0, "create/destroy loops: %d failures", failures);
    mg_pool_destroy(NULL); /* allowed, like free(NULL) */
    CHECK(1, "destroy(NULL)");
}

static void test_pool_of_one_and_default(void) {
    mg_pool *p = make_pool(1);
    CHECK(p && mg_pool_threads(p) == 1, "pool of 1");
    if (p) {
        count_ctx c;
        memset(&c, 0, sizeof c);
        c.expect_nw = 1;
        for (int r = 0; r < 1000; r++) mg_pool_run(p, count_task, &c);
        CHECK(atomic_load(&c.calls[0]) == 1000 && atomic_load(&c.bad_nw) == 0, "pool of 1 runs inline");
        mg_pool_destroy(p);
    }
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    for (int n = 0; n >= -1; n--) {
        mg_pool *d = make_pool(n);
        CHECK(d && mg_pool_threads(d) == (online > 0 ? online : 1), "pool(%d) has %d threads, %ld cores",
              n, d ? mg_pool_threads(d) : -1, online);
        if (d) {
            count_ctx c;
            memset(&c, 0, sizeof c);
            c.expect_nw = mg_pool_threads(d);
            mg_pool_run(d, count_task, &c);
            int ok = atomic_load(&c.bad_nw) == 0;
            for (int w = 0; w < c.expect_nw && w < 64; w++) ok &= atomic_load(&c.calls[w]) == 1;
            CHECK(ok, "default pool runs every worker once");
            mg_pool_destroy(d);
        }
    }
    mg_error err = {{0}};
    CHECK(mg_pool_create(1 << 20, &err) == NULL && err.msg[0], "absurd thread count is refused");
}

/* ---- mg_split_range ------------------------------------------------------------------------- */

static void test_split_range(void) {
    static const int64_t aligns[] = {1, 2, 3, 8, 16, 32, 128};
    int bad = 0, cases = 0;
    unsigned char *seen = malloc(5000);
    for (int64_t n = 0; n <= 5000; n += (n < 300 ? 1 : 97)) {
        for (size_t a = 0; a < sizeof aligns / sizeof *aligns; a++) {
            for (int nw = 1; nw <= 13; nw++) {
                memset(seen, 0, (size_t)n);
                int64_t prev_end = 0;
                for (int w = 0; w < nw; w++) {
                    int64_t b, e;
                    mg_split_range(n, aligns[a], w, nw, &b, &e);
                    /* contiguous, in order, aligned starts, within [0, n] */
                    if (b != prev_end || e < b || e > n || (b % aligns[a] && b != n)) bad++;
                    for (int64_t i = b; i < e && i < n && i >= 0; i++) seen[i]++;
                    prev_end = e;
                }
                if (prev_end != n) bad++;
                for (int64_t i = 0; i < n; i++)
                    if (seen[i] != 1) { bad++; break; }
                cases++;
            }
        }
    }
    free(seen);
    CHECK(bad == 0, "split_range: %d bad of %d cases", bad, cases);
    /* Balance: with align 1 no share exceeds another by more than one element. */
    int64_t b0, e0, b1, e1;
    mg_split_range(1000, 1, 0, 7, &b0, &e0);
    mg_split_range(1000, 1, 6, 7, &b1, &e1);
    CHECK((e0 - b0) - (e1 - b1) <= 1 && (e1 - b1) - (e0 - b0) <= 1, "split_range balance");
    int64_t b, e;
    mg_split_range(100, 16, 5, 4, &b, &e); /* worker out of range: empty */
    CHECK(b == e, "split_range out-of-range worker is empty");
}

/* ---- hand-off cost (printed, not asserted) -------------------------------------------------- */

static void noop_task(void *ctx, int worker, int n_workers) {
    (void)ctx;
    (void)worker;
    (void)n_workers;
}

static void report_overhead(int n_threads) {
    mg_pool *p = make_pool(n_threads);
    if (!p) return;
    for (int r = 0; r < 1000; r++) mg_pool_run(p, noop_task, NULL); /* warm up */
    int runs = 10000;
    double t0 = now_s();
    for (int r = 0; r < runs; r++) mg_pool_run(p, noop_task, NULL);
    double noop = (now_s() - t0) / runs;
    /* Round trip with every worker forced to take part (share 0 waits for the others). */
    runs = 2000;
    t0 = now_s();
    for (int r = 0; r < runs; r++) {
        barrier_ctx c;
        memset(&c, 0, sizeof c);
        c.caller = pthread_self();
        mg_pool_run(p, barrier_task, &c);
    }
    double all = (now_s() - t0) / runs;
    int cold_runs = 20;
    double cold = 0;
    for (int r = 0; r < cold_runs; r++) {
        sleep_us(1000);
        barrier_ctx c;
        memset(&c, 0, sizeof c);
        c.caller = pthread_self();
        double t1 = now_s();
        mg_pool_run(p, barrier_task, &c);
        cold += now_s() - t1;
    }
    printf("pool of %d: empty run %.2f us, hot hand-off to all workers %.2f us, "
           "wake from sleep %.1f us\n", n_threads, noop * 1e6, all * 1e6, cold / cold_runs * 1e6);
    mg_pool_destroy(p);
}

int main(void) {
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    test_pool_of_one_and_default();
    for (int n = 2; n <= 5; n++) test_each_worker_once(n, 2000);
    test_each_worker_once(cores + 1 < 64 ? cores + 1 : 64, 10000); /* 10k rapid runs */
    test_each_worker_once(16, 200);                                /* oversubscribed */
    for (int n = 2; n <= 4; n++) test_workers_participate(n, 500);
    test_visibility(2);
    test_visibility(4);
    test_sleep_paths(2);
    test_sleep_paths(4);
    test_nested();
    test_concurrent_callers();
    test_create_destroy_loops();
    test_split_range();
    report_overhead(2);
    if (cores > 2) report_overhead(cores);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
