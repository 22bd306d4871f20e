/* The int8-activation GEMM (prefill with --activations int8) on plain AVX2, for the CPUs without
 * any VNNI (AMD Zen 2 and Zen 3, Intel Haswell to Comet Lake), which otherwise prefill on fp32
 * tiles.  The design of the AVX-VNNI one (q8_gemm_avxvnni.c: 8-row panels packed by an 8 x 8
 * int32 transpose, each token's 4 x codes broadcast, the weights the reused operand; the
 * contract: kernels/q8_gemm.h) with vpmaddubsw in place of vpdpbusd.  vpmaddubsw adds its two
 * u8 x s8 products in i16 with saturation, so where vpdpbusd takes codes + 128 for every format,
 * here each format's codes get the smallest bias that makes them unsigned (code_forms: 0 for
 * Q4_K, whose codes are 0..15), and the i16 pair sums of S steps of 4 columns add up in i16
 * before one vpmaddwd widens them (S * 2 * U * 127 <= 32767 for the largest biased code U: no
 * sum can saturate or wrap, so the int32 sums are exact).  For Q4_K that is one vpmaddubsw and
 * one vpaddw per step and token, where the fp32 tiles take four FMAs.  The formats whose codes
 * span more than 129 values (Q8_0, IQ4_NL, IQ4_XS) are split as code + 128 = lo + 16 hi into two
 * nibble planes, each summed as Q4_K's, the high plane's sums times 16 in its vpmaddwd.
 * Checked against the scalar twin by tests/c/test_ggml_q8.c and test_q8_fp4.c through the avx2
 * table of a CPU without AVX-VNNI (tests/c/prefetch_flipped.h). */
#include "kernels/tables.h"
#include "kernels/q8_gemm_driver.h"
#include "kernels/q8_rows.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"
#include "kernels/avx2/q8_tile_avx2.h"

/* Tokens per tile: 3 vectors each (two i16 sums, or an i16 and an int32 one, and the float
 * accumulator) and 4 live vectors fit the 16 ymm; 3 measured the same or slower
 * (docs/KERNELS.md). */
#ifndef MG_AVX2_GEMM_TILE
#define MG_AVX2_GEMM_TILE 4
#endif
enum {
    ROWS = 8,                 /* rows per panel: the 8 int32 lanes of a ymm */
    KC = 1024,                /* columns per chunk: a multiple of 256 (every block) and of 32 (the transpose) */
    TILE = MG_AVX2_GEMM_TILE, /* tokens per tile */
};

/* How a format's codes (the contract's, kernels/scalar/q8_scalar.c) become unsigned bytes: + bias,
 * at most max after it.  max > 129 (a pair of products could saturate): the two nibble planes. */
typedef struct {
    int bias, max;
} code_form;

static code_form code_forms(mg_format f) {
    switch (f) {
    case MG_Q4_K: case MG_Q4_1: return (code_form){0, 15};
    case MG_Q5_K: case MG_Q5_1: return (code_form){0, 31};
    case MG_Q2_K: return (code_form){0, 3};
    case MG_Q3_K: return (code_form){4, 7};      /* -4..3 */
    case MG_Q4_0: return (code_form){8, 15};     /* -8..7 */
    case MG_Q5_0: return (code_form){16, 31};    /* -16..15 */
    case MG_Q6_K: return (code_form){32, 63};    /* -32..31 */
    case MG_MXFP4: case MG_FP4_E2M1: return (code_form){12, 24}; /* twice the e2m1 values */
    case MG_IQ1_S: case MG_IQ1_M: return (code_form){9, 18};    /* 8g +- 1 */
    case MG_IQ3_S: return (code_form){15, 30};
    case MG_IQ2_XXS: case MG_IQ2_XS: case MG_IQ2_S: return (code_form){43, 86};
    case MG_IQ3_XXS: return (code_form){62, 124};
    default: return (code_form){128, 255}; /* Q8_0, IQ4_NL, IQ4_XS: any int8 code */
    }
}

static int code_bias(mg_format f) { return code_forms(f).bias; }

/* Steps (of 4 columns) whose i16 pair sums add up before one vpmaddwd: the most of 8, 4, 2, 1 with
 * S * 2 * max * 127 <= 32767 (each pair of products is at most 2 * max * 127; x's codes are
 * within [-127, 127], core/q8_act.h); 8 for the nibble planes (max 15). */
static int sum_steps(code_form c) {
    const int max = c.max > 129 ? 15 : c.max;
    int s = 8;
    while (s > 1 && s * 2 * max * 127 > 32767) s /= 2;
    return s;
}

/* One chunk of 8 rows, decoded and packed. */
typedef struct {
    uint8_t line[KC / 4][32] __attribute__((aligned(64))); /* line s: rows 0-7's columns 4s..4s+3, + bias
                                                            * (the nibble planes: the low nibbles) */
    uint8_t high[KC / 4][32] __attribute__((aligned(64))); /* the nibble planes: the high nibbles */
    float fac[KC / 16][ROWS] __attribute__((aligned(64)));  /* per group: the 8 rows' factors */
    float mn[KC / 16][ROWS] __attribute__((aligned(64)));   /* per group: the 8 rows' mins */
    int8_t codes[ROWS][KC] __attribute__((aligned(64)));    /* the decoder's output, row by row */
    float rfac[ROWS][KC / 16], rmn[ROWS][KC / 16];
    int steps, planes; /* the format's sum_steps; planes: split into nibble planes */
} panel;

/* Decodes rows [r, r + nr) of w, columns [c0, c0 + kc), into the panel (rows nr.. as zeros). */
static void pack(const mg_matrix *w, mg_q8_decode_fn *dec, int64_t r, int nr, int64_t c0, int64_t kc, void *vp) {
    panel *p = vp;
    const code_form form = code_forms(w->format);
    p->steps = sum_steps(form), p->planes = form.max > 129;
    const int64_t kc32 = (kc + 31) / 32 * 32;
    mg_q8_gemm_decode_rows(w, dec, r, nr, ROWS, c0, kc, kc32, p->codes[0], KC, p->rfac[0], p->rmn[0], KC / 16,
                           p->fac[0], p->mn[0]);
    const __m256i bias = _mm256_set1_epi8((char)form.bias), m4 = _mm256_set1_epi8(15);
    for (int64_t j = 0; j < kc32 / 32; j++) {
        __m256i v[8];
        for (int i = 0; i < 8; i++) v[i] = _mm256_load_si256((const __m256i *)(p->codes[i] + 32 * j));
        mg_avx2_transpose8x8_epi32(v);
        for (int s = 0; s < 8; s++) {
            const __m256i u = _mm256_add_epi8(v[s], bias); /* wraps to code + 128 for the planes */
            if (p->planes) {
                _mm256_store_si256((__m256i *)p->line[8 * j + s], _mm256_and_si256(u, m4));
                _mm256_store_si256((__m256i *)p->high[8 * j + s], _mm256_and_si256(_mm256_srli_epi16(u, 4), m4));
            } else {
                _mm256_store_si256((__m256i *)p->line[8 * j + s], u);
            }
        }
    }
}

/* The empty asm makes v a register GCC cannot see into at this point, so each token's sum is
 * added step by step as written: without it GCC computed all the steps' vpmaddubsw first, spilled
 * them to the stack, and added them up as a tree afterwards (half the speed). */
INLINE void keep_in_register(__m256i *v) { __asm__("" : "+x"(*v)); }

/* T tokens against the panel of a chunk of kc columns, S steps per i16 sum (PLANES: the two
 * nibble planes): y[t][0 .. nr) gains the chunk's sums (first: y is overwritten). */
INLINE void tile(const int T, const int G, const int S, const int PLANES, const panel *p, const mg_q8_tile_x *x,
                 int mins, int64_t kc, float *y, int64_t y_stride, int nr, int first) {
    const __m256i ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
    __m256 acc[TILE];
    mg_avx2_tile_load(T, acc, y, y_stride, nr, first);
    const int32_t *xq = x->q;
    const int steps = G / 4, per_sum = S < steps ? S : steps;
    for (int64_t g = 0; g < kc / G; g++, xq += steps * T) {
        __m256i s[TILE];
#pragma GCC unroll 8
        for (int j0 = 0; j0 < steps; j0 += per_sum) {
            __m256i lo[TILE], hi[TILE];
#pragma GCC unroll 8
            for (int j = j0; j < j0 + per_sum; j++) {
                const __m256i wl = _mm256_load_si256((const __m256i *)p->line[g * steps + j]);
                const __m256i wh = PLANES ? _mm256_load_si256((const __m256i *)p->high[g * steps + j]) : wl;
                for (int t = 0; t < T; t++) {
                    const __m256i xb = _mm256_set1_epi32(xq[j * T + t]);
                    const __m256i a = _mm256_maddubs_epi16(wl, xb);
                    lo[t] = j == j0 ? a : _mm256_add_epi16(lo[t], a);
                    keep_in_register(&lo[t]);
                    if (PLANES) {
                        const __m256i b = _mm256_maddubs_epi16(wh, xb);
                        hi[t] = j == j0 ? b : _mm256_add_epi16(hi[t], b);
                        keep_in_register(&hi[t]);
                    }
                }
            }
            for (int t = 0; t < T; t++) {
                __m256i v = _mm256_madd_epi16(lo[t], ones);
                if (PLANES) v = _mm256_add_epi32(v, _mm256_madd_epi16(hi[t], sixteen));
                s[t] = j0 == 0 ? _mm256_add_epi32(v, _mm256_set1_epi32(x->comp[g * T + t])) : _mm256_add_epi32(s[t], v);
            }
        }
        mg_avx2_tile_group(T, acc, s, p->fac[g], p->mn[g], x, g, mins);
    }
    mg_avx2_tile_store(T, acc, y, y_stride, nr);
}

/* T, G, S and the planes as constants of the loops. */
#define TILE_T(G, S, PL)                                                                                    \
    switch (T) {                                                                                            \
    case 1: tile(1, G, S, PL, p, x, mins, kc, y, y_stride, nr, first); break;                               \
    case 2: tile(2 < TILE ? 2 : TILE, G, S, PL, p, x, mins, kc, y, y_stride, nr, first); break;             \
    case 3: tile(3 < TILE ? 3 : TILE, G, S, PL, p, x, mins, kc, y, y_stride, nr, first); break;             \
    default: tile(TILE, G, S, PL, p, x, mins, kc, y, y_stride, nr, first); break;                           \
    }
#define TILE_S(G)                                                                                           \
    switch (p->steps) {                                                                                     \
    case 1: TILE_T(G, 1, 0) break;                                                                          \
    case 2: TILE_T(G, 2, 0) break;                                                                          \
    case 4: TILE_T(G, 4, 0) break;                                                                          \
    default: TILE_T(G, 8, 0) break;                                                                         \
    }

_Static_assert(TILE >= 1 && TILE <= 4, "TILE_T has a case for every count below TILE");

static void tile_any(int T, int G, const void *vp, const mg_q8_tile_x *x, int mins, int64_t kc, float *y,
                     int64_t y_stride, int nr, int first) {
    const panel *p = vp;
    if (p->planes) { /* Q8_0, IQ4_NL, IQ4_XS: groups of 32 */
        TILE_T(32, 8, 1)
    } else if (G == 16) {
        TILE_S(16)
    } else {
        TILE_S(32)
    }
}

void mg_avx2_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                     int64_t r1) {
    static const mg_q8_gemm_isa isa = {ROWS, 4, TILE, KC, sizeof(panel), pack, tile_any, mg_avx2_gemm_rows_entry, code_bias};
    mg_q8_gemm_drive(&isa, w, xq, n_tok, y, y_stride, r0, r1);
}

/* The token count from which this GEMM, which decodes each row once for all tokens, beats the
 * AVX2 rows, which decode it again per token (one core, 256 x 2048, docs/KERNELS.md): 2 for the
 * grid formats, whose rows are the slowest, 4 for the nibble planes (Q8_0 at 3 tokens: 54 GOPS
 * against the rows' 58), else 3 (Q4_K level with the rows at 3, Q6_K 63 against 50). */
static int64_t gemm_min_tok(mg_format f) { return f >= MG_IQ2_XXS ? 2 : code_forms(f).max > 129 ? 4 : 3; }

/* The avx2 table's int8 entry on a CPU without AVX-VNNI: the GEMM for several tokens, the rows
 * for fewer. */
MG_Q8_GEMM_ENTRIES(mg_avx2_linear_q8_gemm, gemm_min_tok, mg_avx2_gemm_q8, mg_avx2_linear_q8_rows)
#else
mg_linear_q8_fn mg_avx2_linear_q8_gemm(int prefetch_l2) { return NULL; }
#endif
