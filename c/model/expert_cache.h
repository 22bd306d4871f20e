/* The budgeted expert cache behind mg_expert_store (cache mode).  Internal to experts.c.
 *
 * Each expert has up to six byte ranges in the shard files (gate/up/down values and their
 * scales), found by mapping the registered descriptors' pointers back to checkpoint tensors.
 * Ranges of one file that lie close together are merged into 4 KiB-aligned extents; a slot
 * holds one expert's extents back to back, so a miss is one to six large reads.  Pieces that
 * are not file bytes (e.g. a scale converted to fp32 at load) stay where they are. */
#ifndef MG_EXPERT_CACHE_H
#define MG_EXPERT_CACHE_H

#include <stdint.h>
#include "core/status.h"
#include "io/safetensors.h"
#include "model/experts.h"

typedef struct mg_expert_cache mg_expert_cache;

/* Slot size for the registered experts, and bytes of pieces that stay outside the cache. */
int mg_expert_cache_measure(const mg_checkpoint *ck, const mg_expert *table, const unsigned char *set,
                            int n_layers, int n_experts, uint64_t *slot_bytes, uint64_t *unbacked_bytes,
                            int *n_registered, mg_error *err);

/* Bytes of the cache's own tables for this many keys and slots (not counting the slots). */
uint64_t mg_expert_cache_table_bytes(int n_keys, uint64_t n_slots, int io_threads);

/* table and set must outlive the cache (they are the store's). */
mg_expert_cache *mg_expert_cache_create(const mg_checkpoint *ck, const mg_expert *table,
                                        const unsigned char *set, int n_layers, int n_experts,
                                        uint64_t cache_bytes, const mg_expert_cache_opts *opts,
                                        mg_error *err);
void mg_expert_cache_free(mg_expert_cache *c);

/* ids are already validated (range, registered). */
int mg_expert_cache_begin(mg_expert_cache *c, int layer, int n, const int *ids, const mg_expert **out,
                          mg_error *err);
int mg_expert_cache_next(mg_expert_cache *c, mg_error *err);
int mg_expert_cache_poll(mg_expert_cache *c, mg_error *err); /* never blocks: MG_FETCH_PENDING */
int mg_expert_cache_prefetch(mg_expert_cache *c, int layer, int n, const int *ids);

int mg_expert_cache_use_history(mg_expert_cache *c, const char *path, double pin_fraction, mg_error *err);
void mg_expert_cache_set_prefetch(mg_expert_cache *c, int depth);
/* ids of `layer` predicted for its next fetch: prefetched first, and valued by the policy. */
void mg_expert_cache_hint(mg_expert_cache *c, int layer, int n, const int *ids);
int mg_expert_cache_prefetching(const mg_expert_cache *c);
/* The read-ahead a fetch of layer - 1 starts (auto_prefetch), now. */
void mg_expert_cache_read_ahead(mg_expert_cache *c, int layer);
/* The I/O pool's disk model (expert_io.h mg_io_pool_emulate_disk); 0: off. */
void mg_expert_cache_emulate_disk(mg_expert_cache *c, double bytes_per_second);

void mg_expert_cache_stats(const mg_expert_cache *c, mg_expert_stats *st);
int mg_expert_cache_save_usage(mg_expert_cache *c, mg_error *err);

#endif
