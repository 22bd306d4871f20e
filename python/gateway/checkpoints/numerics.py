"""Number formats of the checkpoints: exact casts (round to nearest, ties to even, bit-identical
to torch's) and the block quantisers the published checkpoints use.

* bf16: the top half of float32 after rounding;
* fp8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits, max 448, no infinities;
* fp4 e2m1: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign, packed two per byte;
* ue8m0 scales: one byte b meaning 2^(b - 127), so dequantised values are exact in float32.
"""
from __future__ import annotations

import numpy as np

FP8_E4M3_MAX = 448.0
FP8_BLOCK = 128  # 128x128 weight blocks share one scale
FP4_GROUP = 32  # 32 consecutive input columns share one scale
FP4_MAX = 6.0
FP4_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
FP4_VALUES = np.concatenate([FP4_MAGNITUDES, -FP4_MAGNITUDES])  # code -> value (bit 3 = sign)

# ----------------------------------------------------------------------------------------------
# bf16


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16) with round-to-nearest-even; NaN stays NaN."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    rounded = ((bits + rounding) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = np.uint16(0x7FC0)
    return rounded


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


# ----------------------------------------------------------------------------------------------
# fp8 e4m3fn


def _fp8_e4m3_table() -> np.ndarray:
    """float32 value of each of the 256 e4m3fn bit patterns (NaN for 0x7F/0xFF)."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    normal = (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7.0)
    subnormal = (man / 8.0) * np.exp2(-6.0)
    table = sign * np.where(exp == 0, subnormal, normal)
    table[(exp == 0xF) & (man == 0x7)] = np.nan
    return table.astype(np.float32)


FP8_E4M3_VALUES = _fp8_e4m3_table()
_F32_TO_E4M3_EXP_SHIFT = np.uint32((127 - 7) << 3)  # float32 exponent bias -> e4m3 bias, at bit 3
_E4M3_MIN_NORMAL = np.float32(2.0**-6)


def f32_to_fp8_e4m3_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> e4m3fn bit patterns (uint8), saturating to +-448, round to nearest, ties to even.

    Normal range: round the float32 mantissa to 3 bits in the integer domain (a carry moves into
    the exponent, which is the correct rounding) and rebias the exponent. Subnormal range
    (|x| < 2^-6, steps of 2^-9): rint(|x| * 512) is the code, exactly, since scaling by a power
    of two is exact. NaN becomes 0x7F with its sign.
    """
    x = np.ascontiguousarray(values, dtype=np.float32)
    sign = np.where(np.signbit(x), np.uint8(0x80), np.uint8(0))
    nan = np.isnan(x)
    mag = np.where(nan, np.float32(0), np.minimum(np.abs(x), np.float32(FP8_E4M3_MAX)))
    bits = np.ascontiguousarray(mag).view(np.uint32)
    rounding = np.uint32(0x7FFFF) + ((bits >> np.uint32(20)) & np.uint32(1))
    with np.errstate(over="ignore"):  # the subnormal lanes wrap below; np.where discards them
        normal = ((bits + rounding) >> np.uint32(20)) - _F32_TO_E4M3_EXP_SHIFT
    subnormal = np.rint(mag * np.float32(512.0)).astype(np.uint32)
    code = np.where(mag >= _E4M3_MIN_NORMAL, normal, subnormal).astype(np.uint8)
    code = np.where(nan, np.uint8(0x7F), code)
    return (code | sign).astype(np.uint8)


def quantize_fp8_blocks(weight: np.ndarray, block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)) -> tuple[np.ndarray, np.ndarray]:
    """Block-wise FP8 with float32 scales (the Hugging Face FP8 repos' form): per block scale =
    amax/448 and q = e4m3(W/scale); returns (q bits uint8, scale float32 [ceil(O/b0), ceil(K/b1)]).

    Dequantisation is q * scale (the official `weight_scale_inv` name notwithstanding). Edge
    blocks smaller than the block get their own scale; an all-zero block gets scale 1.
    """
    rows, cols = weight.shape
    grid_rows, grid_cols = -(-rows // block[0]), -(-cols // block[1])
    pad_rows, pad_cols = grid_rows * block[0] - rows, grid_cols * block[1] - cols
    padded = np.pad(weight.astype(np.float32), ((0, pad_rows), (0, pad_cols)))
    tiles = padded.reshape(grid_rows, block[0], grid_cols, block[1])
    amax = np.abs(tiles).max(axis=(1, 3))
    scale = np.where(amax > 0, amax / np.float32(FP8_E4M3_MAX), np.float32(1.0)).astype(np.float32)
    scaled = (tiles / scale[:, None, :, None]).reshape(padded.shape)[:rows, :cols]
    return f32_to_fp8_e4m3_bits(scaled), scale


def dequantize_fp8_blocks(bits: np.ndarray, scale: np.ndarray, block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)) -> np.ndarray:
    """Inverse of `quantize_fp8_blocks`: float32(q) * scale of its block, computed in float32."""
    rows, cols = bits.shape
    values = FP8_E4M3_VALUES[bits.astype(np.intp)]
    expanded = np.repeat(np.repeat(scale, block[0], axis=0), block[1], axis=1)[:rows, :cols]
    return (values * expanded).astype(np.float32)


def quantize_fp8_channel(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-channel FP8 (compressed-tensors "channel" strategy, the GLM-4.5-FP8 form):
    one scale per row = amax/448, rounded to bf16 (the dtype the scale is stored in) before
    dividing, so that q * stored scale is what the engine and the oracle both compute.  Returns
    (q bits uint8 [O, K], scale float32 [O, 1] holding bf16-exact values); an all-zero row gets
    scale 1.  A value pushed past 448 by the scale's rounding saturates at 448.
    """
    w = weight.astype(np.float32)
    amax = np.abs(w).max(axis=1, keepdims=True) if w.shape[1] else np.zeros((w.shape[0], 1), np.float32)
    scale = np.where(amax > 0, amax / np.float32(FP8_E4M3_MAX), np.float32(1.0)).astype(np.float32)
    scale = bf16_bits_to_f32(f32_to_bf16_bits(scale))
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)  # underflow guard
    return f32_to_fp8_e4m3_bits(w / scale), scale


def dequantize_fp8_channel(bits: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Inverse of `quantize_fp8_channel`: float32(q) * scale of its row ([O, 1] or [O])."""
    values = FP8_E4M3_VALUES[bits.astype(np.intp)]
    return (values * np.asarray(scale, np.float32).reshape(-1, 1)).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# ue8m0-scaled fp8 / fp4 (the DeepSeek-V4 release)


def ue8m0_exponent(amax: np.ndarray, qmax: float) -> np.ndarray:
    """Smallest power-of-two exponent s with amax / 2^s <= qmax (0 for all-zero blocks)."""
    safe = np.where(amax > 0, amax, np.float32(qmax))
    return np.ceil(np.log2(safe.astype(np.float64) / qmax)).astype(np.int32)


def quantize_fp8_ue8m0(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-> (e4m3 bits uint8 [O, K], ue8m0 scale bytes uint8 [ceil(O/128), ceil(K/128)])."""
    rows, cols = w.shape
    gr, gc = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
    padded = np.zeros((gr * FP8_BLOCK, gc * FP8_BLOCK), np.float32)
    padded[:rows, :cols] = w
    amax = np.abs(padded.reshape(gr, FP8_BLOCK, gc, FP8_BLOCK)).max(axis=(1, 3))
    exp = ue8m0_exponent(amax, FP8_E4M3_MAX)
    scale = np.repeat(np.repeat(np.exp2(exp).astype(np.float32), FP8_BLOCK, 0), FP8_BLOCK, 1)[:rows, :cols]
    return f32_to_fp8_e4m3_bits(w / scale), (exp + 127).astype(np.uint8)


def dequantize_fp8_ue8m0(bits: np.ndarray, scale: np.ndarray) -> np.ndarray:
    rows, cols = bits.shape
    s = np.exp2(scale.astype(np.float32) - 127.0)
    expanded = np.repeat(np.repeat(s, FP8_BLOCK, 0), FP8_BLOCK, 1)[:rows, :cols]
    return (FP8_E4M3_VALUES[bits.astype(np.intp)] * expanded).astype(np.float32)


def quantize_fp4_ue8m0(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-> (packed int8 [O, K/2] low nibble = even column, ue8m0 scale bytes uint8 [O, K/32])."""
    rows, cols = w.shape
    groups = w.reshape(rows, cols // FP4_GROUP, FP4_GROUP)
    exp = ue8m0_exponent(np.abs(groups).max(axis=2), FP4_MAX)
    scaled = groups / np.exp2(exp).astype(np.float32)[:, :, None]
    # nearest magnitude (ties to the smaller one), sign in bit 3
    mag = np.abs(scaled).reshape(rows, cols)
    code = np.abs(mag[..., None] - FP4_MAGNITUDES).argmin(axis=-1).astype(np.uint8)
    code |= np.where(scaled.reshape(rows, cols) < 0, np.uint8(8), np.uint8(0))
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), (exp + 127).astype(np.uint8)


def dequantize_fp4_ue8m0(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    u8 = packed.view(np.uint8)
    rows = u8.shape[0]
    codes = np.stack([u8 & 0xF, u8 >> 4], axis=-1).reshape(rows, -1)
    s = np.repeat(np.exp2(scale.astype(np.float32) - 127.0), FP4_GROUP, axis=1)
    return (FP4_VALUES[codes.astype(np.intp)] * s).astype(np.float32)
