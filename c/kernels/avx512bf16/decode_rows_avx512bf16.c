/* AVX-512 with AVX512_BF16 (AMD Zen 4 and later, Intel Cooper Lake / Sapphire Rapids and later):
 * a cheaper decode (n_tok == 1) of fp4 e2m1 weights than the parent (avx512) table's.  Compiled with the
 * avx512 flags plus -mavx512bf16; c/core/cpu.c selects it only on CPUs that report the feature.
 *
 * Why: the avx512 fp4 loop spends 26 512-bit operations per 64-byte line and row (seven shifts,
 * nine vpermps, nine FMAs, an add).  On a Zen 4 core that fills the four 256-bit FP pipes well
 * below what memory gives one core, so fp4 decode was compute bound.  vdpbf16ps multiplies 32 pairs per operation against 16 for an FMA, and every e2m1
 * value is exact in bf16, so here a line and row costs 18: three 16-bit shifts and four vpermw
 * (a 32-entry table of the codes' bf16 values; vpermw reads the low five bits of each 16-bit
 * lane, so shifts by 4, 8 and 12 bring each nibble down and the table repeats after 16), eight
 * vdpbf16ps, one add and the group-scale multiply (docs/KERNELS.md for what it gained).
 *
 * Exactness: x goes in as two bf16 parts, hi = bf16(x) and lo = bf16(x - hi), both rounded to
 * nearest even; x - hi is exact in fp32, so |hi + lo - x| <= 2^-18 |x|.  Each product of an e2m1
 * value and a part is exact in fp32 and vdpbf16ps adds them with fp32 rounding, so a row differs
 * from the scalar twin by at most 2^-18 of sum |w x| beyond fp32 reordering (3.8e-6, inside the
 * kernel tests' 1e-5; a third part would make it exact but was no faster than the avx512 loop).
 * vdpbf16ps treats denormal inputs as zero, so x with a non-finite value, a magnitude of 2^127 or
 * more, or a non-zero magnitude under 2^-100 (whose lo part could be denormal) takes the parent
 * table's loop instead.
 *
 * Lanes: vector k (nibble k of each 16-bit lane) holds columns 4j + k in 16-bit lane j, so fp32
 * lane i sums columns 8i + k and 8i + 4 + k: lanes 4g..4g+3 hold group g of the line, exactly as
 * in the avx512 loop, and the same scale vector [s0 x4, s1 x4, s2 x4, s3 x4] applies. */
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512BF16__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "kernels/avx512bf16/avx512bf16.h"

/* bf16 of the e2m1 code i & 15, for i < 32 (vpermw indexes with five bits). */
INLINE __m512i fp4_bf16_table(void) {
    static const uint16_t t[16] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
                                   0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};
    const __m256i half = _mm256_loadu_si256((const __m256i *)t);
    return _mm512_inserti64x4(_mm512_castsi256_si512(half), half, 1);
}

/* Whether every x splits into hi + lo as described at the top (no denormal or overflowing part). */
static int x_splits(const float *x, int64_t n) {
    const __m512 big = _mm512_set1_ps(0x1p127f), tiny = _mm512_set1_ps(0x1p-100f), zero = _mm512_setzero_ps();
    int64_t i = 0;
    __mmask16 bad = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + i));
        /* NaN fails the ordered compare, so it counts as bad */
        bad |= (__mmask16)~_mm512_cmp_ps_mask(a, big, _CMP_LT_OQ) |
               (_mm512_cmp_ps_mask(a, tiny, _CMP_LT_OQ) & _mm512_cmp_ps_mask(a, zero, _CMP_NEQ_OQ));
    }
    for (; i < n; i++) {
        const float a = fabsf(x[i]);
        if (!(a < 0x1p127f) || (a != 0.0f && a < 0x1p-100f)) return 0;
    }
    return bad == 0;
}

/* x[0, kc) as the hi and lo bf16 parts in the order the row loop reads them: per 128 columns and
 * nibble k, 32 hi words (word j = column 4j + k) then the 32 lo words. */
static void split_x(const float *x, int64_t kc, uint16_t *xb) {
    for (int64_t g = 0; g < kc; g += 128, xb += 256)
        for (int k = 0; k < 4; k++) {
            float v[32] __attribute__((aligned(64)));
            for (int j = 0; j < 32; j++) v[j] = x[g + 4 * j + k];
            const __m512 v0 = _mm512_load_ps(v), v1 = _mm512_load_ps(v + 16);
            const __m512bh hi = _mm512_cvtne2ps_pbh(v1, v0); /* words 0-15 from v0, 16-31 from v1 */
            const __m512i h = (__m512i)hi;
            const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
            const __m512 h1 =
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
            const __m512bh lo = _mm512_cvtne2ps_pbh(_mm512_sub_ps(v1, h1), _mm512_sub_ps(v0, h0));
            _mm512_store_si512(xb + 64 * k, h);
            _mm512_store_si512(xb + 64 * k + 32, (__m512i)lo);
        }
}

/* R (1..4) rows at once, like the avx512 rows_fp4: p[j] points at the same columns of row j, s[j]
 * at its group scales (NULL: unscaled); each line's hi and lo x loads serve all R rows. */
INLINE void rows_fp4_dp(const int R, const uint8_t *const *p, const uint16_t *xb, int64_t nb, const float *const *s,
                        size_t ahead, float *out) {
    const __m512i tab = fp4_bf16_table();
    __m512 acc[4];
    for (int j = 0; j < R; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xb += 256) {
        __m512 dh[4], dl[4];
        __m512i w[4];
        for (int j = 0; j < R; j++) {
            w[j] = load_line(p[j], i, ahead);
            dh[j] = dl[j] = _mm512_setzero_ps();
        }
        for (int k = 0; k < 4; k++) {
            const __m512bh xh = (__m512bh)_mm512_load_si512(xb + 64 * k);
            const __m512bh xl = (__m512bh)_mm512_load_si512(xb + 64 * k + 32);
            for (int j = 0; j < R; j++) {
                const __m512i n = k == 0 ? w[j] : _mm512_srli_epi16(w[j], 4 * k);
                const __m512bh wb = (__m512bh)_mm512_permutexvar_epi16(n, tab);
                dh[j] = _mm512_dpbf16_ps(dh[j], wb, xh);
                dl[j] = _mm512_dpbf16_ps(dl[j], wb, xl);
            }
        }
        for (int j = 0; j < R; j++) { /* s[0] is loop-invariant: the compiler unswitches */
            const __m512 part = _mm512_add_ps(dh[j], dl[j]);
            acc[j] = s[0] ? _mm512_fmadd_ps(part, fp4_line_scales(s[j], i), acc[j]) : _mm512_add_ps(acc[j], part);
        }
    }
    for (int j = 0; j < R; j++) out[j] = _mm512_reduce_add_ps(acc[j]);
}

MG_FP4_ROWS_FN(fp4_rows_dp, rows_fp4_dp, uint16_t)

/* Decode of rows [r0, r1); returns 0 (having written nothing) when the parent table's entry must do it. */
int mg_avx512bf16_decode_fp4(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1) {
    if (w->cols % 128 || !(w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_E8M0_G32 ||
                           w->scale_kind == MG_SCALE_F32_ROW))
        return 0;
    if (!x_splits(x, w->cols)) return 0;
    uint16_t xb[2 * XP_COLS] __attribute__((aligned(64)));
    float sfr[4][XP_COLS / 32];
    for (int64_t c0 = 0; c0 < w->cols; c0 += XP_COLS) {
        const int64_t kc = w->cols - c0 < XP_COLS ? w->cols - c0 : XP_COLS;
        split_x(x + c0, kc, xb);
        for (int64_t r = r0; r < r1;) r += fp4_rows_dp(w, r, r1 - r < 4 ? r1 - r : 4, c0, kc, xb, y, sfr);
    }
    return 1;
}

#endif
