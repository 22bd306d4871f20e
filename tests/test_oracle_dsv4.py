"""DeepSeek-V4 engine vs transformers' DeepseekV4ForCausalLM (fp32, same dequantised weights).

The tiny checkpoint has all three attention types (sliding-only, CSA with indexer, HCA), hash-
routed and score-routed MoE layers, a window of 8 tokens and compression ratios 4 and 8, so the
~60-90-token sequences below close many compressed blocks of each kind and cross the window
many times.  The tolerance is on max|diff| / max|logit|.
"""
from __future__ import annotations

import numpy as np
import pytest
from tools.ckpt import deepseek_v4 as writer

import oracle_dsv4 as oracle

TOL = 1e-3
PROMPT = 61  # not a multiple of 4 or 8: decoding then crosses the 64 boundary of both ratios
TOTAL = 93  # PROMPT + 32 greedy steps
FORK = 45  # truncate-and-replay point for the alternative continuation


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory):
    return writer.write_checkpoint("deepseek_v4", "tiny", "native", tmp_path_factory.mktemp("dsv4_tiny"), progress=False)


@pytest.fixture(scope="session")
def hf(ckpt_dir):
    return oracle.hf_model(ckpt_dir)


@pytest.fixture(scope="session")
def tokens() -> list[int]:
    rng = np.random.default_rng(1234)
    return [0] + rng.integers(2, writer.TINY.vocab_size, TOTAL - 1).tolist()  # BOS, then any ids


@pytest.fixture(scope="session")
def alt_tokens(tokens) -> list[int]:
    rng = np.random.default_rng(99)
    return tokens[:FORK] + rng.integers(2, writer.TINY.vocab_size, 30).tolist()


@pytest.fixture(scope="session")
def ref(hf, tokens) -> np.ndarray:
    return oracle.full_logits(hf, tokens)


@pytest.fixture(scope="session")
def alt_ref(hf, alt_tokens) -> np.ndarray:
    return oracle.full_logits(hf, alt_tokens)


@pytest.fixture(scope="session")
def engine(ckpt_dir):
    from gateway.engine import Engine

    return Engine(str(ckpt_dir), threads=2)


def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == np.float32
    err = oracle.rel_error(got, want)
    assert err < TOL, f"{what}: max|diff|/max|logit| = {err:.3g}"


def test_info(engine):
    info = engine.info
    assert info["arch"] == "deepseek_v4"
    assert info["vocab_size"] == writer.TINY.vocab_size
    assert info["n_layers"] == writer.TINY.n_layers


def test_prefill_matches(engine, tokens, ref):
    engine.reset()
    check(engine.eval(tokens[:PROMPT]), ref[:PROMPT], "prefill")
    assert engine.n_past == PROMPT


def test_decode_across_block_boundaries(engine, tokens, ref):
    engine.reset()
    engine.eval(tokens[:PROMPT], last_only=True)
    for p in range(PROMPT, PROMPT + 20):  # positions 61..80: closes 4-blocks and 8-blocks 64, 72, 80
        check(engine.eval([tokens[p]]), ref[p : p + 1], f"decode position {p}")


def test_chunked_prefill(engine, tokens, ref):
    engine.reset()
    start = 0
    for size in (5, 7, 1, 1, 13, 3, 9, 2, 23, 1):
        check(engine.eval(tokens[start : start + size]), ref[start : start + size], f"chunk at {start}")
        start += size
    assert engine.n_past == start


def test_last_only(engine, tokens, ref):
    engine.reset()
    got = engine.eval(tokens[:PROMPT], last_only=True)
    check(got, ref[PROMPT - 1 : PROMPT], "last_only")


@pytest.mark.parametrize("cut", [72, 64, 41, 40, 37, 9, 1])
def test_truncate_and_replay(engine, tokens, ref, cut):
    """Cuts inside blocks and exactly on 4-, 8- and window boundaries, then replays the rest."""
    engine.reset()
    engine.eval(tokens[:80], last_only=True)
    engine.truncate(cut)
    assert engine.n_past == cut
    check(engine.eval(tokens[cut : cut + 3]), ref[cut : cut + 3], f"replay after truncate({cut})")
    check(engine.eval([tokens[cut + 3]]), ref[cut + 3 : cut + 4], f"decode after truncate({cut})")


def test_truncate_then_diverge(engine, tokens, alt_tokens, alt_ref):
    engine.reset()
    engine.eval(tokens[:70], last_only=True)
    engine.truncate(FORK)
    check(engine.eval(alt_tokens[FORK:]), alt_ref[FORK:], "different continuation after truncate")


def test_reset_gives_fresh_state(engine, tokens, ref):
    engine.eval(tokens[:10], last_only=True)
    engine.reset()
    assert engine.n_past == 0
    check(engine.eval(tokens[:12]), ref[:12], "after reset")


def test_greedy_32_tokens(engine, hf, tokens):
    """Engine greedy decoding; transformers must pick the same id at every step (teacher-forced
    check over one forward pass: identical to its own greedy run when every choice agrees)."""
    engine.reset()
    prompt = tokens[:PROMPT]
    out = [int(engine.eval(prompt, last_only=True)[0].argmax())]
    for _ in range(31):
        out.append(int(engine.eval([out[-1]], last_only=True)[0].argmax()))
    want = oracle.full_logits(hf, prompt + out[:-1])[PROMPT - 1 :].argmax(axis=-1).tolist()
    assert out == want


def test_long_prompt_spans_several_prefill_chunks(engine, hf):
    """150 tokens: the engine splits prefill into chunks; 37 CSA and 18 HCA rows, indexer picks 4."""
    rng = np.random.default_rng(7)
    seq = [0] + rng.integers(2, writer.TINY.vocab_size, 149).tolist()
    want = oracle.full_logits(hf, seq)
    engine.reset()
    check(engine.eval(seq), want, "150-token prefill")
    engine.truncate(131)
    check(engine.eval(seq[131:]), want[131:], "replay after truncate(131)")


def test_bad_checkpoint_is_a_clear_error(ckpt_dir, tmp_path):
    """A config that does not match the tensors names the offending tensor."""
    import json

    from gateway.engine import Engine, EngineError

    for path in ckpt_dir.iterdir():
        if path.name != "config.json":
            (tmp_path / path.name).symlink_to(path)
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg["q_lora_rank"] = 96
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EngineError, match=r"tensor 'layers\.0\.attn\.(q_norm|wq_a)\..*expected"):
        Engine(str(tmp_path), threads=1)
