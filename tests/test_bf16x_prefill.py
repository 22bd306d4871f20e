"""Fast activations (Engine(activations="int8")) on weights without int8 rows: prefill of bf16
(and fp8 with power-of-two or row scales) weights multiplies x rounded to bf16
(kernels/avx512bf16/prefill_avx512bf16.c) on CPUs with AVX512_BF16; decode keeps fp32 x.

A tiny qwen3_moe bf16 checkpoint, every matrix bf16: prefill logits of the int8 engine against
the default (f32) engine, per position max |int8 - f32| / max |f32|.  Measured on this seed
(Zen 5): 0.005-0.014, median 0.0074, and 0.68 at one position whose top-2 expert choice flips (a
router near a tie, as in tests/test_ggml_q8.py).  So the MEDIAN position is bounded by
BF16X_TOLERANCE = 0.03 (about 4x the measured median) with at most MAX_FLIPS positions above
it; a wrong kernel (a swapped column pair, a lost tile) gives O(1) everywhere, and the C test
(tests/c/test_kernels.c, test_linear_bf16x) pins the kernel exactly, x's rounding included.
Decode (one token at a time) must stay bit for bit the f32 engine's: only prefill rounds x."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gateway import _core
from gateway.engine import Engine

BF16X_TOLERANCE = 0.03
MAX_FLIPS = 2
TOKENS = [5, 17, 99, 3, 42, 250, 7, 311, 64, 128, 12, 77, 200, 9, 150, 33, 480, 21, 2, 260]


def _has_bf16x() -> bool:
    return _core.best_kernel_table() == "avx512bf16"


@pytest.fixture(scope="module")
def ckpt(build_checkpoint: Callable[..., Path]) -> Path:
    return build_checkpoint("qwen3_moe", "bf16")


def _rows(engine: Engine, tokens: list[int]) -> np.ndarray:
    engine.truncate(0)
    return np.asarray(engine.eval(tokens), dtype=np.float64).reshape(len(tokens), -1)


def test_prefill_rounds_x_to_bf16_only_where_the_cpu_has_it(ckpt: Path) -> None:
    f32, fast = Engine(str(ckpt)), Engine(str(ckpt), activations="int8")
    try:
        want, got = _rows(f32, TOKENS), _rows(fast, TOKENS)
        errs = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
        if _has_bf16x():
            assert 1e-6 < float(np.median(errs)) < BF16X_TOLERANCE, errs  # > 0: x was rounded
            assert int(np.sum(errs >= BF16X_TOLERANCE)) <= MAX_FLIPS, errs
        else:
            assert float(np.max(errs)) == 0.0, errs  # no AVX512_BF16: the fp32 tiles, exactly
    finally:
        f32.close(), fast.close()


def test_decode_keeps_fp32_activations(ckpt: Path) -> None:
    f32, fast = Engine(str(ckpt)), Engine(str(ckpt), activations="int8")
    try:
        for e in (f32, fast):
            e.truncate(0)
        for tok in TOKENS[:6]:
            a = np.asarray(f32.eval([tok]), dtype=np.float64)
            b = np.asarray(fast.eval([tok]), dtype=np.float64)
            assert np.array_equal(a, b)
    finally:
        f32.close(), fast.close()
