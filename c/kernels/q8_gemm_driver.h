/* The parts of the int8 GEMM (kernels/q8_gemm.h) that do not depend on the vector width, shared
 * by kernels/avx512/q8_gemm_avx512vnni.c (zmm, 16-row panels), kernels/avx2/q8_gemm_avxvnni.c
 * (ymm, 8-row panels) and kernels/neon/q8_gemm_neondot.c (arm64 sdot, 8-row panels): the
 * decoder lookup, x laid out per token tile, and the loops over column chunks, row panels and
 * token tiles.  A GEMM file supplies its panel (pack: decode rows and
 * transpose them into the panel's lines) and its tile (T tokens against one packed panel).
 * Plain C, so that it compiles with any file's flags; include only from the GEMM files. */
#ifndef MG_KERNELS_Q8_GEMM_DRIVER_H
#define MG_KERNELS_Q8_GEMM_DRIVER_H

#include <stdlib.h>
#include <string.h>
#include "core/kernels.h"
#include "kernels/q8_gemm.h"
#include "kernels/unaligned.h"

/* Native FP4's decoder: the AVX2 one where there is one (x86-64 builds with AVX2), else the
 * scalar one (same output). */
static inline mg_q8_decode_fp4_fn *mg_q8_gemm_decoder_fp4(void) {
    mg_q8_decode_fp4_fn *dec = mg_avx2_q8_decoder_fp4();
    return dec ? dec : mg_scalar_q8_decode_fp4;
}

/* The decoder of format f for the architecture the GEMM runs on: the NEON one on arm64, the
 * AVX2 one on x86-64 (every x86 GEMM file runs on a CPU with AVX2); else, or where that set has
 * none, the scalar one (same output). */
static inline mg_q8_decode_fn *mg_q8_gemm_decoder(mg_format f) {
#if defined(__aarch64__)
    mg_q8_decode_fn *dec = mg_neon_q8_decoder(f);
#else
    mg_q8_decode_fn *dec = mg_avx2_q8_decoder_k(f);
    if (!dec) dec = mg_avx2_q8_decoder_iq(f);
#endif
    return dec ? dec : mg_scalar_q8_decode;
}

/* A token tile's x for one column chunk, laid out so that a tile reads everything at constant
 * offsets from one pointer per array: step s's 4 codes of token t at q[s * T + t] (or, for a
 * tile whose steps are 8 columns, smmla's, its 8 codes at q[2 * (s * T + t)], so that two
 * consecutive tokens' are 16 contiguous bytes), group g's values of token t at [g * T + t].  (With a pointer per token gcc kept them all live and
 * copied accumulators between registers: the zmm tile ran at 1.75x the fp32 tiles, not 2.4x.) */
typedef struct {
    const int32_t *q;    /* 4 codes per int32 */
    const int32_t *comp; /* -bias * (sum of the group's codes): the bias of the x86 tiles' unsigned
                          * weights (mg_q8_gemm_isa.code_bias; NEON's sdot is signed x signed and
                          * has none) */
    const float *dx;     /* the scale of the group's 32 columns */
    const float *sx;     /* dx * (sum of the group's codes) (formats with mins) */
} mg_q8_tile_x;

/* Tokens [t0, t0 + T), columns [c0, c0 + kc), in a tile's layout at q (kc / 4 * T int32) and
 * comp, dx, sx (kc / G * T each); unit: the columns of a step, 4 or 8 (then kc is a multiple of
 * 8); bias: what the tiles added to the weights' codes. */
static inline void mg_q8_gemm_prep_tile(const mg_q8_act *xq, int64_t t0, int T, int64_t c0, int64_t kc, int G,
                                        int mins, int unit, int bias, int32_t *q, int32_t *comp, float *dx,
                                        float *sx) {
    const int64_t cols = xq->cols;
    for (int t = 0; t < T; t++) {
        const int8_t *xt = xq->q + (t0 + t) * cols + c0;
        const float *dt = xq->d + (t0 + t) * (cols / 32) + c0 / 32;
        if (unit == 8)
            for (int64_t s = 0; s < kc / 8; s++) memcpy(q + 2 * (s * T + t), xt + 8 * s, 8);
        else
            for (int64_t s = 0; s < kc / 4; s++) q[s * T + t] = (int32_t)mg_ld32(xt + 4 * s);
        for (int64_t g = 0; g < kc / G; g++) {
            int32_t sum = 0;
            for (int i = 0; i < G; i++) sum += xt[g * G + i];
            comp[g * T + t] = -bias * sum;
            dx[g * T + t] = dt[g * G / 32];
            if (mins) sx[g * T + t] = G == 32 ? xq->s[(t0 + t) * (cols / 32) + c0 / 32 + g] : dt[g / 2] * (float)sum;
        }
    }
}

/* The first half of a pack: rows [r, r + nr) of w, columns [c0, c0 + kc), decoded row by row
 * (codes of row i at codes + i * cstride, zeros up to kc_pad; its factors at rfac + i * fstride,
 * mins at rmn + i * fstride) by dec, or for native FP4 (kernels/q8_fp4.h), whose scales a block
 * pointer does not reach, by mg_q8_gemm_decoder_fp4; then the factors gathered per group for the
 * tile: fac[g * rows + i], mn[g * rows + i].  Rows nr .. rows - 1 are zeros.  The second half,
 * the codes' transpose into the panel's lines, is the GEMM file's. */
static inline void mg_q8_gemm_decode_rows(const mg_matrix *w, mg_q8_decode_fn *dec, int64_t r, int nr, int rows,
                                          int64_t c0, int64_t kc, int64_t kc_pad, int8_t *codes, int64_t cstride,
                                          float *rfac, float *rmn, int64_t fstride, float *fac, float *mn) {
    int64_t e, bytes;
    mg_format_block(w->format, &e, &bytes);
    const int G = mg_q8_gemm_group(w->format), mins = mg_q8_gemm_has_mins(w->format);
    const size_t rb = mg_matrix_row_bytes(w);
    const int64_t ng = kc / G;
    for (int i = 0; i < rows; i++) {
        int8_t *ci = codes + i * cstride;
        if (i < nr && w->format == MG_FP4_E2M1) { /* native FP4: its scales are an array of their own */
            mg_q8_gemm_decoder_fp4()((const uint8_t *)w->data + (size_t)(r + i) * rb + (size_t)(c0 / 2),
                                     (const uint8_t *)w->scale + (size_t)(r + i) * (size_t)w->scale_cols + c0 / 32,
                                     kc / 32, ci, rfac + i * fstride);
            memset(ci + kc, 0, (size_t)(kc_pad - kc));
        } else if (i < nr) {
            dec(w->format, (const uint8_t *)w->data + (size_t)(r + i) * rb + (size_t)(c0 / e * bytes), kc / e, ci,
                rfac + i * fstride, rmn + i * fstride);
            memset(ci + kc, 0, (size_t)(kc_pad - kc));
        } else {
            memset(ci, 0, (size_t)kc_pad);
            memset(rfac + i * fstride, 0, (size_t)ng * sizeof(float));
            memset(rmn + i * fstride, 0, (size_t)ng * sizeof(float));
        }
    }
    for (int64_t g = 0; g < ng; g++)
        for (int i = 0; i < rows; i++) {
            fac[g * rows + i] = rfac[i * fstride + g];
            if (mins) mn[g * rows + i] = rmn[i * fstride + g];
        }
}

/* What a GEMM file plugs into the driver. */
typedef struct {
    int rows;           /* rows per panel (the int32 lanes of a vector) */
    int xunit;          /* columns per step of x's tile layout: 4, or 8 (mg_q8_gemm_prep_tile) */
    int tile_max;       /* tokens per tile at most */
    int64_t kc;         /* columns per chunk: a multiple of 256 (every block) and of the pack's transpose */
    size_t panel_bytes; /* the panel's size (allocated 64-byte aligned) */
    /* Decodes rows [r, r + nr) of w, columns [c0, c0 + kc), into the panel (rows nr.. as zeros). */
    void (*pack)(const mg_matrix *w, mg_q8_decode_fn *dec, int64_t r, int nr, int64_t c0, int64_t kc, void *panel);
    /* T tokens (x in a tile's layout) against the panel of kc columns: y[t][0 .. nr) gains the
     * chunk's sums (first: y is overwritten). */
    void (*tile)(int T, int G, const void *panel, const mg_q8_tile_x *x, int mins, int64_t kc, float *y,
                 int64_t y_stride, int nr, int first);
    /* The row entry, one token at a time, when the buffers cannot be allocated (it needs none;
     * called with n_tok = 1 so that it does not come back here). */
    mg_linear_q8_fn rows_entry;
    /* What pack adds to format f's codes to make them unsigned (x's comp takes it off); NULL:
     * 128, the VNNI tiles' bias for every format. */
    int (*code_bias)(mg_format f);
} mg_q8_gemm_isa;

/* The GEMM: per column chunk, every token tile's x laid out once; then per panel of rows, the
 * panel decoded once and every tile run over it while both stay in L1; the chunks' partial sums
 * meet in y. */
static inline __attribute__((always_inline)) void mg_q8_gemm_drive(const mg_q8_gemm_isa *isa, const mg_matrix *w,
                                                                   const mg_q8_act *xq, int64_t n_tok, float *y,
                                                                   int64_t y_stride, int64_t r0, int64_t r1) {
    const mg_format f = w->format;
    const int G = mg_q8_gemm_group(f), mins = mg_q8_gemm_has_mins(f);
    mg_q8_decode_fn *dec = mg_q8_gemm_decoder(f);
    const int64_t KC = isa->kc, ngc = KC / G;
    const int bias = isa->code_bias ? isa->code_bias(f) : 128;
    /* one chunk's x of all tokens in the tiles' layout (q, comp, dx, sx), and the panel */
    int32_t *xbuf = aligned_alloc(64, ((size_t)n_tok * (size_t)(KC + 3 * 4 * ngc) + 63) / 64 * 64);
    void *p = aligned_alloc(64, (isa->panel_bytes + 63) / 64 * 64);
    if (!xbuf || !p) {
        free(xbuf), free(p);
        for (int64_t t = 0; t < n_tok; t++) {
            const mg_q8_act one = {xq->q + t * xq->cols, xq->d + t * (xq->cols / 32), xq->s + t * (xq->cols / 32),
                                   xq->cols};
            isa->rows_entry(w, &one, 1, y + t * y_stride, y_stride, r0, r1);
        }
        return;
    }
    int32_t *xcomp = xbuf + n_tok * (KC / 4);
    float *xdx = (float *)(xcomp + n_tok * ngc), *xsx = xdx + n_tok * ngc;
    /* tiles of equal size, at most isa->tile_max tokens each */
    const int64_t n_tiles = (n_tok + isa->tile_max - 1) / isa->tile_max;
    for (int64_t c0 = 0; c0 < w->cols; c0 += KC) {
        const int64_t kc = w->cols - c0 < KC ? w->cols - c0 : KC;
        for (int64_t i = 0, t0 = 0; i < n_tiles; i++) {
            const int T = (int)((n_tok * (i + 1)) / n_tiles - t0);
            mg_q8_gemm_prep_tile(xq, t0, T, c0, kc, G, mins, isa->xunit, bias, xbuf + t0 * (KC / 4),
                                 xcomp + t0 * ngc, xdx + t0 * ngc, xsx + t0 * ngc);
            t0 += T;
        }
        for (int64_t r = r0; r < r1; r += isa->rows) {
            const int nr = r1 - r < isa->rows ? (int)(r1 - r) : isa->rows;
            isa->pack(w, dec, r, nr, c0, kc, p);
            for (int64_t i = 0, t0 = 0; i < n_tiles; i++) {
                const int T = (int)((n_tok * (i + 1)) / n_tiles - t0);
                const mg_q8_tile_x x = {xbuf + t0 * (KC / 4), xcomp + t0 * ngc, xdx + t0 * ngc, xsx + t0 * ngc};
                isa->tile(T, G, p, &x, mins, kc, y + t0 * y_stride + r, y_stride, nr, c0 == 0);
                t0 += T;
            }
        }
    }
    free(xbuf), free(p);
}

#endif
