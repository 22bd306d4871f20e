"""The ggml block formats (GGUF weights): our scalar dequantisation (c/core/ggml_blocks.h) equals
gguf-py's gguf.quants.dequantize bit for bit on random blocks of every type, and every kernel
table this CPU runs computes y = W x on those blocks like float64 numpy does."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from tools.ckpt.gguf_file import put_iq1_m_d

from gateway import _core
from test_kernels import TABLES

# name -> (gguf type, elements per block, bytes per block, byte offsets of the f16 scale fields)
FORMATS = {
    "q8_0": (Q.Q8_0, 32, 34, (0,)),
    "q4_0": (Q.Q4_0, 32, 18, (0,)),
    "q5_0": (Q.Q5_0, 32, 22, (0,)),
    "q4_k": (Q.Q4_K, 256, 144, (0, 2)),
    "q5_k": (Q.Q5_K, 256, 176, (0, 2)),
    "q6_k": (Q.Q6_K, 256, 210, (208,)),
    "mxfp4": (Q.MXFP4, 32, 17, ()),
    "iq4_nl": (Q.IQ4_NL, 32, 18, (0,)),
    "iq4_xs": (Q.IQ4_XS, 256, 136, (0,)),
    "q4_1": (Q.Q4_1, 32, 20, (0, 2)),
    "q5_1": (Q.Q5_1, 32, 24, (0, 2)),
    "q2_k": (Q.Q2_K, 256, 84, (80, 82)),
    "q3_k": (Q.Q3_K, 256, 110, (108,)),
    "iq2_xxs": (Q.IQ2_XXS, 256, 66, (0,)),
    "iq2_xs": (Q.IQ2_XS, 256, 74, (0,)),
    "iq2_s": (Q.IQ2_S, 256, 82, (0,)),
    "iq3_xxs": (Q.IQ3_XXS, 256, 98, (0,)),
    "iq3_s": (Q.IQ3_S, 256, 110, (0,)),
    "iq1_s": (Q.IQ1_S, 256, 50, (0,)),
    "iq1_m": (Q.IQ1_M, 256, 56, ()),  # d is spread over the scale words' top nibbles
}


def random_blocks(fmt: str, rows: int, cols: int, rng: np.random.Generator, full_range: bool = False) -> np.ndarray:
    """Raw block bytes [rows, row bytes]: random codes, f16 scales of varied magnitude (never
    NaN/Inf), e8m0 exponents near 127 (so products stay finite) with the denormal scales of bytes
    0 and 1 in the first and last block, and with full_range over all 256 bytes in the first rows
    (12 * 2^127 overflows to inf, in gguf-py too)."""
    _, elems, nbytes, f16_at = FORMATS[fmt]
    nblk = rows * cols // elems
    raw = rng.integers(0, 256, size=(nblk, nbytes), dtype=np.uint8)
    for off in f16_at:
        # |d| from 2^-24 (f16 denormals) to 2^4, random sign and mantissa
        mag = np.exp2(rng.uniform(-24, 4, nblk)).astype(np.float16)
        sign = np.where(rng.random(nblk) < 0.5, -1, 1).astype(np.float16)
        raw[:, off:off + 2] = (mag * sign).astype(np.float16).view(np.uint8).reshape(nblk, 2)
    if fmt == "iq1_m":
        mag = np.exp2(rng.uniform(-24, 4, nblk)) * np.where(rng.random(nblk) < 0.5, -1, 1)
        put_iq1_m_d(raw, mag)
    if fmt == "mxfp4":
        raw[:, 0] = rng.integers(110, 140, nblk)
        if full_range:
            raw[: min(nblk, 4 * (cols // elems)), 0] = rng.integers(0, 256, min(nblk, 4 * (cols // elems)))
        raw[0, 0], raw[-1, 0] = 0, 1
    return raw.reshape(rows, -1)


def shapes(fmt: str) -> list[tuple[int, int]]:
    elems = FORMATS[fmt][1]
    if elems == 32:  # rows whose length is not a multiple of 256 (GLM-Air's 1408 = 44 blocks)
        return [(1, 32), (3, 96), (5, 1408), (7, 32 * 13)]
    return [(1, 256), (3, 768), (5, 256 * 5)]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_dequantize_equals_gguf_py_bit_for_bit(fmt: str) -> None:
    rng = np.random.default_rng(sum(map(ord, fmt)))
    for rows, cols in shapes(fmt):
        raw = random_blocks(fmt, rows, cols, rng, full_range=True)
        ours = _core.dequantize(fmt, raw, rows, cols)
        theirs = dequantize(raw, FORMATS[fmt][0]).reshape(rows, cols).astype(np.float32)
        assert ours.dtype == np.float32 and ours.shape == (rows, cols)
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
        # raw bytes work as well as arrays
        np.testing.assert_array_equal(_core.dequantize(fmt, raw.tobytes(), rows, cols).view(np.uint32), ours.view(np.uint32))
        # the generic element-wise decoder agrees with the block decoder
        np.testing.assert_array_equal(_core.decode(fmt, "none", raw, None, rows, cols).view(np.uint32),
                                      ours.view(np.uint32))


def test_dequantize_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        _core.dequantize("q4_k", np.zeros(144, np.uint8), 1, 128)  # cols not whole blocks
    with pytest.raises(ValueError):
        _core.dequantize("q8_0", np.zeros(33, np.uint8), 1, 32)  # wrong byte count
    with pytest.raises(ValueError):
        _core.dequantize("bf16", np.zeros(64, np.uint8), 1, 32)  # not a block format


def assert_linear_close(y: np.ndarray, dense: np.ndarray, x: np.ndarray, what: str) -> None:
    """The bound of tests/test_kernels.py: 1e-5 relative to sum |w| |x| per output."""
    want = x.astype(np.float64) @ dense.T
    bound = 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(dense).T) + 1e-30
    err = np.abs(y.astype(np.float64) - want)
    assert np.all(err <= bound), f"max err/bound {np.max(err / bound):.3g} ({what})"


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_linear_matches_numpy(table: str, fmt: str) -> None:
    rng = np.random.default_rng(7 + sum(map(ord, fmt)))
    for rows, cols in shapes(fmt) + [(9, 4608 if FORMATS[fmt][1] == 256 else 4128)]:  # > 4096: chunked
        raw = random_blocks(fmt, rows, cols, rng)
        dense = dequantize(raw, FORMATS[fmt][0]).reshape(rows, cols).astype(np.float64)
        for n_tok in (1, 2, 5, 17):
            x = rng.standard_normal((n_tok, cols)).astype(np.float32)
            y = _core.linear(table, fmt, "none", raw, None, rows, cols, x, 1)
            assert_linear_close(y, dense, x, f"{table} {fmt} {rows}x{cols} n_tok={n_tok}")


def test_linear_threaded_equals_single() -> None:
    rng = np.random.default_rng(3)
    raw = random_blocks("q4_k", 67, 512, rng)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    for table in TABLES:
        np.testing.assert_array_equal(_core.linear(table, "q4_k", "none", raw, None, 67, 512, x, 2),
                                      _core.linear(table, "q4_k", "none", raw, None, 67, 512, x, 1))


def test_iq_codebooks_are_the_gguf_packages() -> None:
    """c/core/iq_grids.c holds every entry of gguf's IQ grids and sign table, as generated; the
    random blocks above reach only some of the 2048 IQ1 entries."""
    from tools import gen_iq_grids

    assert gen_iq_grids.OUT.read_text() == gen_iq_grids.render()
