/* A small pool of I/O threads that read file ranges into memory, for the expert cache.
 *
 * Reads belong to groups (a cache slot: one expert's extents).  mg_io_pool_wait_any returns
 * groups as their last read completes, so the caller can compute on experts in arrival order.
 * Two classes of reads, each served in submission order: demand reads (a fetch waits for them)
 * and background reads (read-ahead), which a thread starts only while no demand read is
 * queued or running.
 * A read first tries the O_DIRECT descriptor (offset, length and destination 4 KiB-aligned);
 * when the filesystem refuses (EINVAL) it falls back to the buffered descriptor and stops
 * trying O_DIRECT on that file.  Short reads at end of file are fine as long as the `need`
 * bytes arrived; otherwise the group fails with a message naming `what` and the file. */
#ifndef MG_EXPERT_IO_H
#define MG_EXPERT_IO_H

#include <stdatomic.h>
#include <stdint.h>
#include "core/status.h"

#define MG_IO_ALIGN 4096u

typedef struct mg_io_job {
    int group;               /* [0, n_groups) */
    int fd_direct;           /* -1: none */
    int fd_buffered;
    atomic_int *direct_ok;   /* per-file switch, cleared after EINVAL; may be NULL */
    uint64_t off, len, need; /* read [off, off + len); bytes [off, off + need) must exist */
    void *dst;
    const char *what;        /* tensor name, for errors (must outlive the read) */
    const char *path;        /* file path, for errors (must outlive the read) */
    int background;          /* 1: a read-ahead: starts only while no demand read (0) is queued
                                or running, so it never slows the reads a fetch waits for */
} mg_io_job;

typedef struct mg_io_stats {
    uint64_t bytes_read, direct_reads, buffered_reads;
    double busy_seconds;        /* wall time with at least one read running */
    double demand_busy_seconds; /* ... with at least one demand (not background) read running */
} mg_io_stats;

typedef struct mg_io_pool mg_io_pool;

mg_io_pool *mg_io_pool_create(int n_threads, int n_groups, int max_jobs, mg_error *err);
void mg_io_pool_free(mg_io_pool *p); /* waits for running reads */

/* Queues the reads (all or none: fails when the queue would overflow or a group is busy). */
int mg_io_pool_submit(mg_io_pool *p, const mg_io_job *jobs, int n, mg_error *err);

/* Blocks until some group completes and returns it (and *failed, with msg filled on failure);
 * -1 at once when no group is outstanding. */
int mg_io_pool_wait_any(mg_io_pool *p, int *failed, char *msg, size_t msg_cap);
/* wait_any without blocking: a completed group, -2 when groups are outstanding but none has
 * completed yet, -1 when none is outstanding. */
int mg_io_pool_try_any(mg_io_pool *p, int *failed, char *msg, size_t msg_cap);

/* Withdraws a group none of whose reads has started: returns 1 and the group is idle again, as
 * if never submitted (wait_any will not return it); 0 when one of its reads has started or it
 * is not outstanding (it completes as usual). */
int mg_io_pool_cancel(mg_io_pool *p, int group);

/* 1 when nothing is queued or running. */
int mg_io_pool_idle(mg_io_pool *p);
/* Groups submitted and not yet returned by wait_any. */
int mg_io_pool_outstanding(mg_io_pool *p);

mg_io_stats mg_io_pool_stats(mg_io_pool *p);

/* The disk model, for rehearsals on files whose bytes come back faster than a real disk's
 * (sparse holes, the page cache): a single queue that serves reads in the order the threads
 * take them, at bytes_per_second; a read of len bytes completes no earlier than len / rate
 * after the modelled disk has finished the reads taken before it (its bytes are read as
 * usual, then held).  A read that is slower than that is not sped up.  busy_seconds then
 * counts the modelled time.  0 (the default): off.  Never changes a byte that is read. */
void mg_io_pool_emulate_disk(mg_io_pool *p, double bytes_per_second);
double mg_io_pool_emulated_disk(mg_io_pool *p); /* 0: off */

#endif
