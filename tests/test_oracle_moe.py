"""Our engine against Hugging Face transformers on tiny random glm4_moe / qwen3_moe checkpoints.

Metric: max |engine - reference| / max |reference| below 1e-4 (f32) or 1e-3 (bf16, fp8), where
the reference runs transformers' own model class in float32 on the same (upcast or dequantised)
weights. A failure is an engine bug to find, not a tolerance to widen.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import oracle
from oracle import GREEDY_STEPS, Reference

CASES = oracle.oracle_cases()


@dataclass
class Case:
    name: str
    arch: str
    fmt: str
    ref: Reference
    engine: Any

    @property
    def tolerance(self) -> float:
        return oracle.TOLERANCE[self.fmt]

    @property
    def vocab(self) -> int:
        return int(self.ref.config["vocab_size"])

    def check(self, actual: np.ndarray, expected: np.ndarray, what: str) -> None:
        actual = np.asarray(actual)
        assert actual.dtype == np.float32, f"{self.name} {what}: engine returned {actual.dtype}, expected float32"
        error = oracle.relative_error(actual, expected)
        assert error < self.tolerance, (
            f"{self.name} {what}: relative error {error:.3e} >= {self.tolerance:.0e} "
            f"(max |ref| {np.abs(expected).max():.3f}; worst row {int(np.abs(actual - expected).max(axis=-1).argmax())})"
        )


@pytest.fixture(scope="module", params=CASES, ids=[case[0] for case in CASES])
def case(request: pytest.FixtureRequest, build_checkpoint: Callable[..., Path], reference_for, engine_for) -> Case:
    name, arch, fmt, overrides = request.param
    ckpt = build_checkpoint(arch, fmt, overrides or None)
    engine = engine_for(ckpt)
    return Case(name, arch, fmt, reference_for(ckpt, arch, fmt), engine)


def test_info_matches_config(case: Case) -> None:
    info = case.engine.info
    assert info["arch"] == case.arch
    assert info["vocab_size"] == case.vocab
    assert info["n_layers"] == case.ref.config["num_hidden_layers"]


@pytest.mark.parametrize("n_tokens", [1, 7, 33])
def test_prefill(case: Case, n_tokens: int) -> None:
    case.engine.reset()
    assert case.engine.n_past == 0
    logits = case.engine.eval(case.ref.tokens[:n_tokens])
    assert logits.shape == (n_tokens, case.vocab)
    assert case.engine.n_past == n_tokens
    case.check(logits, case.ref.full[:n_tokens], f"prefill of {n_tokens}")


def test_single_token_decode_steps(case: Case) -> None:
    prompt = 8
    case.engine.reset()
    case.check(case.engine.eval(case.ref.tokens[:prompt]), case.ref.full[:prompt], "prompt before decoding")
    for step in range(24):
        position = prompt + step
        logits = case.engine.eval([case.ref.tokens[position]])
        assert logits.shape == (1, case.vocab)
        assert case.engine.n_past == position + 1
        case.check(logits, case.ref.full[position : position + 1], f"decode step {step} (position {position})")


@pytest.mark.parametrize("keep", [0, 1, 17, 39])
def test_truncate_and_replay(case: Case, keep: int) -> None:
    """Evaluate 40 tokens, truncate to `keep`, evaluate past the old end: rows must equal a fresh run."""
    case.engine.reset()
    case.engine.eval(case.ref.tokens[:40])
    assert case.engine.n_past == 40
    case.engine.truncate(keep)
    assert case.engine.n_past == keep
    end = 48
    logits = case.engine.eval(case.ref.tokens[keep:end])
    assert case.engine.n_past == end
    case.check(logits, case.ref.full[keep:end], f"replay after truncate({keep})")


def test_truncate_after_different_continuation(case: Case) -> None:
    """A stale cache entry must not leak: diverge, truncate back, then continue the real sequence."""
    tokens = case.ref.tokens
    case.engine.reset()
    case.engine.eval(tokens[:20])
    case.engine.eval(list(reversed(tokens[20:30])))  # a different continuation, then discarded
    case.engine.truncate(20)
    case.check(case.engine.eval(tokens[20:30]), case.ref.full[20:30], "continuation after a discarded branch")


def test_last_only_is_last_row(case: Case) -> None:
    prompt = case.ref.tokens[:9]
    case.engine.reset()
    full = case.engine.eval(prompt)
    case.engine.reset()
    last = case.engine.eval(prompt, last_only=True)
    assert last.shape == (1, case.vocab)
    assert case.engine.n_past == len(prompt)
    case.check(last, full[-1:], "last_only vs the engine's own full eval")
    case.check(last, case.ref.full[len(prompt) - 1 : len(prompt)], "last_only vs transformers")


def test_greedy_decoding_matches(case: Case) -> None:
    ref = case.ref
    case.engine.reset()
    logits = case.engine.eval(ref.greedy_prompt, last_only=True)
    chosen: list[int] = []
    for step in range(GREEDY_STEPS):
        assert logits.shape == (1, case.vocab)
        case.check(logits, ref.greedy_rows[step : step + 1], f"greedy step {step}")
        next_id = int(np.argmax(logits[0]))
        if next_id != ref.greedy_ids[step]:
            pytest.fail(
                f"{case.name}: greedy step {step} chose {next_id}, transformers chose {ref.greedy_ids[step]} "
                f"(transformers' top-2 margin there {oracle.top2_margin(ref.greedy_rows[step]):.4f}); "
                f"ids so far {chosen}"
            )
        chosen.append(next_id)
        logits = case.engine.eval([next_id], last_only=True)
    assert chosen == ref.greedy_ids
    assert case.engine.n_past == len(ref.greedy_prompt) + GREEDY_STEPS
