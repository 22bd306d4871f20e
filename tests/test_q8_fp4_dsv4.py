"""Engine(native DeepSeek-V4, activations="int8"): the FP4 routed experts (e2m1 + ue8m0 scales per
32 columns, kernels/q8_fp4.h) take the int8 path, the FP8 and BF16 weights keep f32.

On the tiny native checkpoint (tools/ckpt/deepseek_v4.py) the routed experts are the only
matrices with an int8 path, so whatever int8 changes here is theirs.  The same bounds as the
GGUF files' int8 tests (tests/test_ggml_q8.py, which say how they were measured): per decode
step max |int8 - f32| / max |f32| of the logits, the median below MEDIAN_TOLERANCE with at most
MAX_FLIPS steps above it (a router near a tie), and above 0 (the experts did run int8); the
best table against the scalar twin, both int8, within TWIN_TOLERANCE; a whole-prompt prefill
(the int8 GEMM where the kernels have one) against the same tokens decoded one at a time.
Measured on this seed (avx512 table): int8 vs f32 steps 0.009-0.018 (median 0.010); the best
table against the twin and prefill against decode median 1e-6, the largest step 1.6e-3 (the
reordering moving an activation across a rounding boundary of its int8 code, as in the GGUF
tests)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tools.ckpt import deepseek_v4 as writer

from gateway.engine import Engine
from test_ggml_q8 import MAX_FLIPS, MEDIAN_TOLERANCE, N_STEPS, TWIN_TOLERANCE, decode_logits, step_errors


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return writer.write_checkpoint("deepseek_v4", "tiny", "native", tmp_path_factory.mktemp("dsv4_q8"),
                                   progress=False)


@pytest.fixture(scope="module")
def tokens() -> list[int]:
    rng = np.random.default_rng(7)
    return [0] + rng.integers(2, writer.TINY.vocab_size, N_STEPS - 1).tolist()


def test_fp4_experts_int8_close_to_f32(native: Path, tokens: list[int]) -> None:
    f32 = decode_logits(native, tokens)
    int8 = decode_logits(native, tokens, activations="int8")
    errs = step_errors(int8, f32)
    median = float(np.median(errs))
    assert 0 < median < MEDIAN_TOLERANCE, f"int8 vs f32, median step error {median:.3g} ({errs})"
    assert int(np.sum(errs >= MEDIAN_TOLERANCE)) <= MAX_FLIPS, f"int8 vs f32 step errors {errs}"
    twin = decode_logits(native, tokens, activations="int8", kernels="scalar")
    twin_errs = step_errors(int8, twin)
    assert float(np.median(twin_errs)) < TWIN_TOLERANCE and float(np.max(twin_errs)) < MEDIAN_TOLERANCE, twin_errs


def test_fp4_int8_prefill_matches_int8_decode(native: Path, tokens: list[int]) -> None:
    """As tests/test_ggml_q8.py::test_int8_prefill_matches_int8_decode for GGUF files: the
    prompt in one prefill gives the logits of the tokens decoded one at a time, as close as the
    twin's where the kernels have an int8 GEMM (each token's x is quantised the same way, the
    integer sums are the same), and that prefill is not the f32 one.  On a CPU with AVX512_BF16
    the best table's prefill also rounds x to bf16 for the FP8 and BF16 weights (decode does not):
    that comparison runs on the avx512 table (the same int8 GEMM, no bf16 prefill), and the best
    table's prefill is held to the int8 bound."""
    from gateway import _core

    table = "avx512" if _core.best_kernel_table() == "avx512bf16" else None
    engine = Engine(native, max_ctx=64, activations="int8", kernels=table)
    try:
        gemm = engine.info["int8_prefill"]
        prefill = np.asarray(engine.eval(tokens))
    finally:
        engine.close()
    errs = step_errors(prefill, decode_logits(native, tokens, activations="int8", kernels=table))
    bound = TWIN_TOLERANCE if gemm else MEDIAN_TOLERANCE
    assert float(np.median(errs)) < bound and float(np.max(errs)) < MEDIAN_TOLERANCE, (gemm, errs)
    if gemm:
        f32 = Engine(native, max_ctx=64, kernels=table)
        try:
            assert float(np.median(step_errors(prefill, np.asarray(f32.eval(tokens))))) > 10 * TWIN_TOLERANCE
        finally:
            f32.close()
    if table:
        best = Engine(native, max_ctx=64, activations="int8")
        try:
            errs = step_errors(np.asarray(best.eval(tokens)), decode_logits(native, tokens, activations="int8"))
        finally:
            best.close()
        assert float(np.median(errs)) < MEDIAN_TOLERANCE and int(np.sum(errs >= MEDIAN_TOLERANCE)) <= MAX_FLIPS, errs


def test_startup_hint_counts_fp4_as_int8_capable() -> None:
    """The server's startup line points f32 runs of FP4 experts at --activations int8 (they have
    an int8 path now), and stays quiet where every format keeps f32 (FP8, BF16)."""
    from gateway.server.serve import _activations_hint

    native = {"fp8_e4m3": 50, "bf16": 22, "fp4_e2m1": 288}
    assert "--activations int8" in _activations_hint({"weights": native, "activations": "f32"})
    assert _activations_hint({"weights": native, "activations": "int8", "int8_prefill": True}) == ""
    assert _activations_hint({"weights": {"fp8_e4m3": 50, "bf16": 22}, "activations": "f32"}) == ""
    # bf16 / fp8 weights: the fast path's prefill (x rounded to bf16) only on a CPU with AVX512_BF16
    floats = {"fp8_e4m3": 50, "bf16": 22}
    assert "faster prefill" in _activations_hint({"weights": floats, "activations": "f32", "simd": "avx512bf16"})
    assert _activations_hint({"weights": floats, "activations": "f32", "simd": "avx512"}) == ""
    assert _activations_hint({"weights": floats, "activations": "int8", "simd": "avx512bf16"}) == ""
