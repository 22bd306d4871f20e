/* I/O thread pool: one mutex guards the job queues, per-group counters and statistics; the
 * reads themselves run unlocked.  The lookup path of the cache never takes this lock. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "model/expert_io.h"

#include "core/clock.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { GROUP_IDLE = 0, GROUP_RUNNING = 1, GROUP_DONE = 2 };

struct mg_io_pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    pthread_t *threads;
    int n_threads, started, stop;
    mg_io_job *queue[2]; /* rings: [0] demand reads, [1] background (mg_io_job.background) */
    int qcap, qhead[2], qcount[2];
    int running_demand;  /* demand reads taken by a thread and not finished */
    int n_groups;
    int *pending;           /* [n_groups] reads not finished */
    unsigned char *state;   /* [n_groups] GROUP_* */
    char **msg;             /* [n_groups] first failure, malloc'd */
    int *done;              /* ring of completed groups, capacity n_groups */
    int dhead, dcount;
    int outstanding, running;
    double busy_since, demand_since; /* when running, running_demand last became non-zero */
    mg_io_stats st;
    /* The disk model (mg_io_pool_emulate_disk): one queue served at disk_bps in the order the
     * threads take reads; disk_free_at is when it has served every read handed out so far. */
    double disk_bps, disk_free_at;
};


/* Reads one job; returns bytes read or -1 with msg set.  *direct_used reports the mode of
 * the last read call. */
static int64_t do_read(const mg_io_job *j, int *direct_used, char *msg, size_t cap) {
    int direct = j->fd_direct >= 0 && (!j->direct_ok || atomic_load(j->direct_ok));
    uint64_t got = 0;
    unsigned char *dst = j->dst;
    while (got < j->len) {
        size_t chunk = j->len - got > ((uint64_t)1 << 30) ? (size_t)1 << 30 : (size_t)(j->len - got);
        ssize_t r = pread(direct ? j->fd_direct : j->fd_buffered, dst + got, chunk, (off_t)(j->off + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            if (direct && errno == EINVAL) {
                /* the filesystem (or this range) refuses direct I/O: buffered from now on */
                direct = 0;
                if (j->direct_ok) atomic_store(j->direct_ok, 0);
                continue;
            }
            snprintf(msg, cap, "reading '%s' from %s at offset %llu (%llu bytes): %s", j->what, j->path,
                     (unsigned long long)(j->off + got), (unsigned long long)(j->len - got), strerror(errno));
            return -1;
        }
        if (r == 0) {
            if (got >= j->need) break; /* the aligned tail past the end of the file */
            snprintf(msg, cap, "reading '%s' from %s: the file ends at byte %llu but the tensor's "
                     "data reaches byte %llu (was the file truncated or replaced after it was opened?)",
                     j->what, j->path, (unsigned long long)(j->off + got),
                     (unsigned long long)(j->off + j->need));
            return -1;
        }
        got += (uint64_t)r;
        /* a short direct read leaves an unaligned position: finish this job buffered */
        if (direct && ((uint64_t)r % MG_IO_ALIGN) && got < j->len) direct = 0;
    }
    *direct_used = direct;
    return (int64_t)got;
}

/* Sleeps until the monotonic clock (mg_wall_seconds) reads `until`. */
static void sleep_until(double until) {
    struct timespec ts;
    ts.tv_sec = (time_t)floor(until);
    ts.tv_nsec = (long)((until - floor(until)) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

/* The queue the next read comes from (mu held): demand reads first; a background read starts
 * only when no demand read is queued or running, so it never shares the disk with the reads a
 * fetch is waiting for (at most the reads already started hold a demand read back).  -1: none
 * may start now. */
static int next_queue(const mg_io_pool *p) {
    if (p->qcount[0]) return 0;
    return p->qcount[1] && !p->running_demand ? 1 : -1;
}

static void *worker(void *arg) {
    mg_io_pool *p = arg;
    char msg[768];
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int q;
        while ((q = next_queue(p)) < 0 && !(p->stop && !p->qcount[1])) pthread_cond_wait(&p->work_cv, &p->mu);
        if (q < 0) break; /* stopping and drained (a queued demand read is always taken first) */
        mg_io_job j = p->queue[q][p->qhead[q]];
        p->qhead[q] = (p->qhead[q] + 1) % p->qcap;
        p->qcount[q]--;
        if (q == 0 && p->running_demand++ == 0) p->demand_since = mg_wall_seconds();
        if (p->running++ == 0) p->busy_since = mg_wall_seconds();
        /* With the disk model on, the read is handed to the modelled disk now: it starts when
         * the disk has served the reads taken before it and lasts len / rate; the bytes come
         * back from the file as usual and are held until then (the same order as a real
         * single-queue disk, whatever the threads' interleaving). */
        double due = 0.0;
        if (p->disk_bps > 0) {
            const double now = mg_wall_seconds();
            due = (p->disk_free_at > now ? p->disk_free_at : now) + (double)j.len / p->disk_bps;
            p->disk_free_at = due;
        }
        pthread_mutex_unlock(&p->mu);

        int direct = 0;
        msg[0] = 0;
        int64_t got = do_read(&j, &direct, msg, sizeof msg);
        if (due > 0) sleep_until(due);

        pthread_mutex_lock(&p->mu);
        if (--p->running == 0) p->st.busy_seconds += mg_wall_seconds() - p->busy_since;
        if (q == 0 && --p->running_demand == 0) {
            p->st.demand_busy_seconds += mg_wall_seconds() - p->demand_since;
            if (p->qcount[1]) pthread_cond_broadcast(&p->work_cv);
        }
        if (got >= 0) {
            p->st.bytes_read += (uint64_t)got;
            if (direct) p->st.direct_reads++;
            else p->st.buffered_reads++;
        } else if (!p->msg[j.group]) {
            p->msg[j.group] = strdup(msg[0] ? msg : "read failed");
            if (!p->msg[j.group]) p->msg[j.group] = (char *)""; /* marks failure without text */
        }
        if (--p->pending[j.group] == 0) {
            p->state[j.group] = GROUP_DONE;
            p->done[(p->dhead + p->dcount) % p->n_groups] = j.group;
            p->dcount++;
            pthread_cond_broadcast(&p->done_cv);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

mg_io_pool *mg_io_pool_create(int n_threads, int n_groups, int max_jobs, mg_error *err) {
    if (n_threads <= 0 || n_threads > 64 || n_groups <= 0 || max_jobs <= 0) {
        mg_fail(err, "expert I/O: invalid pool size (%d threads, %d groups, %d jobs)", n_threads,
                n_groups, max_jobs);
        return NULL;
    }
    mg_io_pool *p = calloc(1, sizeof *p);
    if (!p) {
        mg_fail(err, "expert I/O: out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->n_groups = n_groups;
    p->qcap = max_jobs;
    p->queue[0] = calloc((size_t)max_jobs, sizeof *p->queue[0]);
    p->queue[1] = calloc((size_t)max_jobs, sizeof *p->queue[1]);
    p->pending = calloc((size_t)n_groups, sizeof *p->pending);
    p->state = calloc((size_t)n_groups, 1);
    p->msg = calloc((size_t)n_groups, sizeof *p->msg);
    p->done = calloc((size_t)n_groups, sizeof *p->done);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->queue[0] || !p->queue[1] || !p->pending || !p->state || !p->msg || !p->done || !p->threads) {
        mg_io_pool_free(p);
        mg_fail(err, "expert I/O: out of memory");
        return NULL;
    }
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
            mg_io_pool_free(p);
            mg_fail(err, "expert I/O: cannot start I/O thread %d: %s", i, strerror(errno));
            return NULL;
        }
        p->started++;
    }
    p->n_threads = n_threads;
    return p;
}

void mg_io_pool_free(mg_io_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
    if (p->msg)
        for (int g = 0; g < p->n_groups; g++)
            if (p->msg[g] && p->msg[g][0]) free(p->msg[g]);
    free(p->msg);
    free(p->queue[0]);
    free(p->queue[1]);
    free(p->pending);
    free(p->state);
    free(p->done);
    free(p->threads);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int mg_io_pool_submit(mg_io_pool *p, const mg_io_job *jobs, int n, mg_error *err) {
    if (n <= 0) return 0;
    pthread_mutex_lock(&p->mu);
    int rc = 0, want[2] = {0, 0};
    for (int i = 0; i < n; i++) want[jobs[i].background != 0]++;
    for (int q = 0; q < 2 && !rc; q++)
        if (want[q] > p->qcap - p->qcount[q])
            rc = mg_fail(err, "expert I/O: %d reads do not fit the queue (%d free)", want[q], p->qcap - p->qcount[q]);
    /* validate everything before changing anything: every group must be idle */
    for (int i = 0; i < n && !rc; i++) {
        int g = jobs[i].group;
        if (g < 0 || g >= p->n_groups) rc = mg_fail(err, "expert I/O: group %d out of range", g);
        else if (p->state[g] != GROUP_IDLE) rc = mg_fail(err, "expert I/O: group %d is still in use", g);
    }
    if (!rc) {
        for (int i = 0; i < n; i++) {
            int g = jobs[i].group, q = jobs[i].background != 0;
            if (p->pending[g]++ == 0) p->outstanding++;
            p->queue[q][(p->qhead[q] + p->qcount[q]++) % p->qcap] = jobs[i];
        }
        for (int i = 0; i < n; i++) p->state[jobs[i].group] = GROUP_RUNNING;
        pthread_cond_broadcast(&p->work_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Hands out the oldest completed group (mu held, dcount > 0). */
static int take_done(mg_io_pool *p, int *failed, char *msg, size_t msg_cap) {
    int g = p->done[p->dhead];
    p->dhead = (p->dhead + 1) % p->n_groups;
    p->dcount--;
    p->outstanding--;
    p->state[g] = GROUP_IDLE;
    *failed = p->msg[g] != NULL;
    if (msg && msg_cap) {
        snprintf(msg, msg_cap, "%s", p->msg[g] ? p->msg[g] : "");
    }
    if (p->msg[g] && p->msg[g][0]) free(p->msg[g]);
    p->msg[g] = NULL;
    return g;
}

int mg_io_pool_wait_any(mg_io_pool *p, int *failed, char *msg, size_t msg_cap) {
    pthread_mutex_lock(&p->mu);
    if (p->outstanding == 0) {
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    while (p->dcount == 0) pthread_cond_wait(&p->done_cv, &p->mu);
    int g = take_done(p, failed, msg, msg_cap);
    pthread_mutex_unlock(&p->mu);
    return g;
}

int mg_io_pool_try_any(mg_io_pool *p, int *failed, char *msg, size_t msg_cap) {
    pthread_mutex_lock(&p->mu);
    int g = p->dcount ? take_done(p, failed, msg, msg_cap) : p->outstanding ? -2 : -1;
    pthread_mutex_unlock(&p->mu);
    return g;
}

int mg_io_pool_cancel(mg_io_pool *p, int group) {
    if (group < 0 || group >= p->n_groups) return 0;
    pthread_mutex_lock(&p->mu);
    int queued = 0;
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < p->qcount[q]; i++) queued += p->queue[q][(p->qhead[q] + i) % p->qcap].group == group;
    int cancel = p->state[group] == GROUP_RUNNING && queued > 0 && queued == p->pending[group];
    if (cancel) { /* close the rings over its reads, keeping the others' order */
        for (int q = 0; q < 2; q++) {
            int kept = 0;
            for (int i = 0; i < p->qcount[q]; i++) {
                mg_io_job j = p->queue[q][(p->qhead[q] + i) % p->qcap];
                if (j.group != group) p->queue[q][(p->qhead[q] + kept++) % p->qcap] = j;
            }
            p->qcount[q] = kept;
        }
        p->pending[group] = 0;
        p->state[group] = GROUP_IDLE;
        p->outstanding--;
    }
    pthread_mutex_unlock(&p->mu);
    return cancel;
}

int mg_io_pool_idle(mg_io_pool *p) {
    pthread_mutex_lock(&p->mu);
    int idle = p->qcount[0] == 0 && p->qcount[1] == 0 && p->running == 0;
    pthread_mutex_unlock(&p->mu);
    return idle;
}

int mg_io_pool_outstanding(mg_io_pool *p) {
    pthread_mutex_lock(&p->mu);
    int n = p->outstanding;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void mg_io_pool_emulate_disk(mg_io_pool *p, double bytes_per_second) {
    pthread_mutex_lock(&p->mu);
    p->disk_bps = bytes_per_second > 0 && isfinite(bytes_per_second) ? bytes_per_second : 0.0;
    p->disk_free_at = 0.0;
    pthread_mutex_unlock(&p->mu);
}

double mg_io_pool_emulated_disk(mg_io_pool *p) {
    pthread_mutex_lock(&p->mu);
    double bps = p->disk_bps;
    pthread_mutex_unlock(&p->mu);
    return bps;
}

mg_io_stats mg_io_pool_stats(mg_io_pool *p) {
    pthread_mutex_lock(&p->mu);
    mg_io_stats s = p->st;
    const double now = mg_wall_seconds();
    if (p->running) s.busy_seconds += now - p->busy_since;
    if (p->running_demand) s.demand_busy_seconds += now - p->demand_since;
    pthread_mutex_unlock(&p->mu);
    return s;
}
