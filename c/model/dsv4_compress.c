/* Compressor windows (see dsv4_compress.h); follows transformers' DeepseekV4{CSA,HCA}Compressor
 * and DeepseekV4Indexer compressor maths token by token. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "model/dsv4_compress.h"

static int64_t width_of(const dsv4_compressor *c) { return (int64_t)(c->overlap ? 2 : 1) * c->dim; }
static int grow_snaps(dsv4_compressor *c, int64_t need, int exact, mg_error *err);

int dsv4_comp_init(dsv4_compressor *c, mg_error *err) {
    const int64_t w = width_of(c);
    c->pend_kv = calloc((size_t)(c->ratio * w), sizeof(float));
    c->pend_gate = calloc((size_t)(c->ratio * w), sizeof(float));
    c->prev_kv = calloc((size_t)(c->ratio * c->dim), sizeof(float));
    c->prev_gate = calloc((size_t)(c->ratio * c->dim), sizeof(float));
    c->slot_w = calloc((size_t)(2 * c->ratio), sizeof(float));
    c->row_f32 = calloc((size_t)c->dim, sizeof(float));
    if (c->overlap && (c->keep_every <= 0 || c->keep_every % c->snap_every || c->ring_len < 2))
        return mg_fail(err, "internal: compressor snapshots every %lld kept, ring of %lld",
                       (long long)c->keep_every, (long long)c->ring_len);
    c->ring_snaps = c->overlap ? calloc((size_t)(c->ring_len * 2 * c->ratio * c->dim), sizeof(float)) : NULL;
    if (!c->pend_kv || !c->pend_gate || !c->prev_kv || !c->prev_gate || !c->slot_w || !c->row_f32 ||
        (c->overlap && !c->ring_snaps))
        return mg_fail(err, "out of memory (compressor state)");
    if (c->overlap && grow_snaps(c, 1, 0, err)) return -1; /* entry 0: position 0 (no carry), never read */
    return 0;
}

void dsv4_comp_free(dsv4_compressor *c) {
    free(c->pend_kv); free(c->pend_gate); free(c->prev_kv); free(c->prev_gate);
    free(c->rows); free(c->snaps); free(c->ring_snaps); free(c->slot_w); free(c->row_f32);
    free(c->ape); free(c->norm);
    memset(c, 0, sizeof *c);
}

/* Grows *p to hold `need` rows of `row_bytes` (doubling), or to exactly `need` when exact. */
static int grow(void **p, int64_t *cap, int64_t need, size_t row_bytes, int exact, mg_error *err) {
    if (need <= *cap) return 0;
    int64_t n = exact ? need : *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *q = realloc(*p, (size_t)n * row_bytes);
    if (!q) return mg_fail(err, "out of memory (compressed rows)");
    *p = q;
    *cap = n;
    return 0;
}

static int grow_snaps(dsv4_compressor *c, int64_t need, int exact, mg_error *err) {
    void *p = c->snaps; /* through a void * object: no float ** / void ** aliasing */
    int rc = grow(&p, &c->cap_snaps, need, 2 * (size_t)c->ratio * (size_t)c->dim * sizeof(float), exact, err);
    c->snaps = p;
    return rc;
}

int dsv4_comp_reserve(dsv4_compressor *c, int64_t max_pos, mg_error *err) {
    if (grow(&c->rows, &c->cap_rows, max_pos / c->ratio + 1, (size_t)c->dim * mg_kv_type_bytes(c->row_type), 1,
             err))
        return -1;
    if (!c->overlap) return 0;
    return grow_snaps(c, max_pos / c->keep_every + 1, 1, err);
}

static uint64_t snap_floats(int ratio, int dim) { return 2 * (uint64_t)ratio * (uint64_t)dim; }

uint64_t dsv4_comp_bytes_per_pos(int ratio, int dim, int overlap, int64_t keep_every, mg_kv_type row_type) {
    uint64_t rows = ((uint64_t)dim * mg_kv_type_bytes(row_type) + (uint64_t)ratio - 1) / (uint64_t)ratio;
    uint64_t snaps = overlap ? (snap_floats(ratio, dim) * sizeof(float) + (uint64_t)keep_every - 1) /
                                   (uint64_t)keep_every
                             : 0;
    return rows + snaps;
}

uint64_t dsv4_comp_fixed_bytes(int ratio, int dim, int overlap, int64_t ring_len) {
    return overlap ? (uint64_t)ring_len * snap_floats(ratio, dim) * sizeof(float) : 0;
}

/* Where the snapshot of position t (a multiple of snap_every) lives: kept, or in the ring. */
static float *snap_at(const dsv4_compressor *c, int64_t t) {
    const int64_t sz = (int64_t)snap_floats(c->ratio, c->dim);
    if (t % c->keep_every == 0) return c->snaps + (t / c->keep_every) * sz;
    return c->ring_snaps + ((t / c->snap_every) % c->ring_len) * sz;
}

/* Row of the window that token p closes: per channel, softmax over the slots' gates. */
static void close_window(dsv4_compressor *c, int64_t p, float *row) {
    const int r = c->ratio, D = c->dim;
    const int64_t w = width_of(c);
    const int n_prev = c->overlap && c->has_prev ? r : 0;
    for (int ch = 0; ch < D; ch++) {
        float top = -INFINITY;
        float *sw = c->slot_w;
        int n = 0;
        /* slots: A halves of the previous window (overlap), then this window (B halves) */
        for (int s = 0; s < n_prev; s++) sw[n++] = c->prev_gate[s * D + ch];
        const int64_t off = c->overlap ? D : 0;
        for (int s = 0; s < r; s++) sw[n++] = c->pend_gate[s * w + off + ch];
        for (int i = 0; i < n; i++) top = sw[i] > top ? sw[i] : top;
        float sum = 0.0f;
        for (int i = 0; i < n; i++) { sw[i] = expf(sw[i] - top); sum += sw[i]; }
        float acc = 0.0f;
        int i = 0;
        for (int s = 0; s < n_prev; s++, i++) acc += c->prev_kv[s * D + ch] * (sw[i] / sum);
        for (int s = 0; s < r; s++, i++) acc += c->pend_kv[s * w + off + ch] * (sw[i] / sum);
        row[ch] = acc;
    }
    /* RMSNorm with weight, then RoPE at the window's first position */
    double ss = 0.0;
    for (int ch = 0; ch < D; ch++) ss += (double)row[ch] * row[ch];
    float inv = 1.0f / sqrtf((float)(ss / D) + c->eps);
    for (int ch = 0; ch < D; ch++) row[ch] = c->norm[ch] * (row[ch] * inv);
    if (c->rope && c->rope->half > 0) {
        float cs[256], sn[256];
        int64_t first = p + 1 - r;
        mg_rope_table(c->rope, first, 1, cs, sn);
        mg_rope_rows(c->rope, row, 1, D, 1, D, cs, sn, 0);
    }
}

int dsv4_comp_push(dsv4_compressor *c, const float *kv, const float *gate, int64_t p, mg_error *err) {
    const int r = c->ratio, D = c->dim;
    const int64_t w = width_of(c);
    const int slot = (int)(p % r);
    memcpy(c->pend_kv + slot * w, kv, sizeof(float) * (size_t)w);
    for (int64_t i = 0; i < w; i++) c->pend_gate[slot * w + i] = gate[i] + c->ape[slot * w + i];
    if (slot != r - 1) return 0;
    if (grow(&c->rows, &c->cap_rows, c->n_rows + 1, (size_t)D * mg_kv_type_bytes(c->row_type), 0, err)) return -1;
    close_window(c, p, c->row_f32);
    mg_kv_put(c->row_type, c->rows, c->n_rows * D, c->row_f32, D);
    c->n_rows++;
    if (c->overlap) {
        for (int s = 0; s < r; s++) {
            memcpy(c->prev_kv + s * D, c->pend_kv + s * w, sizeof(float) * (size_t)D);
            memcpy(c->prev_gate + s * D, c->pend_gate + s * w, sizeof(float) * (size_t)D);
        }
        c->has_prev = 1;
        if ((p + 1) % c->snap_every == 0) {
            if ((p + 1) % c->keep_every == 0 && grow_snaps(c, (p + 1) / c->keep_every + 1, 0, err)) return -1;
            float *snap = snap_at(c, p + 1);
            memcpy(snap, c->prev_kv, sizeof(float) * (size_t)(r * D));
            memcpy(snap + r * D, c->prev_gate, sizeof(float) * (size_t)(r * D));
        }
    }
    return 0;
}

void dsv4_comp_rewind(dsv4_compressor *c, int64_t t0) {
    const int r = c->ratio, D = c->dim;
    c->n_rows = t0 / r;
    if (!c->overlap) return;
    c->has_prev = t0 > 0;
    if (t0 > 0) {
        const float *snap = snap_at(c, t0);
        memcpy(c->prev_kv, snap, sizeof(float) * (size_t)(r * D));
        memcpy(c->prev_gate, snap + r * D, sizeof(float) * (size_t)(r * D));
    }
}

int dsv4_comp_regions(dsv4_compressor *c, int64_t n, int64_t tail_at, int reserve,
                      int (*fn)(void *, void *, uint64_t), void *ctx, mg_error *err) {
    if (reserve && dsv4_comp_reserve(c, n, err)) return -1;
    const int64_t rows = n / c->ratio, snaps = c->overlap ? n / c->keep_every + 1 : 0;
    if (rows > c->cap_rows || snaps > c->cap_snaps)
        return mg_fail(err, "compressor: %lld positions asked, fewer held", (long long)n);
    int rc = fn(ctx, c->rows, (uint64_t)rows * (uint64_t)c->dim * mg_kv_type_bytes(c->row_type));
    if (rc || !snaps) return rc;
    const uint64_t snap_bytes = snap_floats(c->ratio, c->dim) * sizeof(float);
    if ((rc = fn(ctx, c->snaps, (uint64_t)snaps * snap_bytes))) return rc;
    /* the tail's snapshot (a multiple of keep_every: already among the kept ones, sent again) */
    return fn(ctx, snap_at(c, tail_at), snap_bytes);
}
