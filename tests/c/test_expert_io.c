/* Tests for the expert store's I/O pool (c/model/expert_io.h): reads land in their groups with
 * the file's bytes, a group whose reads have not started can be withdrawn (the store's
 * wrong read-aheads), leaving the pool as if it had never been submitted, and the disk model
 * of rehearsals paces reads as one queue at its rate without changing their bytes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "model/expert_io.h"
#include "check.h"

#define CHUNK (4u << 20) /* bytes per read */
#define N_CHUNKS 8

static mg_io_job job(int group, int fd, int chunk, void *dst) {
    mg_io_job j;
    memset(&j, 0, sizeof j);
    j.group = group;
    j.fd_direct = -1;
    j.fd_buffered = fd;
    j.off = (uint64_t)chunk * CHUNK;
    j.len = j.need = CHUNK;
    j.dst = dst;
    j.what = "chunk";
    j.path = "test file";
    return j;
}

/* the file's byte at offset o */
static unsigned char pattern(uint64_t o) { return (unsigned char)(o * 2654435761u >> 13); }

static int holds_chunk(const unsigned char *buf, int chunk) {
    for (uint64_t i = 0; i < CHUNK; i += 997)
        if (buf[i] != pattern((uint64_t)chunk * CHUNK + i)) return 0;
    return 1;
}

int main(void) {
    char path[512];
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/mg_io_XXXXXX", base);
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        return 1;
    }
    unsigned char *buf = malloc((size_t)CHUNK * N_CHUNKS), *dst = malloc((size_t)CHUNK * (N_CHUNKS + 1));
    for (uint64_t o = 0; o < (uint64_t)CHUNK * N_CHUNKS; o++) buf[o] = pattern(o);
    CHECK(write(fd, buf, (size_t)CHUNK * N_CHUNKS) == (ssize_t)CHUNK * N_CHUNKS, "writing the test file");

    mg_error err = {0};
    mg_io_pool *p = mg_io_pool_create(1, 2, 2 * N_CHUNKS, &err);
    CHECK(p != NULL, "%s", err.msg);
    if (!p) return 1;
    CHECK(mg_io_pool_cancel(p, 1) == 0, "an idle group withdrawn");
    CHECK(mg_io_pool_cancel(p, 7) == 0 && mg_io_pool_cancel(p, -1) == 0, "a group out of range withdrawn");

    /* one thread busy with group 0's reads: group 1's read, queued behind them, can be
     * withdrawn (a read of 4 MB takes far longer than the call; retried in case it did not) */
    int withdrawn = 0;
    for (int attempt = 0; attempt < 20 && !withdrawn; attempt++) {
        mg_io_job jobs[N_CHUNKS];
        for (int c = 0; c < N_CHUNKS; c++) jobs[c] = job(0, fd, c, dst + (size_t)c * CHUNK);
        CHECK(mg_io_pool_submit(p, jobs, N_CHUNKS, &err) == 0, "%s", err.msg);
        mg_io_job late = job(1, fd, 3, dst + (size_t)N_CHUNKS * CHUNK);
        CHECK(mg_io_pool_submit(p, &late, 1, &err) == 0, "%s", err.msg);
        withdrawn = mg_io_pool_cancel(p, 1);
        int failed = 0, got[3] = {-1, -1, -1};
        for (int i = 0; i < 3; i++) got[i] = mg_io_pool_wait_any(p, &failed, NULL, 0);
        CHECK(!failed, "a read failed");
        if (withdrawn) {
            CHECK(got[0] == 0 && got[1] == -1, "withdrawn: groups %d %d returned", got[0], got[1]);
            CHECK(mg_io_pool_outstanding(p) == 0 && mg_io_pool_idle(p), "the pool is not idle");
        } else {
            CHECK(got[2] == -1 && got[0] + got[1] == 1, "not withdrawn: groups %d %d %d", got[0], got[1], got[2]);
        }
        CHECK(mg_io_pool_cancel(p, 0) == 0, "a completed group withdrawn");
    }
    CHECK(withdrawn, "a read queued behind 32 MB of reads on one thread was never withdrawn");
    for (int c = 0; c < N_CHUNKS; c++) CHECK(holds_chunk(dst + (size_t)c * CHUNK, c), "chunk %d", c);
    /* the withdrawn group is as if never submitted: it can be submitted again and lands */
    mg_io_job again = job(1, fd, 5, dst + (size_t)N_CHUNKS * CHUNK);
    CHECK(mg_io_pool_submit(p, &again, 1, &err) == 0, "%s", err.msg);
    int failed = 0;
    CHECK(mg_io_pool_wait_any(p, &failed, NULL, 0) == 1 && !failed, "the resubmitted group");
    CHECK(holds_chunk(dst + (size_t)N_CHUNKS * CHUNK, 5), "the resubmitted group's bytes");
    mg_io_stats st = mg_io_pool_stats(p);
    CHECK(st.bytes_read % CHUNK == 0 && st.buffered_reads == st.bytes_read / CHUNK, "%llu bytes in %llu reads",
          (unsigned long long)st.bytes_read, (unsigned long long)st.buffered_reads);

    mg_io_pool_free(p);

    /* The disk model: N_CHUNKS reads of CHUNK bytes in their own groups, on 3 threads, at
     * DISK_BPS.  One queue: the k-th group to complete does so no sooner than k chunks'
     * time after the submit (whatever the threads' interleaving), the bytes are the file's,
     * and the pool's busy time counts the modelled time. */
    const double DISK_BPS = 128e6; /* 4 MB chunks: 31 ms each, 0.25 s in all */
    p = mg_io_pool_create(3, N_CHUNKS, N_CHUNKS, &err);
    CHECK(p != NULL, "%s", err.msg);
    if (!p) return 1;
    mg_io_pool_emulate_disk(p, DISK_BPS);
    CHECK(mg_io_pool_emulated_disk(p) == DISK_BPS, "the disk model's rate");
    memset(dst, 0, (size_t)CHUNK * N_CHUNKS);
    mg_io_job paced[N_CHUNKS];
    for (int c = 0; c < N_CHUNKS; c++) paced[c] = job(c, fd, c, dst + (size_t)c * CHUNK);
    const double t0 = mg_wall_seconds();
    CHECK(mg_io_pool_submit(p, paced, N_CHUNKS, &err) == 0, "%s", err.msg);
    for (int k = 1; k <= N_CHUNKS; k++) {
        int g = mg_io_pool_wait_any(p, &failed, NULL, 0);
        const double at = mg_wall_seconds() - t0, floor_s = k * (double)CHUNK / DISK_BPS;
        CHECK(g >= 0 && !failed, "paced read %d", k);
        CHECK(at >= floor_s, "the %d-th paced read completed after %.4f s, before the disk's %.4f s", k, at, floor_s);
    }
    for (int c = 0; c < N_CHUNKS; c++) CHECK(holds_chunk(dst + (size_t)c * CHUNK, c), "paced chunk %d", c);
    st = mg_io_pool_stats(p);
    CHECK(st.bytes_read == (uint64_t)CHUNK * N_CHUNKS, "paced bytes %llu", (unsigned long long)st.bytes_read);
    CHECK(st.busy_seconds >= N_CHUNKS * (double)CHUNK / DISK_BPS, "busy %.4f s", st.busy_seconds);
    /* Background reads (read-ahead) start only while no demand read is queued or running:
     * submitted together, group 0 (background, first in the call) completes after the demand
     * groups 1-3 whatever the threads do, and it can still be withdrawn while they run. */
    {
        mg_io_job mixed[4];
        for (int c = 0; c < 4; c++) mixed[c] = job(c, fd, c, dst + (size_t)c * CHUNK);
        mixed[0].background = 1;
        CHECK(mg_io_pool_submit(p, mixed, 4, &err) == 0, "%s", err.msg);
        int order[4];
        for (int k = 0; k < 4; k++) {
            order[k] = mg_io_pool_wait_any(p, &failed, NULL, 0);
            CHECK(order[k] >= 0 && !failed, "mixed read %d", k);
        }
        CHECK(order[3] == 0, "the background read completed before a demand read (order %d %d %d %d)", order[0],
              order[1], order[2], order[3]);
        for (int c = 0; c < 4; c++) CHECK(holds_chunk(dst + (size_t)c * CHUNK, c), "mixed chunk %d", c);
        CHECK(mg_io_pool_submit(p, mixed, 4, &err) == 0, "%s", err.msg);
        CHECK(mg_io_pool_cancel(p, 0) == 1, "a background read queued behind demand reads was not withdrawn");
        int n_done = 0;
        while (mg_io_pool_wait_any(p, &failed, NULL, 0) >= 0) n_done++;
        CHECK(n_done == 3 && mg_io_pool_idle(p), "%d groups after the withdrawal", n_done);
        /* Demand-busy time counts demand reads only (the read-ahead credit is paid from the rest):
         * two background reads alone add their modelled time to busy, none to demand-busy;
         * one demand read adds at least its own to both. */
        const mg_io_stats before = mg_io_pool_stats(p);
        mixed[0].background = mixed[1].background = 1;
        CHECK(mg_io_pool_submit(p, mixed, 2, &err) == 0, "%s", err.msg);
        while (mg_io_pool_wait_any(p, &failed, NULL, 0) >= 0) {}
        const mg_io_stats bg = mg_io_pool_stats(p);
        CHECK(bg.busy_seconds - before.busy_seconds >= 2 * (double)CHUNK / DISK_BPS, "busy %.4f s for two background reads",
              bg.busy_seconds - before.busy_seconds);
        CHECK(bg.demand_busy_seconds == before.demand_busy_seconds, "background reads counted %.4f s of demand-busy time",
              bg.demand_busy_seconds - before.demand_busy_seconds);
        CHECK(mg_io_pool_submit(p, mixed + 2, 1, &err) == 0, "%s", err.msg);
        CHECK(mg_io_pool_wait_any(p, &failed, NULL, 0) == 2 && !failed, "a demand read");
        const mg_io_stats dm = mg_io_pool_stats(p);
        CHECK(dm.demand_busy_seconds - bg.demand_busy_seconds >= (double)CHUNK / DISK_BPS,
              "a demand read counted %.4f s of demand-busy time", dm.demand_busy_seconds - bg.demand_busy_seconds);
    }
    /* off again: nothing is held (the reads only take the file's time) */
    mg_io_pool_emulate_disk(p, 0.0);
    CHECK(mg_io_pool_emulated_disk(p) == 0.0, "the disk model is off");
    CHECK(mg_io_pool_submit(p, paced, 1, &err) == 0, "%s", err.msg);
    CHECK(mg_io_pool_wait_any(p, &failed, NULL, 0) == 0 && !failed, "an unpaced read");
    mg_io_pool_free(p);
    close(fd);
    unlink(path);
    free(buf);
    free(dst);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
