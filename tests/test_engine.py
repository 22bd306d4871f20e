"""gateway.engine.Engine: API behaviour, slot bookkeeping and error reporting on tiny checkpoints.

Numerical agreement with transformers is tests/test_oracle_moe.py; here the engine is checked
against itself (last_only vs full rows, truncate vs fresh run, scalar vs SIMD kernels) and
against broken inputs, which must raise exceptions that name the culprit, never crash.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gateway.engine import Engine, EngineError
from gateway.model_config import ConfigError, normalise

ARCHS = ("qwen3_moe", "glm4_moe")
TOKENS = [5, 17, 300, 2, 999, 64, 128, 7, 7, 512, 33]


@pytest.fixture(scope="module", params=ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def ckpt(arch: str, build_checkpoint: Callable[..., Path]) -> Path:
    return build_checkpoint(arch, "bf16")


@pytest.fixture(scope="module")
def engine(ckpt: Path) -> Engine:
    return Engine(ckpt, threads=2)


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max())


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---- info and bookkeeping -----------------------------------------------------------------------


def test_info_fields(engine: Engine, arch: str, ckpt: Path) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    info = engine.info
    assert info["arch"] == arch
    assert info["vocab_size"] == config["vocab_size"]
    assert info["n_layers"] == config["num_hidden_layers"]
    assert info["threads"] == 2
    assert info["simd"] in ("scalar", "avx2", "avx512", "avx512bf16", "neon")
    assert info["max_ctx"] == min(config["max_position_embeddings"], 32768)
    file_bytes = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    assert 0.9 * file_bytes < info["model_bytes"] <= file_bytes  # tensor data, headers aside
    # every linear layer of a bf16 checkpoint is bound as bf16 (embeddings and head included)
    assert set(info["weights"]) == {"bf16"}
    experts = info["n_experts"] * 3 * sum(1 for flag in engine.config["layer_is_moe"] if flag)
    assert info["weights"]["bf16"] > experts


def test_n_past_bookkeeping(engine: Engine) -> None:
    engine.reset()
    assert engine.n_past == 0
    engine.eval(TOKENS[:4])
    assert engine.n_past == 4
    engine.eval([TOKENS[4]])
    assert engine.n_past == 5
    engine.eval(TOKENS[5:], last_only=True)
    assert engine.n_past == len(TOKENS)
    engine.reset()
    assert engine.n_past == 0


def test_eval_returns_float32_rows(engine: Engine) -> None:
    engine.reset()
    logits = engine.eval(TOKENS)
    assert logits.dtype == np.float32
    assert logits.shape == (len(TOKENS), engine.vocab_size)
    assert np.isfinite(logits).all()


def test_empty_eval(engine: Engine) -> None:
    engine.reset()
    engine.eval(TOKENS[:3])
    empty = engine.eval([])
    assert empty.shape == (0, engine.vocab_size) and empty.dtype == np.float32
    assert engine.eval([], last_only=True).shape == (0, engine.vocab_size)
    assert engine.n_past == 3


def test_last_only_equals_last_row(engine: Engine) -> None:
    engine.reset()
    full = engine.eval(TOKENS)
    engine.reset()
    last = engine.eval(TOKENS, last_only=True)
    assert last.shape == (1, engine.vocab_size)
    # the head runs with one token instead of eleven: only summation order may differ
    assert relative(last[0], full[-1]) < 1e-6


def test_prefill_equals_token_by_token(engine: Engine) -> None:
    engine.reset()
    full = engine.eval(TOKENS)
    engine.reset()
    steps = np.concatenate([engine.eval([t]) for t in TOKENS])
    assert relative(steps, full) < 1e-5


def test_truncate_matches_fresh_run(engine: Engine) -> None:
    engine.reset()
    fresh = engine.eval(TOKENS)
    engine.reset()
    engine.eval(TOKENS[:6] + [1, 2, 3, 4])  # a different continuation, then rolled back
    engine.truncate(6)
    assert engine.n_past == 6
    again = engine.eval(TOKENS[6:])
    np.testing.assert_allclose(again, fresh[6:], rtol=0, atol=1e-5 * float(np.abs(fresh).max()))
    engine.truncate(0)
    assert engine.n_past == 0


def test_truncate_beyond_n_past_is_an_error(engine: Engine) -> None:
    engine.reset()
    engine.eval(TOKENS[:3])
    with pytest.raises(EngineError, match="holds 3"):
        engine.truncate(4)
    with pytest.raises(EngineError):
        engine.truncate(-1)
    assert engine.n_past == 3


def test_bad_token_id_names_id_and_vocab(engine: Engine) -> None:
    engine.reset()
    engine.eval(TOKENS[:2])
    vocab = engine.vocab_size
    for bad in (vocab, -1, 2**40):
        with pytest.raises(EngineError, match=rf"{bad}.*{vocab}"):
            engine.eval([1, bad])
    with pytest.raises(TypeError):
        engine.eval([1.5])
    assert engine.n_past == 2
    # the slot keeps working after errors
    assert engine.eval([3]).shape == (1, vocab)
    assert engine.n_past == 3


def test_context_overflow_is_an_error(ckpt: Path) -> None:
    small = Engine(ckpt, threads=1, max_ctx=8)
    assert small.info["max_ctx"] == 8
    small.eval(TOKENS[:6])
    with pytest.raises(EngineError, match="max_ctx 8"):
        small.eval(TOKENS[:3])
    assert small.n_past == 6
    assert small.eval(TOKENS[:2], last_only=True).shape == (1, small.vocab_size)
    assert small.n_past == 8


def test_scalar_and_best_kernels_agree(ckpt: Path, engine: Engine) -> None:
    scalar = Engine(ckpt, threads=1, kernels="scalar")
    assert scalar.info["simd"] == "scalar"
    engine.reset()
    best = engine.eval(TOKENS)
    reference = scalar.eval(TOKENS)
    assert relative(best, reference) < 1e-5


def test_unknown_kernel_table(ckpt: Path) -> None:
    with pytest.raises(EngineError, match="kernel table 'sse9'"):
        Engine(ckpt, kernels="sse9")


def test_stats(engine: Engine) -> None:
    engine.reset()
    engine.eval(TOKENS)
    engine.eval([1])
    stats = engine.stats()
    assert stats["prefill_tokens"] >= len(TOKENS) and stats["decode_tokens"] >= 1
    assert stats["tokens_evaluated"] == stats["prefill_tokens"] + stats["decode_tokens"]
    assert stats["prefill_tok_per_s"] > 0 and stats["decode_tok_per_s"] > 0
    assert set(stats["experts"]) >= {"fetches", "hits", "misses", "bytes_read"}
    assert stats["experts"]["fetches"] > 0


# ---- broken checkpoints and configs -----------------------------------------------------------------


def test_unknown_model_type(ckpt: Path, tmp_path: Path) -> None:
    broken = copy_checkpoint(ckpt, tmp_path / "ck")
    config = json.loads((broken / "config.json").read_text())
    config["model_type"] = "llama_moe_9000"
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="llama_moe_9000.*glm4_moe.*qwen3_moe"):
        Engine(broken)


def test_missing_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config.json"):
        Engine(tmp_path)
    with pytest.raises(EngineError, match="not a model folder"):
        Engine(tmp_path / "nowhere")


def test_wrong_shape_in_config_names_tensor_and_shard(ckpt: Path, tmp_path: Path) -> None:
    broken = copy_checkpoint(ckpt, tmp_path / "ck")
    config = json.loads((broken / "config.json").read_text())
    config["moe_intermediate_size"] += 8
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError, match=r"mlp\.experts\.0\.gate_proj\.weight") as info:
        Engine(broken)
    assert ".safetensors" in str(info.value)


def test_missing_tensor_is_named(ckpt: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = copy_checkpoint(ckpt, tmp_path / "ck")
    index_path = broken / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    victim = "model.layers.1.self_attn.k_proj.weight"
    shard = broken / index["weight_map"].pop(victim)
    tensors = load_file(str(shard))
    del tensors[victim]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))
    with pytest.raises(EngineError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        Engine(broken)


def test_truncated_safetensors_file_is_named(ckpt: Path, tmp_path: Path) -> None:
    broken = copy_checkpoint(ckpt, tmp_path / "ck")
    shard = sorted(broken.glob("*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(EngineError, match=shard.name):
        Engine(broken)


def test_bad_config_values_are_value_errors() -> None:
    base = {
        "model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 100,
    }
    assert normalise(base)["head_dim"] == 16
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        normalise({**base, "num_key_value_heads": 3})
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        normalise({**base, "num_experts_per_tok": 9})
    with pytest.raises(ConfigError, match="hidden_size"):
        normalise({**base, "hidden_size": "64"})
    with pytest.raises(ConfigError, match="RoPE type 'yarn'"):
        normalise({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


def test_config_normalisation_rules() -> None:
    glm = {
        "model_type": "glm4_moe", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96, "moe_intermediate_size": 32,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": 2, "vocab_size": 100,
        "rope_theta": 1e6,
    }
    cfg = normalise(glm)
    assert cfg["layer_is_moe"] == [0, 0, 1, 1]
    assert cfg["partial_rotary_factor"] == 0.5 and cfg["rotary_dim"] == 16  # glm4_moe default
    assert cfg["rope_theta"] == 1e6 and cfg["router"] == "sigmoid" and cfg["o_proj_bias"] is False
    newer = normalise({**glm, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5,
                                                  "partial_rotary_factor": 1.0}})
    assert newer["rope_theta"] == 5e5 and newer["rotary_dim"] == 32
    qwen = {
        "model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 96, "moe_intermediate_size": 32,
        "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 100, "decoder_sparse_step": 2,
        "mlp_only_layers": [3], "attention_bias": True,
    }
    cfg = normalise(qwen)
    assert cfg["layer_is_moe"] == [0, 1, 0, 0]
    assert cfg["rotary_dim"] == 16 and cfg["router"] == "softmax" and cfg["o_proj_bias"] is True
    assert cfg["norm_topk_prob"] is False  # transformers' default for qwen3_moe
