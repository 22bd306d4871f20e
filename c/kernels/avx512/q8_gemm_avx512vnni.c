/* The int8-activation GEMM (prefill with --activations int8) on AVX-512 VNNI: the contract of
 * kernels/q8_gemm.h, checked against the scalar twin by tests/c/test_ggml_q8.c.
 *
 * Why a GEMM of its own: the row entries (q8_avx512vnni.c) decode every weight row again for
 * every token, and their vpdpbusd lanes hold 4 columns of one row, so each 32-column group of
 * one (row, token) costs a conversion and a float multiply-add per 8 int32 lanes.  Here the
 * roles are turned around:
 *  - 16 rows are decoded once per call (the AVX2 block decoders of kernels/q8_gemm.h) and packed
 *    into a panel whose 64-byte line s holds columns 4s..4s+3 of each of the 16 rows, the codes
 *    biased to unsigned (code + 128, vpdpbusd's unsigned operand);
 *  - a zmm accumulator is one token's 16 rows: per 4 columns, one line of the panel times x's 4
 *    codes broadcast from memory (vpdpbusd's embedded broadcast), for T tokens at once;
 *  - per group of G columns each accumulator is converted and scaled once: 8 (G = 32) or 4
 *    vpdpbusd per conversion and multiply-add, where the row entries pay one per vpdpbusd.
 * The bias adds 128 * (sum of the group's x codes), which the accumulator starts at minus (comp,
 * prepared once per call).  The group sums are exact in int32 (|sum| <= 32 * 255 * 127 + 2^12).
 * The panel is decoded per column chunk of KC, so that it (16 KiB) and the token tile's x codes
 * stay in L1 while every token tile runs over it; the chunks' partial sums meet in y.
 * Those loops, x's tile layout and the decoder lookup are kernels/q8_gemm_driver.h's, shared with
 * the AVX-VNNI (ymm, 8-row panels) GEMM avx2/q8_gemm_avxvnni.c; this file is the panel and tile. */
#include "kernels/tables.h"
#include "kernels/q8_gemm_driver.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"

enum {
    ROWS = 16,   /* rows per panel: the 16 int32 lanes of a zmm */
    KC = 1024,   /* columns per chunk: a multiple of 256 (every block) and of 64 (the transpose) */
    TILE = 12,   /* tokens per tile: 2 * TILE accumulators + 4 live vectors fit the 32 zmm */
};

/* One chunk of 16 rows, decoded and packed. */
typedef struct {
    uint8_t line[KC / 4][64] __attribute__((aligned(64))); /* line s: rows 0-15's columns 4s..4s+3, + 128 */
    float fac[KC / 16][ROWS] __attribute__((aligned(64)));  /* per group: the 16 rows' factors */
    float mn[KC / 16][ROWS] __attribute__((aligned(64)));   /* per group: the 16 rows' mins */
    int8_t codes[ROWS][KC] __attribute__((aligned(64)));    /* the decoder's output, row by row */
    float rfac[ROWS][KC / 16], rmn[ROWS][KC / 16];
} panel;

/* 16 x 16 int32 transpose: out[s] = (in[0][s], ..., in[15][s]). */
INLINE void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* per 128-bit lane L: r[i + c] = column 4L + c of rows i..i+3 */
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int h = 0; h < 16; h += 8)
        for (int c = 0; c < 4; c++) {
            t[h + c] = _mm512_shuffle_i32x4(r[h + c], r[h + 4 + c], 0x88);     /* lanes 0, 2 */
            t[h + 4 + c] = _mm512_shuffle_i32x4(r[h + c], r[h + 4 + c], 0xdd); /* lanes 1, 3 */
        }
    for (int c = 0; c < 8; c++) {
        r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
    }
}

/* Decodes rows [r, r + nr) of w, columns [c0, c0 + kc), into the panel (rows nr.. as zeros). */
static void pack(const mg_matrix *w, mg_q8_decode_fn *dec, int64_t r, int nr, int64_t c0, int64_t kc, void *vp) {
    panel *p = vp;
    const int64_t kc64 = (kc + 63) / 64 * 64;
    mg_q8_gemm_decode_rows(w, dec, r, nr, ROWS, c0, kc, kc64, p->codes[0], KC, p->rfac[0], p->rmn[0], KC / 16,
                           p->fac[0], p->mn[0]);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int64_t j = 0; j < kc64 / 64; j++) {
        __m512i v[16];
        for (int i = 0; i < 16; i++) v[i] = _mm512_load_si512(p->codes[i] + 64 * j);
        transpose16(v);
        for (int s = 0; s < 16; s++) _mm512_store_si512(p->line[16 * j + s], _mm512_xor_si512(v[s], bias));
    }
}

/* T tokens against the panel of a chunk of kc columns: y[t][0 .. 16) (mask m) gains the chunk's
 * sums (first: y is overwritten). */
INLINE void tile(const int T, const int G, const panel *p, const mg_q8_tile_x *x, int mins, int64_t kc, float *y,
                 int64_t y_stride, __mmask16 m, int first) {
    __m512 acc[TILE];
    for (int t = 0; t < T; t++) acc[t] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, y + t * y_stride);
    const int32_t *xq = x->q;
    for (int64_t g = 0; g < kc / G; g++, xq += G / 4 * T) {
        __m512i s[TILE];
        for (int t = 0; t < T; t++) s[t] = _mm512_set1_epi32(x->comp[g * T + t]);
#pragma GCC unroll 8
        for (int j = 0; j < G / 4; j++) {
            const __m512i wv = _mm512_load_si512(p->line[g * (G / 4) + j]);
            for (int t = 0; t < T; t++) s[t] = _mm512_dpbusd_epi32(s[t], wv, _mm512_set1_epi32(xq[j * T + t]));
        }
        const __m512 f = _mm512_load_ps(p->fac[g]);
        for (int t = 0; t < T; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(f, _mm512_set1_ps(x->dx[g * T + t])),
                                     acc[t]);
        if (mins) {
            const __m512 mv = _mm512_load_ps(p->mn[g]);
            for (int t = 0; t < T; t++) acc[t] = _mm512_fnmadd_ps(mv, _mm512_set1_ps(x->sx[g * T + t]), acc[t]);
        }
    }
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + t * y_stride, m, acc[t]);
}

#define TILE_CASES(G)                                                                               \
    switch (T) {                                                                                    \
    case 1: tile(1, G, p, x, mins, kc, y, y_stride, m, first); break;                               \
    case 2: tile(2, G, p, x, mins, kc, y, y_stride, m, first); break;                               \
    case 3: tile(3, G, p, x, mins, kc, y, y_stride, m, first); break;                               \
    case 4: tile(4, G, p, x, mins, kc, y, y_stride, m, first); break;                               \
    case 5: tile(5, G, p, x, mins, kc, y, y_stride, m, first); break;                               \
    case 6: tile(6, G, p, x, mins, kc, y, y_stride, m, first); break;                               \
    case 7: tile(7, G, p, x, mins, kc, y, y_stride, m, first); break;                               \
    case 8: tile(8, G, p, x, mins, kc, y, y_stride, m, first); break;                               \
    case 9: tile(9, G, p, x, mins, kc, y, y_stride, m, first); break;                               \
    case 10: tile(10, G, p, x, mins, kc, y, y_stride, m, first); break;                             \
    case 11: tile(11, G, p, x, mins, kc, y, y_stride, m, first); break;                             \
    default: tile(TILE, G, p, x, mins, kc, y, y_stride, m, first); break;                           \
    }

/* The driver's tile: G and T as constants of the loops. */
static void tile_any(int T, int G, const void *vp, const mg_q8_tile_x *x, int mins, int64_t kc, float *y,
                     int64_t y_stride, int nr, int first) {
    const panel *p = vp;
    const __mmask16 m = (__mmask16)((1u << nr) - 1);
    if (G == 16) {
        TILE_CASES(16)
    } else {
        TILE_CASES(32)
    }
}

static void rows_entry(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                       int64_t r0, int64_t r1) {
    mg_avx512vnni_linear_q8(0)(w, xq, n_tok, y, y_stride, r0, r1); /* one token, after a failed allocation */
}

void mg_avx512vnni_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                           int64_t r0, int64_t r1) {
    static const mg_q8_gemm_isa isa = {ROWS, 4, TILE, KC, sizeof(panel), pack, tile_any, rows_entry, NULL};
    mg_q8_gemm_drive(&isa, w, xq, n_tok, y, y_stride, r0, r1);
}
#endif
