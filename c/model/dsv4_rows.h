/* DeepSeek-V4's sliding-window K=V rows (docs/reference/dsv4-arch.md §4.3).
 *
 * Attention at position p reads only the rows of positions [p - W + 1, p]; older positions
 * reach it through the compressed rows (dsv4_compress.h).  So the slot keeps a ring of the last
 * `ring` positions per layer, not every position's row: at Flash's geometry a row is 44 KiB per
 * position over the 43 layers, 5.8 GB at a 128k-token context, against 180 MB for the ring.
 *
 * Exact rewinds stay exact.  truncate(n) replays from a point s <= n whose W preceding rows are
 * at hand (the compressors restore exactly at multiples of snap_every):
 *   - the last multiple of snap_every <= n when its rows are still in the ring: a rewind of up
 *     to ring - W - snap_every positions (about 3,800 at Flash's) replays < snap_every tokens,
 *     as every rewind did when all rows were kept;
 *   - otherwise the last multiple of `period` <= n, whose W rows were copied to a snapshot when
 *     they were written: a deep rewind replays < period + snap_every tokens.
 * Chat turns rewind near the end of the last answer (the ring's case); a different
 * conversation sharing only a system prompt rewinds deep, and replays at most `period`.
 *
 * Prefix snapshots (arch.h prefix_regions) carry the row snapshots up to n and a tail: the W rows
 * before the replay point truncate(n) would pick now, with that point. */
#ifndef MG_DSV4_ROWS_H
#define MG_DSV4_ROWS_H

#include <stdint.h>
#include "core/status.h"
#include "model/arch.h"
#include "model/blocks.h"

/* ring = max(RING_WINDOWS * W, W + the longest write at once); period = SNAP_WINDOWS * W rounded
 * up to snap_every.  At Flash's W = 128: a 4,096-position ring (176 MiB in bf16) and a snapshot
 * of 5.5 MiB every 1,024 positions (5.5 KiB per position; the compressed state is 7 KiB). */
#define DSV4_RING_WINDOWS 32
#define DSV4_SNAP_WINDOWS 8

typedef struct dsv4_rows {
    int n_layers;
    int64_t dim, window;     /* row width, W */
    int64_t ring, period, snap_every, max_pos;
    mg_kv_type type;
    void *ring_rows;         /* [n_layers][ring][dim]: position p in slot p % ring */
    void *snaps;             /* [cap_snaps][n_layers][W][dim]: snapshot k holds [(k+1)P - W, (k+1)P) */
    int64_t cap_snaps;
    int64_t lo, hi;          /* the ring holds the rows of positions [lo, hi) */
    int64_t tail_at;         /* a prefix snapshot's replay point, read back during a restore */
} dsv4_rows;

/* The ring's positions and the snapshot period for these sizes (what init picks). */
int64_t dsv4_rows_ring_len(int64_t window, int64_t max_write);
int64_t dsv4_rows_period(int64_t window, int64_t snap_every);

/* max_write: the most positions one eval writes per layer between attention reads (a sub-chunk). */
int dsv4_rows_init(dsv4_rows *r, int n_layers, int64_t dim, int64_t window, int64_t max_write,
                   int64_t snap_every, int64_t max_pos, mg_kv_type type, mg_error *err);
void dsv4_rows_free(dsv4_rows *r);
/* Room for the snapshots of positions up to max_pos now (a budgeted slot never grows later). */
int dsv4_rows_reserve(dsv4_rows *r, int64_t max_pos, mg_error *err);
/* What the slot pays: once (the ring) and per position of context (its share of a snapshot). */
uint64_t dsv4_rows_fixed_bytes(int n_layers, int64_t dim, int64_t window, int64_t max_write, mg_kv_type type);
uint64_t dsv4_rows_bytes_per_pos(int n_layers, int64_t dim, int64_t window, int64_t snap_every, mg_kv_type type);

/* Positions [pos, pos + n) are written next (pos is the end of the held context). */
int dsv4_rows_begin(dsv4_rows *r, int64_t pos, int64_t n, mg_error *err);
/* Stores the rows of positions [pos, pos + n) of one layer (n <= max_write at once). */
void dsv4_rows_store(dsv4_rows *r, int layer, int64_t pos, int64_t n, const float *rows);
/* Position p's row of `layer` as fp32 (the row itself for f32, else converted into tmp[dim]);
 * p must be in [hi - ring, hi) and written. */
static inline const float *dsv4_rows_get(const dsv4_rows *r, int layer, int64_t p, float *tmp) {
    const int64_t off = ((int64_t)layer * r->ring + p % r->ring) * r->dim;
    return mg_kv_get(r->type, r->ring_rows, off, r->dim, tmp);
}

/* Cuts the held context to n positions: returns the replay point s (<= n) from which the caller
 * re-evaluates [s, n), after the ring was made to hold the W rows before s. */
int64_t dsv4_rows_rewind(dsv4_rows *r, int64_t n);
/* Walks what a prefix snapshot of [0, n) needs (see the header comment).  With `reserve` this
 * is a restore: room is made first, and the tail lands in the ring. */
int dsv4_rows_regions(dsv4_rows *r, int64_t n, int reserve, mg_region_fn fn, void *ctx, mg_error *err);

#endif
