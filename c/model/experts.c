/* The expert store: the (layer, expert) table, argument checks, the routing trace, and the
 * switch between resident mode (descriptors into the mapped checkpoint; every fetch is a hit)
 * and cache mode (expert_cache.c).
 *
 * Routing trace file (little-endian), read by tools/routing_trace.py:
 *   "MGRTRACE"  u32 version (3)  u32 n_layers  u32 n_experts  u32 reserved (0)
 *   then one record per fetch:  u16 layer  u16 n  u16 ids[n]  u16 n_scores  f32 scores[n_scores]
 *                               u16 n_hint  [u16 hint_layer  u16 hint_ids[n_hint]]
 *   n_scores is n_experts when the fetch came with the router's scores (the values its top-k
 *   ranked, for the batch's last token), else 0.  The hint is the last one given
 *   (mg_expert_store_hint) since the previous record, best first; n_hint 0: none.  Version 1
 *   had no scores or hints, version 2 no hints. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "model/experts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/expert_cache.h"

struct mg_expert_store {
    int n_layers, n_experts;
    mg_expert *table;   /* [n_layers * n_experts] */
    unsigned char *set; /* registered? */
    mg_expert_stats stats; /* resident mode */
    mg_expert_cache *cache; /* NULL: resident mode */
    FILE *trace;
    int *hint, hint_n, hint_layer; /* tracing: the hint given since the last record */
    int open_n, open_next; /* resident mode: the batch handed out by fetch_next */
    double compute_seconds, wait_seconds; /* mg_expert_store_note_times, either mode */
};

mg_expert_store *mg_expert_store_create(int n_layers, int n_experts, mg_error *err) {
    if (n_layers <= 0 || n_experts <= 0 || n_layers > 65535 || n_experts > 65535 ||
        (size_t)n_layers > SIZE_MAX / sizeof(mg_expert) / (size_t)n_experts) {
        mg_fail(err, "expert store: invalid size %d layers x %d experts", n_layers, n_experts);
        return NULL;
    }
    size_t n = (size_t)n_layers * (size_t)n_experts;
    mg_expert_store *s = calloc(1, sizeof *s);
    if (s) {
        s->table = calloc(n, sizeof *s->table);
        s->set = calloc(n, 1);
        s->hint = malloc(sizeof(int) * (size_t)n_experts);
    }
    if (!s || !s->table || !s->set || !s->hint) {
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
    if (s->cache) {
        mg_expert_stats st;
        memset(&st, 0, sizeof st);
        mg_expert_cache_stats(s->cache, &st);
        if (st.fetches) mg_expert_cache_save_usage(s->cache, NULL); /* best effort: only a hint */
    }
    mg_expert_cache_free(s->cache);
    if (s->trace) fclose(s->trace);
    free(s->hint);
    free(s->table);
    free(s->set);
    free(s);
}

void mg_expert_store_set(mg_expert_store *s, int layer, int e, const mg_expert *x) {
    if (!s || !x || s->cache || layer < 0 || layer >= s->n_layers || e < 0 || e >= s->n_experts) return;
    size_t i = (size_t)layer * (size_t)s->n_experts + (size_t)e;
    s->table[i] = *x;
    s->set[i] = 1;
}

static int check_batch(const mg_expert_store *s, int layer, int n, const int *ids, mg_error *err) {
    if (!s || layer < 0 || layer >= s->n_layers)
        return mg_fail(err, "expert store: layer %d out of range", layer);
    if (n < 0 || (n > 0 && !ids)) return mg_fail(err, "expert store: layer %d: invalid batch of %d", layer, n);
    for (int i = 0; i < n; i++) {
        int e = ids[i];
        if (e < 0 || e >= s->n_experts)
            return mg_fail(err, "expert store: layer %d: expert %d out of range [0, %d)", layer, e,
                           s->n_experts);
        if (!s->set[(size_t)layer * (size_t)s->n_experts + (size_t)e])
            return mg_fail(err, "expert store: layer %d: expert %d was never registered", layer, e);
    }
    return 0;
}

static void trace_record(mg_expert_store *s, int layer, int n, const int *ids, const float *scores) {
    uint16_t head[2] = {(uint16_t)layer, (uint16_t)n};
    int ok = fwrite(head, sizeof head, 1, s->trace) == 1;
    for (int i = 0; i < n && ok; i++) {
        uint16_t e = (uint16_t)ids[i];
        ok = fwrite(&e, sizeof e, 1, s->trace) == 1;
    }
    uint16_t n_scores = scores ? (uint16_t)s->n_experts : 0;
    ok = ok && fwrite(&n_scores, sizeof n_scores, 1, s->trace) == 1;
    if (ok && n_scores) ok = fwrite(scores, sizeof(float), n_scores, s->trace) == n_scores;
    uint16_t n_hint = (uint16_t)s->hint_n, hint_layer = (uint16_t)s->hint_layer;
    ok = ok && fwrite(&n_hint, sizeof n_hint, 1, s->trace) == 1;
    if (ok && n_hint) ok = fwrite(&hint_layer, sizeof hint_layer, 1, s->trace) == 1;
    for (int i = 0; i < s->hint_n && ok; i++) {
        uint16_t e = (uint16_t)s->hint[i];
        ok = fwrite(&e, sizeof e, 1, s->trace) == 1;
    }
    s->hint_n = 0;
    if (!ok) { /* disk full or similar: stop tracing rather than fail inference */
        fclose(s->trace);
        s->trace = NULL;
    }
}

int mg_expert_store_fetch_begin(mg_expert_store *s, int layer, int n, const int *ids,
                                const mg_expert **out, mg_error *err) {
    return mg_expert_store_fetch_begin_scored(s, layer, n, ids, NULL, out, err);
}

int mg_expert_store_fetch_begin_scored(mg_expert_store *s, int layer, int n, const int *ids,
                                       const float *scores, const mg_expert **out, mg_error *err) {
    if (check_batch(s, layer, n, ids, err)) return -1;
    if (s->trace) trace_record(s, layer, n, ids, scores);
    if (s->cache) return mg_expert_cache_begin(s->cache, layer, n, ids, out, err);
    for (int i = 0; i < n; i++) out[i] = &s->table[(size_t)layer * (size_t)s->n_experts + (size_t)ids[i]];
    s->stats.fetches++;
    s->stats.hits += (uint64_t)n;
    s->open_n = n;
    s->open_next = 0;
    return 0;
}

int mg_expert_store_wants_scores(const mg_expert_store *s) { return s && s->trace; }

int mg_expert_store_fetch_next(mg_expert_store *s, mg_error *err) {
    if (!s) return -1;
    if (s->cache) return mg_expert_cache_next(s->cache, err);
    return s->open_next < s->open_n ? s->open_next++ : -1;
}

int mg_expert_store_fetch_poll(mg_expert_store *s, mg_error *err) {
    if (!s) return -1;
    if (s->cache) return mg_expert_cache_poll(s->cache, err);
    return s->open_next < s->open_n ? s->open_next++ : -1;
}

int mg_expert_store_fetch(mg_expert_store *s, int layer, int n, const int *ids,
                          const mg_expert **out, mg_error *err) {
    if (mg_expert_store_fetch_begin(s, layer, n, ids, out, err)) return -1;
    int r;
    while ((r = mg_expert_store_fetch_next(s, err)) >= 0) {}
    return r == -1 ? 0 : -1;
}

int mg_expert_store_prefetch(mg_expert_store *s, int layer, int n, const int *ids) {
    if (!s || !s->cache || layer < 0 || layer >= s->n_layers || n <= 0 || !ids) return 0;
    return mg_expert_cache_prefetch(s->cache, layer, n, ids);
}

mg_expert_stats mg_expert_store_stats(const mg_expert_store *s) {
    mg_expert_stats z;
    memset(&z, 0, sizeof z);
    if (!s) return z;
    if (!s->cache) z = s->stats;
    else mg_expert_cache_stats(s->cache, &z);
    z.compute_seconds = s->compute_seconds;
    z.wait_seconds = s->wait_seconds;
    return z;
}

void mg_expert_store_note_times(mg_expert_store *s, double compute_seconds, double wait_seconds) {
    if (!s) return;
    s->compute_seconds += compute_seconds;
    s->wait_seconds += wait_seconds;
}

/* ---- cache mode ----------------------------------------------------------------------- */

uint64_t mg_expert_store_expert_bytes(const mg_expert_store *s) {
    if (!s) return 0;
    uint64_t total = 0;
    size_t n = (size_t)s->n_layers * (size_t)s->n_experts;
    for (size_t i = 0; i < n; i++)
        if (s->set[i])
            total += mg_matrix_bytes(&s->table[i].gate) + mg_matrix_bytes(&s->table[i].up) +
                     mg_matrix_bytes(&s->table[i].down);
    return total;
}

uint64_t mg_expert_store_slot_bytes(const mg_expert_store *s, const mg_checkpoint *ck, mg_error *err) {
    uint64_t slot = 0, unbacked = 0;
    int n_reg = 0;
    if (!s || !ck) {
        mg_fail(err, "expert store: no store or checkpoint");
        return 0;
    }
    if (mg_expert_cache_measure(ck, s->table, s->set, s->n_layers, s->n_experts, &slot, &unbacked, &n_reg, err))
        return 0;
    if (!slot) mg_fail(err, "expert store: no registered expert has bytes in the checkpoint's files");
    return slot;
}

/* The process's resident set now (interpreter, libraries, what was touched so far). */
static uint64_t current_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, resident = 0;
    if (!f) return 0;
    int ok = fscanf(f, "%llu %llu", &size, &resident) == 2;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return ok && page > 0 ? (uint64_t)resident * (uint64_t)page : 0;
}

int mg_expert_store_plan(const mg_expert_store *s, const mg_checkpoint *ck, uint64_t ram_bytes,
                         uint64_t other_bytes, uint64_t *cache_bytes, mg_error *err) {
    if (!s || !ck || !cache_bytes) return mg_fail(err, "expert store: plan needs a store and a checkpoint");
    uint64_t slot = 0, unbacked = 0;
    int n_reg = 0;
    if (mg_expert_cache_measure(ck, s->table, s->set, s->n_layers, s->n_experts, &slot, &unbacked, &n_reg, err))
        return -1;
    if (!n_reg || !slot) return mg_fail(err, "expert store: no registered expert has bytes in the checkpoint's files");
    int min_slots = s->n_experts < n_reg ? s->n_experts : n_reg;
    int n_keys = s->n_layers * s->n_experts;
    uint64_t process = current_rss_bytes();
    /* tables for the largest useful cache: a conservative (slightly high) count */
    uint64_t max_slots = ram_bytes / slot < (uint64_t)n_reg ? ram_bytes / slot : (uint64_t)n_reg;
    uint64_t tables = mg_expert_cache_table_bytes(n_keys, max_slots, 4);
    uint64_t fixed = other_bytes + process + tables + unbacked;
    uint64_t min_cache = (uint64_t)min_slots * slot;
    if (ram_bytes < fixed + min_cache) {
        /* The minimum we name must still load when the user (or a test) retries with it, yet the
         * process's RSS drifts between loads (allocator, interpreter, pages touched by the failed
         * attempt): name it with headroom of 2% of the process plus 16 MB. */
        double need = (double)(fixed + min_cache) + 0.02 * (double)process + 16e6;
        return mg_fail(err, "RAM budget %.2f GB is too small: the resident part needs %.2f GB (weights, "
                       "KV cache and buffers %.2f GB, process %.2f GB, expert tables %.2f GB) and the "
                       "expert cache at least %.2f GB (one layer's %d experts x %.2f MB); the minimum "
                       "is %.2f GB",
                       ram_bytes / 1e9, fixed / 1e9, other_bytes / 1e9, process / 1e9,
                       (tables + unbacked) / 1e9, min_cache / 1e9, min_slots, slot / 1e6,
                       (double)((uint64_t)(need / 1e7) + 1) / 100.0);
    }
    uint64_t cache = ram_bytes - fixed;
    if (cache / slot > (uint64_t)n_reg) cache = (uint64_t)n_reg * slot;
    *cache_bytes = cache;
    return 0;
}

int mg_expert_store_configure(mg_expert_store *s, const mg_checkpoint *ck, uint64_t cache_bytes,
                              const mg_expert_cache_opts *opts, mg_error *err) {
    if (!s || !ck) return mg_fail(err, "expert store: configure needs a store and a checkpoint");
    if (s->cache) return mg_fail(err, "expert store: already configured as a cache");
    mg_expert_cache *c = mg_expert_cache_create(ck, s->table, s->set, s->n_layers, s->n_experts, cache_bytes,
                                                opts, err);
    if (!c) return -1;
    s->cache = c;
    return 0;
}

int mg_expert_store_trace(mg_expert_store *s, const char *path, mg_error *err) {
    if (!s) return mg_fail(err, "expert store: no store");
    if (s->trace) {
        fclose(s->trace);
        s->trace = NULL;
    }
    s->hint_n = 0;
    if (!path) return 0;
    FILE *f = fopen(path, "wb");
    if (!f) return mg_fail(err, "expert store: cannot write routing trace %s: %s", path, strerror(errno));
    uint32_t head[4] = {3, (uint32_t)s->n_layers, (uint32_t)s->n_experts, 0};
    if (fwrite("MGRTRACE", 1, 8, f) != 8 || fwrite(head, sizeof head, 1, f) != 1) {
        fclose(f);
        return mg_fail(err, "expert store: cannot write routing trace %s", path);
    }
    s->trace = f;
    return 0;
}

int mg_expert_store_use_history(mg_expert_store *s, const char *path, double pin_fraction, mg_error *err) {
    if (!s) return mg_fail(err, "expert store: no store");
    if (!s->cache || !path) return 0;
    return mg_expert_cache_use_history(s->cache, path, pin_fraction, err);
}

void mg_expert_store_set_prefetch(mg_expert_store *s, int depth) {
    if (s && s->cache) mg_expert_cache_set_prefetch(s->cache, depth);
}

void mg_expert_store_read_ahead(mg_expert_store *s, int layer) {
    if (s && s->cache && layer >= 0 && layer < s->n_layers) mg_expert_cache_read_ahead(s->cache, layer);
}

void mg_expert_store_emulate_disk(mg_expert_store *s, double bytes_per_second) {
    if (s && s->cache) mg_expert_cache_emulate_disk(s->cache, bytes_per_second);
}

int mg_expert_store_wants_hints(const mg_expert_store *s) {
    return s && (s->trace || (s->cache && mg_expert_cache_prefetching(s->cache)));
}

void mg_expert_store_hint(mg_expert_store *s, int layer, int n, const int *ids) {
    if (!s || layer < 0 || layer >= s->n_layers || n <= 0 || !ids) return;
    if (s->trace) {
        int k = 0;
        for (int i = 0; i < n && k < s->n_experts; i++)
            if (ids[i] >= 0 && ids[i] < s->n_experts) s->hint[k++] = ids[i];
        s->hint_n = k;
        s->hint_layer = layer;
    }
    /* only a store that reads ahead acts on hints: tracing alone must not change the cache */
    if (s->cache && mg_expert_cache_prefetching(s->cache)) mg_expert_cache_hint(s->cache, layer, n, ids);
}

