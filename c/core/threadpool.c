/* A persistent spin-then-sleep thread pool.
 *
 * A run has n_threads shares, numbered 0 .. n_threads-1 (the `worker` argument of the task).
 * The caller always runs share 0; shares 1.. are claimed from a counter by whoever gets there
 * first, the caller included once its own share is done.  So a worker that a busy neighbour
 * process has descheduled (or that is still waking up) never holds the run up: the caller runs
 * its share instead.  Every share still runs exactly once, on exactly one thread.
 *
 * Hand-off protocol:
 *   caller: writes task/ctx, sets `pending` = n_threads - 1, then publishes a new generation in
 *           `state` (seq_cst) with the claim counter reset to 1; wakes sleepers only if
 *           `n_sleeping` says there are any; runs share 0; claims and runs leftover shares;
 *           waits for `pending` to reach 0 (spin, then sleep on done_cv).
 *   worker: waits for the generation in `state` to move past the one it last saw (spin, then
 *           sleep on wake_cv), then claims shares (CAS on `state`, which fails once the
 *           generation moved on) and runs them; each finished share decrements `pending`
 *           (release); the last one wakes the caller if it went to sleep.
 * task/ctx are read only after a successful claim: the caller cannot finish the run, and so
 * cannot overwrite them, until that share is done.  When everybody is hot, a run costs a few
 * cache-line transfers and no syscalls.  The sleep decisions are Dekker-style (each side
 * publishes its own flag, then reads the other's, both seq_cst), so a wake-up is never lost.
 *
 * Spinning is bounded by wall time (SPIN_NS), not by an iteration count, because the cost of
 * a pause instruction differs by an order of magnitude between CPUs.  A spinner that notices it
 * was descheduled (a long gap between two clock reads) stops spinning at once: the core is
 * contended, and a sleeper woken by a futex gets the CPU back sooner than a preempted spinner,
 * while spinning on would take time from the threads doing the work. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "core/threadpool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__) || defined(__arm__)
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() ((void)0)
#endif

/* How long an idle worker (or the waiting caller) spins before sleeping.  Decode issues a run
 * every few tens of microseconds, so workers stay hot across a token; an idle server sleeps
 * after this long.  Short enough that a busy neighbour process gets the core back quickly. */
enum { SPIN_NS = 100 * 1000, PREEMPTED_NS = 30 * 1000, SPINS_PER_CLOCK_READ = 64 };
enum { MAX_THREADS = 1024, SHARE_BITS = 16 };
#define SHARE_MASK ((uint64_t)(1u << SHARE_BITS) - 1)

struct mg_pool {
    /* generation << SHARE_BITS | next unclaimed share.  The caller sets it once per run;
     * claimers increment the share part. */
    _Alignas(64) _Atomic uint64_t state;
    mg_pool_task task; /* published by the release in the state store */
    void *ctx;
    _Atomic int stop;
    /* Written once per share, by whichever thread ran it. */
    _Alignas(64) _Atomic int pending; /* shares 1.. not finished yet */
    /* Sleep bookkeeping: touched only on the slow paths. */
    _Alignas(64) _Atomic int n_sleeping;   /* workers inside (or entering) wake_cv waits */
    _Atomic int caller_sleeping;           /* the caller is inside (or entering) a done_cv wait */
    _Atomic int busy;                      /* a run is in progress: nested calls go inline */
    pthread_mutex_t mu;
    pthread_cond_t wake_cv, done_cv;
    int n_threads;
    int n_started; /* worker threads actually created (n_threads - 1 on success) */
    pthread_t *threads;
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Bookkeeping of one bounded spin: call every SPINS_PER_CLOCK_READ iterations; returns 1 when
 * the spin should give up (budget spent, or this thread was preempted in between). */
typedef struct spin_clock {
    uint64_t deadline, last;
} spin_clock;

static int spin_should_stop(spin_clock *sc) {
    uint64_t t = now_ns();
    if (!sc->deadline) {
        sc->deadline = t + SPIN_NS;
        sc->last = t;
        return 0;
    }
    int preempted = t - sc->last > PREEMPTED_NS;
    sc->last = t;
    return preempted || t >= sc->deadline;
}

static uint64_t generation_of(uint64_t state) { return state >> SHARE_BITS; }

/* Spins until the generation differs from `seen` or the spin budget runs out. */
static uint64_t spin_for_generation(mg_pool *p, uint64_t seen) {
    spin_clock sc = {0, 0};
    for (unsigned i = 1;; i++) {
        uint64_t g = generation_of(atomic_load_explicit(&p->state, memory_order_acquire));
        if (g != seen) return g;
        CPU_RELAX();
        if (i % SPINS_PER_CLOCK_READ == 0 && spin_should_stop(&sc)) return g;
    }
}

/* Claims the next unrun share of generation `gen`; -1 when none is left or the run is over. */
static int claim_share(mg_pool *p, uint64_t gen) {
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        if (generation_of(s) != gen || (s & SHARE_MASK) >= (uint64_t)p->n_threads) return -1;
        if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return (int)(s & SHARE_MASK);
    }
}

/* Runs shares of generation `gen` until none is left. */
static void run_shares(mg_pool *p, uint64_t gen) {
    int share;
    while ((share = claim_share(p, gen)) >= 0) {
        p->task(p->ctx, share, p->n_threads);
        /* The last share out checks whether the caller went to sleep (seq_cst RMW, then load). */
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* Worker threads have no fixed share: they run whatever shares they claim. */
static void *worker_main(void *pool) {
    mg_pool *p = pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = spin_for_generation(p, seen);
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1); /* seq_cst: pairs with publish() */
            while ((g = generation_of(atomic_load(&p->state))) == seen)
                pthread_cond_wait(&p->wake_cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        run_shares(p, g);
    }
    return NULL;
}

/* Publishes the next generation with `first_share` as the next claimable share, and wakes
 * sleeping workers if there are any.  Only the caller (or destroy) writes the generation. */
static uint64_t publish(mg_pool *p, uint64_t first_share) {
    uint64_t gen = generation_of(atomic_load_explicit(&p->state, memory_order_relaxed)) + 1;
    atomic_store(&p->state, gen << SHARE_BITS | first_share); /* seq_cst: release + Dekker */
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake_cv);
        pthread_mutex_unlock(&p->mu);
    }
    return gen;
}

static void wait_for_shares(mg_pool *p) {
    spin_clock sc = {0, 0};
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) return;
        CPU_RELAX();
        if (i % SPINS_PER_CLOCK_READ == 0 && spin_should_stop(&sc)) break;
    }
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->caller_sleeping, 1); /* seq_cst: pairs with the last share's decrement */
    while (atomic_load(&p->pending) != 0) pthread_cond_wait(&p->done_cv, &p->mu);
    atomic_store(&p->caller_sleeping, 0);
    pthread_mutex_unlock(&p->mu);
}

/* Stops and joins the first n_started workers, then frees everything. */
static void pool_free(mg_pool *p) {
    if (p->n_started > 0) {
        atomic_store(&p->stop, 1);
        publish(p, SHARE_MASK); /* nothing claimable */
        for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    }
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->wake_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

mg_pool *mg_pool_create(int n_threads, mg_error *err) {
    if (n_threads <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online > 0 ? (int)(online < MAX_THREADS ? online : MAX_THREADS) : 1;
    }
    if (n_threads > MAX_THREADS) {
        mg_fail(err, "thread pool: %d threads requested, at most %d supported", n_threads, MAX_THREADS);
        return NULL;
    }
    void *mem = NULL;
    if (posix_memalign(&mem, 64, sizeof(mg_pool)) != 0) {
        mg_fail(err, "out of memory creating the thread pool");
        return NULL;
    }
    mg_pool *p = mem;
    memset(p, 0, sizeof *p);
    atomic_init(&p->state, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->busy, 0);
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    int n_workers = n_threads - 1;
    if (n_workers > 0) {
        p->threads = calloc((size_t)n_workers, sizeof *p->threads);
        if (!p->threads) {
            mg_fail(err, "out of memory creating the thread pool");
            pool_free(p);
            return NULL;
        }
    }
    for (int i = 0; i < n_workers; i++) {
        int rc = pthread_create(&p->threads[i], NULL, worker_main, p);
        if (rc != 0) {
            mg_fail(err, "thread pool: could not start worker %d of %d: %s", i + 1, n_workers,
                    strerror(rc));
            pool_free(p);
            return NULL;
        }
        p->n_started++;
    }
    return p;
}

void mg_pool_destroy(mg_pool *pool) {
    if (pool) pool_free(pool);
}

int mg_pool_threads(const mg_pool *pool) { return pool ? pool->n_threads : 1; }

void mg_pool_run(mg_pool *pool, mg_pool_task task, void *ctx) {
    /* No pool, a pool of one, or a nested/concurrent call (the workers are taken): run inline.
     * Tasks split their work by (worker, n_workers), so one worker simply does all of it. */
    if (!pool || pool->n_threads == 1 || atomic_exchange_explicit(&pool->busy, 1, memory_order_acquire)) {
        task(ctx, 0, 1);
        return;
    }
    pool->task = task;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    uint64_t gen = publish(pool, 1);
    task(ctx, 0, pool->n_threads);
    run_shares(pool, gen); /* shares no worker has picked up yet */
    wait_for_shares(pool);
    atomic_store_explicit(&pool->busy, 0, memory_order_release);
}

void mg_split_range(int64_t n, int64_t align, int w, int nw, int64_t *begin, int64_t *end) {
    if (n <= 0 || nw <= 0 || w < 0 || w >= nw) { *begin = *end = 0; return; } /* empty share */
    if (align < 1) align = 1;
    int64_t units = (n + align - 1) / align;
    int64_t b = units * w / nw, e = units * (w + 1) / nw;
    *begin = b * align < n ? b * align : n;
    *end = e * align < n ? e * align : n;
}
