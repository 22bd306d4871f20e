"""Engine(gguf, activations="int8"): the GGUF block formats' decode with int8 activations
(core/q8_act.h, docs/KERNELS.md) against the default fp32 path on the same file.

Tiny qwen3_moe models (hidden 256) from tools/ckpt/gguf_file.py, as a Q8_0 file, as a
Q4_K_M-like mix of the older block formats, as a low-bit mix (Q2_K, Q3_K, Q4_1, Q5_1) and as a
mix of the seven IQ grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M);
tokens decoded one at a time; per step, max |int8 - f32| / max |f32|
of the logits.  Measured on these seeds (avx512 table): per-step errors 0.016-0.028 (Q8_0 file,
median 0.022), 0.009-0.020 (mixed, median 0.015), about 0.006-0.016 (lowbit, median about
0.01) and 0.004-0.007 (iq, median 0.006), except a step whose top-2 expert choice flips (a
router near a tie: a property of MoE, not of the kernels), which gave 0.51.  So the test bounds the MEDIAN step by
MEDIAN_TOLERANCE = 0.06 (about 3x the measured medians) and allows at most MAX_FLIPS steps
above it; a wrong kernel (a swapped sub-block scale, a lost min) gives O(1) on every step.
The best table and the scalar twin, both int8, differ only in fp32 summation order: median
step below TWIN_TOLERANCE = 1e-4 (measured 1e-7 .. 4e-7); one step reached 2e-3, where that
reordering moved a later layer's activation across a rounding boundary of its int8 code."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tools.ckpt.gguf_file import write_gguf

from child_env import gateway_child_env
from gateway import _core
from gateway.engine import Engine

MEDIAN_TOLERANCE = 0.06
MAX_FLIPS = 2
TWIN_TOLERANCE = 1e-4
N_STEPS = 12

WIDE = {"hidden_size": 256, "intermediate_size": 256, "moe_intermediate_size": 256, "num_experts": 6,
        "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64}
MIXED = {
    "blk.*.ffn_gate_exps.weight": "Q4_K", "blk.*.ffn_up_exps.weight": "Q5_K",
    "blk.*.ffn_down_exps.weight": "Q6_K",
    "blk.*.attn_q.weight": "Q8_0", "blk.*.attn_k.weight": "Q4_0", "blk.*.attn_v.weight": "MXFP4",
    "blk.*.attn_output.weight": "IQ4_XS", "token_embd.weight": "Q8_0", "output.weight": "IQ4_NL",
}
# The low-bit formats (Q2_K / Q3_K files, and the Q4_1 / Q5_1 llama-quantize puts in them).
LOWBIT = {
    "blk.*.ffn_gate_exps.weight": "Q2_K", "blk.*.ffn_up_exps.weight": "Q3_K",
    "blk.*.ffn_down_exps.weight": "Q2_K",
    "blk.*.attn_q.weight": "Q4_1", "blk.*.attn_k.weight": "Q5_1", "blk.*.attn_v.weight": "Q3_K",
    "blk.*.attn_output.weight": "Q2_K", "token_embd.weight": "Q8_0", "output.weight": "Q3_K",
}
# The codebook formats of UD-IQ1 / IQ2 / IQ3 files, all seven (random blocks with sane scales:
# tools/ckpt/gguf_file.py cannot quantise them, which does not matter for int8 against f32 on
# the same file).
IQ = {
    "blk.*.ffn_gate_exps.weight": "IQ2_XXS", "blk.*.ffn_up_exps.weight": "IQ2_XS",
    "blk.*.ffn_down_exps.weight": "IQ3_XXS",
    "blk.*.attn_q.weight": "IQ3_S", "blk.*.attn_k.weight": "IQ2_S", "blk.*.attn_v.weight": "IQ1_S",
    "blk.*.attn_output.weight": "IQ1_M", "token_embd.weight": "Q8_0", "output.weight": "IQ2_S",
}
CASES = {"q8_0": {"default": "Q8_0"}, "mixed": {"types": MIXED, "default": "Q5_0"},
         "lowbit": {"types": LOWBIT, "default": "Q4_1"}, "iq": {"types": IQ, "default": "IQ3_S"}}


@pytest.fixture(scope="module")
def gguf(build_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    built: dict[str, Path] = {}

    def make(case: str) -> Path:
        if case not in built:
            ckpt = build_checkpoint("qwen3_moe", "f32", WIDE)
            folder = tmp_path_factory.mktemp(f"q8-{case}")
            built[case] = write_gguf(ckpt, folder / "model.gguf", **CASES[case])
        return built[case]

    return make


def decode_logits(path: Path, tokens: list[int], **kwargs) -> np.ndarray:
    """Logits of each token fed one at a time (decode steps), [len(tokens), vocab]."""
    engine = Engine(path, max_ctx=64, **kwargs)
    try:
        return np.stack([np.asarray(engine.eval([t], last_only=True))[-1] for t in tokens])
    finally:
        engine.close()


def step_errors(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """max |actual - expected| / max |expected| of each step (row)."""
    return np.max(np.abs(actual - expected), axis=1) / np.max(np.abs(expected), axis=1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_int8_activations_close_to_f32(case: str, gguf) -> None:
    path = gguf(case)
    vocab = Engine(path, max_ctx=8).vocab_size
    tokens = [int(t) for t in np.random.default_rng(7).integers(0, vocab, N_STEPS)]
    f32 = decode_logits(path, tokens)
    int8 = decode_logits(path, tokens, activations="int8")
    errs = step_errors(int8, f32)
    median = float(np.median(errs))
    assert 0 < median < MEDIAN_TOLERANCE, f"{case}: int8 vs f32, median step error {median:.3g} ({errs})"
    assert int(np.sum(errs >= MEDIAN_TOLERANCE)) <= MAX_FLIPS, f"{case}: int8 vs f32 step errors {errs}"
    twin = decode_logits(path, tokens, activations="int8", kernels="scalar")
    twin_errs = step_errors(int8, twin)
    assert float(np.median(twin_errs)) < TWIN_TOLERANCE and float(np.max(twin_errs)) < MEDIAN_TOLERANCE, twin_errs


@pytest.mark.parametrize("case", sorted(CASES))
def test_int8_prefill_matches_int8_decode(case: str, gguf) -> None:
    """The int8 GEMM (kernels/q8_gemm.h) in a whole model: the tokens evaluated in one prefill
    give the logits of the same tokens decoded one at a time, as close as the twin's (each
    token's x is quantised the same way and the integer sums are the same; the GEMM folds the
    per-16 k into its float factor and adds in another order).  Where the kernels have no int8
    GEMM, prefill runs f32 and is only as close as int8 is to f32."""
    path = gguf(case)
    engine = Engine(path, max_ctx=64, activations="int8")
    try:
        vocab, gemm = engine.vocab_size, engine.info["int8_prefill"]
        tokens = [int(t) for t in np.random.default_rng(7).integers(0, vocab, N_STEPS)]
        prefill = np.asarray(engine.eval(tokens))
    finally:
        engine.close()
    errs = step_errors(prefill, decode_logits(path, tokens, activations="int8"))
    bound = TWIN_TOLERANCE if gemm else MEDIAN_TOLERANCE
    assert float(np.median(errs)) < bound and float(np.max(errs)) < MEDIAN_TOLERANCE, (gemm, errs)
    if gemm:  # and it is not the f32 prefill: that is as far from int8 as the rounding of x
        f32 = Engine(path, max_ctx=64)
        try:
            assert float(np.median(step_errors(prefill, np.asarray(f32.eval(tokens))))) > 10 * TWIN_TOLERANCE
        finally:
            f32.close()


# The avx2 table of a CPU without any VNNI (MOEGATE_AVXVNNI=0, read when the tables are built,
# so in a process of its own): int8 prefill and int8 decode of the same tokens there.
_PLAIN_AVX2 = """
import json, sys
import numpy as np
from gateway import _core
from gateway.engine import Engine
path, n_steps = sys.argv[1], int(sys.argv[2])
def run(one_by_one):
    engine = Engine(path, max_ctx=64, activations="int8", kernels="avx2")
    try:
        tokens = [int(t) for t in np.random.default_rng(7).integers(0, engine.vocab_size, n_steps)]
        if one_by_one:
            logits = np.stack([np.asarray(engine.eval([t], last_only=True))[-1] for t in tokens])
        else:
            logits = np.asarray(engine.eval(tokens))
        return engine.info["int8_prefill"], logits.tolist()
    finally:
        engine.close()
gemm, prefill = run(False)
print(json.dumps({"avxvnni": _core.cpu_features()["avxvnni"], "gemm": gemm, "prefill": prefill,
                  "decode": run(True)[1]}))
"""


@pytest.mark.skipif(not _core.cpu_features()["avx2"], reason="the avx2 table: an x86 CPU with AVX2")
@pytest.mark.parametrize("case", sorted(CASES))
def test_int8_prefill_on_avx2_without_vnni(case: str, gguf) -> None:
    """q8_gemm_avx2.c (vpmaddubsw, for CPUs without any VNNI) in a whole model: as the test
    above, prefill gives the logits of the same tokens decoded one at a time as closely as the
    twin's, on the avx2 table of a CPU without AVX-VNNI (MOEGATE_AVXVNNI=0 where this one has
    it); and that table has an int8 GEMM."""
    out = subprocess.run([sys.executable, "-c", _PLAIN_AVX2, str(gguf(case)), str(N_STEPS)],
                         env=gateway_child_env(MOEGATE_AVXVNNI="0"), capture_output=True, text=True, check=True,
                         timeout=300)
    result = json.loads(out.stdout)
    assert result["avxvnni"] is False and result["gemm"] is True, {k: result[k] for k in ("avxvnni", "gemm")}
    errs = step_errors(np.asarray(result["prefill"]), np.asarray(result["decode"]))
    assert float(np.median(errs)) < TWIN_TOLERANCE and float(np.max(errs)) < MEDIAN_TOLERANCE, errs


def test_activations_reported_and_default_f32(gguf) -> None:
    path = gguf("q8_0")
    engine = Engine(path, max_ctx=8)
    assert engine.info["activations"] == "f32"
    engine.close()
    engine = Engine(path, max_ctx=8, activations="int8")
    assert engine.info["activations"] == "int8"
    engine.close()


def test_bogus_activations_is_a_value_error(gguf) -> None:
    with pytest.raises(ValueError, match="activations must be one of f32, int8"):
        Engine(gguf("q8_0"), activations="bogus")


def test_cli_and_startup_summary(gguf) -> None:
    """`python -m gateway --activations int8` reaches the engine (default f32; other values are
    refused by the parser), and the startup line that names the kernel table says which."""
    from gateway.__main__ import build_parser
    from gateway.server.serve import ServeOptions, build_state, startup_summary

    assert build_parser().parse_args(["--model", "m"]).activations == "f32"
    assert build_parser().parse_args(["--model", "m", "--activations", "int8"]).activations == "int8"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "m", "--activations", "bogus"])
    assert ServeOptions(model="m").activations == "f32"
    for activations in ("int8", "f32"):
        state = build_state(ServeOptions(model=str(gguf("q8_0")), threads=1, ctx=64, prefix_cache_gb=0.0,
                                         activations=activations))
        try:
            summary = startup_summary(state, "http://127.0.0.1:8000")
            assert state.engine.info["activations"] == activations
            assert re.search(rf"SIMD +\S+ +activations {activations} ", summary), summary
            # the exact default on a block-format file says where the faster decode is
            assert ("--activations int8" in summary) == (activations == "f32"), summary
        finally:
            state.engine.close()
