/* The int8-activation GEMM (prefill with --activations int8) on arm64 with the int8 matrix
 * multiply (smmla, FEAT_I8MM): the contract of kernels/q8_gemm.h, the loops of
 * kernels/q8_gemm_driver.h, the sdot GEMM's design (q8_gemm_neondot.c) with smmla's shapes.
 * Compiled with -march=armv8.2-a+dotprod+i8mm (the _neoni8mm.c suffix, c/flags.mk); the neon
 * table takes its entry only on a CPU whose HWCAP2 has I8MM (table_neon.c).  Checked against the
 * scalar twin under qemu by tests/c/test_ggml_q8.c; not timed (no arm64 machine:
 * docs/KERNELS.md).
 *
 * Why: one smmla multiplies a 2 x 8 block of int8 by another's transpose into a 2 x 2 block of
 * int32, 32 products, where one sdot does 16.  So:
 *  - panels of 8 rows: line s (64 bytes) holds columns 8s..8s+7 of the row pairs (0, 1), (2, 3),
 *    (4, 5), (6, 7), 16 bytes each (the first row's 8 codes, then the second's);
 *  - the driver lays x out 8 columns per step (xunit 8): tokens t, t + 1 of a step are 16
 *    contiguous bytes, one load;
 *  - an int32x4 accumulator is a 2 x 2 block [row 2p token t, row 2p token t + 1, row 2p + 1
 *    token t, row 2p + 1 token t + 1]: per step, 4 row pairs x T / 2 token pairs smmla;
 *  - per group of G columns each block is converted and scaled once: acc += (fac x dx) * isum
 *    - mn x sx, the factor and min vectors laid out as the block is ([f0 f0 f1 f1] from the
 *    panel, [d0 d1 d0 d1] from x);
 *  - signed x signed, so no bias (as sdot).
 * Registers: tiles of at most TILE = 4 tokens: 8 int32 and 8 float accumulators, the line's 4
 * row pairs and 2 token pairs: 22 of the 32.  Per group of 32 columns, 32 smmla (1024 products)
 * and 24 instructions to convert and scale; the sdot tile does 1536 products in 96 sdot and 36.
 * The token count from which it takes over from the rows is the sdot GEMM's (2). */
#include "kernels/tables.h"
#include "kernels/q8_gemm_driver.h"

#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD) && \
    defined(__ARM_FEATURE_MATMUL_INT8)
#include "kernels/neon/neon.h"
#include "kernels/neon/q8_rows_neon.h" /* the rows, for one token (built here with sdot too) */

#ifndef MG_NEONI8MM_KC
#define MG_NEONI8MM_KC 1024
#endif

enum {
    ROWS = 8,           /* rows per panel: four row pairs */
    KC = MG_NEONI8MM_KC, /* columns per chunk: a multiple of 256 (every block) */
    TILE = 4,           /* tokens per tile: two token pairs */
};

_Static_assert(KC % 256 == 0, "a chunk holds whole blocks");

/* One chunk of 8 rows, decoded and packed. */
typedef struct {
    int8_t line[KC / 8][4][16] __attribute__((aligned(64))); /* line s, row pair p: rows 2p, 2p + 1's columns 8s.. */
    float fac[KC / 16][4][4] __attribute__((aligned(64)));   /* per group and row pair: [f0 f0 f1 f1] */
    float mn[KC / 16][4][4] __attribute__((aligned(64)));    /* the mins alike */
    float gfac[KC / 16][ROWS], gmn[KC / 16][ROWS];           /* the driver's: per group, the 8 rows' */
    int8_t codes[ROWS][KC] __attribute__((aligned(64)));     /* the decoder's output, row by row */
    float rfac[ROWS][KC / 16], rmn[ROWS][KC / 16];
} panel;

/* [a0 a0 a1 a1] of two floats. */
ALWAYS_INLINE float32x4_t pair_rows(const float *a) {
    const float32x2_t v = vld1_f32(a);
    return vcombine_f32(vzip1_f32(v, v), vzip2_f32(v, v));
}

/* Decodes rows [r, r + nr) of w, columns [c0, c0 + kc), into the panel (rows nr.. as zeros). */
static void pack(const mg_matrix *w, mg_q8_decode_fn *dec, int64_t r, int nr, int64_t c0, int64_t kc, void *vp) {
    panel *p = vp;
    const int G = mg_q8_gemm_group(w->format), mins = mg_q8_gemm_has_mins(w->format);
    mg_q8_gemm_decode_rows(w, dec, r, nr, ROWS, c0, kc, kc, p->codes[0], KC, p->rfac[0], p->rmn[0], KC / 16,
                           p->gfac[0], p->gmn[0]);
    for (int64_t s = 0; s < kc / 8; s++)
        for (int q = 0; q < 4; q++)
            vst1q_s8(p->line[s][q], vcombine_s8(vld1_s8(p->codes[2 * q] + 8 * s), vld1_s8(p->codes[2 * q + 1] + 8 * s)));
    for (int64_t g = 0; g < kc / G; g++)
        for (int q = 0; q < 4; q++) {
            vst1q_f32(p->fac[g][q], pair_rows(p->gfac[g] + 2 * q));
            if (mins) vst1q_f32(p->mn[g][q], pair_rows(p->gmn[g] + 2 * q));
        }
}

/* Tokens 2k, 2k + 1 of step s as one vector (n = 1: only token 2k exists; its pair is zero). */
ALWAYS_INLINE int8x16_t x_pair(const int32_t *q, int T, int64_t s, int k, const int n) {
    const int8_t *at = (const int8_t *)(q + 2 * (s * T + 2 * k));
    return n == 2 ? vld1q_s8(at) : vcombine_s8(vld1_s8(at), vdup_n_s8(0));
}

/* [v0 v1 v0 v1] of the values of tokens 2k, 2k + 1 at v (n = 1: v0 only, the rest 0). */
ALWAYS_INLINE float32x4_t pair_tokens(const float *v, const int n) {
    const float32x2_t a = n == 2 ? vld1_f32(v) : vset_lane_f32(v[0], vdup_n_f32(0.0f), 0);
    return vcombine_f32(a, a);
}

/* T tokens (1..TILE, a constant after inlining) against the panel of a chunk of kc columns:
 * y[t][0 .. nr) gains the chunk's sums (first: y is overwritten). */
ALWAYS_INLINE void tile(const int T, const int G, const panel *p, const mg_q8_tile_x *x, int mins, int64_t kc, float *y,
                        int64_t y_stride, int nr, int first) {
    enum { TP = (TILE + 1) / 2 };
    const int np = (T + 1) / 2; /* token pairs */
    float32x4_t acc[4][TP];
    /* y's rows as the blocks: rows 2q, 2q + 1 of tokens 2k, 2k + 1 (zip of the two tokens' rows) */
#pragma GCC unroll 2
    for (int k = 0; k < np; k++) {
        const int n = T - 2 * k < 2 ? 1 : 2;
        float a[2][ROWS] = {{0}};
        if (!first)
            for (int i = 0; i < n; i++) memcpy(a[i], y + (2 * k + i) * y_stride, sizeof(float) * (size_t)nr);
        const float32x4_t a0 = vld1q_f32(a[0]), a1 = vld1q_f32(a[0] + 4), b0 = vld1q_f32(a[1]), b1 = vld1q_f32(a[1] + 4);
        acc[0][k] = vzip1q_f32(a0, b0), acc[1][k] = vzip2q_f32(a0, b0);
        acc[2][k] = vzip1q_f32(a1, b1), acc[3][k] = vzip2q_f32(a1, b1);
    }
    for (int64_t g = 0; g < kc / G; g++) {
        int32x4_t s[4][TP];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
#pragma GCC unroll 2
            for (int k = 0; k < np; k++) s[q][k] = vdupq_n_s32(0);
#pragma GCC unroll 2
        for (int j = 0; j < G / 8; j++) {
            const int64_t st = g * (G / 8) + j;
            int8x16_t xv[TP];
#pragma GCC unroll 2
            for (int k = 0; k < np; k++) xv[k] = x_pair(x->q, T, st, k, T - 2 * k < 2 ? 1 : 2);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                const int8x16_t wv = vld1q_s8(p->line[st][q]);
#pragma GCC unroll 2
                for (int k = 0; k < np; k++) s[q][k] = vmmlaq_s32(s[q][k], wv, xv[k]);
            }
        }
#pragma GCC unroll 2
        for (int k = 0; k < np; k++) {
            const int n = T - 2 * k < 2 ? 1 : 2;
            const float32x4_t dx = pair_tokens(x->dx + g * T + 2 * k, n);
            const float32x4_t sx = mins ? pair_tokens(x->sx + g * T + 2 * k, n) : vdupq_n_f32(0.0f);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                acc[q][k] = vfmaq_f32(acc[q][k], vcvtq_f32_s32(s[q][k]), vmulq_f32(vld1q_f32(p->fac[g][q]), dx));
                if (mins) acc[q][k] = vfmsq_f32(acc[q][k], vld1q_f32(p->mn[g][q]), sx);
            }
        }
    }
#pragma GCC unroll 2
    for (int k = 0; k < np; k++) {
        const int n = T - 2 * k < 2 ? 1 : 2;
        float a[2][ROWS];
        vst1q_f32(a[0], vuzp1q_f32(acc[0][k], acc[1][k])), vst1q_f32(a[0] + 4, vuzp1q_f32(acc[2][k], acc[3][k]));
        vst1q_f32(a[1], vuzp2q_f32(acc[0][k], acc[1][k])), vst1q_f32(a[1] + 4, vuzp2q_f32(acc[2][k], acc[3][k]));
        for (int i = 0; i < n; i++) memcpy(y + (2 * k + i) * y_stride, a[i], sizeof(float) * (size_t)nr);
    }
}

/* The driver's tile: G and T as constants of the loops. */
static void tile_any(int T, int G, const void *vp, const mg_q8_tile_x *x, int mins, int64_t kc, float *y,
                     int64_t y_stride, int nr, int first) {
    const panel *p = vp;
#define TILE_CASES(G)                                                                      \
    switch (T) {                                                                           \
    case 1: tile(1, G, p, x, mins, kc, y, y_stride, nr, first); break;                     \
    case 2: tile(2, G, p, x, mins, kc, y, y_stride, nr, first); break;                     \
    case 3: tile(3, G, p, x, mins, kc, y, y_stride, nr, first); break;                     \
    default: tile(TILE, G, p, x, mins, kc, y, y_stride, nr, first); break;                 \
    }
    if (G == 16) {
        TILE_CASES(16)
    } else {
        TILE_CASES(32)
    }
#undef TILE_CASES
}

void mg_neoni8mm_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1) {
    static const mg_q8_gemm_isa isa = {ROWS, 8, TILE, KC, sizeof(panel), pack, tile_any, neon_q8_rows, NULL};
    mg_q8_gemm_drive(&isa, w, xq, n_tok, y, y_stride, r0, r1);
}

/* The neon table's int8 entry on a CPU with the int8 matrix multiply: the GEMM from 2 tokens (as
 * the sdot one; not measured), the sdot rows for one. */
static void linear_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                      int64_t r1) {
    if (n_tok >= 2)
        mg_neoni8mm_gemm_q8(w, xq, n_tok, y, y_stride, r0, r1);
    else
        neon_q8_rows(w, xq, n_tok, y, y_stride, r0, r1);
}

mg_linear_q8_fn mg_neoni8mm_linear_q8(void) { return linear_q8; }
#else
mg_linear_q8_fn mg_neoni8mm_linear_q8(void) { return NULL; }
#endif
