/* DeepSeek-V4 KV compressors (dsv4-arch.md §4.4): every window of `ratio` tokens becomes one
 * row, a per-channel softmax-gated sum of the tokens' projections, RMS-normed and rotated at the
 * window's first position.  Overlapping (CSA, ratio 4 in Flash) compressors mix the previous
 * window's "A" halves with the current window's "B" halves (2 * ratio slots); HCA windows do
 * not overlap.  The same code serves the lightning indexer's own compressor.
 *
 * State for exact truncation: the emitted rows (a list cut back to t0 / ratio), the open
 * window's pending projections (empty at multiples of the ratio) and, for overlapping
 * compressors, the A halves of the last closed window, snapshotted at every multiple of
 * `snap_every` so that the state at such a position can be restored exactly.  Those snapshots
 * are kept where a rewind can land (dsv4_rows.h): the recent ones in a ring of `ring_len`
 * entries, the older ones only at multiples of `keep_every`. */
#ifndef MG_DSV4_COMPRESS_H
#define MG_DSV4_COMPRESS_H

#include <stdint.h>
#include "core/matrix.h"
#include "core/status.h"
#include "model/blocks.h"

typedef struct dsv4_compressor {
    int ratio, dim, overlap;  /* rows are `dim` wide; projections are (overlap ? 2 : 1) * dim */
    int64_t snap_every;       /* a multiple of ratio */
    int64_t keep_every;       /* a multiple of snap_every: snapshots kept for good (set before init) */
    int64_t ring_len;         /* recent snapshots held (set before init) */
    mg_matrix wkv, wgate;     /* [width, d] */
    float *ape;               /* [ratio, width], added to the gate of the token at slot p % ratio */
    float *norm;              /* [dim] */
    const mg_rope *rope;      /* rotates the last rope dims of a row (rot_off = dim - rope_dim) */
    float eps;
    /* live state */
    float *pend_kv, *pend_gate;  /* [ratio, width] */
    float *prev_kv, *prev_gate;  /* [ratio, dim]: A halves of the last closed window (overlap) */
    int has_prev;
    mg_kv_type row_type;         /* storage of the emitted rows (set before init) */
    void *rows;                  /* [cap_rows, dim] values of row_type */
    int64_t n_rows, cap_rows;
    float *row_f32;              /* [dim]: the row being closed, before it is stored */
    float *snaps;                /* [cap_snaps, 2 * ratio * dim]: prev at positions j * keep_every */
    int64_t cap_snaps;
    float *ring_snaps;           /* [ring_len, 2 * ratio * dim]: prev at k * snap_every in slot k % ring_len */
    float *slot_w;               /* [2 * ratio] scratch */
} dsv4_compressor;

/* Allocates the state (weights must already be bound). */
int dsv4_comp_init(dsv4_compressor *c, mg_error *err);
/* Makes room for every row and snapshot up to position max_pos now (a budgeted model: the
 * arrays never grow by copying later; pages stay unresident until written). */
int dsv4_comp_reserve(dsv4_compressor *c, int64_t max_pos, mg_error *err);
/* Bytes the state adds per position (rows and kept snapshots), rounded up, and once (the ring). */
uint64_t dsv4_comp_bytes_per_pos(int ratio, int dim, int overlap, int64_t keep_every, mg_kv_type row_type);
uint64_t dsv4_comp_fixed_bytes(int ratio, int dim, int overlap, int64_t ring_len);
/* Row r of the emitted rows as fp32 (the row itself for f32, else converted into tmp[dim]). */
static inline const float *dsv4_comp_row(const dsv4_compressor *c, int64_t r, float *tmp) {
    return mg_kv_get(c->row_type, c->rows, r * c->dim, c->dim, tmp);
}
void dsv4_comp_free(dsv4_compressor *c);

/* Feeds the projections of the token at position p (kv, gate: `width` floats each, gate without
 * ape).  Closes the window when (p + 1) % ratio == 0 and appends its row. */
int dsv4_comp_push(dsv4_compressor *c, const float *kv, const float *gate, int64_t p, mg_error *err);

/* Restores the state as of position t0 (a multiple of snap_every, <= the current position,
 * either a multiple of keep_every or recent enough for the ring: dsv4_rows_rewind's choice). */
void dsv4_comp_rewind(dsv4_compressor *c, int64_t t0);

/* Reports what positions [0, n) left: the emitted rows and, for overlapping compressors, the
 * kept snapshots up to position n and the one at `tail_at` (with `reserve`, room is made
 * first).  Enough for dsv4_comp_rewind to tail_at, or to a multiple of keep_every <= n, after
 * the regions are written back. */
int dsv4_comp_regions(dsv4_compressor *c, int64_t n, int64_t tail_at, int reserve,
                      int (*fn)(void *, void *, uint64_t), void *ctx, mg_error *err);

#endif
