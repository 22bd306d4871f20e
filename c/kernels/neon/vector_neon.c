/* NEON vector ops: dot, axpy, scale, rmsnorm, swiglu and the read_sum bandwidth yardstick. */
#include "kernels/tables.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include "kernels/neon/neon.h"

float mg_neon_dot(const float *a, const float *b, int64_t n) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = vfmaq_f32(a0, vld1q_f32(a + i), vld1q_f32(b + i));
        a1 = vfmaq_f32(a1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        a2 = vfmaq_f32(a2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        a3 = vfmaq_f32(a3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, vld1q_f32(a + i), vld1q_f32(b + i));
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return hsum4(a0, a1, a2, a3) + tail;
}

void mg_neon_axpy(float *y, float a, const float *x, int64_t n) {
    const float32x4_t av = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), av, vld1q_f32(x + i)));
        vst1q_f32(y + i + 4, vfmaq_f32(vld1q_f32(y + i + 4), av, vld1q_f32(x + i + 4)));
    }
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), av, vld1q_f32(x + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

void mg_neon_scale(float *y, float a, int64_t n) {
    const float32x4_t av = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_f32(vld1q_f32(y + i), av));
    for (; i < n; i++) y[i] *= a;
}

/* Sum of squares in double, as the scalar twin does, so long rows do not lose precision. */
void mg_neon_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    float64x2_t s0 = vdupq_n_f64(0.0), s1 = s0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(x + i);
        float64x2_t lo = vcvt_f64_f32(vget_low_f32(v)), hi = vcvt_high_f64_f32(v);
        s0 = vfmaq_f64(s0, lo, lo);
        s1 = vfmaq_f64(s1, hi, hi);
    }
    double ss = vaddvq_f64(vaddq_f64(s0, s1));
    for (; i < n; i++) ss += (double)x[i] * x[i];
    const float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    const float32x4_t iv = vdupq_n_f32(inv);
    i = 0;
    if (w) {
        for (; i + 4 <= n; i += 4)
            vst1q_f32(out + i, vmulq_f32(vmulq_f32(vld1q_f32(x + i), iv), vld1q_f32(w + i)));
        for (; i < n; i++) out[i] = x[i] * inv * w[i];
    } else {
        for (; i + 4 <= n; i += 4) vst1q_f32(out + i, vmulq_f32(vld1q_f32(x + i), iv));
        for (; i < n; i++) out[i] = x[i] * inv;
    }
}

/* e^x to about 1 ulp: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for exact reduction),
 * a degree-6 polynomial for e^r, and 2^n applied as two factors so that results that overflow
 * become inf and results that underflow pass through the subnormals to 0, as expf does. */
ALWAYS_INLINE float32x4_t exp_neon(float32x4_t x) {
    x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(100.0f)), vdupq_n_f32(-110.0f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t ni = vcvtq_s32_f32(n);
    const int32x4_t n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
    const float32x4_t f1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, vdupq_n_s32(127)), 23));
    const float32x4_t f2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23));
    return vmulq_f32(vmulq_f32(p, f1), f2);
}

void mg_neon_swiglu(float *out, const float *gate, const float *up, int64_t n, float limit) {
    const float32x4_t one = vdupq_n_f32(1.0f), lim = vdupq_n_f32(limit), nlim = vdupq_n_f32(-limit);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t g = vld1q_f32(gate + i), u = vld1q_f32(up + i);
        if (limit > 0.0f) {
            g = vminq_f32(g, lim);
            u = vmaxq_f32(vminq_f32(u, lim), nlim);
        }
        const float32x4_t silu = vdivq_f32(g, vaddq_f32(one, exp_neon(vnegq_f32(g))));
        vst1q_f32(out + i, vmulq_f32(silu, u));
    }
    for (; i < n; i++) {
        float g = gate[i], u = up[i];
        if (limit > 0.0f) {
            g = g > limit ? limit : g;
            u = u > limit ? limit : (u < -limit ? -limit : u);
        }
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

float mg_neon_read_sum(const float *p, int64_t n) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = vaddq_f32(a0, vld1q_f32(p + i));
        a1 = vaddq_f32(a1, vld1q_f32(p + i + 4));
        a2 = vaddq_f32(a2, vld1q_f32(p + i + 8));
        a3 = vaddq_f32(a3, vld1q_f32(p + i + 12));
    }
    float tail = 0.0f;
    for (; i < n; i++) tail += p[i];
    return hsum4(a0, a1, a2, a3) + tail;
}
#endif
