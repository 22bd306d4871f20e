/* prefill_avx2.c's fp32 tiles, shared with prefill_avx512.c (which includes this, not avx2.h:
 * the two instruction sets' helper headers define the same helper names). */
#ifndef MG_KERNELS_PREFILL_TILE_H
#define MG_KERNELS_PREFILL_TILE_H

#include <stdint.h>
#include "core/matrix.h"

/* prefill_avx2.c's tiles: rows [r, r + nr) (nr <= MG_PREFILL_TILE_ROWS) x columns [c0, c0 + kc) (c0 a multiple of
 * MG_PREFILL_TILE_COLS, kc <= it) of w dequantised exactly, column-major (tile[c * 16 + i] is row
 * r + i, column c0 + c), F32_ROW row scales left out; lanes past nr hold values no output reads.
 * prefill_avx512.c runs its wider micro-kernel over the same tiles, so both tables sum each
 * (row, token) in the same order. */
enum { MG_PREFILL_TILE_ROWS = 16, MG_PREFILL_TILE_COLS = 512 };
void mg_avx2_prefill_tile(const mg_matrix *w, int64_t r, int64_t nr, int64_t c0, int64_t kc, float *tile);

#endif
