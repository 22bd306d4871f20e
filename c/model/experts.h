/* The expert store: every routed expert is addressed as (layer, expert) and its three
 * matrices are found through this one lookup.
 *
 * Two modes behind the same fetch call:
 *   resident (default)  descriptors point into the mapped checkpoint; every fetch is a hit.
 *   cache               after mg_expert_store_configure(): a fixed arena of expert-sized slots
 *                       (cache_bytes).  The experts of a fetch that are not in a slot are read
 *                       from the shard files in one batch by a small pool of I/O threads
 *                       (O_DIRECT into 4 KiB-aligned slots where the filesystem allows it,
 *                       buffered pread otherwise; never page faults through the mapping).
 *                       Bytes keep their on-disk format, so a cached expert's matrices are
 *                       bitwise the resident ones.  Replacement: frequency with aging (or LRU),
 *                       plus an optional hot set read at start from the routing history of earlier
 *                       runs.
 *
 * Integration (an arch loader, after every mg_expert_store_set):
 *     uint64_t cache = 0;
 *     if (env->ram_gb > 0 &&
 *         (mg_expert_store_plan(s->experts, env->ck, (uint64_t)(env->ram_gb * 1e9), other_bytes,
 *                               &cache, err) ||
 *          mg_expert_store_configure(s->experts, env->ck, cache, &opts, err)))
 *         goto fail;
 * where other_bytes = bound weight bytes (census) - mg_expert_store_expert_bytes(s->experts)
 *                     + KV cache bytes + scratch buffer bytes. */
#ifndef MG_EXPERTS_H
#define MG_EXPERTS_H

#include <stdint.h>
#include "core/matrix.h"
#include "core/status.h"
#include "io/safetensors.h"

typedef struct mg_expert {
    mg_matrix gate; /* [width, d]  (w1) */
    mg_matrix up;   /* [width, d]  (w3) */
    mg_matrix down; /* [d, width]  (w2) */
} mg_expert;

typedef struct mg_expert_store mg_expert_store;

mg_expert_store *mg_expert_store_create(int n_layers, int n_experts, mg_error *err);
/* Also writes the routing history (opts.usage_path) when the store ran as a cache. */
void mg_expert_store_free(mg_expert_store *s);

/* Registers where expert (layer, e) lives (descriptors into the mapped checkpoint). */
void mg_expert_store_set(mg_expert_store *s, int layer, int e, const mg_expert *x);

/* Makes experts ids[0..n) of `layer` available together (one batch: the routing result of a
 * layer) and writes their descriptors to out[i].  They stay valid until the next fetch.
 * In cache mode n may not exceed the number of slots (the plan guarantees >= n_experts). */
int mg_expert_store_fetch(mg_expert_store *s, int layer, int n, const int *ids,
                          const mg_expert **out, mg_error *err);

/* The same fetch split in two, so that computing the experts already cached overlaps the
 * reads of the missing ones: begin fills out[] (descriptors of missing experts are not
 * readable yet) and starts the reads; each next call returns the index i of a batch member
 * whose bytes are now in memory (cached ones first, then misses in arrival order), -1 when
 * every member was returned, or -2 on a read error (err names the tensor and the file; the
 * batch is then over).  A begin (or fetch) while a batch is still open finishes it first. */
int mg_expert_store_fetch_begin(mg_expert_store *s, int layer, int n, const int *ids,
                                const mg_expert **out, mg_error *err);
int mg_expert_store_fetch_next(mg_expert_store *s, mg_error *err);

/* fetch_next without waiting for a read: MG_FETCH_PENDING when members remain but none of
 * them has its bytes in memory yet (a read of this batch, or a read-ahead it asked for, is
 * still running).  The MoE computes what is in memory first (cached experts, read-aheads that
 * landed, the shared expert), then each remaining member as it lands. */
#define MG_FETCH_PENDING (-3)
int mg_expert_store_fetch_poll(mg_expert_store *s, mg_error *err);

/* fetch_begin with the router's scores of the batch's last token: scores[n_experts], the
 * values its top-k ranked (NULL: none, as fetch_begin).  Recorded in the routing trace. */
int mg_expert_store_fetch_begin_scored(mg_expert_store *s, int layer, int n, const int *ids,
                                       const float *scores, const mg_expert **out, mg_error *err);
/* 1 when the scores are used (a routing trace is being written): callers may skip computing
 * them otherwise. */
int mg_expert_store_wants_scores(const mg_expert_store *s);

/* Reads these experts of `layer` into the cache only if the disk would otherwise sit idle
 * (no read queued or running) and only into slots the policy would evict anyway (never
 * pinned ones, never the open batch), as background reads (a later fetch's reads go first).
 * A hint: no error, returns how many reads it started. */
int mg_expert_store_prefetch(mg_expert_store *s, int layer, int n, const int *ids);

typedef struct mg_expert_stats {
    uint64_t fetches, hits, misses, bytes_read;
    double read_seconds;      /* wall time with at least one read running: GB/s = bytes_read / it */
    uint64_t evictions;
    uint64_t direct_reads;    /* reads done with O_DIRECT */
    uint64_t buffered_reads;  /* reads done with buffered pread (fallback) */
    uint64_t prefetches;      /* experts read by mg_expert_store_prefetch */
    uint64_t slots;           /* cache slots (0: resident mode) */
    uint64_t slot_bytes;
    uint64_t hot_set;         /* experts in the routing history's hot set: read at start, then evicted only
                                 when no other victim is left (never for a read-ahead) */
    uint64_t preloaded;       /* of those, read into the cache at start */
    uint64_t auto_prefetches; /* of prefetches: started by the store itself (next layer) */
    uint64_t prefetch_hits;   /* of hits: the first request of an expert a prefetch read */
    uint64_t prefetches_withdrawn; /* of prefetches: read-aheads its layer did not ask for, withdrawn
                                      before any of their reads started (no bytes read) */
    double compute_seconds;   /* wall time the MoE computed routed experts (and the shared one) */
    double wait_seconds;      /* wall time it waited for the store: issuing reads, then each miss */
    double emulated_disk_bps; /* the disk model's rate (mg_expert_store_emulate_disk); 0: off */
} mg_expert_stats;

mg_expert_stats mg_expert_store_stats(const mg_expert_store *s);
/* The MoE's account of one fetch (blocks.c): seconds computing, seconds waiting for it. */
void mg_expert_store_note_times(mg_expert_store *s, double compute_seconds, double wait_seconds);

/* ---- cache mode ----------------------------------------------------------------------- */

typedef enum mg_expert_policy_kind {
    MG_EXPERT_POLICY_LFRU = 0, /* predicted next use: layer distance + learned reuse (default) */
    MG_EXPERT_POLICY_LRU = 1,
} mg_expert_policy_kind;

/* All zero = defaults. */
typedef struct mg_expert_cache_opts {
    int policy;             /* mg_expert_policy_kind */
    int io_threads;         /* reads in flight at once; 0: 4 */
    int buffered_only;      /* 1: never try O_DIRECT */
    double half_life;       /* aging half-life in fetches; 0: a bank of half-lives (expert_policy.h) */
    double pin_fraction;    /* share of the slots the history's hot set may fill at start; 0: 0.5, < 0: none */
    const char *usage_path; /* routing history: read at configure (seeds the policy and the
                               pinned set), rewritten at free; NULL: none */
} mg_expert_cache_opts;

/* Bytes of every registered expert (values + scales): what the resident mode would map. */
uint64_t mg_expert_store_expert_bytes(const mg_expert_store *s);

/* Bytes one cache slot needs (the largest expert's aligned read layout), 0 with err set when
 * an expert's bytes cannot be located in the checkpoint's files. */
uint64_t mg_expert_store_slot_bytes(const mg_expert_store *s, const mg_checkpoint *ck, mg_error *err);

/* Sizes the cache from a RAM budget: cache = ram_bytes - other_bytes (everything the process
 * holds besides the experts) - the process's current resident set - the store's own tables.
 * Fails, saying the minimum budget, when that leaves fewer slots than one layer's experts. */
int mg_expert_store_plan(const mg_expert_store *s, const mg_checkpoint *ck, uint64_t ram_bytes,
                         uint64_t other_bytes, uint64_t *cache_bytes, mg_error *err);

/* Switches to cache mode with floor(cache_bytes / slot_bytes) slots (at most one per
 * registered expert; at least n_experts or an error).  ck must outlive the store. */
int mg_expert_store_configure(mg_expert_store *s, const mg_checkpoint *ck, uint64_t cache_bytes,
                              const mg_expert_cache_opts *opts, mg_error *err);

/* Records every fetch (layer + expert ids, in either mode) to `path` for
 * tools/routing_trace.py; NULL stops recording.  Format: see expert_trace in experts.c. */
int mg_expert_store_trace(mg_expert_store *s, const char *path, mg_error *err);

/* Attaches a routing history file to a configured cache (resident mode: returns 0, nothing
 * happens; call once, before the first fetch).  As opts.usage_path at configure: the file is
 * read if it exists (another model's or a damaged one is ignored: only a hint), it seeds the
 * policy, reads the most requested experts (up to pin_fraction of the slots; 0: 0.5, < 0: none)
 * into the cache now (not pinned: the policy may evict them later), and it is rewritten at free. */
int mg_expert_store_use_history(mg_expert_store *s, const char *path, double pin_fraction, mg_error *err);

/* Cache mode: when a fetch of layer l has issued its reads, the store itself reads ahead up
 * to `depth` experts of layer l + 1 from the look-ahead hint (mg_expert_store_hint; none
 * without one), as many as the disk's idle time pays for, under the rules of
 * mg_expert_store_prefetch except the cap on reads at once: background reads, which start
 * once the fetch's own reads are served, overlap the computation on the fetched experts and
 * the next layer's attention, and never evict an expert the policy values more.  The next fetch withdraws those it does not
 * ask for whose reads have not started.  0 (the default): off.  Resident mode: no
 * effect. */
void mg_expert_store_set_prefetch(mg_expert_store *s, int depth);

/* Look-ahead hints: ids[0..n) are the experts of `layer`, best first, that its router picks
 * for the hidden state one layer early (decode only), given before the previous layer's
 * fetch.  Wanted with prefetch on (cache mode) or while a routing trace is written (it keeps
 * them); callers skip computing them otherwise.  When the previous layer's fetch completes,
 * the store reads ahead the hinted experts it lacks whose rank of hint has come true often
 * enough (expert_cache.c), and its policy values hinted experts by that accuracy
 * (expert_policy.h).  Never changes what is computed. */
int mg_expert_store_wants_hints(const mg_expert_store *s);

/* Cache mode, rehearsals only: reads behave as from a disk of bytes_per_second with one queue
 * (expert_io.h mg_io_pool_emulate_disk): on sparse files, whose holes come back at memory
 * speed, wall time then shows how much of a real disk's read time the engine hides behind
 * compute.  Bytes read are unchanged.  0: off (the default; a server never sets it).
 * Resident mode: no effect. */
void mg_expert_store_emulate_disk(mg_expert_store *s, double bytes_per_second);
void mg_expert_store_hint(mg_expert_store *s, int layer, int n, const int *ids);
/* Reads ahead the hinted experts of `layer` now, as the fetch of layer - 1 would: for a hint
 * known before any fetch precedes the layer (a decode step's first layer, when its routing
 * depends on the token alone).  No effect without read-ahead (set_prefetch) or a hint. */
void mg_expert_store_read_ahead(mg_expert_store *s, int layer);

#endif
