/* Expert cache: slot arena, O(1) lookup (key -> slot table, touched only by the fetching
 * thread), victims from expert_policy, batched reads through expert_io. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "model/expert_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/clock.h"
#include "model/expert_io.h"
#include "model/expert_policy.h"

#define N_PIECES 6                   /* gate, gate scale, up, up scale, down, down scale */
#define MERGE_GAP ((uint64_t)64 << 10) /* read through gaps this small rather than split */
#define USAGE_MAGIC "MGUSAGE2" /* counts, then visits of each layer */

typedef struct piece_src {
    uint64_t file_off, nbytes;
    int32_t shard;  /* -1: not file bytes (the pointer is used as it is) */
    int32_t tensor; /* checkpoint tensor index, for messages */
} piece_src;

typedef struct extent {
    int shard, tensor;
    uint64_t off, len, need, slot_off;
} extent;

typedef struct layout {
    int n_ext;
    extent ext[N_PIECES];
    uint64_t piece_slot_off[N_PIECES]; /* UINT64_MAX: not in the slot */
    uint64_t total;
} layout;

struct mg_expert_cache {
    const mg_checkpoint *ck;
    const mg_expert *table;
    const unsigned char *set;
    int n_layers, n_experts, n_keys;
    piece_src *src; /* [n_keys * N_PIECES] */

    int n_shards;
    int *fd_direct;        /* [n_shards], -1: none */
    atomic_int *direct_ok; /* [n_shards] */

    int n_slots;
    uint64_t slot_bytes;
    unsigned char *arena;
    size_t arena_bytes;
    int *slot_key;          /* [n_slots], -1: empty */
    mg_expert *slot_desc;   /* [n_slots] */
    uint32_t *mark;         /* [n_slots]: == epoch while in the open batch */
    unsigned char *loading; /* [n_slots]: a read is in flight */
    unsigned char *prefetched; /* [n_slots]: read by a prefetch, not requested since (prefetch_hits) */
    int n_loading;
    int *key_slot;          /* [n_keys], -1: not cached */

    mg_policy *pol;
    unsigned char *pinned; /* [n_keys] the history's hot set, while it is read at start */
    int n_pinned;          /* its size */
    float *usage_old, *usage_new; /* [n_keys + n_layers] request counts, then visits of each
                                     layer: earlier runs (aged), this run */
    char *usage_path;
    int io_threads;
    mg_io_pool *io;
    uint32_t epoch;

    /* the open batch */
    int batch_layer, batch_n, batch_waiting, batch_open;
    int *batch_slot;   /* [n_slots] */
    int *ready;        /* [n_slots] ring of batch indices ready to hand out */
    int ready_head, ready_len;
    int *victims, *heap; /* [n_slots] */
    mg_io_job *jobs;     /* [n_slots * N_PIECES] */

    int prefetch_depth; /* experts of the next layer the store prefetches itself (0: off) */
    int *cand;          /* [n_experts] prefetch candidates */
    int *hint;          /* [n_experts] keys predicted for hint_layer's next visit (mg_expert_cache_hint) */
    int hint_n, hint_layer;
    /* read-ahead uses only the time the disk is not serving demand reads: at each fetch, wall
     * time and the I/O pool's demand-busy time since the previous one give those seconds per
     * fetch (moving average; read-aheads themselves do not count as busy, or the time they fill
     * would no longer pay for them and they would stop every other fetch); seconds x the pool's
     * read rate / slot bytes accrue as credit, one expert per read-ahead */
    double ra_wall, ra_demand_busy, ra_idle, ra_credit;

    uint64_t fetches, hits, misses, evictions, prefetches, preloaded, auto_prefetches, prefetch_hits;
    uint64_t prefetches_withdrawn;
};

/* ---- locating expert bytes in the files ------------------------------------------------- */

typedef struct tensor_index {
    const mg_checkpoint *ck;
    size_t n;
    size_t *order; /* tensor indices sorted by data address */
} tensor_index;

static int by_address(const void *a, const void *b, void *arg) {
    const mg_checkpoint *ck = arg;
    uintptr_t x = (uintptr_t)mg_checkpoint_at(ck, *(const size_t *)a)->data;
    uintptr_t y = (uintptr_t)mg_checkpoint_at(ck, *(const size_t *)b)->data;
    return x < y ? -1 : x > y;
}

static int index_build(tensor_index *ix, const mg_checkpoint *ck, mg_error *err) {
    ix->ck = ck;
    ix->n = mg_checkpoint_count(ck);
    ix->order = malloc(sizeof(size_t) * (ix->n ? ix->n : 1));
    if (!ix->order) return mg_fail(err, "expert cache: out of memory");
    for (size_t i = 0; i < ix->n; i++) ix->order[i] = i;
    qsort_r(ix->order, ix->n, sizeof(size_t), by_address, (void *)ck);
    return 0;
}

/* The tensor whose bytes contain [p, p + n), or -1. */
static long index_find(const tensor_index *ix, const void *p, uint64_t n) {
    size_t lo = 0, hi = ix->n;
    uintptr_t a = (uintptr_t)p;
    while (lo < hi) { /* first tensor starting after a */
        size_t mid = (lo + hi) / 2;
        if ((uintptr_t)mg_checkpoint_at(ix->ck, ix->order[mid])->data <= a) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return -1;
    const mg_tensor *t = mg_checkpoint_at(ix->ck, ix->order[lo - 1]);
    uintptr_t start = (uintptr_t)t->data;
    if (a - start > t->nbytes || n > t->nbytes - (a - start)) return -1;
    return (long)ix->order[lo - 1];
}

static void expert_pieces(const mg_expert *x, const void *ptr[N_PIECES], uint64_t len[N_PIECES]) {
    const mg_matrix *m[3] = {&x->gate, &x->up, &x->down};
    for (int k = 0; k < 3; k++) {
        uint64_t values = (uint64_t)m[k]->rows * mg_matrix_row_bytes(m[k]);
        ptr[2 * k] = m[k]->data;
        len[2 * k] = values;
        ptr[2 * k + 1] = m[k]->scale;
        len[2 * k + 1] = m[k]->scale ? mg_matrix_bytes(m[k]) - values : 0;
    }
}

static void locate(const tensor_index *ix, const mg_expert *x, piece_src out[N_PIECES]) {
    const void *ptr[N_PIECES];
    uint64_t len[N_PIECES];
    expert_pieces(x, ptr, len);
    for (int k = 0; k < N_PIECES; k++) {
        out[k] = (piece_src){0, len[k], -1, -1};
        if (!ptr[k] || !len[k]) continue;
        long t = index_find(ix, ptr[k], len[k]);
        if (t < 0) continue;
        const mg_tensor *tt = mg_checkpoint_at(ix->ck, (size_t)t);
        out[k].shard = tt->shard;
        out[k].tensor = (int32_t)t;
        out[k].file_off = tt->file_offset + (uint64_t)((uintptr_t)ptr[k] - (uintptr_t)tt->data);
    }
}

static uint64_t align_down(uint64_t v) { return v & ~(uint64_t)(MG_IO_ALIGN - 1); }
static uint64_t align_up(uint64_t v) { return align_down(v + MG_IO_ALIGN - 1); }

/* Groups the file pieces into aligned extents and places them in a slot. */
static void make_layout(const piece_src ps[N_PIECES], layout *L) {
    int idx[N_PIECES], n = 0, piece_ext[N_PIECES];
    for (int k = 0; k < N_PIECES; k++) {
        L->piece_slot_off[k] = UINT64_MAX;
        piece_ext[k] = -1;
        if (ps[k].shard >= 0 && ps[k].nbytes) idx[n++] = k;
    }
    for (int i = 1; i < n; i++) /* insertion sort by (shard, offset) */
        for (int j = i; j > 0; j--) {
            const piece_src *a = &ps[idx[j - 1]], *b = &ps[idx[j]];
            if (a->shard < b->shard || (a->shard == b->shard && a->file_off <= b->file_off)) break;
            int t = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = t;
        }
    L->n_ext = 0;
    uint64_t end = 0;
    for (int i = 0; i < n; i++) {
        const piece_src *p = &ps[idx[i]];
        extent *e = L->n_ext ? &L->ext[L->n_ext - 1] : NULL;
        if (e && e->shard == p->shard && p->file_off <= end + MERGE_GAP) {
            if (p->file_off + p->nbytes > end) end = p->file_off + p->nbytes;
        } else {
            if (e) e->need = end - e->off;
            e = &L->ext[L->n_ext++];
            e->shard = p->shard;
            e->tensor = p->tensor;
            e->off = align_down(p->file_off);
            end = p->file_off + p->nbytes;
        }
        piece_ext[idx[i]] = L->n_ext - 1;
    }
    if (L->n_ext) L->ext[L->n_ext - 1].need = end - L->ext[L->n_ext - 1].off;
    uint64_t cursor = 0;
    for (int i = 0; i < L->n_ext; i++) {
        L->ext[i].len = align_up(L->ext[i].need);
        L->ext[i].slot_off = cursor;
        cursor += L->ext[i].len;
    }
    for (int k = 0; k < N_PIECES; k++)
        if (piece_ext[k] >= 0) {
            const extent *e = &L->ext[piece_ext[k]];
            L->piece_slot_off[k] = e->slot_off + (ps[k].file_off - e->off);
        }
    L->total = cursor;
}

/* Fills src (may be NULL) for every registered key and measures. */
static int measure(const mg_checkpoint *ck, const mg_expert *table, const unsigned char *set, int n_keys,
                   piece_src *src, uint64_t *slot_bytes, uint64_t *unbacked, int *n_registered,
                   mg_error *err) {
    tensor_index ix;
    if (index_build(&ix, ck, err)) return -1;
    uint64_t sb = 0, ub = 0;
    int nr = 0;
    for (int key = 0; key < n_keys; key++) {
        if (!set[key]) continue;
        piece_src ps[N_PIECES];
        locate(&ix, &table[key], ps);
        layout L;
        make_layout(ps, &L);
        if (L.total > sb) sb = L.total;
        for (int k = 0; k < N_PIECES; k++)
            if (ps[k].shard < 0) ub += ps[k].nbytes;
        if (src) memcpy(&src[(size_t)key * N_PIECES], ps, sizeof ps);
        nr++;
    }
    free(ix.order);
    *slot_bytes = sb;
    *unbacked = ub;
    *n_registered = nr;
    return 0;
}

int mg_expert_cache_measure(const mg_checkpoint *ck, const mg_expert *table, const unsigned char *set,
                            int n_layers, int n_experts, uint64_t *slot_bytes, uint64_t *unbacked_bytes,
                            int *n_registered, mg_error *err) {
    return measure(ck, table, set, n_layers * n_experts, NULL, slot_bytes, unbacked_bytes, n_registered, err);
}

uint64_t mg_expert_cache_table_bytes(int n_keys, uint64_t n_slots, int io_threads) {
    uint64_t per_key = sizeof(piece_src) * N_PIECES + sizeof(int) + mg_policy_bytes_per_key() + 1 + 2 * sizeof(float);
    uint64_t per_slot = sizeof(int) * 5 + sizeof(mg_expert) + sizeof(uint32_t) + 2 +
                        sizeof(mg_io_job) * N_PIECES;
    /* thread stacks only count as far as touched: a few pages each */
    return (uint64_t)n_keys * per_key + n_slots * per_slot + (uint64_t)io_threads * (64u << 10);
}

/* ---- usage history -------------------------------------------------------------------- */

static void usage_load(mg_expert_cache *c) {
    if (!c->usage_path) return;
    FILE *f = fopen(c->usage_path, "rb");
    if (!f) return; /* first run */
    char magic[8];
    uint32_t dims[2];
    const size_t n = (size_t)c->n_keys + (size_t)c->n_layers;
    int ok = fread(magic, 1, 8, f) == 8 && fread(dims, 4, 2, f) == 2 && dims[0] == (uint32_t)c->n_layers &&
             dims[1] == (uint32_t)c->n_experts;
    ok = ok && !memcmp(magic, USAGE_MAGIC, 8) && fread(c->usage_old, sizeof(float), n, f) == n;
    fclose(f);
    if (!ok) { /* another model's or a damaged history: start afresh (it is only a hint) */
        memset(c->usage_old, 0, sizeof(float) * n);
        return;
    }
    for (size_t k = 0; k < n; k++)
        if (!isfinite(c->usage_old[k]) || c->usage_old[k] < 0) c->usage_old[k] = 0;
}

static int by_count_desc(const void *a, const void *b, void *arg) {
    const float *cnt = arg;
    float x = cnt[*(const int *)a], y = cnt[*(const int *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

/* Seeds the policy with the history and picks the most requested experts (the hot set). */
static int usage_apply(mg_expert_cache *c, double pin_fraction, mg_error *err) {
    int n_hist = 0;
    for (int k = 0; k < c->n_keys; k++) n_hist += c->usage_old[k] > 0;
    mg_policy_seed(c->pol, c->usage_old, c->usage_old + c->n_keys);
    int n_pin = pin_fraction > 0 ? (int)(pin_fraction * c->n_slots) : 0;
    if (n_pin > n_hist) n_pin = n_hist;
    if (n_pin <= 0) return 0;
    int *order = malloc(sizeof(int) * (size_t)c->n_keys);
    if (!order) return mg_fail(err, "expert cache: out of memory");
    for (int k = 0; k < c->n_keys; k++) order[k] = k;
    qsort_r(order, (size_t)c->n_keys, sizeof(int), by_count_desc, c->usage_old);
    for (int i = 0; i < n_pin; i++) c->pinned[order[i]] = 1;
    c->n_pinned = n_pin;
    free(order);
    return 0;
}

int mg_expert_cache_save_usage(mg_expert_cache *c, mg_error *err) {
    if (!c || !c->usage_path) return 0;
    size_t pl = strlen(c->usage_path);
    char *tmp = malloc(pl + 16);
    if (!tmp) return mg_fail(err, "expert cache: out of memory");
    snprintf(tmp, pl + 16, "%s.tmp%d", c->usage_path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        int rc = mg_fail(err, "expert cache: cannot write routing history %s: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    uint32_t dims[2] = {(uint32_t)c->n_layers, (uint32_t)c->n_experts};
    int ok = fwrite(USAGE_MAGIC, 1, 8, f) == 8 && fwrite(dims, 4, 2, f) == 2;
    for (int k = 0; k < c->n_keys + c->n_layers && ok; k++) {
        float v = 0.5f * c->usage_old[k] + c->usage_new[k]; /* earlier runs count half */
        ok = fwrite(&v, sizeof v, 1, f) == 1;
    }
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, c->usage_path) != 0) {
        int rc = mg_fail(err, "expert cache: cannot write routing history %s: %s", c->usage_path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return rc;
    }
    free(tmp);
    return 0;
}

/* ---- create / free ---------------------------------------------------------------------- */

void mg_expert_cache_free(mg_expert_cache *c) {
    if (!c) return;
    mg_io_pool_free(c->io); /* joins the threads: no read touches the arena after this */
    if (c->arena) munmap(c->arena, c->arena_bytes);
    if (c->fd_direct)
        for (int i = 0; i < c->n_shards; i++)
            if (c->fd_direct[i] >= 0) close(c->fd_direct[i]);
    free(c->fd_direct);
    free(c->direct_ok);
    free(c->src);
    free(c->slot_key);
    free(c->slot_desc);
    free(c->mark);
    free(c->loading);
    free(c->prefetched);
    free(c->key_slot);
    mg_policy_free(c->pol);
    free(c->pinned);
    free(c->usage_old);
    free(c->usage_new);
    free(c->usage_path);
    free(c->batch_slot);
    free(c->ready);
    free(c->victims);
    free(c->heap);
    free(c->jobs);
    free(c->cand);
    free(c->hint);
    free(c);
}

mg_expert_cache *mg_expert_cache_create(const mg_checkpoint *ck, const mg_expert *table,
                                        const unsigned char *set, int n_layers, int n_experts,
                                        uint64_t cache_bytes, const mg_expert_cache_opts *opts,
                                        mg_error *err) {
    mg_expert_cache_opts o;
    memset(&o, 0, sizeof o);
    if (opts) o = *opts;
    mg_expert_cache *c = calloc(1, sizeof *c);
    if (!c) {
        mg_fail(err, "expert cache: out of memory");
        return NULL;
    }
    c->ck = ck;
    c->table = table;
    c->set = set;
    c->n_layers = n_layers;
    c->n_experts = n_experts;
    c->n_keys = n_layers * n_experts;
    c->io_threads = o.io_threads > 0 ? o.io_threads : 4;
    if (!(c->src = calloc((size_t)c->n_keys * N_PIECES, sizeof *c->src))) goto oom;
    uint64_t unbacked = 0;
    int n_reg = 0;
    if (measure(ck, table, set, c->n_keys, c->src, &c->slot_bytes, &unbacked, &n_reg, err)) goto fail;
    if (n_reg == 0) {
        mg_fail(err, "expert cache: no expert was registered");
        goto fail;
    }
    if (c->slot_bytes == 0) c->slot_bytes = MG_IO_ALIGN; /* nothing file-backed: keep one page */
    uint64_t want = cache_bytes / c->slot_bytes;
    if (want > (uint64_t)n_reg) want = (uint64_t)n_reg;
    int min_slots = n_experts < n_reg ? n_experts : n_reg;
    if (want < (uint64_t)min_slots) {
        mg_fail(err, "expert cache: %.3f GB holds %llu slots of %.2f MB; one layer's %d experts need at "
                "least %.3f GB", cache_bytes / 1e9, (unsigned long long)want, c->slot_bytes / 1e6,
                min_slots, (double)min_slots * (double)c->slot_bytes / 1e9);
        goto fail;
    }
    c->n_slots = (int)want;
    c->arena_bytes = (size_t)(c->slot_bytes * want);
    void *arena = mmap(NULL, c->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED) {
        mg_fail(err, "expert cache: cannot reserve %.3f GB for %d slots: %s", c->arena_bytes / 1e9,
                c->n_slots, strerror(errno));
        goto fail;
    }
    c->arena = arena;

    size_t S = (size_t)c->n_slots, K = (size_t)c->n_keys;
    c->slot_key = malloc(sizeof(int) * S);
    c->slot_desc = calloc(S, sizeof(mg_expert));
    c->mark = calloc(S, sizeof(uint32_t));
    c->loading = calloc(S, 1);
    c->prefetched = calloc(S, 1);
    c->key_slot = malloc(sizeof(int) * K);
    c->pinned = calloc(K, 1);
    c->usage_old = calloc(K + (size_t)n_layers, sizeof(float));
    c->usage_new = calloc(K + (size_t)n_layers, sizeof(float));
    c->batch_slot = malloc(sizeof(int) * S);
    c->ready = malloc(sizeof(int) * S);
    c->victims = malloc(sizeof(int) * S);
    c->heap = malloc(sizeof(int) * S);
    c->jobs = malloc(sizeof(mg_io_job) * S * N_PIECES);
    c->cand = malloc(sizeof(int) * (size_t)n_experts);
    c->hint = malloc(sizeof(int) * (size_t)n_experts);
    if (!c->cand || !c->hint || !c->slot_key || !c->slot_desc || !c->mark || !c->loading || !c->prefetched ||
        !c->key_slot || !c->pinned || !c->usage_old || !c->usage_new || !c->batch_slot || !c->ready || !c->victims ||
        !c->heap || !c->jobs)
        goto oom;
    for (size_t i = 0; i < S; i++) c->slot_key[i] = -1;
    for (size_t k = 0; k < K; k++) c->key_slot[k] = -1;

    c->n_shards = mg_checkpoint_shards(ck);
    c->fd_direct = malloc(sizeof(int) * (size_t)(c->n_shards ? c->n_shards : 1));
    c->direct_ok = malloc(sizeof(atomic_int) * (size_t)(c->n_shards ? c->n_shards : 1));
    if (!c->fd_direct || !c->direct_ok) goto oom;
    for (int i = 0; i < c->n_shards; i++) {
        c->fd_direct[i] = -1;
        atomic_init(&c->direct_ok[i], 0);
        if (o.buffered_only) continue;
        /* tmpfs and some network filesystems refuse O_DIRECT at open (EINVAL): buffered then */
        int fd = open(mg_checkpoint_shard_path(ck, i), O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (fd >= 0) {
            c->fd_direct[i] = fd;
            atomic_store(&c->direct_ok[i], 1);
        }
    }

    double half_life = o.half_life > 0 ? o.half_life : 0; /* 0: the policy's bank of half-lives */
    if (!(c->pol = mg_policy_create(o.policy, n_layers, n_experts, half_life, err))) goto fail;
    if (!(c->io = mg_io_pool_create(c->io_threads, c->n_slots, c->n_slots * N_PIECES, err))) goto fail;
    if (o.usage_path && mg_expert_cache_use_history(c, o.usage_path, o.pin_fraction, err)) goto fail;
    return c;
oom:
    mg_fail(err, "expert cache: out of memory");
fail:
    mg_expert_cache_free(c);
    return NULL;
}

/* ---- fetching --------------------------------------------------------------------------- */

static void slot_unmap(mg_expert_cache *c, int slot) {
    int key = c->slot_key[slot];
    if (key >= 0) c->key_slot[key] = -1;
    c->slot_key[slot] = -1;
    c->prefetched[slot] = 0;
}

/* Waits for one read group to finish and files it: returns the slot, or -1 when nothing is in
 * flight.  *failed (with msg) when its read failed: the slot is then emptied. */
static int reap(mg_expert_cache *c, int *failed, char *msg, size_t cap) {
    int slot = mg_io_pool_wait_any(c->io, failed, msg, cap);
    if (slot < 0) return -1;
    c->loading[slot] = 0;
    c->n_loading--;
    if (*failed) slot_unmap(c, slot);
    return slot;
}

/* reap without blocking: -2 when reads are in flight but none has finished. */
static int reap_now(mg_expert_cache *c, int *failed, char *msg, size_t cap) {
    int slot = mg_io_pool_try_any(c->io, failed, msg, cap);
    if (slot < 0) return slot;
    c->loading[slot] = 0;
    c->n_loading--;
    if (*failed) slot_unmap(c, slot);
    return slot;
}

/* Files a finished slot into the open batch: its members become ready. */
static void batch_arrived(mg_expert_cache *c, int slot) {
    if (!c->batch_open) return;
    for (int i = 0; i < c->batch_n; i++)
        if (c->batch_slot[i] == slot) {
            c->ready[(c->ready_head + c->ready_len++) % c->n_slots] = i;
            c->batch_waiting--;
            c->batch_slot[i] = -1 - slot; /* filed */
        }
}

static int in_batch(const mg_expert_cache *c, int slot) {
    if (!c->batch_open) return 0;
    for (int i = 0; i < c->batch_n; i++)
        if (c->batch_slot[i] == slot) return 1;
    return 0;
}

/* Members of the open batch waiting on this slot stop waiting (without becoming ready). */
static void batch_forget(mg_expert_cache *c, int slot) {
    for (int i = 0; i < c->batch_n; i++)
        if (c->batch_slot[i] == slot) {
            c->batch_waiting--;
            c->batch_slot[i] = -1 - slot;
        }
}

/* A read of the open batch failed: waits for the batch's other reads so that none of them
 * surfaces later as an error of another fetch.  Failed slots are left empty (reap), so the
 * next request reads them again; members that did arrive stay cached (their bytes are good). */
static void batch_abort(mg_expert_cache *c, int failed_slot) {
    batch_forget(c, failed_slot);
    while (c->batch_waiting > 0) {
        int failed = 0;
        char msg[768];
        int slot = reap(c, &failed, msg, sizeof msg);
        if (slot < 0) break;
        batch_forget(c, slot);
    }
    c->batch_open = 0;
    c->ready_len = 0;
}

static void auto_prefetch(mg_expert_cache *c, int layer);

/* mg_expert_cache_next / _poll: block says whether to wait for a read. */
static int cache_next(mg_expert_cache *c, int block, mg_error *err) {
    if (!c->batch_open) return -1;
    while (c->ready_len == 0) {
        if (c->batch_waiting == 0) {
            c->batch_open = 0;
            return -1;
        }
        int failed = 0;
        char msg[768];
        int slot = block ? reap(c, &failed, msg, sizeof msg) : reap_now(c, &failed, msg, sizeof msg);
        if (slot == -2) return MG_FETCH_PENDING; /* (only without blocking) */
        if (slot < 0) { /* cannot happen while members wait; stay safe */
            c->batch_open = 0;
            return mg_fail(err, "expert cache: internal: batch waits on no read"), -2;
        }
        if (failed && in_batch(c, slot)) {
            mg_fail(err, "expert store: %s", msg);
            batch_abort(c, slot);
            return -2;
        }
        if (!failed) batch_arrived(c, slot);
    }
    int i = c->ready[c->ready_head];
    c->ready_head = (c->ready_head + 1) % c->n_slots;
    c->ready_len--;
    return i;
}

int mg_expert_cache_next(mg_expert_cache *c, mg_error *err) { return cache_next(c, 1, err); }

int mg_expert_cache_poll(mg_expert_cache *c, mg_error *err) { return cache_next(c, 0, err); }

/* Fills a slot's descriptor and queues its reads into jobs[]; returns the job count. */
static int prepare_slot(mg_expert_cache *c, int slot, int key, mg_io_job *jobs) {
    const piece_src *ps = &c->src[(size_t)key * N_PIECES];
    layout L;
    make_layout(ps, &L);
    unsigned char *base = c->arena + (size_t)slot * c->slot_bytes;
    mg_expert d = c->table[key];
    mg_matrix *m[3] = {&d.gate, &d.up, &d.down};
    for (int k = 0; k < 3; k++) {
        if (L.piece_slot_off[2 * k] != UINT64_MAX) m[k]->data = base + L.piece_slot_off[2 * k];
        if (L.piece_slot_off[2 * k + 1] != UINT64_MAX) m[k]->scale = base + L.piece_slot_off[2 * k + 1];
    }
    c->slot_desc[slot] = d;
    c->slot_key[slot] = key;
    c->key_slot[key] = slot;
    for (int i = 0; i < L.n_ext; i++) {
        const extent *e = &L.ext[i];
        jobs[i] = (mg_io_job){
            .group = slot,
            .fd_direct = c->fd_direct[e->shard],
            .fd_buffered = mg_checkpoint_shard_fd(c->ck, e->shard),
            .direct_ok = &c->direct_ok[e->shard],
            .off = e->off, .len = e->len, .need = e->need,
            .dst = base + e->slot_off,
            .what = e->tensor >= 0 ? mg_checkpoint_at(c->ck, (size_t)e->tensor)->name : "?",
            .path = mg_checkpoint_shard_path(c->ck, e->shard),
        };
    }
    return L.n_ext;
}

/* Finishes the open batch (errors were or will be reported by whoever asked; a new batch
 * just needs the slots settled). */
static void drain_batch(mg_expert_cache *c) {
    mg_error ignore;
    while (c->batch_open && mg_expert_cache_next(c, &ignore) >= 0) {}
    c->batch_open = 0;
}

int mg_expert_cache_begin(mg_expert_cache *c, int layer, int n, const int *ids, const mg_expert **out,
                          mg_error *err) {
    drain_batch(c);
    if (n > c->n_slots)
        return mg_fail(err, "expert store: layer %d: a batch of %d experts exceeds the %d cache slots", layer,
                       n, c->n_slots);
    /* reads in flight (prefetches, members of a failed batch) hold their slots: when they
     * could leave too few victims, let them land first */
    if (c->n_loading && c->n_loading > c->n_slots - n) {
        int failed;
        char msg[768];
        while (reap(c, &failed, msg, sizeof msg) >= 0) {}
    }
    c->fetches++;
    if (++c->epoch == 0) { /* wrapped: forget old marks */
        memset(c->mark, 0, sizeof(uint32_t) * (size_t)c->n_slots);
        c->epoch = 1;
    }
    const int base_key = layer * c->n_experts;
    for (int i = 0; i < n; i++) c->victims[i] = base_key + ids[i]; /* (scratch until the victims) */
    mg_policy_request(c->pol, layer, n, c->victims);
    c->usage_new[c->n_keys + layer] += 1.0f; /* one visit of the layer */
    int n_miss = 0;
    for (int i = 0; i < n; i++) {
        int key = base_key + ids[i];
        c->usage_new[key] += 1.0f;
        int slot = c->key_slot[key];
        if (slot >= 0) {
            if (c->mark[slot] != c->epoch) { /* (a repeated id is not a second request) */
                c->hits++;
                c->prefetch_hits += c->prefetched[slot];
                c->prefetched[slot] = 0;
            }
            c->mark[slot] = c->epoch;
        } else {
            n_miss++;
        }
    }
    /* slots with reads in flight (prefetch, or members of a failed batch) are not victims,
     * except prefetches of this layer that the batch did not ask for (unmarked) and whose reads
     * have not started: they are withdrawn, so a wrong hint costs no bytes and the batch's
     * reads do not queue behind it */
    if (c->n_loading)
        for (int s = 0; s < c->n_slots; s++) {
            if (!c->loading[s] || c->mark[s] == c->epoch) continue;
            if (c->prefetched[s] && c->slot_key[s] / c->n_experts == layer && mg_io_pool_cancel(c->io, s)) {
                c->loading[s] = 0;
                c->n_loading--;
                slot_unmap(c, s);
                c->prefetches_withdrawn++;
            } else {
                c->mark[s] = c->epoch;
            }
        }
    int got = mg_policy_victims(c->pol, c->slot_key, c->n_slots, c->mark, c->epoch, c->pinned, 1, n_miss,
                                c->victims, c->heap);
    if (got < n_miss)
        return mg_fail(err, "expert store: layer %d: no free cache slot for %d missing experts", layer, n_miss);

    int v = 0, n_jobs = 0;
    c->batch_layer = layer;
    c->batch_n = n;
    c->batch_waiting = 0;
    c->ready_head = c->ready_len = 0;
    for (int i = 0; i < n; i++) {
        int key = base_key + ids[i];
        int slot = c->key_slot[key];
        if (slot < 0) {
            slot = c->victims[v++];
            if (c->slot_key[slot] >= 0) {
                c->evictions++;
                slot_unmap(c, slot);
            }
            c->mark[slot] = c->epoch;
            int nj = prepare_slot(c, slot, key, c->jobs + n_jobs);
            n_jobs += nj;
            if (nj) {
                c->loading[slot] = 1;
                c->n_loading++;
            }
            c->misses++;
        }
        out[i] = &c->slot_desc[slot];
        c->batch_slot[i] = slot;
        if (c->loading[slot]) c->batch_waiting++;
        else {
            c->ready[(c->ready_head + c->ready_len++) % c->n_slots] = i;
            c->batch_slot[i] = -1 - slot;
        }
    }
    c->batch_open = 1;
    if (mg_io_pool_submit(c->io, c->jobs, n_jobs, err)) {
        /* nothing was queued: undo the new slots so they are not waited for */
        for (int i = 0; i < n; i++) {
            int slot = c->batch_slot[i];
            if (slot >= 0 && c->loading[slot] && c->key_slot[base_key + ids[i]] == slot) {
                c->loading[slot] = 0;
                c->n_loading--;
                slot_unmap(c, slot);
            }
        }
        c->batch_open = 0;
        return -1;
    }
    /* The next layer's hinted experts are queued now, behind this batch's reads: the I/O pool
     * starts them as soon as the disk has served the batch (never sharing it with the batch's
     * reads), so they are read while this layer computes and the next one's attention runs,
     * not only once this thread has come back to collect the last miss. */
    if (c->prefetch_depth > 0) auto_prefetch(c, (layer + 1) % c->n_layers);
    return 0;
}

/* Starts reads of up to max_started of ids[0..n) of `layer` (see mg_expert_store_prefetch):
 * only while the disk is idle, or for the read-ahead at any time (the read-ahead paces
 * itself).  Either way they are background reads (expert_io.h): the pool starts them only
 * while no demand read is queued or running. */
static int prefetch_ids(mg_expert_cache *c, int layer, int n, const int *ids, int max_started, int read_ahead) {
    if (!read_ahead && (!mg_io_pool_idle(c->io) || (c->batch_open && c->batch_waiting))) return 0;
    int started = 0;
    const int base_key = layer * c->n_experts;
    if (++c->epoch == 0) {
        memset(c->mark, 0, sizeof(uint32_t) * (size_t)c->n_slots);
        c->epoch = 1;
    }
    /* keep the open batch and reads in flight out of reach */
    if (c->batch_open)
        for (int i = 0; i < c->batch_n; i++) {
            int s = c->batch_slot[i];
            c->mark[s >= 0 ? s : -1 - s] = c->epoch;
        }
    if (c->n_loading)
        for (int s = 0; s < c->n_slots; s++)
            if (c->loading[s]) c->mark[s] = c->epoch;
    for (int i = 0; i < n && started < max_started; i++) {
        if (ids[i] < 0 || ids[i] >= c->n_experts) continue;
        int key = base_key + ids[i];
        if (c->key_slot[key] >= 0 || !c->set[key]) continue;
        int victim;
        if (mg_policy_victims(c->pol, c->slot_key, c->n_slots, c->mark, c->epoch, c->pinned, 0, 1, &victim,
                              c->heap) < 1)
            break;
        /* only a slot the policy values less than this expert (an empty one always), and
         * never one requested at its layer's latest visit unless this expert is hinted: a
         * blind guess must not push out the experts the next tokens are most likely to ask
         * for again; a hint's value is measured (mg_policy_hint) */
        int old = c->slot_key[victim];
        if (old >= 0 && ((mg_policy_recent(c->pol, old) && !(mg_policy_hint_accuracy(c->pol, key) > 0)) ||
                         !(mg_policy_score(c->pol, old) < mg_policy_score(c->pol, key))))
            continue;
        if (old >= 0) {
            c->evictions++;
            slot_unmap(c, victim);
        }
        int nj = prepare_slot(c, victim, key, c->jobs);
        if (nj == 0) continue; /* nothing to read: it is in place already */
        for (int k = 0; k < nj; k++) c->jobs[k].background = 1;
        if (mg_io_pool_submit(c->io, c->jobs, nj, NULL)) {
            slot_unmap(c, victim);
            break;
        }
        c->mark[victim] = c->epoch;
        c->loading[victim] = 1;
        c->n_loading++;
        c->prefetched[victim] = 1;
        c->prefetches++;
        started++;
    }
    return started;
}

/* A caller's guesses: no more reads at once than the store has threads, so that the next
 * fetch never queues behind many of them. */
int mg_expert_cache_prefetch(mg_expert_cache *c, int layer, int n, const int *ids) {
    return prefetch_ids(c, layer, n, ids, c->io_threads, 0);
}

void mg_expert_cache_stats(const mg_expert_cache *c, mg_expert_stats *st) {
    mg_io_stats io = mg_io_pool_stats(c->io);
    st->fetches = c->fetches;
    st->hits = c->hits;
    st->misses = c->misses;
    st->bytes_read = io.bytes_read;
    st->read_seconds = io.busy_seconds;
    st->evictions = c->evictions;
    st->direct_reads = io.direct_reads;
    st->buffered_reads = io.buffered_reads;
    st->prefetches = c->prefetches;
    st->slots = (uint64_t)c->n_slots;
    st->slot_bytes = c->slot_bytes;
    st->hot_set = (uint64_t)c->n_pinned;
    st->preloaded = c->preloaded;
    st->auto_prefetches = c->auto_prefetches;
    st->prefetch_hits = c->prefetch_hits;
    st->prefetches_withdrawn = c->prefetches_withdrawn;
    st->emulated_disk_bps = mg_io_pool_emulated_disk(c->io);
}

/* ---- the store's own prefetch and the history's preload ------------------------------------ */

/* A rank of hint that came true less often than this is not read ahead.  On the disk-bound
 * bench (tools/bench_experts.py, random weights: next-layer hints about 55 % right) 0.5 read
 * a third more bytes per token for 7 points of hit rate; 0.7 a tenth more for 4 points. */
#define MG_HINT_MIN_ACCURACY 0.7

#define RA_IDLE_KEEP 0.9 /* per fetch: the idle time's moving average remembers ~10 fetches */

/* Experts the disk's idle time pays for now (see ra_* in the struct), at most `cap`. */
static int read_ahead_allowance(mg_expert_cache *c, int cap) {
    const double now = mg_wall_seconds();
    const mg_io_stats io = mg_io_pool_stats(c->io);
    if (c->ra_wall > 0) {
        double idle = (now - c->ra_wall) - (io.demand_busy_seconds - c->ra_demand_busy);
        c->ra_idle = c->ra_idle * RA_IDLE_KEEP + (1.0 - RA_IDLE_KEEP) * (idle > 0 ? idle : 0.0);
    }
    c->ra_wall = now;
    c->ra_demand_busy = io.demand_busy_seconds;
    if (!(io.busy_seconds > 0) || !c->slot_bytes) return 0; /* no read rate measured yet */
    const double rate = (double)io.bytes_read / io.busy_seconds;
    c->ra_credit += c->ra_idle * rate / (double)c->slot_bytes;
    if (c->ra_credit > cap) c->ra_credit = cap;
    return (int)c->ra_credit;
}

/* Read-ahead, when a fetch of layer - 1 has issued its reads (mg_expert_cache_begin): the
 * hinted experts of `layer` that are not cached and whose rank of hint has come true at least
 * MG_HINT_MIN_ACCURACY of the time, best rank first, up to the prefetch depth and as many as
 * the disk's idle time pays for (read_ahead_allowance: a disk busy with misses all the time
 * reads nothing ahead, where extra bytes would only slow it down).  Background reads: they
 * start once the fetch's own reads are served, and are read while the fetched experts are
 * computed.  When hints come true they are the next fetch's own reads, started early. */
static void auto_prefetch(mg_expert_cache *c, int layer) {
    const int n_hint = c->hint_layer == layer ? c->hint_n : 0;
    c->hint_n = 0;
    const int allowed = read_ahead_allowance(c, c->prefetch_depth);
    const int base = layer * c->n_experts;
    int n = 0;
    for (int i = 0; i < n_hint && n < allowed; i++) {
        int key = c->hint[i];
        if (c->key_slot[key] < 0 && mg_policy_hint_accuracy(c->pol, key) >= MG_HINT_MIN_ACCURACY)
            c->cand[n++] = key - base;
    }
    if (!n) return;
    int started = prefetch_ids(c, layer, n, c->cand, n, 1);
    c->ra_credit -= started;
    c->auto_prefetches += (uint64_t)started;
}

void mg_expert_cache_read_ahead(mg_expert_cache *c, int layer) {
    if (c && c->prefetch_depth > 0) auto_prefetch(c, layer);
}

void mg_expert_cache_hint(mg_expert_cache *c, int layer, int n, const int *ids) {
    if (!c || layer < 0 || layer >= c->n_layers) return;
    const int base = layer * c->n_experts;
    int k = 0;
    for (int i = 0; i < n && k < c->n_experts; i++) {
        if (ids[i] < 0 || ids[i] >= c->n_experts || !c->set[base + ids[i]]) continue;
        int dup = 0;
        for (int j = 0; j < k && !dup; j++) dup = c->hint[j] == base + ids[i];
        if (!dup) c->hint[k++] = base + ids[i];
    }
    c->hint_layer = layer;
    c->hint_n = k;
    mg_policy_hint(c->pol, layer, k, c->hint);
}

int mg_expert_cache_prefetching(const mg_expert_cache *c) {
    return c && c->prefetch_depth > 0;
}

void mg_expert_cache_emulate_disk(mg_expert_cache *c, double bytes_per_second) {
    if (c) mg_io_pool_emulate_disk(c->io, bytes_per_second);
}

void mg_expert_cache_set_prefetch(mg_expert_cache *c, int depth) {
    if (!c) return;
    c->prefetch_depth = depth > 0 ? depth : 0;
}

/* Reads the hot set into empty slots now, so the first tokens already hit them.  A read that
 * fails leaves its slot empty (the fetch that needs the expert reports the error). */
static void usage_preload(mg_expert_cache *c) {
    if (!c->n_pinned) return;
    drain_batch(c);
    int slot = 0;
    for (int key = 0; key < c->n_keys; key++) {
        if (!c->pinned[key] || !c->set[key] || c->key_slot[key] >= 0) continue;
        while (slot < c->n_slots && (c->slot_key[slot] >= 0 || c->loading[slot])) slot++;
        if (slot >= c->n_slots) break;
        int nj = prepare_slot(c, slot, key, c->jobs);
        if (nj == 0) continue; /* nothing file-backed: in place already */
        if (mg_io_pool_submit(c->io, c->jobs, nj, NULL)) {
            slot_unmap(c, slot);
            break;
        }
        c->loading[slot] = 1;
        c->n_loading++;
    }
    int failed;
    char msg[768];
    while (reap(c, &failed, msg, sizeof msg) >= 0)
        if (!failed) c->preloaded++;
}

int mg_expert_cache_use_history(mg_expert_cache *c, const char *path, double pin_fraction, mg_error *err) {
    char *copy = strdup(path);
    if (!copy) return mg_fail(err, "expert cache: out of memory");
    free(c->usage_path);
    c->usage_path = copy;
    memset(c->usage_old, 0, sizeof(float) * ((size_t)c->n_keys + (size_t)c->n_layers));
    memset(c->pinned, 0, (size_t)c->n_keys);
    c->n_pinned = 0;
    usage_load(c);
    if (usage_apply(c, pin_fraction == 0 ? 0.5 : pin_fraction, err)) return -1;
    usage_preload(c);
    /* The hot set is a head start, not a reservation: from here on the seeded rates rank it
     * like everything else.  Replayed on recorded traces, keeping it pinned cost up to 14
     * points of hit rate over 200 tokens when the history came from another prompt (and a
     * point when it came from the same conversation) against reading it in unpinned. */
    memset(c->pinned, 0, (size_t)c->n_keys);
    return 0;
}
