/* e^x for the SIMD softmax entries (core/kernels.h), one recipe for every width: x clamped to
 * [LO, HI] (below LO e^x rounds to 0, above HI to inf), x = n ln2 + r with |r| <= ln2 / 2
 * (Cody-Waite: ln2 in two parts, the product by the high one exact), e^r = 1 + r + r^2 P(r) with
 * Cephes' degree-5 P, and 2^n applied as 2^(n >> 1) * 2^(n - (n >> 1)): each factor a normal
 * float for n in [-159, 128], so subnormal results round once.  Within 2 ulp of expf
 * (tests/c/test_kernels.c: test_softmax). */
#ifndef MG_KERNELS_EXP_POLY_H
#define MG_KERNELS_EXP_POLY_H

#define MG_EXP_LO -110.0f
#define MG_EXP_HI 89.0f
#define MG_EXP_LOG2E 1.44269504088896341f
#define MG_EXP_LN2_HI 0.693359375f
#define MG_EXP_LN2_LO -2.12194440e-4f
#define MG_EXP_P0 1.9875691500e-4f
#define MG_EXP_P1 1.3981999507e-3f
#define MG_EXP_P2 8.3334519073e-3f
#define MG_EXP_P3 4.1665795894e-2f
#define MG_EXP_P4 1.6666665459e-1f
#define MG_EXP_P5 5.0000001201e-1f

#endif
