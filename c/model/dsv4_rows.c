#include "model/dsv4_rows.h"

#include <stdlib.h>
#include <string.h>

int64_t dsv4_rows_ring_len(int64_t window, int64_t max_write) {
    const int64_t want = DSV4_RING_WINDOWS * window, least = window + max_write;
    return want > least ? want : least;
}

int64_t dsv4_rows_period(int64_t window, int64_t snap_every) {
    const int64_t want = DSV4_SNAP_WINDOWS * window;
    return (want + snap_every - 1) / snap_every * snap_every;
}

static int64_t wrap(int64_t p, int64_t ring) { return ((p % ring) + ring) % ring; }

/* Bytes of one snapshot (every layer's W rows) and of one layer's share of it. */
static uint64_t layer_rows_bytes(const dsv4_rows *r) {
    return (uint64_t)r->window * (uint64_t)r->dim * mg_kv_type_bytes(r->type);
}
static uint64_t snap_bytes(const dsv4_rows *r) { return (uint64_t)r->n_layers * layer_rows_bytes(r); }

uint64_t dsv4_rows_fixed_bytes(int n_layers, int64_t dim, int64_t window, int64_t max_write, mg_kv_type type) {
    return (uint64_t)n_layers * (uint64_t)dsv4_rows_ring_len(window, max_write) * (uint64_t)dim * mg_kv_type_bytes(type);
}

uint64_t dsv4_rows_bytes_per_pos(int n_layers, int64_t dim, int64_t window, int64_t snap_every, mg_kv_type type) {
    const uint64_t snap = (uint64_t)n_layers * (uint64_t)window * (uint64_t)dim * mg_kv_type_bytes(type);
    const uint64_t period = (uint64_t)dsv4_rows_period(window, snap_every);
    return (snap + period - 1) / period;
}

int dsv4_rows_init(dsv4_rows *r, int n_layers, int64_t dim, int64_t window, int64_t max_write,
                   int64_t snap_every, int64_t max_pos, mg_kv_type type, mg_error *err) {
    memset(r, 0, sizeof *r);
    if (n_layers <= 0 || dim <= 0 || window <= 0 || max_write <= 0 || snap_every <= 0)
        return mg_fail(err, "internal: window rows of %d layers x %lld, W %lld", n_layers, (long long)dim,
                       (long long)window);
    r->n_layers = n_layers;
    r->dim = dim;
    r->window = window;
    r->ring = dsv4_rows_ring_len(window, max_write);
    r->period = dsv4_rows_period(window, snap_every);
    r->snap_every = snap_every;
    r->max_pos = max_pos;
    r->type = type;
    /* calloc: pages become resident as positions are written */
    r->ring_rows = calloc((size_t)n_layers * (size_t)r->ring * (size_t)dim, mg_kv_type_bytes(type));
    if (!r->ring_rows) return mg_fail(err, "out of memory (window rows)");
    return 0;
}

void dsv4_rows_free(dsv4_rows *r) {
    free(r->ring_rows);
    free(r->snaps);
    memset(r, 0, sizeof *r);
}

int dsv4_rows_reserve(dsv4_rows *r, int64_t max_pos, mg_error *err) {
    const int64_t want = max_pos / r->period;
    if (want <= r->cap_snaps) return 0;
    int64_t cap = r->cap_snaps ? r->cap_snaps : 4;
    while (cap < want) cap *= 2;
    const int64_t limit = r->max_pos / r->period;
    if (cap > limit) cap = limit > want ? limit : want;
    void *p = realloc(r->snaps, (size_t)cap * (size_t)snap_bytes(r));
    if (!p) return mg_fail(err, "out of memory (window row snapshots for %lld positions)", (long long)max_pos);
    r->snaps = p;
    r->cap_snaps = cap;
    return 0;
}

int dsv4_rows_begin(dsv4_rows *r, int64_t pos, int64_t n, mg_error *err) {
    if (pos != r->hi)
        return mg_fail(err, "internal: window rows written at %lld, the context ends at %lld", (long long)pos,
                       (long long)r->hi);
    if (pos + n > r->max_pos)
        return mg_fail(err, "context of %lld positions exceeds the cache limit of %lld", (long long)(pos + n),
                       (long long)r->max_pos);
    if (dsv4_rows_reserve(r, pos + n, err)) return -1;
    r->hi = pos + n;
    if (r->hi - r->ring > r->lo) r->lo = r->hi - r->ring;
    return 0;
}

static void *snap_rows(const dsv4_rows *r, int64_t k, int layer) {
    return (char *)r->snaps + (uint64_t)k * snap_bytes(r) + (uint64_t)layer * layer_rows_bytes(r);
}

void dsv4_rows_store(dsv4_rows *r, int layer, int64_t pos, int64_t n, const float *rows) {
    const int64_t D = r->dim, W = r->window, P = r->period;
    for (int64_t t = 0; t < n; t++) {
        const int64_t p = pos + t;
        mg_kv_put(r->type, r->ring_rows, ((int64_t)layer * r->ring + p % r->ring) * D, rows + t * D, D);
        const int64_t k = p / P, at = p % P - (P - W); /* snapshot k holds [(k+1)P - W, (k+1)P) */
        if (at >= 0 && k < r->cap_snaps) mg_kv_put(r->type, snap_rows(r, k, layer), at * D, rows + t * D, D);
    }
}

/* The replay point truncate(n) would use now, and whether the ring already holds its rows. */
static int64_t replay_point(const dsv4_rows *r, int64_t n, int *in_ring) {
    const int64_t t0 = n / r->snap_every * r->snap_every;
    const int64_t need = t0 > r->window ? t0 - r->window : 0;
    *in_ring = t0 <= r->hi && need >= r->lo;
    return *in_ring ? t0 : n / r->period * r->period;
}

/* Ring slots of one layer for positions [at - W, at): (up to) two runs, walked in order. */
static int walk_ring_tail(dsv4_rows *r, int layer, int64_t at, mg_region_fn fn, void *ctx) {
    const size_t es = mg_kv_type_bytes(r->type);
    const int64_t W = r->window, start = wrap(at - W, r->ring);
    const int64_t first = r->ring - start < W ? r->ring - start : W;
    char *base = (char *)r->ring_rows + (size_t)layer * (size_t)r->ring * (size_t)r->dim * es;
    int rc = fn(ctx, base + (size_t)start * (size_t)r->dim * es, (uint64_t)first * (uint64_t)r->dim * es);
    if (rc || first == W) return rc;
    return fn(ctx, base, (uint64_t)(W - first) * (uint64_t)r->dim * es);
}

/* Copies one memory run into the next bytes of the ring tail being restored (mg_region_fn). */
typedef struct run_copy {
    const char *from;
} run_copy;

static int copy_run(void *ctx, void *ptr, uint64_t bytes) {
    run_copy *c = ctx;
    memcpy(ptr, c->from, (size_t)bytes);
    c->from += bytes;
    return 0;
}

int64_t dsv4_rows_rewind(dsv4_rows *r, int64_t n) {
    int in_ring;
    const int64_t s = replay_point(r, n, &in_ring);
    if (in_ring) {
        r->hi = s;
        return s;
    }
    if (s > 0) { /* the snapshot's rows go back into the ring: the replay reads them there */
        for (int l = 0; l < r->n_layers; l++) {
            run_copy c = {snap_rows(r, s / r->period - 1, l)};
            walk_ring_tail(r, l, s, copy_run, &c);
        }
    }
    r->lo = s > r->window ? s - r->window : 0;
    r->hi = s;
    return s;
}

int dsv4_rows_regions(dsv4_rows *r, int64_t n, int reserve, mg_region_fn fn, void *ctx, mg_error *err) {
    if (reserve && dsv4_rows_reserve(r, n, err)) return -1;
    const int64_t k_n = n / r->period;
    if (k_n > r->cap_snaps) return mg_fail(err, "window rows: %lld positions asked, fewer held", (long long)n);
    int rc = fn(ctx, r->snaps, (uint64_t)k_n * snap_bytes(r));
    if (rc) return rc;
    int in_ring = 1;
    if (!reserve) r->tail_at = replay_point(r, n, &in_ring);
    if ((rc = fn(ctx, &r->tail_at, sizeof r->tail_at))) return rc;
    const int64_t at = r->tail_at;
    if (reserve && (at < k_n * r->period || at > n || at % r->snap_every))
        return mg_fail(err, "prefix snapshot: a window-row tail at position %lld does not fit %lld positions",
                       (long long)at, (long long)n);
    for (int l = 0; l < r->n_layers; l++) {
        if (!in_ring && at > 0) rc = fn(ctx, snap_rows(r, at / r->period - 1, l), layer_rows_bytes(r));
        else rc = walk_ring_tail(r, l, at, fn, ctx);
        if (rc) return rc;
    }
    if (reserve) {
        r->lo = at > r->window ? at - r->window : 0;
        r->hi = at;
    }
    return 0;
}
