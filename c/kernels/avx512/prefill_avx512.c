/* AVX-512 prefill (n_tok > 1): prefill_avx2.c's exact fp32 tiles (16 rows x 512 columns,
 * column-major, built by mg_avx2_prefill_tile) under a micro-kernel of 512-bit FMAs.  A tile column
 * is one zmm of 16 row values; two tiles side by side (32 rows) times up to MICRO_TOK broadcast x
 * values: 2 x MICRO_TOK accumulators, 2 column loads and MICRO_TOK broadcasts per 2 x MICRO_TOK
 * FMAs.  Why: on a core with full-width 512-bit FMA units (Zen 5, Xeon) a zmm FMA does twice the
 * work of the avx2 tile's ymm FMA in the same issue slot, and the avx2 kernel already ran at the
 * ymm peak (docs/KERNELS.md, "Prefill").
 *
 * Each (row, token) is the same sequential fp32 sum over the columns of each 512-column chunk as
 * in the avx2 tile (chunks added to y in column order, F32_ROW row scales applied to the whole sum
 * last): the two tables give the same bits, and outputs do not depend on how tokens are batched.
 * Scalar twin: the scalar table's prefill (kernels/scalar/linear_scalar.c); tests/c/test_kernels.c
 * and tests/c/test_ggml_blocks.c compare them on odd shapes and token counts. */
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "kernels/avx2/prefill_tile.h"
#include "kernels/avx512/ggml_avx512.h"
#include "kernels/prefetch_rows.h"

enum { TR = MG_PREFILL_TILE_ROWS, TC = MG_PREFILL_TILE_COLS, MICRO_TOK = 12 };

/* y[t][r + 16h + i] (+)= sum over c < kc of tile_h[c][i] * x[t][c] for T tokens and H (1, 2)
 * tiles: stored by the first column chunk, added by the next ones; the last one multiplies the
 * F32_ROW row scales (rs, NULL otherwise) into the whole sum. */
INLINE void micro(const int H, const int T, const float *t0, const float *t1, const float *x, int64_t xs, int64_t kc,
                  float *y, int64_t ys, int64_t nr, int first, const __m512 *rs) {
    /* All loops over h and t unroll (H and T are constants here) so the sums stay in registers. */
    __m512 a[2][MICRO_TOK];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) a[0][t] = a[1][t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < kc; c++) {
        const __m512 w0 = _mm512_load_ps(t0 + c * TR);
        const __m512 w1 = H == 2 ? _mm512_load_ps(t1 + c * TR) : w0;
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            const __m512 xb = _mm512_set1_ps(x[t * xs + c]);
            a[0][t] = _mm512_fmadd_ps(w0, xb, a[0][t]);
            if (H == 2) a[1][t] = _mm512_fmadd_ps(w1, xb, a[1][t]);
        }
    }
    prefill_store(H, T, a, y, ys, nr, first, rs);
}

/* ---- tiles of the K-quants Q4_K / Q5_K / Q6_K and the 32-element formats --------------------------
 * (Q4_K_M, Q5_K_M, Q8_0, IQ4_XS files, and the MXFP4 experts of gpt-oss and DeepSeek-V4 GGUFs.)
 * The avx2 tile decodes 8 values per operation into a row-major buffer and transposes it 8 x 8
 * (about a third of prefill's kernel time for MoE experts of ~32 tokens, where it is paid once per
 * 32 tokens).  Here each row's block is decoded 16 values per operation and 16 rows are transposed
 * 16 x 16 in registers: half the operations per weight.  The values are the scalar decoder's
 * (core/ggml_blocks.h) bit for bit, as the avx2 ones: d * sub-scale is exact, so each value is one
 * rounding (one FMA for Q4_K's and Q5_K's ds * q - dm, where ds * q is exact). */

/* One block's 256 (Q8_0 and the other 32-element formats: 32) values at p into out. */
INLINE void block_q8_0(const uint8_t *p, float *out) {
    const __m512 d = _mm512_set1_ps(f16_at(p));
    _mm512_store_ps(out, _mm512_mul_ps(_mm512_cvtepi32_ps(i8x16(p + 2)), d));
    _mm512_store_ps(out + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(i8x16(p + 18)), d));
}
/* Q5_K: chunk c's byte l holds element l of sub-blocks 2c (low nibble) and 2c + 1 (high), bit j
 * of qh[l] is the fifth bit of element l of sub-block j; ds * q - dm in one FMA (ds * q exact). */
INLINE void block_q5_k(const uint8_t *p, float *out) {
    uint8_t sc[8], mn[8];
    mg_ggml_k4_scales_mins(p + 4, sc, mn);
    const float d = f16_at(p), dmin = f16_at(p + 2);
    const uint8_t *qh = p + 16, *qs = p + 48;
    for (int c = 0; c < 4; c++) {
        const __m512 ds0 = _mm512_set1_ps(d * (float)sc[2 * c]), dm0 = _mm512_set1_ps(dmin * (float)mn[2 * c]);
        const __m512 ds1 = _mm512_set1_ps(d * (float)sc[2 * c + 1]), dm1 = _mm512_set1_ps(dmin * (float)mn[2 * c + 1]);
        for (int k = 0; k < 2; k++) {
            __m512i lo, hi;
            q5_k_codes(u8x16(qs + 32 * c + 16 * k), qh + 16 * k, c, &lo, &hi);
            _mm512_store_ps(out + 64 * c + 16 * k, _mm512_fmsub_ps(_mm512_cvtepi32_ps(lo), ds0, dm0));
            _mm512_store_ps(out + 64 * c + 32 + 16 * k, _mm512_fmsub_ps(_mm512_cvtepi32_ps(hi), ds1, dm1));
        }
    }
}
/* 32 values from 16 nibble bytes at q through the table tbl, times d: the scalar decoder's
 * d * table value, one rounding. */
INLINE void nibbles_table(const uint8_t *q, __m512 tbl, __m512 d, float *out) {
    __m512 lo, hi;
    nibble_values(q, tbl, &lo, &hi);
    _mm512_store_ps(out, _mm512_mul_ps(lo, d));
    _mm512_store_ps(out + 16, _mm512_mul_ps(hi, d));
}
/* IQ4_XS: eight sub-blocks of 32 with the 6-bit scale s, (d * (s - 32)) * table value. */
INLINE void block_iq4_xs(const uint8_t *p, __m512 tbl, float *out) {
    const float d = f16_at(p);
    uint16_t sh;
    memcpy(&sh, p + 2, 2);
    for (int j = 0; j < 8; j++) {
        const int s = ((p[4 + j / 2] >> (4 * (j & 1))) & 15) | (((sh >> (2 * j)) & 3) << 4);
        nibbles_table(p + 8 + 16 * j, tbl, _mm512_set1_ps(d * (float)(s - 32)), out + 32 * j);
    }
}
/* A block of 32 of the nibble formats (Q4_0, IQ4_NL, MXFP4, Q5_0, Q4_1, Q5_1): d * value (Q4_1,
 * Q5_1: + m, one FMA), the values through tbl (nibble_table) with Q5's fifth bits; d * value is
 * exact, so one rounding, the scalar decoder's bits. */
INLINE void block_32(mg_format f, const uint8_t *b, __m512 tbl, float *out) {
    const size_t qs = mg_ggml_qs_at(f);
    const __m512 d = _mm512_set1_ps(f == MG_MXFP4 ? MG_E8M0_HALF[b[0]] : f16_at(b));
    __m512 lo, hi;
    if (f == MG_Q5_0 || f == MG_Q5_1) {
        uint32_t qh;
        memcpy(&qh, b + qs - 4, 4);
        nibble5_values(b + qs, qh, tbl, &lo, &hi);
    } else {
        nibble_values(b + qs, tbl, &lo, &hi);
    }
    if (f == MG_Q4_1 || f == MG_Q5_1) {
        const __m512 m = _mm512_set1_ps(f16_at(b + 2));
        _mm512_store_ps(out, _mm512_fmadd_ps(lo, d, m));
        _mm512_store_ps(out + 16, _mm512_fmadd_ps(hi, d, m));
    } else {
        _mm512_store_ps(out, _mm512_mul_ps(lo, d));
        _mm512_store_ps(out + 16, _mm512_mul_ps(hi, d));
    }
}
/* The n / 32 blocks of 32 of one piece of a row at p. */
INLINE void blocks_32(mg_format f, const uint8_t *p, int64_t n, __m512 tbl, float *out) {
    int64_t e, bytes;
    mg_format_block(f, &e, &bytes);
    for (int64_t j = 0; j < n; j += 32) block_32(f, p + (size_t)(j / 32 * bytes), tbl, out + j);
}
/* Q2_K: element 128h + 32s + l is bits 2s, 2s + 1 of qs[32h + l]; (d * sc) * q - dmin * m in one
 * FMA (the product exact), sub-block 8h + 2s + k for l in 16k .. 16k + 15. */
INLINE void block_q2_k(const uint8_t *p, float *out) {
    const float d = f16_at(p + 80), dmin = f16_at(p + 82);
    const __m512i m3 = _mm512_set1_epi32(3);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 2; k++) {
            const __m512i q = u8x16(p + 16 + 32 * h + 16 * k);
            for (int s = 0; s < 4; s++) {
                const int g = 8 * h + 2 * s + k;
                const __m512i c = _mm512_and_si512(s ? _mm512_srli_epi32(q, 2 * s) : q, m3);
                _mm512_store_ps(out + 128 * h + 32 * s + 16 * k,
                                _mm512_fmsub_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(d * (float)(p[g] & 15)),
                                                _mm512_set1_ps(dmin * (float)(p[g] >> 4))));
            }
        }
}
/* Q3_K: Q2_K's low 2 bits with the third from bit 4h + s of hmask[l], merged into bit 2 by one
 * vpternlogd and read by vpermps from the table (i & 7) - 4 (bit 3 is don't-care); times
 * d * scale, exact as the scalar decoder's (d * scale) * q. */
INLINE void block_q3_k(const uint8_t *p, float *out) {
    const float d = f16_at(p + 108);
    int8_t sc[16];
    _mm_storeu_si128((__m128i *)sc, q3_k_scales(p + 96));
    const __m512 tbl = _mm512_setr_ps(-4, -3, -2, -1, 0, 1, 2, 3, -4, -3, -2, -1, 0, 1, 2, 3);
    const __m512i m3 = _mm512_set1_epi32(3);
    for (int k = 0; k < 2; k++) {
        const __m512i hm = u8x16(p + 16 * k);
        for (int h = 0; h < 2; h++) {
            const __m512i q = u8x16(p + 32 + 32 * h + 16 * k);
            for (int s = 0; s < 4; s++) {
                const int bit = 4 * h + s; /* to bit 2 */
                const __m512i hb = bit >= 2 ? _mm512_srli_epi32(hm, (unsigned)(bit - 2)) : _mm512_slli_epi32(hm, (unsigned)(2 - bit));
                const __m512i idx = _mm512_ternarylogic_epi32(m3, s ? _mm512_srli_epi32(q, 2 * s) : q, hb, 0xca);
                _mm512_store_ps(out + 128 * h + 32 * s + 16 * k,
                                _mm512_mul_ps(_mm512_permutexvar_ps(idx, tbl), _mm512_set1_ps(d * (float)sc[8 * h + 2 * s + k])));
            }
        }
    }
}

/* The formats tile_ggml builds; the others take mg_avx2_prefill_tile. */
INLINE int tile_ggml_takes(mg_format f) {
    switch (f) {
    case MG_Q4_K:
    case MG_Q5_K:
    case MG_Q6_K:
    case MG_Q8_0:
    case MG_Q4_0:
    case MG_Q5_0:
    case MG_IQ4_NL:
    case MG_IQ4_XS:
    case MG_MXFP4:
    case MG_Q4_1:
    case MG_Q5_1:
    case MG_Q2_K:
    case MG_Q3_K: return 1;
    default: return 0;
    }
}

/* One 256-column piece (n columns, 32-element formats: a multiple of 32) of one row at p, for the
 * formats tile_ggml does not build straight into the tile (Q4_K, Q6_K). */
INLINE void block_any(mg_format f, const uint8_t *p, int64_t n, float *out) {
    const __m512 tbl = nibble_table(f);
    switch (f) {
    case MG_Q5_K: block_q5_k(p, out); break;
    case MG_IQ4_XS: block_iq4_xs(p, tbl, out); break;
    case MG_Q2_K: block_q2_k(p, out); break;
    case MG_Q3_K: block_q3_k(p, out); break;
    case MG_Q8_0:
        for (int64_t j = 0; j < n; j += 32) block_q8_0(p + (size_t)(j / 32 * 34), out + j);
        break;
    /* the format a constant in each call, so each loop is that format's */
    case MG_Q4_0: blocks_32(MG_Q4_0, p, n, tbl, out); break;
    case MG_Q5_0: blocks_32(MG_Q5_0, p, n, tbl, out); break;
    case MG_Q4_1: blocks_32(MG_Q4_1, p, n, tbl, out); break;
    case MG_Q5_1: blocks_32(MG_Q5_1, p, n, tbl, out); break;
    case MG_MXFP4: blocks_32(MG_MXFP4, p, n, tbl, out); break;
    default: blocks_32(MG_IQ4_NL, p, n, tbl, out); break;
    }
}

/* Q4_K's 256 columns at column b of the tile, straight into its columns: the 16 rows' code bytes
 * are transposed as dwords (one line per 4 byte columns: lane i holds row i's 4 bytes), so that
 * a shift and a mask give a column's 16 codes, and one FMA with vectors of the 16 rows'
 * sub-block factors its values, ds * q - dm (ds * q exact, so one rounding, the scalar
 * decoder's bits).  Where decoding each row into a buffer and a 16 x 16 float transpose move
 * every value twice more (about 10 operations per 16 values), this takes 5 and a 16 x 16 dword
 * transpose per 4096 codes. */
INLINE void tile_q4_k_block(const uint8_t *const rows[TR], float *tile) {
    float ds[8][TR] __attribute__((aligned(64))), dm[8][TR] __attribute__((aligned(64)));
    for (int i = 0; i < TR; i++) {
        uint8_t sc[8], mn[8];
        mg_ggml_k4_scales_mins(rows[i] + 4, sc, mn);
        const float d = f16_at(rows[i]), dmin = f16_at(rows[i] + 2);
        for (int j = 0; j < 8; j++) ds[j][i] = d * (float)sc[j], dm[j][i] = dmin * (float)mn[j];
    }
    const __m512i m4 = _mm512_set1_epi32(15);
    for (int h = 0; h < 2; h++) { /* qs bytes 64h .. 64h + 63: chunks 2h and 2h + 1 */
        __m512 v[16];
        for (int i = 0; i < TR; i++) v[i] = _mm512_loadu_ps(rows[i] + 16 + 64 * h);
        transpose16_ps(v); /* v[s]: bytes 64h + 4s .. + 3 of the 16 rows */
        for (int k = 0; k < 2; k++) {
            const int c = 2 * h + k; /* chunk c: byte l is column 64c + l (low nibble), 64c + 32 + l (high) */
            const __m512 ds0 = _mm512_load_ps(ds[2 * c]), dm0 = _mm512_load_ps(dm[2 * c]);
            const __m512 ds1 = _mm512_load_ps(ds[2 * c + 1]), dm1 = _mm512_load_ps(dm[2 * c + 1]);
            for (int s = 0; s < 8; s++) {
                const __m512i line = _mm512_castps_si512(v[8 * k + s]);
                for (int j = 0; j < 4; j++) {
                    const int l = 4 * s + j;
                    const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(line, 8 * j), m4);
                    const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(line, 8 * j + 4), m4);
                    _mm512_store_ps(tile + (64 * c + l) * TR, _mm512_fmsub_ps(_mm512_cvtepi32_ps(lo), ds0, dm0));
                    _mm512_store_ps(tile + (64 * c + 32 + l) * TR, _mm512_fmsub_ps(_mm512_cvtepi32_ps(hi), ds1, dm1));
                }
            }
        }
    }
}

/* Q6_K the same way: per half h, the 16 rows' ql bytes 64h .. 64h + 63 and qh bytes 32h ..
 * 32h + 31 transposed as dwords; byte m of ql holds the low 4 bits of elements m (low nibble) and
 * 64 + m (high), qh byte m % 32 their top 2 bits at bit 2 * (m / 32) and 2 * (m / 32 + 2).  Each
 * value is (d * scale) * (q - 32), as the scalar decoder computes it. */
INLINE void tile_q6_k_block(const uint8_t *const rows[TR], float *tile) {
    float ds[16][TR] __attribute__((aligned(64)));
    for (int i = 0; i < TR; i++) {
        const float d = f16_at(rows[i] + 208);
        const int8_t *sc = (const int8_t *)(rows[i] + 192);
        for (int g = 0; g < 16; g++) ds[g][i] = d * (float)sc[g];
    }
    const __m512i m4 = _mm512_set1_epi32(15), m30 = _mm512_set1_epi32(0x30), k32 = _mm512_set1_epi32(32);
    for (int h = 0; h < 2; h++) {
        __m512 v[16], u[16];
        for (int i = 0; i < TR; i++) {
            v[i] = _mm512_loadu_ps(rows[i] + 64 * h);
            u[i] = _mm512_zextps256_ps512(_mm256_loadu_ps((const float *)(rows[i] + 128 + 32 * h)));
        }
        transpose16_ps(v); /* v[s]: ql bytes 64h + 4s .. + 3 of the 16 rows */
        transpose16_ps(u); /* u[s], s < 8: qh bytes 32h + 4s .. + 3 */
        for (int s = 0; s < 16; s++) {
            const __m512i ql = _mm512_castps_si512(v[s]), qh = _mm512_castps_si512(u[s % 8]);
            const int t = s / 8; /* m / 32 */
            const __m512 dlo = _mm512_load_ps(ds[8 * h + s / 4]), dhi = _mm512_load_ps(ds[8 * h + 4 + s / 4]);
            for (int j = 0; j < 4; j++) {
                const int m = 4 * s + j, sh = 8 * j + 2 * t - 4; /* qh's bits of element m moved to bits 4-5 */
                const __m512i top = sh >= 0 ? _mm512_srli_epi32(qh, (unsigned)sh) : _mm512_slli_epi32(qh, (unsigned)-sh);
                const __m512i lo = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(ql, 8 * j), m4), _mm512_and_si512(top, m30));
                const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(ql, 8 * j + 4), m4),
                                                   _mm512_and_si512(_mm512_srli_epi32(qh, (unsigned)(sh + 4)), m30));
                _mm512_store_ps(tile + (128 * h + m) * TR, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(lo, k32)), dlo));
                _mm512_store_ps(tile + (128 * h + 64 + m) * TR, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(hi, k32)), dhi));
            }
        }
    }
}

/* The tile of rows [r, r + nr) x columns [c0, c0 + kc) for the formats of tile_ggml_takes
 * (returns 0 for the others: mg_avx2_prefill_tile's then).  256 columns of the 16 rows at a time: each row's
 * values into a row-major buffer, then 16 x 16 transposes; lanes past nr repeat the last row. */
static int tile_ggml(const mg_matrix *w, int64_t r, int64_t nr, int64_t c0, int64_t kc, float *tile) {
    const mg_format f = w->format;
    if (!tile_ggml_takes(f)) return 0;
    int64_t e, bytes;
    mg_format_block(f, &e, &bytes);
    const size_t rb = mg_matrix_row_bytes(w);
    float buf[TR][256] __attribute__((aligned(64)));
    const uint8_t *rows[TR];
    for (int i = 0; i < TR; i++)
        rows[i] = (const uint8_t *)w->data + (size_t)(r + (i < nr ? i : nr - 1)) * rb + (size_t)(c0 / e * bytes);
    const size_t piece = (size_t)(256 / e * bytes); /* the bytes of 256 columns of a row */
    for (int64_t b = 0; b < kc; b += 256) {
        const int64_t n = kc - b < 256 ? kc - b : 256; /* rows of 32-element blocks: a multiple of 32 */
        /* The 16 rows are 16 streams that the hardware prefetcher follows badly: without this the
         * first load of each row's piece waited on memory (a fifth of the builder's time).  The
         * next 256 columns of each row (past the chunk's end: the next chunk's start), into L2;
         * two pieces ahead measured slower (+ 63: a piece's last line). */
        for (int i = 0; i < TR; i++) mg_prefetch_rows(rows[i] + (size_t)(b / e * bytes) + piece, piece + 63, 1);
        if (f == MG_Q4_K || f == MG_Q6_K) {
            const uint8_t *blk[TR];
            for (int i = 0; i < TR; i++) blk[i] = rows[i] + (size_t)(b / 256 * bytes);
            if (f == MG_Q4_K)
                tile_q4_k_block(blk, tile + b * TR);
            else
                tile_q6_k_block(blk, tile + b * TR);
            continue;
        }
        for (int i = 0; i < TR; i++) block_any(f, rows[i] + (size_t)(b / e * bytes), n, buf[i]);
        for (int64_t k = 0; k < n; k += 16) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) v[i] = _mm512_load_ps(buf[i] + k);
            transpose16_ps(v);
            for (int j = 0; j < 16; j++) _mm512_store_ps(tile + (b + k + j) * TR, v[j]);
        }
    }
    return 1;
}

INLINE void build_tile(const mg_matrix *w, int64_t r, int64_t nr, int64_t c0, int64_t kc, float *tile) {
    if (!tile_ggml(w, r, nr, c0, kc, tile)) mg_avx2_prefill_tile(w, r, nr, c0, kc, tile);
}

typedef void micro_fn(const float *t0, const float *t1, const float *x, int64_t xs, int64_t kc, float *y, int64_t ys,
                      int64_t nr, int first, const __m512 *rs);

/* One out-of-line function per (tiles, tokens), as in prefill_avx2.c: inlined into the tile
 * loop, the compiler keeps the caller's invariants in registers and spills accumulators. */
#define MICRO_FN(H, T)                                                                                         \
    static __attribute__((noinline)) void micro_##H##_##T(const float *t0, const float *t1, const float *x,    \
                                                          int64_t xs, int64_t kc, float *y, int64_t ys,       \
                                                          int64_t nr, int first, const __m512 *rs) {           \
        micro(H, T, t0, t1, x, xs, kc, y, ys, nr, first, rs);                                                  \
    }
#define MICRO_FNS(H)                                                                                             \
    MICRO_FN(H, 1) MICRO_FN(H, 2) MICRO_FN(H, 3) MICRO_FN(H, 4) MICRO_FN(H, 5) MICRO_FN(H, 6) MICRO_FN(H, 7)    \
        MICRO_FN(H, 8) MICRO_FN(H, 9) MICRO_FN(H, 10) MICRO_FN(H, 11) MICRO_FN(H, 12)
MICRO_FNS(1)
MICRO_FNS(2)
#define MICRO_TABLE(H)                                                                                           \
    {NULL, micro_##H##_1, micro_##H##_2, micro_##H##_3, micro_##H##_4, micro_##H##_5, micro_##H##_6,           \
     micro_##H##_7, micro_##H##_8, micro_##H##_9, micro_##H##_10, micro_##H##_11, micro_##H##_12}
static micro_fn *const MICRO[2][MICRO_TOK + 1] = {MICRO_TABLE(1), MICRO_TABLE(2)};

/* All tokens over one pair of tiles, in blocks of at most MICRO_TOK spread evenly (a remainder
 * never leaves a block of one or two tokens, too few chains to hide the FMA latency). */
INLINE void tile_tokens(int H, const float *t0, const float *t1, const float *x, int64_t xs, int64_t n_tok,
                        int64_t kc, float *y, int64_t ys, int64_t nr, int first, const __m512 *rs) {
    const int64_t nb = (n_tok + MICRO_TOK - 1) / MICRO_TOK, base = n_tok / nb, extra = n_tok % nb;
    int64_t t = 0;
    for (int64_t b = 0; b < nb; b++) {
        const int T = (int)(base + (b < extra));
        MICRO[H - 1][T](t0, t1, x + t * xs, xs, kc, y + t * ys, ys, nr, first, rs);
        t += T;
    }
}

void mg_avx512_prefill(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride,
                       int64_t r0, int64_t r1) {
    float tile[2][TR * TC] __attribute__((aligned(64)));
    const int64_t cols = w->cols;
    for (int64_t r = r0; r < r1; r += 2 * TR) {
        const int64_t nr = r1 - r < 2 * TR ? r1 - r : 2 * TR;
        const int H = nr > TR ? 2 : 1;
        __m512 rsv[2];
        if (w->scale_kind == MG_SCALE_F32_ROW) prefill_row_scales(w, r, nr, rsv);
        for (int64_t c0 = 0; c0 < cols; c0 += TC) {
            const int64_t kc = cols - c0 < TC ? cols - c0 : TC;
            build_tile(w, r, H == 2 ? TR : nr, c0, kc, tile[0]);
            if (H == 2) build_tile(w, r + TR, nr - TR, c0, kc, tile[1]);
            tile_tokens(H, tile[0], tile[1], x + c0, x_stride, n_tok, kc, y + r, y_stride, nr, c0 == 0,
                        c0 + kc == cols && w->scale_kind == MG_SCALE_F32_ROW ? rsv : NULL);
        }
    }
}
#endif
