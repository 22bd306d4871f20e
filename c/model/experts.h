/* The expert store: every routed expert is addressed as (layer, expert) and its three
 * matrices are found through this one lookup.  Today all experts are resident (pointing into
 * the mapped checkpoint); the expert-store issue turns this into a budgeted cache with batched
 * disk reads, behind the same fetch call. */
#ifndef MG_EXPERTS_H
#define MG_EXPERTS_H

#include <stdint.h>
#include "core/matrix.h"
#include "core/status.h"

typedef struct mg_expert {
    mg_matrix gate; /* [width, d]  (w1) */
    mg_matrix up;   /* [width, d]  (w3) */
    mg_matrix down; /* [d, width]  (w2) */
} mg_expert;

typedef struct mg_expert_store mg_expert_store;

mg_expert_store *mg_expert_store_create(int n_layers, int n_experts, mg_error *err);
void mg_expert_store_free(mg_expert_store *s);

/* Registers where expert (layer, e) lives. */
void mg_expert_store_set(mg_expert_store *s, int layer, int e, const mg_expert *x);

/* Makes experts ids[0..n) of `layer` available together (one batch: the routing result of a
 * layer) and writes their descriptors to out[i].  They stay valid until the next fetch. */
int mg_expert_store_fetch(mg_expert_store *s, int layer, int n, const int *ids,
                          const mg_expert **out, mg_error *err);

typedef struct mg_expert_stats {
    uint64_t fetches, hits, misses, bytes_read;
} mg_expert_stats;

mg_expert_stats mg_expert_store_stats(const mg_expert_store *s);

#endif
