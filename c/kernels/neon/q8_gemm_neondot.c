/* The int8-activation GEMM (prefill with --activations int8) on arm64 with the dot-product
 * extension (sdot): the contract of kernels/q8_gemm.h, the design of the x86 GEMMs
 * (avx512/q8_gemm_avx512vnni.c; the loops, x's tile layout and the decoder lookup are
 * kernels/q8_gemm_driver.h's), this file the panel and the tile.  Compiled with
 * -march=armv8.2-a+dotprod (the _neondot.c suffix, c/flags.mk); the neon table takes its entry
 * only on a CPU whose HWCAP has the extension (table_neon.c).  Checked against the scalar twin
 * under qemu by tests/c/test_ggml_q8.c; not timed (no arm64 machine: docs/KERNELS.md).
 *
 * Why a GEMM: the neon table's int8 rows (ggml_neon.c) decode every weight row again for every
 * token, and, built for the baseline, multiply by widening (vmull_s8 + vpadalq_s16: 4
 * instructions per 16 products).  Here each row is decoded once per call (the NEON decoders,
 * q8_decode_neon.c) and one sdot does 16 products:
 *  - panels of 8 rows: line s (32 bytes) holds columns 4s..4s+3 of rows 0-3 (the first 16
 *    bytes) and of rows 4-7, by 4 x 4 int32 transposes of the decoded codes;
 *  - an int32x4 accumulator is 4 rows of one token; per 4 columns, sdot by element
 *    (vdotq_laneq_s32) multiplies a half line by one token's 4 x codes, taken from a vector that
 *    holds 4 tokens' codes for those columns: the driver lays x out as q[s * T + t], so one load
 *    serves 4 tokens;
 *  - sdot is signed x signed, so the codes go in as they are: no +128 bias and no comp term (the
 *    x86 tiles need those for vpdpbusd's unsigned operand); the K-quants' unsigned codes (0..31)
 *    are non-negative int8 anyway;
 *  - per group of G columns each accumulator is converted and scaled once, as on x86:
 *    acc += (fac * dx) * isum - mn * sx.
 * Registers (32 q registers): a token needs 4, two int32 group sums and two float accumulators
 * (8 rows), so tiles of at most TILE = 6 tokens: 24, plus the line's two halves, two x vectors and
 * the factors.  gcc 12 keeps them all in registers: the step loop (2 steps, 24 sdot at T = 6)
 * has no stack access, the group loop 3 (aarch64-linux-gnu-gcc -O3, objdump).
 * The per-group conversion costs 3 instructions (4 with mins) per 8 sdot (G = 32) or per 4
 * (G = 16), the same ratio as the x86 tiles. */
#include "kernels/tables.h"
#include "kernels/q8_gemm_driver.h"

#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#include "kernels/neon/neon.h"
#include "kernels/neon/q8_rows_neon.h" /* the rows, built here with sdot */

/* Compile-time knobs for measuring on a real arm64 CPU (TILE up to 8: the tile cases below). */
#ifndef MG_NEONDOT_TILE
#define MG_NEONDOT_TILE 6
#endif
#ifndef MG_NEONDOT_KC
#define MG_NEONDOT_KC 1024
#endif

enum {
    ROWS = 8,               /* rows per panel: two int32x4 */
    KC = MG_NEONDOT_KC,     /* columns per chunk: a multiple of 256 (every block) and of 16 (the transpose) */
    TILE = MG_NEONDOT_TILE, /* tokens per tile: 4 * TILE accumulators + 6 live vectors fit the 32 q registers */
};

_Static_assert(TILE >= 1 && TILE <= 8, "TILE_CASES has a case for every count below TILE");
_Static_assert(KC % 256 == 0, "a chunk holds whole blocks");

/* One chunk of 8 rows, decoded and packed. */
typedef struct {
    int8_t line[KC / 4][4 * ROWS] __attribute__((aligned(64))); /* line s: rows 0-3's columns 4s..4s+3, rows 4-7's */
    float fac[KC / 16][ROWS] __attribute__((aligned(64)));     /* per group: the 8 rows' factors */
    float mn[KC / 16][ROWS] __attribute__((aligned(64)));      /* per group: the 8 rows' mins */
    int8_t codes[ROWS][KC] __attribute__((aligned(64)));       /* the decoder's output, row by row */
    float rfac[ROWS][KC / 16], rmn[ROWS][KC / 16];
} panel;

/* 4 x 4 int32 transpose: out[c] = (a[c], b[c], c[c], d[c]), column c = 4 codes of one row. */
ALWAYS_INLINE void transpose4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d, int32x4_t out[4]) {
    const int64x2_t t0 = vreinterpretq_s64_s32(vtrn1q_s32(a, b)); /* a0 b0 a2 b2 */
    const int64x2_t t1 = vreinterpretq_s64_s32(vtrn2q_s32(a, b)); /* a1 b1 a3 b3 */
    const int64x2_t t2 = vreinterpretq_s64_s32(vtrn1q_s32(c, d)); /* c0 d0 c2 d2 */
    const int64x2_t t3 = vreinterpretq_s64_s32(vtrn2q_s32(c, d)); /* c1 d1 c3 d3 */
    out[0] = vreinterpretq_s32_s64(vtrn1q_s64(t0, t2));
    out[1] = vreinterpretq_s32_s64(vtrn1q_s64(t1, t3));
    out[2] = vreinterpretq_s32_s64(vtrn2q_s64(t0, t2));
    out[3] = vreinterpretq_s32_s64(vtrn2q_s64(t1, t3));
}

ALWAYS_INLINE int32x4_t ld_s32(const int8_t *p) { return vreinterpretq_s32_s8(vld1q_s8(p)); }

/* Decodes rows [r, r + nr) of w, columns [c0, c0 + kc), into the panel (rows nr.. as zeros). */
static void pack(const mg_matrix *w, mg_q8_decode_fn *dec, int64_t r, int nr, int64_t c0, int64_t kc, void *vp) {
    panel *p = vp;
    const int64_t kc16 = (kc + 15) / 16 * 16;
    mg_q8_gemm_decode_rows(w, dec, r, nr, ROWS, c0, kc, kc16, p->codes[0], KC, p->rfac[0], p->rmn[0], KC / 16,
                           p->fac[0], p->mn[0]);
    for (int64_t j = 0; j < kc16 / 16; j++)
        for (int h = 0; h < 2; h++) { /* rows 4h .. 4h + 3, columns 16j .. 16j + 15 */
            int32x4_t v[4];
            transpose4(ld_s32(p->codes[4 * h] + 16 * j), ld_s32(p->codes[4 * h + 1] + 16 * j),
                       ld_s32(p->codes[4 * h + 2] + 16 * j), ld_s32(p->codes[4 * h + 3] + 16 * j), v);
            for (int s = 0; s < 4; s++) vst1q_s8(p->line[4 * j + s] + 16 * h, vreinterpretq_s8_s32(v[s]));
        }
}

/* The 4-column x codes of n (1..4, a constant after inlining) consecutive tokens at q as the lanes
 * of one vector; lanes n.. are never read (zero, or a copy of lane 0), and nothing past q[n - 1]
 * is loaded. */
ALWAYS_INLINE int8x16_t x_lanes(const int32_t *q, const int n) {
    switch (n) {
    case 1: return vreinterpretq_s8_s32(vld1q_dup_s32(q));
    case 2: return vreinterpretq_s8_s32(vcombine_s32(vld1_s32(q), vdup_n_s32(0)));
    case 3: return vreinterpretq_s8_s32(vld1q_lane_s32(q + 2, vcombine_s32(vld1_s32(q), vdup_n_s32(0)), 2));
    default: return vreinterpretq_s8_s32(vld1q_s32(q));
    }
}

/* acc + sdot of w's 4 rows with lane l of x (l a constant after inlining: the instruction takes
 * the lane as an immediate; the switch keeps that true whatever the optimiser does). */
ALWAYS_INLINE int32x4_t dot_lane(int32x4_t acc, int8x16_t w, int8x16_t x, const int l) {
    switch (l) {
    case 0: return vdotq_laneq_s32(acc, w, x, 0);
    case 1: return vdotq_laneq_s32(acc, w, x, 1);
    case 2: return vdotq_laneq_s32(acc, w, x, 2);
    default: return vdotq_laneq_s32(acc, w, x, 3);
    }
}

/* T tokens against the panel of a chunk of kc columns: y[t][0 .. nr) gains the chunk's sums
 * (first: y is overwritten). */
ALWAYS_INLINE void tile(const int T, const int G, const panel *p, const mg_q8_tile_x *x, int mins, int64_t kc, float *y,
                        int64_t y_stride, int nr, int first) {
    float32x4_t acc[TILE][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        if (first) {
            acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
        } else if (nr == ROWS) {
            acc[t][0] = vld1q_f32(y + t * y_stride), acc[t][1] = vld1q_f32(y + t * y_stride + 4);
        } else {
            float b[ROWS] = {0};
            memcpy(b, y + t * y_stride, sizeof(float) * (size_t)nr);
            acc[t][0] = vld1q_f32(b), acc[t][1] = vld1q_f32(b + 4);
        }
    }
    const int32_t *xq = x->q;
    for (int64_t g = 0; g < kc / G; g++, xq += G / 4 * T) {
        int32x4_t s[TILE][2];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) s[t][0] = s[t][1] = vdupq_n_s32(0);
        /* unrolled by 2, not 8: with the whole group unrolled, gcc 12 hoisted all 16 line loads
         * ahead of the sdots and spilled the accumulators to the stack */
#pragma GCC unroll 2
        for (int j = 0; j < G / 4; j++) {
            const int8_t *l = p->line[g * (G / 4) + j];
            const int8x16_t w0 = vld1q_s8(l), w1 = vld1q_s8(l + 16);
#pragma GCC unroll 2
            for (int b = 0; b < (T + 3) / 4; b++) {
                const int n = T - 4 * b < 4 ? T - 4 * b : 4;
                const int8x16_t xv = x_lanes(xq + j * T + 4 * b, n);
#pragma GCC unroll 4
                for (int k = 0; k < n; k++) {
                    s[4 * b + k][0] = dot_lane(s[4 * b + k][0], w0, xv, k);
                    s[4 * b + k][1] = dot_lane(s[4 * b + k][1], w1, xv, k);
                }
            }
        }
        const float32x4_t f0 = vld1q_f32(p->fac[g]), f1 = vld1q_f32(p->fac[g] + 4);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const float dx = x->dx[g * T + t];
            acc[t][0] = vfmaq_f32(acc[t][0], vcvtq_f32_s32(s[t][0]), vmulq_n_f32(f0, dx));
            acc[t][1] = vfmaq_f32(acc[t][1], vcvtq_f32_s32(s[t][1]), vmulq_n_f32(f1, dx));
        }
        if (mins) {
            const float32x4_t m0 = vld1q_f32(p->mn[g]), m1 = vld1q_f32(p->mn[g] + 4);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const float sx = x->sx[g * T + t];
                acc[t][0] = vfmsq_n_f32(acc[t][0], m0, sx), acc[t][1] = vfmsq_n_f32(acc[t][1], m1, sx);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        if (nr == ROWS) {
            vst1q_f32(y + t * y_stride, acc[t][0]), vst1q_f32(y + t * y_stride + 4, acc[t][1]);
        } else {
            float b[ROWS];
            vst1q_f32(b, acc[t][0]), vst1q_f32(b + 4, acc[t][1]);
            memcpy(y + t * y_stride, b, sizeof(float) * (size_t)nr);
        }
    }
}

#define TILE_CASE(N, G) \
    case N: tile(N < TILE ? N : TILE, G, p, x, mins, kc, y, y_stride, nr, first); break;
#define TILE_CASES(G)                                                                                     \
    switch (T) {                                                                                          \
        TILE_CASE(1, G) TILE_CASE(2, G) TILE_CASE(3, G) TILE_CASE(4, G) TILE_CASE(5, G) TILE_CASE(6, G) \
        TILE_CASE(7, G)                                                                                   \
    default: tile(TILE, G, p, x, mins, kc, y, y_stride, nr, first); break;                                \
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

void mg_neondot_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                        int64_t r0, int64_t r1) {
    static const mg_q8_gemm_isa isa = {ROWS, 4, TILE, KC, sizeof(panel), pack, tile_any, neon_q8_rows, NULL};
    mg_q8_gemm_drive(&isa, w, xq, n_tok, y, y_stride, r0, r1);
}

/* The token count from which the GEMM takes over from the rows (q8_rows_neon.h, built in this
 * file with sdot).  Not measured (no arm64 machine): 2 for every format.  The rows were first
 * built for the baseline only (4 instructions per 16 products); with sdot they pay one, as the
 * GEMM, but still decode every weight row again per token, where the GEMM decodes it once per
 * call (docs/KERNELS.md, "NEON int8 GEMM", has the instruction counts under qemu).  On x86, whose
 * VNNI rows use the GEMM's instruction too, the rows win up to 2-4 tokens: the first thing to
 * measure on real hardware. */
static int64_t gemm_min_tok(mg_format f) { return 2; }

/* The neon table's int8 entry on a CPU with the dot product: the GEMM for several tokens, the
 * rows for fewer. */
static void linear_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                      int64_t r1) {
    if (n_tok >= gemm_min_tok(w->format))
        mg_neondot_gemm_q8(w, xq, n_tok, y, y_stride, r0, r1);
    else
        neon_q8_rows(w, xq, n_tok, y, y_stride, r0, r1);
}

mg_linear_q8_fn mg_neondot_linear_q8(void) { return linear_q8; }
#else
mg_linear_q8_fn mg_neondot_linear_q8(void) { return NULL; }
#endif
