/* The int8-activation GEMM (prefill with --activations int8) on AVX-VNNI: the VEX (ymm) vpdpbusd
 * of Intel client CPUs from Alder Lake, which have no AVX-512.  The design of the AVX-512 one
 * (avx512/q8_gemm_avx512vnni.c; the contract: kernels/q8_gemm.h) at half the width; the loops,
 * x's tile layout and the decoder lookup are shared (kernels/q8_gemm_driver.h).  What differs:
 *  - panels of 8 rows (a ymm's int32 lanes), packed by an 8 x 8 int32 transpose: line s (32
 *    bytes) holds columns 4s..4s+3 of the 8 rows, + 128;
 *  - vpdpbusd has no embedded broadcast in its VEX form: each token's 4 x codes are a separate
 *    vpbroadcastd (a load-port op), so the weights are the reused operand, as there;
 *  - 16 ymm registers instead of 32 zmm: 2 per token (the int32 group sum and the float
 *    accumulator) plus the line, the broadcast, the factors and a temporary, so tiles of at
 *    most TILE tokens (measured: docs/KERNELS.md, "int8 GEMM on AVX-VNNI").
 * Checked against the scalar twin by tests/c/test_ggml_q8.c through the avx2 table, which takes
 * this file's entry on a CPU with AVX-VNNI (table_avx2.c). */
#include "kernels/tables.h"
#include "kernels/q8_gemm_driver.h"
#include "kernels/q8_rows.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVXVNNI__)
#include "kernels/avx2/avx2.h"
#include "kernels/avx2/q8_tile_avx2.h"

/* Compile-time knobs for measuring (TILE up to 8: the tile cases below). */
#ifndef MG_AVXVNNI_TILE
#define MG_AVXVNNI_TILE 6
#endif
#ifndef MG_AVXVNNI_KC
#define MG_AVXVNNI_KC 1024
#endif

enum {
    ROWS = 8,               /* rows per panel: the 8 int32 lanes of a ymm */
    KC = MG_AVXVNNI_KC,     /* columns per chunk: a multiple of 256 (every block) and of 32 (the transpose) */
    TILE = MG_AVXVNNI_TILE, /* tokens per tile: 2 * TILE accumulators + 4 live vectors fit the 16 ymm */
};

_Static_assert(TILE >= 1 && TILE <= 8, "TILE_CASES has a case for every count below TILE");

/* One chunk of 8 rows, decoded and packed. */
typedef struct {
    uint8_t line[KC / 4][32] __attribute__((aligned(64))); /* line s: rows 0-7's columns 4s..4s+3, + 128 */
    float fac[KC / 16][ROWS] __attribute__((aligned(64)));  /* per group: the 8 rows' factors */
    float mn[KC / 16][ROWS] __attribute__((aligned(64)));   /* per group: the 8 rows' mins */
    int8_t codes[ROWS][KC] __attribute__((aligned(64)));    /* the decoder's output, row by row */
    float rfac[ROWS][KC / 16], rmn[ROWS][KC / 16];
} panel;

/* Decodes rows [r, r + nr) of w, columns [c0, c0 + kc), into the panel (rows nr.. as zeros). */
static void pack(const mg_matrix *w, mg_q8_decode_fn *dec, int64_t r, int nr, int64_t c0, int64_t kc, void *vp) {
    panel *p = vp;
    const int64_t kc32 = (kc + 31) / 32 * 32;
    mg_q8_gemm_decode_rows(w, dec, r, nr, ROWS, c0, kc, kc32, p->codes[0], KC, p->rfac[0], p->rmn[0], KC / 16,
                           p->fac[0], p->mn[0]);
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int64_t j = 0; j < kc32 / 32; j++) {
        __m256i v[8];
        for (int i = 0; i < 8; i++) v[i] = _mm256_load_si256((const __m256i *)(p->codes[i] + 32 * j));
        mg_avx2_transpose8x8_epi32(v);
        for (int s = 0; s < 8; s++) _mm256_store_si256((__m256i *)p->line[8 * j + s], _mm256_xor_si256(v[s], bias));
    }
}

/* T tokens against the panel of a chunk of kc columns: y[t][0 .. nr) gains the chunk's sums
 * (first: y is overwritten). */
INLINE void tile(const int T, const int G, const panel *p, const mg_q8_tile_x *x, int mins, int64_t kc, float *y,
                 int64_t y_stride, int nr, int first) {
    __m256 acc[TILE];
    mg_avx2_tile_load(T, acc, y, y_stride, nr, first);
    const int32_t *xq = x->q;
    for (int64_t g = 0; g < kc / G; g++, xq += G / 4 * T) {
        __m256i s[TILE];
        for (int t = 0; t < T; t++) s[t] = _mm256_set1_epi32(x->comp[g * T + t]);
#pragma GCC unroll 8
        for (int j = 0; j < G / 4; j++) {
            const __m256i wv = _mm256_load_si256((const __m256i *)p->line[g * (G / 4) + j]);
            for (int t = 0; t < T; t++) s[t] = _mm256_dpbusd_avx_epi32(s[t], wv, _mm256_set1_epi32(xq[j * T + t]));
        }
        mg_avx2_tile_group(T, acc, s, p->fac[g], p->mn[g], x, g, mins);
    }
    mg_avx2_tile_store(T, acc, y, y_stride, nr);
}

#define TILE_CASE(N, G) \
    case N: tile(N < TILE ? N : TILE, G, p, x, mins, kc, y, y_stride, nr, first); break;
#define TILE_CASES(G)                                                                                          \
    switch (T) {                                                                                               \
        TILE_CASE(1, G) TILE_CASE(2, G) TILE_CASE(3, G) TILE_CASE(4, G) TILE_CASE(5, G) TILE_CASE(6, G)      \
        TILE_CASE(7, G)                                                                                        \
    default: tile(TILE, G, p, x, mins, kc, y, y_stride, nr, first); break;                                     \
    }

/* The driver's tile: G and T as constants of the loops. */
static void tile_any(int T, int G, const void *vp, const mg_q8_tile_x *x, int mins, int64_t kc, float *y,
                     int64_t y_stride, int nr, int first) {
    const panel *p = vp;
    if (G == 16) {
        TILE_CASES(16)
    } else {
        TILE_CASES(32)
    }
}

void mg_avxvnni_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                        int64_t r0, int64_t r1) {
    static const mg_q8_gemm_isa isa = {ROWS, 4, TILE, KC, sizeof(panel), pack, tile_any, mg_avx2_gemm_rows_entry, NULL};
    mg_q8_gemm_drive(&isa, w, xq, n_tok, y, y_stride, r0, r1);
}

/* The token count from which this GEMM, which decodes each row once for all tokens, beats the
 * AVX2 rows (q8_avx2.c), which decode it again per token (measured on Zen 5, docs/KERNELS.md):
 * from 3 tokens for every format, from 2 for the grid formats, whose rows are the slowest.  The
 * AVX2 rows are slower than the VNNI ones, so the GEMM takes over earlier than on AVX-512. */
static int64_t gemm_min_tok(mg_format f) { return f >= MG_IQ2_XXS ? 2 : 3; }

/* The avx2 table's int8 entry on a CPU with AVX-VNNI: the GEMM for several tokens, the rows for
 * fewer. */
MG_Q8_GEMM_ENTRIES(mg_avxvnni_linear_q8, gemm_min_tok, mg_avxvnni_gemm_q8, mg_avxvnni_linear_q8_rows)
#else
mg_linear_q8_fn mg_avxvnni_linear_q8(int prefetch_l2) { return NULL; }
#endif
