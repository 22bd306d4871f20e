/* Weight number formats as they appear in checkpoints, and their scalar decoders.
 * The scalar decoders are the ground truth every SIMD kernel is tested against. */
#ifndef MG_FORMATS_H
#define MG_FORMATS_H

#include <stdint.h>
#include <string.h>
#include <math.h>

typedef enum mg_format {
    MG_F32 = 0,
    MG_BF16 = 1,
    MG_F16 = 2,
    MG_FP8_E4M3 = 3, /* "fn" variant: no inf, S.1111.111 is NaN, max 448 */
    MG_FP4_E2M1 = 4, /* two codes per byte, low nibble = even column */
    /* ggml block formats, as GGUF files store them (docs/reference/gguf.md §2): each row is a
     * run of self-scaled blocks (mg_format_block gives their size); no separate scale table. */
    MG_Q8_0 = 5,
    MG_Q4_0 = 6,
    MG_Q5_0 = 7,
    MG_Q4_K = 8,
    MG_Q5_K = 9,
    MG_Q6_K = 10,
    MG_MXFP4 = 11,   /* GGUF layout: e8m0 byte, then 16 bytes (element j low nibble, j+16 high) */
    MG_IQ4_NL = 12,
    MG_IQ4_XS = 13,
    MG_Q4_1 = 14,    /* Q4_0 / Q5_0 with an f16 min: GLM-4.5-Air's ffn_down in Q5_K files, UD mixes */
    MG_Q5_1 = 15,
    MG_Q2_K = 16,    /* Q2_K_*, Q3_K_* and UD-Q2_K_XL / Q3_K_XL files */
    MG_Q3_K = 17,
    /* the codebook formats of UD-IQ1 / IQ2 / IQ3 files (grids in core/iq_grids.h) */
    MG_IQ2_XXS = 18,
    MG_IQ2_XS = 19,
    MG_IQ2_S = 20,
    MG_IQ3_XXS = 21,
    MG_IQ3_S = 22,
    MG_IQ1_S = 23,
    MG_IQ1_M = 24,
    MG_FORMAT_COUNT
} mg_format;

/* Elements and bytes of one block of a ggml block format (1 and the element size otherwise;
 * MG_FP4_E2M1 is 2 elements in 1 byte). */
static inline void mg_format_block(mg_format f, int64_t *elems, int64_t *bytes) {
    static const int64_t e[MG_FORMAT_COUNT] = {1, 1, 1, 1, 2, 32, 32, 32, 256, 256, 256, 32, 32, 256, 32, 32, 256, 256, 256, 256, 256, 256, 256, 256, 256};
    static const int64_t b[MG_FORMAT_COUNT] = {4, 2, 2, 1, 1, 34, 18, 22, 144, 176, 210, 17, 18, 136, 20, 24, 84, 110, 66, 74, 82, 98, 110, 50, 56};
    *elems = (unsigned)f < MG_FORMAT_COUNT ? e[f] : 0;
    *bytes = (unsigned)f < MG_FORMAT_COUNT ? b[f] : 0;
}

/* 1 for the ggml block formats (rows are whole blocks; cols a multiple of the block). */
static inline int mg_format_is_ggml_block(mg_format f) { return f >= MG_Q8_0 && f < MG_FORMAT_COUNT; }

/* The formats with int8-activation kernels (core/q8_act.h) in every table (linear_q8 set): every
 * block format, the IQ grid formats included, and MG_FP4_E2M1, whose values doubled are the small
 * integers of GGUF's MXFP4 (-12..12), but only with its ue8m0 scales per 32 columns
 * (MG_SCALE_E8M0_G32, DeepSeek-V4's experts): a format alone does not say whether a matrix runs
 * int8, mg_matrix_has_q8_path (core/matrix.h) does.  The others keep fp32 activations under
 * --activations int8 (linear_q8 NULL): FP8's e4m3 values are not small integers. */
static inline int mg_format_has_q8_path(mg_format f) { return mg_format_is_ggml_block(f) || f == MG_FP4_E2M1; }

/* How a quantised matrix is scaled.  Values are multiplied by the scale (never divided),
 * even for tensors named weight_scale_inv, as transformers' fine-grained FP8 does. */
typedef enum mg_scale_kind {
    MG_SCALE_NONE = 0,
    MG_SCALE_F32_BLOCK128 = 1,  /* fp32 [ceil(rows/128), ceil(cols/128)] (GLM/Qwen FP8) */
    MG_SCALE_E8M0_BLOCK128 = 2, /* ue8m0 bytes [ceil(rows/128), ceil(cols/128)] (DeepSeek-V4 FP8) */
    MG_SCALE_E8M0_G32 = 3,      /* ue8m0 bytes [rows, cols/32] (MXFP4 experts) */
    MG_SCALE_F32_ROW = 4,       /* fp32 [rows, 1]: one scale per output row (compressed-tensors
                                 * "channel" FP8, GLM-4.5-FP8); scale_cols is 1.  Kernels may
                                 * multiply a row's dot product by it once instead of each weight. */
    MG_SCALE_KIND_COUNT
} mg_scale_kind;

const char *mg_format_name(mg_format f);

static inline float mg_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round-to-nearest-even, as torch does when casting fp32 to bf16. */
static inline uint16_t mg_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float mg_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float mg_fp8_e4m3_to_f32(uint8_t b) {
    int sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 0x7;
    float v;
    if (exp == 0xf && man == 0x7) return NAN;
    if (exp == 0) v = ldexpf((float)man / 8.0f, -6);
    else v = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return sign ? -v : v;
}

/* ue8m0: an unsigned exponent byte; 255 is NaN. */
static inline float mg_e8m0_to_f32(uint8_t b) {
    if (b == 255) return NAN;
    if (b == 0) return ldexpf(1.0f, -127);
    uint32_t u = (uint32_t)b << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float mg_fp4_e2m1_to_f32(uint8_t code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 7];
    return (code & 8) ? -v : v;
}

#endif
