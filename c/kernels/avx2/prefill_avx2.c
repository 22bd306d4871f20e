/* AVX2 prefill (n_tok > 1): a tile of 16 rows x 512 columns is dequantised exactly into an
 * fp32 buffer, column-major (a column is the 16 rows' values: rows go along the vector lanes),
 * and a 16-row x (up to) 6-token micro-kernel runs over it: two tile vectors times one broadcast
 * x value per token, so no horizontal sums, and each (row, token) is a sequential fp32 sum over
 * the chunk's columns, the same whatever the other tokens of the call (outputs do not depend on
 * batching).  The decoding cost is paid once per tile, not per token; row scales are left out of
 * the tile and multiply each output's whole sum instead. */
#include <math.h>
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"
#include "core/ggml_blocks.h"
#include "kernels/avx2/q6_k_codes.h"
#include "kernels/prefetch_rows.h"

/* Rows go along the vector lanes: the tile holds TILE_ROWS rows of TILE_COLS columns
 * column-major (tile[c * TILE_ROWS + i]), so one column is two ymm of 16 row values, and the
 * micro-kernel multiplies them by one broadcast x value per token.  Each (row, token) is then a
 * plain sequential sum over the columns of a chunk (no horizontal sums), its lanes already in
 * output order (y rows are contiguous), and it does not depend on the other tokens. */
enum { TILE_ROWS = MG_PREFILL_TILE_ROWS, TILE_COLS = MG_PREFILL_TILE_COLS, MICRO_TOK = 6 };
/* Formats whose tiles prefetch the next chunk of their rows: a chunk of an fp8 or fp4 row is only
 * two to four cache lines, too short a stream for the hardware prefetcher, and with few tokens per
 * tile (MoE experts) the multiply-adds do not hide the misses.  Wider rows did worse with it. */
#define PREFILL_PREFETCH(f) ((f) == MG_FP4_E2M1 || (f) == MG_FP8_E4M3)

/* r[0..7] (8 rows x 8 columns) to columns: r[k] becomes column k (lane i = row i). */
INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
        r[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
    }
}

/* Scales of the tile, per scale block and row (lanes), applied to transposed columns: sc[k *
 * TILE_ROWS + i] multiplies row i of the k-th scale block of the chunk.  sc holds scale times the
 * format's power-of-two raw factor, which is one multiply equal to the two bit for bit (the factor
 * is exact) unless that product overflows; then (returns 2) sc holds the scale and fc the factor
 * (1 in lanes without overflow) for two multiplies.  Returns 0 when there is nothing to multiply
 * (sc is then not written), 1 for one multiply.  Rows past nr get harmless scales of 1. */
INLINE __m256 e8m0_lanes(__m128i b) { /* 8 e8m0 bytes to fp32, as mg_e8m0_to_f32 */
    const __m256i e = _mm256_cvtepu8_epi32(b);
    __m256i u = _mm256_slli_epi32(e, 23);
    u = _mm256_blendv_epi8(u, _mm256_set1_epi32(0x00400000), _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
    u = _mm256_blendv_epi8(u, _mm256_set1_epi32(0x7fc00000), _mm256_cmpeq_epi32(e, _mm256_set1_epi32(255)));
    return _mm256_castsi256_ps(u);
}

INLINE int tile_scales(const mg_matrix *w, mg_format f, int64_t r, int64_t nr, int64_t c0, int64_t kc,
                       float *sc, float *fc) {
    const float factor = raw_factor(f);
    if (w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_F32_ROW) {
        for (int i = 0; i < 8; i++) sc[i] = factor;
        return factor != 1.0f;
    }
    const int64_t bc = block_cols(w->scale_kind), nb = (kc + bc - 1) / bc;
    int split = 0;
    if (w->scale_kind == MG_SCALE_E8M0_G32) { /* 8 blocks of 16 rows at a time: a vector per row */
        const __m256 vf = _mm256_set1_ps(factor), inf = _mm256_set1_ps(INFINITY);
        const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        for (int64_t k0 = 0; k0 < nb && !split; k0 += 8) {
            const uint8_t *p = (const uint8_t *)w->scale + c0 / 32 + k0;
            const size_t nbytes = (size_t)(nb - k0 < 8 ? nb - k0 : 8);
            float rowsc[TILE_ROWS][8] __attribute__((aligned(32)));
            for (int64_t i = 0; i < TILE_ROWS; i++) {
                uint64_t bytes = 0x7f7f7f7f7f7f7f7full; /* 1.0 */
                if (i < nr) memcpy(&bytes, p + (r + i) * w->scale_cols, nbytes);
                const __m256 sv = e8m0_lanes(_mm_cvtsi64_si128((long long)bytes)), sf = _mm256_mul_ps(sv, vf);
                /* overflow: sf infinite while the scale is finite */
                const __m256 ov = _mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(sf, abs_mask), inf, _CMP_EQ_OQ),
                                                _mm256_cmp_ps(_mm256_and_ps(sv, abs_mask), inf, _CMP_LT_OQ));
                split |= _mm256_movemask_ps(ov);
                _mm256_store_ps(rowsc[i], sf);
            }
            for (int g = 0; g < TILE_ROWS; g += 8) {
                __m256 v[8];
                for (int i = 0; i < 8; i++) v[i] = _mm256_load_ps(rowsc[g + i]);
                transpose8(v);
                for (int64_t k = 0; k < (int64_t)nbytes; k++) _mm256_store_ps(sc + (k0 + k) * TILE_ROWS + g, v[k]);
            }
        }
        if (!split) return 1;
        split = 0; /* rare: redo below lane by lane */
    }
    for (int64_t k = 0; k < nb; k++)
        for (int64_t i = 0; i < TILE_ROWS; i++) {
            const float s = i < nr ? scale_at(w, r + i, c0 + k * bc) : 1.0f, sf = s * factor;
            const int sp = !isfinite(sf) && isfinite(s);
            sc[k * TILE_ROWS + i] = sp ? s : sf;
            fc[k * TILE_ROWS + i] = sp ? factor : 1.0f;
            split |= sp;
        }
    return split ? 2 : 1;
}

/* Columns per dequantisation step: f32 rows are transposed as fp32 (8 columns), the other formats
 * as 16-bit codes (16 columns; fp4: 32), which takes half the shuffles of transposing them after
 * widening. */
INLINE int64_t tile_step(mg_format f) { return f == MG_F32 ? 8 : (f == MG_FP4_E2M1 ? 32 : 16); }

/* 16-bit codes of one tile step of a row in column order, h[0] columns 0..15 (h[1] 16..31 for
 * fp4): bf16 bits for bf16, f16 bits for the others (fp8: the raw f16 of dec_fp8x16, value
 * times 2^-8; fp4: the exact values, as in dec_fp4x32). */
INLINE void dec16_step(mg_format f, const uint8_t *p, __m256i h[2]) {
    if (f == MG_BF16 || f == MG_F16) {
        h[0] = _mm256_loadu_si256((const __m256i *)p);
    } else if (f == MG_FP8_E4M3) {
        const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
        h[0] = _mm256_and_si256(_mm256_slli_epi16(v, 7), _mm256_set1_epi16((short)0xBF80));
    } else {
        const __m128i lut = fp4_f16_lut(), m4 = _mm_set1_epi8(0x0f);
        const __m128i b = _mm_loadu_si128((const __m128i *)p);
        const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, m4));
        const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
        h[0] = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi)), 8);
        h[1] = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_unpackhi_epi8(lo, hi)), 8);
    }
}

/* The first n (< tile_step) columns of a step, from a zero-padded copy (zero codes are zeros). */
INLINE void dec16_step_tail(mg_format f, const uint8_t *p, int64_t n, __m256i h[2]) {
    uint8_t buf[64] __attribute__((aligned(32)));
    copy_tail(f, p, n, buf, sizeof buf);
    dec16_step(f, buf, h);
}

/* h[0..7] (8 rows x 16 columns of 16-bit codes) to columns, within each 128-bit lane: h[k] becomes
 * column k in its low lane and column k + 8 in its high lane (element i = row i). */
INLINE void transpose8x16(__m256i h[8]) {
    __m256i a[8], b[8];
    for (int j = 0; j < 4; j++) {
        a[j] = _mm256_unpacklo_epi16(h[2 * j], h[2 * j + 1]);     /* cols 0-3 | 8-11, rows 2j, 2j+1 */
        a[j + 4] = _mm256_unpackhi_epi16(h[2 * j], h[2 * j + 1]); /* cols 4-7 | 12-15 */
    }
    for (int q = 0; q < 2; q++) { /* q: cols 0-3 or 4-7 (of each lane) */
        const __m256i *x = a + 4 * q;
        b[4 * q + 0] = _mm256_unpacklo_epi32(x[0], x[1]); /* rows 0-3, cols 4q+0, 4q+1 */
        b[4 * q + 1] = _mm256_unpackhi_epi32(x[0], x[1]); /* rows 0-3, cols 4q+2, 4q+3 */
        b[4 * q + 2] = _mm256_unpacklo_epi32(x[2], x[3]); /* rows 4-7 */
        b[4 * q + 3] = _mm256_unpackhi_epi32(x[2], x[3]);
    }
    for (int q = 0; q < 2; q++)
        for (int j = 0; j < 2; j++) {
            h[4 * q + 2 * j] = _mm256_unpacklo_epi64(b[4 * q + j], b[4 * q + 2 + j]);     /* col 4q+2j */
            h[4 * q + 2 * j + 1] = _mm256_unpackhi_epi64(b[4 * q + j], b[4 * q + 2 + j]); /* col 4q+2j+1 */
        }
}

/* 8 16-bit codes (one column of 8 rows) to fp32. */
INLINE __m256 widen16(mg_format f, __m128i h) {
    return f == MG_BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}

INLINE void store_col(float *o, __m256 d, int how, __m256 sv, __m256 fv) {
    if (how == 2) d = _mm256_mul_ps(d, fv);
    if (how) d = _mm256_mul_ps(d, sv);
    _mm256_store_ps(o, d);
}

/* Dequantise rows [r, r + nr) (nr <= 8) x columns [c, c + n) (n <= tile_step) into the tile
 * columns at o (row stride TILE_ROWS): decode each row, transpose, scale per lane (how, sv, fv:
 * see tile_scales). */
INLINE void dequant_group_step(mg_format f, const uint8_t *const *rows, int64_t nr, int64_t c, int64_t n,
                               int how, __m256 sv, __m256 fv, float *o) {
    const int64_t step = tile_step(f);
    if (PREFILL_PREFETCH(f) && (col_bytes(f, c) & 63) == 0) /* the same columns of the next chunk */
        for (int i = 0; i < nr; i++) _mm_prefetch((const char *)rows[i] + col_bytes(f, c + TILE_COLS), _MM_HINT_T0);
    if (f == MG_F32) {
        __m256 v[8];
        for (int i = 0; i < 8; i++)
            v[i] = i >= nr ? _mm256_setzero_ps() : load_partial((const float *)rows[i] + c, n);
        transpose8(v);
        for (int k = 0; k < n; k++) store_col(o + k * TILE_ROWS, v[k], how, sv, fv);
        return;
    }
    __m256i v[2][8];
    for (int i = 0; i < 8; i++) {
        __m256i d[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        if (i < nr) {
            if (n == step) dec16_step(f, rows[i] + col_bytes(f, c), d);
            else dec16_step_tail(f, rows[i] + col_bytes(f, c), n, d);
        }
        v[0][i] = d[0];
        v[1][i] = d[1];
    }
    for (int q = 0; q < step / 16 && q * 16 < n; q++) {
        transpose8x16(v[q]);
        for (int k = 0; k < 8; k++) {
            const int64_t j = q * 16 + k;
            if (j < n) store_col(o + j * TILE_ROWS, widen16(f, _mm256_castsi256_si128(v[q][k])), how, sv, fv);
            if (j + 8 < n) store_col(o + (j + 8) * TILE_ROWS, widen16(f, _mm256_extracti128_si256(v[q][k], 1)), how, sv, fv);
        }
    }
}

/* Dequantise rows [r, r + nr) x columns [c0, c0 + kc) of w exactly into the column-major tile
 * (rows nr..TILE_ROWS-1 are zeros), 8 rows at a time.  Scale blocks (32, 128 or 256 columns)
 * never straddle a TILE_COLS chunk. */
INLINE void dequant_tile(const mg_matrix *w, mg_format f, int64_t r, int64_t nr, int64_t c0, int64_t kc,
                         float *tile) {
    const int64_t step = tile_step(f), end = c0 + kc;
    const int64_t bc = w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_F32_ROW ? TILE_COLS : block_cols(w->scale_kind);
    const size_t rb = mg_matrix_row_bytes(w);
    float sc[TILE_COLS / 32 * TILE_ROWS] __attribute__((aligned(32))), fc[TILE_COLS / 32 * TILE_ROWS] __attribute__((aligned(32)));
    const int how = tile_scales(w, f, r, nr, c0, kc, sc, fc);
    for (int g = 0; g < TILE_ROWS; g += 8) {
        const int64_t gn = nr - g < 0 ? 0 : (nr - g < 8 ? nr - g : 8);
        const uint8_t *rows[8];
        for (int i = 0; i < 8; i++) rows[i] = (const uint8_t *)w->data + (size_t)(r + g + (i < gn ? i : 0)) * rb;
        for (int64_t b = c0; b < end; b += bc) {
            const int64_t be = b + bc < end ? b + bc : end, k = bc == TILE_COLS ? 0 : (b - c0) / bc;
            const __m256 sv = how ? _mm256_load_ps(sc + (bc == TILE_COLS ? 0 : k * TILE_ROWS + g)) : _mm256_setzero_ps();
            const __m256 fv = how == 2 ? _mm256_load_ps(fc + k * TILE_ROWS + g) : sv;
            int64_t c = b;
            float *o = tile + (c - c0) * TILE_ROWS + g;
            if (how == 0)
                for (; c + step <= be; c += step, o += step * TILE_ROWS) dequant_group_step(f, rows, gn, c, step, 0, sv, fv, o);
            else if (how == 1)
                for (; c + step <= be; c += step, o += step * TILE_ROWS) dequant_group_step(f, rows, gn, c, step, 1, sv, fv, o);
            else
                for (; c + step <= be; c += step, o += step * TILE_ROWS) dequant_group_step(f, rows, gn, c, step, 2, sv, fv, o);
            if (c < be) dequant_group_step(f, rows, gn, c, be - c, how, sv, fv, o);
        }
    }
}

/* The 8 rows of the tile's lane group g (lanes past nr repeat the last row), each from byte `at`
 * of its row on.  Returns 0, having zeroed the group's lanes, when none of its rows is in the
 * tile: no output reads them, and zeros keep stale values out of the FMAs. */
INLINE int tile_group_rows(const mg_matrix *w, int64_t r, int64_t nr, int g, size_t at, int64_t kc, float *tile,
                           const uint8_t *rows[8]) {
    if (g >= nr) {
        for (int64_t c = 0; c < kc; c++) _mm256_store_ps(tile + c * TILE_ROWS + g, _mm256_setzero_ps());
        return 0;
    }
    const size_t rb = mg_matrix_row_bytes(w);
    for (int i = 0; i < 8; i++) {
        const int64_t ri = r + g + i < r + nr ? r + g + i : r + nr - 1;
        rows[i] = (const uint8_t *)w->data + (size_t)ri * rb + at;
    }
    return 1;
}

/* 8 rows of 32 bytes to 32 columns of 8: out[8 * e + i] is byte e of row i (three rounds of
 * unpacks, bytes then pairs then quads, within each 128-bit lane). */
INLINE void transpose_bytes8x32(const __m256i r[8], uint8_t *out) {
    __m256i a[8], b[8];
    for (int j = 0; j < 4; j++) {
        a[2 * j] = _mm256_unpacklo_epi8(r[2 * j], r[2 * j + 1]);     /* rows 2j, 2j+1: bytes 0-7 | 16-23 */
        a[2 * j + 1] = _mm256_unpackhi_epi8(r[2 * j], r[2 * j + 1]); /* bytes 8-15 | 24-31 */
    }
    for (int h = 0; h < 2; h++) { /* rows 0-3, then 4-7 */
        const __m256i *x = a + 4 * h;
        b[4 * h + 0] = _mm256_unpacklo_epi16(x[0], x[2]); /* bytes 0-3 | 16-19 */
        b[4 * h + 1] = _mm256_unpackhi_epi16(x[0], x[2]); /* 4-7 | 20-23 */
        b[4 * h + 2] = _mm256_unpacklo_epi16(x[1], x[3]); /* 8-11 | 24-27 */
        b[4 * h + 3] = _mm256_unpackhi_epi16(x[1], x[3]); /* 12-15 | 28-31 */
    }
    for (int k = 0; k < 4; k++) { /* columns 4k .. 4k + 3 | 16 + 4k .. */
        const __m256i lo = _mm256_unpacklo_epi32(b[k], b[k + 4]), hi = _mm256_unpackhi_epi32(b[k], b[k + 4]);
        _mm_storeu_si128((__m128i *)(out + 32 * k), _mm256_castsi256_si128(lo));
        _mm_storeu_si128((__m128i *)(out + 32 * k + 16), _mm256_castsi256_si128(hi));
        _mm_storeu_si128((__m128i *)(out + 128 + 32 * k), _mm256_extracti128_si256(lo, 1));
        _mm_storeu_si128((__m128i *)(out + 128 + 32 * k + 16), _mm256_extracti128_si256(hi, 1));
    }
}

/* Columns [0, 32) of a sub-block of 8 rows into the tile at o: codes (out of
 * transpose_bytes8x32) times the rows' scales minus their mins, one lane per row. */
INLINE void q4_k_columns(const uint8_t *codes, __m256 ds, __m256 dm, float *o) {
    for (int e = 0; e < 32; e++) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 8 * e))));
        _mm256_store_ps(o + e * TILE_ROWS, _mm256_fmsub_ps(q, ds, dm));
    }
}

/* The next 256 columns (piece bytes from at) of a group's 8 rows, into L2: 8 streams that the
 * hardware prefetcher follows badly, so that the first load of each row's piece waited on memory
 * (a third of the Q4_K builder's time; prefill_avx512.c's builders do the same). */
INLINE void prefetch_next_piece(const uint8_t *const rows[8], size_t at, size_t piece) {
    for (int i = 0; i < 8; i++) mg_prefetch_rows(rows[i] + at + piece, piece + 63, 1); /* + 63: a piece's last line */
}

/* Q4_K tiles without float transposes: a chunk's 8 rows of codes are transposed as bytes (a
 * quarter of the data), widened a column at a time and scaled with a vector of the 8 rows'
 * sub-block scales and mins: each value is ds * q - dm in one FMA, as
 * mg_avx2_ggml_dequant_block computes it (ds * q exact), so the tile is the same bit for bit. */
INLINE void dequant_tile_q4_k(const mg_matrix *w, int64_t r, int64_t nr, int64_t c0, int64_t kc, float *tile) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    uint8_t cols[256] __attribute__((aligned(32)));
    for (int g = 0; g < TILE_ROWS; g += 8) {
        const uint8_t *rows[8];
        if (!tile_group_rows(w, r, nr, g, (size_t)(c0 / 256 * 144), kc, tile, rows)) continue;
        for (int64_t b = 0; b < kc; b += 256) {
            prefetch_next_piece(rows, (size_t)(b / 256 * 144), 144);
            __m256 ds[8], dm[8]; /* row i's eight sub-block factors, then transposed: [j] lane i */
            for (int i = 0; i < 8; i++) {
                const uint8_t *p = rows[i] + (size_t)(b / 256 * 144);
                uint8_t sc[8], mn[8];
                uint16_t d16, m16;
                memcpy(&d16, p, 2), memcpy(&m16, p + 2, 2);
                mg_ggml_k4_scales_mins(p + 4, sc, mn);
                ds[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc))),
                                      _mm256_set1_ps(_cvtsh_ss(d16)));
                dm[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn))),
                                      _mm256_set1_ps(_cvtsh_ss(m16)));
            }
            transpose8(ds);
            transpose8(dm);
            for (int c = 0; c < 4; c++) { /* sub-blocks 2c (low nibbles of qs[32c ..]) and 2c + 1 (high) */
                __m256i lo[8], hi[8];
                for (int i = 0; i < 8; i++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(rows[i] + (size_t)(b / 256 * 144) + 16 + 32 * c));
                    lo[i] = _mm256_and_si256(v, m4);
                    hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                }
                float *o = tile + (b + 64 * c) * TILE_ROWS + g;
                transpose_bytes8x32(lo, cols);
                q4_k_columns(cols, ds[2 * c], dm[2 * c], o);
                transpose_bytes8x32(hi, cols);
                q4_k_columns(cols, ds[2 * c + 1], dm[2 * c + 1], o + 32 * TILE_ROWS);
            }
        }
    }
}

/* Columns [0, 32) of 8 rows into the tile at o: signed codes (out of transpose_bytes8x32) times
 * the rows' sub-block scales, s0 for columns 0..15 and s1 for 16..31 (Q6_K's sub-blocks of 16). */
INLINE void q6_k_columns(const uint8_t *codes, __m256 s0, __m256 s1, float *o) {
    for (int e = 0; e < 32; e++) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 8 * e))));
        _mm256_store_ps(o + e * TILE_ROWS, _mm256_mul_ps(q, e < 16 ? s0 : s1));
    }
}

/* Q6_K tiles the same way as Q4_K's: each group of 32 codes of 8 rows is transposed as bytes
 * and multiplied by a vector of the rows' d * scale, which is (d * scale) * q as
 * mg_avx2_ggml_dequant_block computes it (d * scale exact): the same tile bit for bit. */
INLINE void dequant_tile_q6_k(const mg_matrix *w, int64_t r, int64_t nr, int64_t c0, int64_t kc, float *tile) {
    uint8_t cols[256] __attribute__((aligned(32)));
    for (int g = 0; g < TILE_ROWS; g += 8) {
        const uint8_t *rows[8];
        if (!tile_group_rows(w, r, nr, g, (size_t)(c0 / 256 * 210), kc, tile, rows)) continue;
        for (int64_t b = 0; b < kc; b += 256) {
            prefetch_next_piece(rows, (size_t)(b / 256 * 210), 210);
            const size_t blk = (size_t)(b / 256 * 210);
            __m256 s[2][8]; /* row i's 16 factors d * scale, then transposed: s[j / 8][j % 8] lane i */
            for (int i = 0; i < 8; i++) {
                const uint8_t *p = rows[i] + blk;
                uint16_t d16;
                memcpy(&d16, p + 208, 2);
                const __m256 d = _mm256_set1_ps(_cvtsh_ss(d16));
                const __m128i sc = _mm_loadu_si128((const __m128i *)(p + 192));
                s[0][i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d);
                s[1][i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), d);
            }
            transpose8(s[0]);
            transpose8(s[1]);
            for (int h = 0; h < 2; h++)
                for (int q = 0; q < 4; q++) { /* group q of half h: scales 8h + 2q, 8h + 2q + 1 */
                    __m256i v[8];
                    for (int i = 0; i < 8; i++) v[i] = q6_k_group(rows[i] + blk, h, q);
                    transpose_bytes8x32(v, cols);
                    q6_k_columns(cols, s[h][2 * q], s[h][2 * q + 1], tile + (b + 128 * h + 32 * q) * TILE_ROWS + g);
                }
        }
    }
}

/* The tile of a ggml block-format matrix (kc whole blocks: TILE_COLS is a multiple of 256):
 * each row's blocks are dequantised exactly (ggml_avx2.c) into a row-major buffer of 8 rows,
 * then transposed 8 x 8 into the tile's columns.  Lanes past nr repeat the last row. */
INLINE void dequant_tile_ggml(const mg_matrix *w, int64_t r, int64_t nr, int64_t c0, int64_t kc, float *tile) {
    if (w->format == MG_Q4_K) {
        dequant_tile_q4_k(w, r, nr, c0, kc, tile);
        return;
    }
    if (w->format == MG_Q6_K) {
        dequant_tile_q6_k(w, r, nr, c0, kc, tile);
        return;
    }
    int64_t e, bytes;
    mg_format_block(w->format, &e, &bytes);
    float buf[8][256] __attribute__((aligned(32)));
    for (int g = 0; g < TILE_ROWS; g += 8) {
        const uint8_t *rows[8];
        if (!tile_group_rows(w, r, nr, g, (size_t)(c0 / e * bytes), kc, tile, rows)) continue;
        for (int64_t b = 0; b < kc; b += e) {
            if (b % 256 == 0) prefetch_next_piece(rows, (size_t)(b / e * bytes), (size_t)(256 / e * bytes));
            for (int i = 0; i < 8; i++) mg_avx2_ggml_dequant_block(w->format, rows[i] + (size_t)(b / e * bytes), buf[i]);
            for (int64_t k = 0; k < e; k += 8) {
                __m256 v[8];
                for (int i = 0; i < 8; i++) v[i] = _mm256_load_ps(buf[i] + k);
                transpose8(v);
                for (int j = 0; j < 8; j++) _mm256_store_ps(tile + (b + k + j) * TILE_ROWS + g, v[j]);
            }
        }
    }
}

/* y[t][r + i] (+)= sum over c < kc of tile[c][i] * x[t][c] for T tokens and the nr (<= 16) rows
 * of the tile: stored by the first column chunk, added by the next ones; the last one applies the
 * F32_ROW row scales (rs, NULL otherwise) to the whole sum.  Each column is two vectors of 16 row
 * values times one broadcast x value per token. */
INLINE void micro_tokens(const int T, const float *tile, const float *x, int64_t xs, int64_t kc, float *y,
                         int64_t ys, int64_t nr, int first, const __m256 *rs) {
    /* Every loop over t and h is unrolled (T is a constant here), so that the sums stay in
     * registers: indexed by a variable, GCC keeps the arrays in memory and stores them each step. */
    __m256 a[2][MICRO_TOK];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) a[0][t] = a[1][t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < kc; c++) {
        const __m256 w0 = _mm256_load_ps(tile + c * TILE_ROWS), w1 = _mm256_load_ps(tile + c * TILE_ROWS + 8);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m256 xb = _mm256_broadcast_ss(x + t * xs + c);
            a[0][t] = _mm256_fmadd_ps(w0, xb, a[0][t]);
            a[1][t] = _mm256_fmadd_ps(w1, xb, a[1][t]);
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const int64_t n = nr - 8 * h;
        const __m256i m = lane_mask(n < 0 ? 0 : n);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            float *p = y + t * ys + 8 * h;
            __m256 v = a[h][t];
            if (n >= 8) {
                if (!first) v = _mm256_add_ps(_mm256_loadu_ps(p), v);
                if (rs) v = _mm256_mul_ps(v, rs[h]);
                _mm256_storeu_ps(p, v);
            } else if (n > 0) {
                if (!first) v = _mm256_add_ps(_mm256_maskload_ps(p, m), v);
                if (rs) v = _mm256_mul_ps(v, rs[h]);
                _mm256_maskstore_ps(p, m, v);
            }
        }
    }
}

/* One function per token count, kept out of line: inlined into the tile loop, the compiler kept
 * loop-invariant values of the caller in registers and spilled an accumulator of the 6-token
 * loop to the stack (a store-to-load dependency per column). */
#define MICRO_FN(T)                                                                                     \
    static __attribute__((noinline)) void micro_tokens##T(const float *tile, const float *x, int64_t xs, \
                                                          int64_t kc, float *y, int64_t ys, int64_t nr,   \
                                                          int first, const __m256 *rs) {                  \
        micro_tokens(T, tile, x, xs, kc, y, ys, nr, first, rs);                                          \
    }
MICRO_FN(1)
MICRO_FN(2)
MICRO_FN(3)
MICRO_FN(4)
MICRO_FN(5)
MICRO_FN(6)

/* All tokens over one tile, in blocks of at most MICRO_TOK spread evenly (so that a remainder
 * never leaves a block of one or two tokens too short to hide the FMA latency). */
INLINE void tile_tokens(const float *tile, const float *x, int64_t xs, int64_t n_tok, int64_t kc, float *y,
                        int64_t ys, int64_t nr, int first, const __m256 *rs) {
    static void (*const micro[MICRO_TOK + 1])(const float *, const float *, int64_t, int64_t, float *, int64_t,
                                              int64_t, int, const __m256 *) = {
        NULL, micro_tokens1, micro_tokens2, micro_tokens3, micro_tokens4, micro_tokens5, micro_tokens6};
    const int64_t nb = (n_tok + MICRO_TOK - 1) / MICRO_TOK, base = n_tok / nb, extra = n_tok % nb;
    int64_t t = 0;
    for (int64_t b = 0; b < nb; b++) {
        const int T = (int)(base + (b < extra));
        micro[T](tile, x + t * xs, xs, kc, y + t * ys, ys, nr, first, rs);
        t += T;
    }
}

INLINE void linear_prefill(const mg_matrix *w, mg_format f, const float *x, int64_t x_stride, int64_t n_tok,
                           float *y, int64_t y_stride, int64_t r0, int64_t r1) {
    float tile[TILE_ROWS * TILE_COLS] __attribute__((aligned(32)));
    const int64_t cols = w->cols;
    for (int64_t r = r0; r < r1; r += TILE_ROWS) {
        const int64_t nr = r1 - r < TILE_ROWS ? r1 - r : TILE_ROWS;
        __m256 rsv[2];
        if (w->scale_kind == MG_SCALE_F32_ROW) {
            float rs[TILE_ROWS] = {0};
            for (int64_t i = 0; i < nr; i++) rs[i] = row_scale(w, r + i);
            rsv[0] = _mm256_loadu_ps(rs);
            rsv[1] = _mm256_loadu_ps(rs + 8);
        }
        for (int64_t c0 = 0; c0 < cols; c0 += TILE_COLS) {
            const int64_t kc = cols - c0 < TILE_COLS ? cols - c0 : TILE_COLS;
            const int last = c0 + kc == cols;
            if (mg_format_is_ggml_block(f))
                dequant_tile_ggml(w, r, nr, c0, kc, tile);
            else
                dequant_tile(w, f, r, nr, c0, kc, tile);
            tile_tokens(tile, x + c0, x_stride, n_tok, kc, y + r, y_stride, nr, c0 == 0,
                        last && w->scale_kind == MG_SCALE_F32_ROW ? rsv : NULL);
        }
    }
}

/* The tile of rows [r, r + nr) (nr <= 16) x columns [c0, c0 + kc) (kc <= 512, c0 a multiple of 512),
 * for prefill_avx512.c, which runs its own micro-kernel over the same tiles (row scales left out,
 * as here).  One switch per tile, so that each format's dequantiser keeps its constant format. */
void mg_avx2_prefill_tile(const mg_matrix *w, int64_t r, int64_t nr, int64_t c0, int64_t kc, float *tile) {
    switch (w->format) {
    case MG_F32: dequant_tile(w, MG_F32, r, nr, c0, kc, tile); break;
    case MG_BF16: dequant_tile(w, MG_BF16, r, nr, c0, kc, tile); break;
    case MG_F16: dequant_tile(w, MG_F16, r, nr, c0, kc, tile); break;
    case MG_FP8_E4M3: dequant_tile(w, MG_FP8_E4M3, r, nr, c0, kc, tile); break;
    case MG_FP4_E2M1: dequant_tile(w, MG_FP4_E2M1, r, nr, c0, kc, tile); break;
    default: dequant_tile_ggml(w, r, nr, c0, kc, tile); break;
    }
}

#define PREFILL_FN(NAME, FMT)                                                                          \
    void NAME(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride, \
              int64_t r0, int64_t r1) {                                                                \
        linear_prefill(w, FMT, x, x_stride, n_tok, y, y_stride, r0, r1);                               \
    }
PREFILL_FN(mg_avx2_prefill_f32, MG_F32)
PREFILL_FN(mg_avx2_prefill_bf16, MG_BF16)
PREFILL_FN(mg_avx2_prefill_f16, MG_F16)
PREFILL_FN(mg_avx2_prefill_fp8, MG_FP8_E4M3)
PREFILL_FN(mg_avx2_prefill_fp4, MG_FP4_E2M1)
PREFILL_FN(mg_avx2_prefill_ggml, MG_Q8_0) /* every ggml block format: the tile reads w->format */
#endif
