/* Resident expert store: a table of descriptors pointing into the mapped checkpoint.
 * Every fetch is served from memory, so every fetched expert counts as a hit. */
#include "model/experts.h"

#include <stdlib.h>
#include <string.h>

struct mg_expert_store {
    int n_layers, n_experts;
    mg_expert *table;   /* [n_layers * n_experts] */
    unsigned char *set; /* registered? */
    mg_expert_stats stats;
};

mg_expert_store *mg_expert_store_create(int n_layers, int n_experts, mg_error *err) {
    if (n_layers <= 0 || n_experts <= 0 || (size_t)n_layers > SIZE_MAX / sizeof(mg_expert) / (size_t)n_experts) {
        mg_fail(err, "expert store: invalid size %d layers x %d experts", n_layers, n_experts);
        return NULL;
    }
    size_t n = (size_t)n_layers * (size_t)n_experts;
    mg_expert_store *s = calloc(1, sizeof *s);
    if (s) {
        s->table = calloc(n, sizeof *s->table);
        s->set = calloc(n, 1);
    }
    if (!s || !s->table || !s->set) {
        mg_expert_store_free(s);
        mg_fail(err, "expert store: out of memory");
        return NULL;
    }
    s->n_layers = n_layers;
    s->n_experts = n_experts;
    return s;
}

void mg_expert_store_free(mg_expert_store *s) {
    if (!s) return;
    free(s->table);
    free(s->set);
    free(s);
}

void mg_expert_store_set(mg_expert_store *s, int layer, int e, const mg_expert *x) {
    if (!s || !x || layer < 0 || layer >= s->n_layers || e < 0 || e >= s->n_experts) return;
    size_t i = (size_t)layer * (size_t)s->n_experts + (size_t)e;
    s->table[i] = *x;
    s->set[i] = 1;
}

int mg_expert_store_fetch(mg_expert_store *s, int layer, int n, const int *ids,
                          const mg_expert **out, mg_error *err) {
    if (!s || layer < 0 || layer >= s->n_layers)
        return mg_fail(err, "expert store: layer %d out of range", layer);
    for (int i = 0; i < n; i++) {
        int e = ids[i];
        if (e < 0 || e >= s->n_experts)
            return mg_fail(err, "expert store: layer %d: expert %d out of range [0, %d)", layer, e,
                           s->n_experts);
        size_t k = (size_t)layer * (size_t)s->n_experts + (size_t)e;
        if (!s->set[k])
            return mg_fail(err, "expert store: layer %d: expert %d was never registered", layer, e);
        out[i] = &s->table[k];
    }
    s->stats.fetches++;
    s->stats.hits += (uint64_t)(n > 0 ? n : 0);
    return 0;
}

mg_expert_stats mg_expert_store_stats(const mg_expert_store *s) {
    mg_expert_stats z;
    memset(&z, 0, sizeof z);
    return s ? s->stats : z;
}
