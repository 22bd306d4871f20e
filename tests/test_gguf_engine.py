"""Engine("model.gguf") against transformers on the weights the GGUF file holds.

tools/ckpt/gguf_file.py writes tiny qwen3_moe / glm4_moe checkpoints as llama.cpp lays them
out (names, ggml dim order, metadata, stacked experts); the reference dequantises every tensor
of the FILE with gguf.quants.dequantize, loads those weights into transformers' own model class
and runs it in float32.  Metric as the other oracle tests: max |engine - reference| /
max |reference| below 1e-4 (the dequantised weights are the same numbers on both sides)."""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tools.ckpt.gguf_file import gguf_parts, read_gguf_as_hf, write_gguf
from tools.ckpt.hf_moe import fuse_experts, hf_config_object, hf_model_class

import oracle
from engine_budget import stated_minimum_gb
from gateway import _core

TOLERANCE = 1e-4
N_TOKENS = 24

# K-quants need rows of whole 256-element blocks: wider tiny models for the mixed files.
WIDE = {
    "qwen3_moe": {"hidden_size": 256, "intermediate_size": 256, "moe_intermediate_size": 256, "num_experts": 6,
                  "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 64},
    "glm4_moe": {"hidden_size": 256, "intermediate_size": 256, "moe_intermediate_size": 256, "n_routed_experts": 8,
                 "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 64, "first_k_dense_replace": 1},
}
# A Q4_K_M-like mix: K-quant experts, Q8_0 attention, Q6_K head, Q5_0/Q4_0 shared and dense
# MLPs, Q8_0 embeddings; norms, biases, routers and the correction bias stay F32.
MIXED = {
    "blk.*.ffn_gate_exps.weight": "Q4_K", "blk.*.ffn_up_exps.weight": "Q5_K",
    "blk.*.ffn_down_exps.weight": "Q6_K",
    "blk.*.attn_q.weight": "Q8_0", "blk.*.attn_k.weight": "Q8_0", "blk.*.attn_v.weight": "Q8_0",
    "blk.*.attn_output.weight": "IQ4_XS",
    "blk.*.ffn_gate_shexp.weight": "Q5_0", "blk.*.ffn_up_shexp.weight": "Q4_0", "blk.*.ffn_down_shexp.weight": "IQ4_NL",
    "blk.*.ffn_gate.weight": "Q4_0", "blk.*.ffn_up.weight": "Q5_0", "blk.*.ffn_down.weight": "Q8_0",
    "token_embd.weight": "Q8_0", "output.weight": "Q6_K",
}
# The low-bit mixes desktop users run for the biggest models (Q2_K / Q3_K files, UD-Q2_K_XL) and
# the Q4_1 / Q5_1 that llama-quantize puts where rows are not whole 256-blocks (GLM-4.5-Air).
LOWBIT = {
    "blk.*.ffn_gate_exps.weight": "Q2_K", "blk.*.ffn_up_exps.weight": "Q3_K",
    "blk.*.ffn_down_exps.weight": "Q3_K",
    "blk.*.attn_q.weight": "Q4_1", "blk.*.attn_k.weight": "Q5_1", "blk.*.attn_v.weight": "Q5_1",
    "blk.*.attn_output.weight": "Q2_K",
    "blk.*.ffn_gate_shexp.weight": "Q4_1", "blk.*.ffn_up_shexp.weight": "Q5_1", "blk.*.ffn_down_shexp.weight": "Q3_K",
    "blk.*.ffn_gate.weight": "Q3_K", "blk.*.ffn_up.weight": "Q2_K", "blk.*.ffn_down.weight": "Q4_1",
    "token_embd.weight": "Q5_1", "output.weight": "Q3_K",
}
# The codebook types of unsloth's UD-IQ1 / IQ2 / IQ3 files (DeepSeek-V4-Flash, GLM-4.5/4.6,
# Qwen3-235B), every one of them somewhere, beside the IQ4_XS / Q4_K those files keep.
IQ = {
    "blk.*.ffn_gate_exps.weight": "IQ2_XXS", "blk.*.ffn_up_exps.weight": "IQ2_XS",
    "blk.*.ffn_down_exps.weight": "IQ3_XXS",
    "blk.*.attn_q.weight": "IQ3_S", "blk.*.attn_k.weight": "IQ2_S", "blk.*.attn_v.weight": "IQ4_XS",
    "blk.*.attn_output.weight": "IQ1_M",
    "blk.*.ffn_gate_shexp.weight": "IQ1_S", "blk.*.ffn_up_shexp.weight": "IQ2_S", "blk.*.ffn_down_shexp.weight": "IQ3_S",
    "blk.*.ffn_gate.weight": "IQ1_S", "blk.*.ffn_up.weight": "IQ1_M", "blk.*.ffn_down.weight": "IQ2_XXS",
    "token_embd.weight": "IQ3_XXS", "output.weight": "Q4_K",
}

# name -> (arch, checkpoint overrides, write_gguf options)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "qwen3_moe-f32": ("qwen3_moe", {}, {}),
    "glm4_moe-bf16": ("glm4_moe", {}, {"default": "BF16"}),
    "qwen3_moe-q8_0": ("qwen3_moe", {}, {"default": "Q8_0"}),
    "glm4_moe-q8_0": ("glm4_moe", {"moe_intermediate_size": 64}, {"default": "Q8_0"}),
    "qwen3_moe-mixed": ("qwen3_moe", WIDE["qwen3_moe"], {"types": MIXED}),
    "glm4_moe-mixed": ("glm4_moe", WIDE["glm4_moe"], {"types": MIXED}),
    "qwen3_moe-lowbit": ("qwen3_moe", WIDE["qwen3_moe"], {"types": LOWBIT}),
    "glm4_moe-lowbit": ("glm4_moe", WIDE["glm4_moe"], {"types": LOWBIT}),
    "qwen3_moe-iq": ("qwen3_moe", WIDE["qwen3_moe"], {"types": IQ}),
    "glm4_moe-iq": ("glm4_moe", WIDE["glm4_moe"], {"types": IQ}),
    "qwen3_moe-split": ("qwen3_moe", {}, {"split_max_tensors": 12, "default": "F16"}),
    "glm4_moe-tied": ("glm4_moe", {}, {"tied": True}),
    # general.alignment 256: every tensor (and so each stacked expert tensor) starts elsewhere.
    "qwen3_moe-q5_0-align256": ("qwen3_moe", {}, {"default": "Q5_0", "alignment": 256}),
}


@pytest.fixture(scope="session")
def gguf_file(build_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """gguf_file(case) -> (checkpoint folder, GGUF path to open), written once per session."""
    root = tmp_path_factory.mktemp("gguf")
    built: dict[str, tuple[Path, Path]] = {}

    def build(case: str) -> tuple[Path, Path]:
        if case not in built:
            arch, overrides, options = CASES[case]
            ckpt = build_checkpoint(arch, "f32", overrides or None)
            (root / case).mkdir()
            built[case] = (ckpt, write_gguf(ckpt, root / case / "model.gguf", **options))
        return built[case]

    return build


def reference_model(ckpt: Path, path: Path, tied: bool) -> torch.nn.Module:
    """transformers' class holding the file's dequantised weights (MTP layers dropped)."""
    config = oracle.read_config(ckpt)
    if tied:
        config["tie_word_embeddings"] = True
    n_layers = config["num_hidden_layers"]
    tensors = {
        name: torch.from_numpy(np.ascontiguousarray(values))
        for name, values in read_gguf_as_hf(path).items()
        if not (name.startswith("model.layers.") and int(name.split(".")[2]) >= n_layers)
    }
    if tied:
        assert "lm_head.weight" not in tensors
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    torch.manual_seed(0)
    model = hf_model_class(config)(hf_config_object(config)).float()
    model.load_state_dict(fuse_experts(tensors, config), strict=True)
    return model.eval()


def tokens_for(vocab: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(5).integers(0, vocab, N_TOKENS)]


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return oracle.relative_error(np.asarray(actual), np.asarray(expected))


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_matches_transformers(case: str, gguf_file) -> None:
    check_against_transformers(case, gguf_file, "")


@pytest.mark.skipif(not _core.cpu_features()["avx2"], reason="the avx2 table: an x86 CPU with AVX2")
@pytest.mark.parametrize("case", ["qwen3_moe-mixed", "glm4_moe-mixed", "qwen3_moe-lowbit"])
def test_gguf_matches_transformers_on_the_avx2_table(case: str, gguf_file) -> None:
    """The table of every x86 CPU without AVX-512 (the desktops of Alder Lake and later, Zen 2 and
    Zen 3), whose fp32 decode rows of Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS take x in lane order."""
    check_against_transformers(case, gguf_file, "avx2")


def check_against_transformers(case: str, gguf_file, kernels: str) -> None:
    from gateway.engine import Engine

    ckpt, path = gguf_file(case)
    model = reference_model(ckpt, path, CASES[case][2].get("tied", False))
    engine = Engine(str(path), threads=1, kernels=kernels)
    try:
        config = oracle.read_config(ckpt)
        assert engine.info["vocab_size"] == config["vocab_size"]
        assert engine.info["n_layers"] == config["num_hidden_layers"]
        tokens = tokens_for(config["vocab_size"])
        expected = oracle.full_logits(model, tokens)
        prefill = engine.eval(tokens[:16])
        error = relative_error(prefill, expected[:16])
        assert error < TOLERANCE, f"{case} prefill: relative error {error:.3e}"
        for position in range(16, N_TOKENS):  # decode steps through the KV cache
            row = engine.eval([tokens[position]])
            error = relative_error(row, expected[position : position + 1])
            assert error < TOLERANCE, f"{case} decode at {position}: relative error {error:.3e}"
    finally:
        engine.close()


def test_split_set_has_several_parts(gguf_file) -> None:
    _, path = gguf_file("qwen3_moe-split")
    parts = gguf_parts(path)
    assert len(parts) >= 3 and all(p.is_file() for p in parts), parts
    assert path.name.endswith("-00001-of-%05d.gguf" % len(parts))


def test_cached_experts_read_from_disk_are_bitwise_resident(gguf_file) -> None:
    """A budget small enough that experts live in a cache and are read (O_DIRECT or pread) from
    the file's expert slices: the logits are bitwise those of the resident run."""
    from gateway.engine import Engine

    for case in ("qwen3_moe-mixed", "qwen3_moe-split", "glm4_moe-mixed"):
        _, path = gguf_file(case)
        resident = Engine(str(path), threads=1)
        tokens = tokens_for(resident.vocab_size)
        want = resident.eval(tokens)
        resident.close()
        engine = Engine(str(path), ram_gb=stated_minimum_gb(path), threads=1, expert_history=False, expert_prefetch=False)
        try:
            got = engine.eval(tokens)
            stats = engine.stats()["experts"]
            assert stats["slots"] > 0 and stats["misses"] > 0 and stats["bytes_read"] > 0, stats
            assert stats["direct_reads"] + stats["buffered_reads"] > 0, stats
            assert np.array_equal(got, want), f"{case}: cached run differs from the resident one"
        finally:
            engine.close()


def test_config_from_metadata_matches_folder(gguf_file) -> None:
    """The normalised config built from GGUF metadata equals the one from config.json."""
    from gateway.model_config import load_config

    for case in ("qwen3_moe-f32", "glm4_moe-bf16", "glm4_moe-mixed"):
        ckpt, path = gguf_file(case)
        assert load_config(path) == load_config(ckpt), case


def test_history_beside_a_gguf_file(gguf_file) -> None:
    from gateway.engine import EXPERT_HISTORY_NAME, default_expert_history

    _, path = gguf_file("qwen3_moe-f32")
    history = default_expert_history(path)
    assert history == path.resolve().parent / f"{path.name}{EXPERT_HISTORY_NAME}"


def test_prefix_snapshots_of_a_gguf_file_are_keyed_by_the_file(gguf_file, tmp_path: Path) -> None:
    """Disk prefix snapshots live under a key of the model; for a file that key changes when
    another file is saved under the same name."""
    from gateway.prefix_disk import model_folder

    _, path = gguf_file("qwen3_moe-f32")
    copy = tmp_path / "model.gguf"
    shutil.copyfile(path, copy)
    before = model_folder(tmp_path / "snaps", copy, "f32")
    assert before == model_folder(tmp_path / "snaps", copy, "f32")
    with open(copy, "ab") as handle:
        handle.write(b"\0" * 32)
    assert model_folder(tmp_path / "snaps", copy, "f32") != before


# ---- errors -------------------------------------------------------------------------------


def test_unsupported_type_is_named(build_checkpoint, tmp_path: Path) -> None:
    from gateway.engine import Engine, EngineError

    ckpt = build_checkpoint("qwen3_moe", "f32", WIDE["qwen3_moe"])  # rows of whole 256-blocks
    path = write_gguf(ckpt, tmp_path / "tq1.gguf", types={"blk.*.ffn_down_exps.weight": "TQ1_0"})
    with pytest.raises(EngineError) as info:
        Engine(str(path))
    message = str(info.value)
    assert "blk.0.ffn_down_exps.weight" in message and "TQ1_0" in message and "not supported" in message, message
    assert "Q8_0" in message and "Q4_K" in message, message  # the supported ones are listed


def test_missing_tensor_is_named_as_stored(build_checkpoint, tmp_path: Path) -> None:
    from gateway.engine import Engine, EngineError

    ckpt = build_checkpoint("glm4_moe", "f32")
    for dropped, expected in (("blk.2.ffn_down_exps.weight", r"blk\.2\.ffn_down_exps\.weight \(expert 0\)"),
                              ("blk.1.post_attention_norm.weight", r"blk\.1\.ffn_norm\.weight or blk\.1\.post_attention_norm\.weight"),
                              ("blk.0.attn_k.bias", r"blk\.0\.attn_k\.bias")):
        path = write_gguf(ckpt, tmp_path / f"{dropped}.gguf", drop=(dropped,))
        with pytest.raises(EngineError, match=f"not found in the file.*{expected}|{expected}.*not found"):
            Engine(str(path))


@pytest.mark.parametrize("claim, expected", [
    ({"num_experts": 12}, r"blk\.0\.ffn_gate_inp\.weight.*shape \[8, 64\], expected \[12, 64\]"),
    ({"hidden_size": 96}, r"token_embd\.weight.*shape \[\d+, 64\], expected \[\d+, 96\]"),
    ({"num_hidden_layers": 4}, r"blk\.3\.attn_norm\.weight.*not found|not found.*blk\.3\.attn_norm\.weight"),
    ({"num_key_value_heads": 3}, r"not a multiple of num_key_value_heads"),
    ({"num_experts_per_tok": 9}, r"num_experts_per_tok 9 exceeds"),
    ({"moe_intermediate_size": 16}, r"ffn_gate_exps\.weight.*expected \[16, 64\]"),
])
def test_metadata_that_contradicts_the_tensors(build_checkpoint, tmp_path: Path, claim: dict[str, Any], expected: str) -> None:
    """Metadata that does not fit the tensors is an error naming what disagrees, never a crash."""
    from gateway.engine import ConfigError, Engine, EngineError

    ckpt = build_checkpoint("qwen3_moe", "f32")
    path = write_gguf(ckpt, tmp_path / "claim.gguf", metadata=claim)
    with pytest.raises((EngineError, ConfigError), match=expected):
        Engine(str(path))


def test_vector_in_a_block_type_is_named(build_checkpoint, tmp_path: Path) -> None:
    from gateway.engine import Engine, EngineError

    ckpt = build_checkpoint("qwen3_moe", "f32")
    path = write_gguf(ckpt, tmp_path / "norm.gguf", types={"blk.1.attn_norm.weight": "Q8_0"})
    with pytest.raises(EngineError, match=r"blk\.1\.attn_norm\.weight.*Q8_0"):
        Engine(str(path))


def test_unknown_architecture(build_checkpoint, tmp_path: Path) -> None:
    from gateway import _core
    from gateway.engine import ConfigError, Engine
    from gateway.model_config import load_config

    ckpt = build_checkpoint("qwen3_moe", "f32")
    path = write_gguf(ckpt, tmp_path / "llama.gguf", arch="llama")
    with pytest.raises(ConfigError, match=r"'llama'.*glm4moe, qwen3moe"):
        Engine(str(path))
    # The C side refuses it on its own too (a config from elsewhere does not make it readable).
    config = json.dumps(load_config(ckpt))
    with pytest.raises(RuntimeError, match=r"llama\.gguf: general\.architecture 'llama' is not supported"):
        _core.Model(str(path), config)


def test_truncated_file(gguf_file, tmp_path: Path) -> None:
    from gateway import _core
    from gateway.engine import Engine, EngineError
    from gateway.model_config import load_config

    ckpt, path = gguf_file("qwen3_moe-f32")
    cut = tmp_path / "cut.gguf"
    shutil.copyfile(path, cut)
    with open(cut, "r+b") as handle:
        handle.truncate(os.path.getsize(cut) - 100)
    with pytest.raises((EngineError, ValueError), match=r"cut\.gguf"):
        Engine(str(cut))
    with pytest.raises(RuntimeError, match=r"cut\.gguf.*(beyond|past|end)"):
        _core.Model(str(cut), json.dumps(load_config(ckpt)))


def test_missing_split_part(gguf_file, tmp_path: Path) -> None:
    from gateway import _core
    from gateway.engine import ConfigError, Engine
    from gateway.model_config import load_config

    ckpt, path = gguf_file("qwen3_moe-split")
    parts = gguf_parts(path)
    for part in parts[:1] + parts[2:]:
        shutil.copyfile(part, tmp_path / part.name)
    first, missing = tmp_path / parts[0].name, tmp_path / parts[1].name
    with pytest.raises(ConfigError, match=f"split part 2 of {len(parts)} is missing: .*{missing.name}"):
        Engine(str(first))
    with pytest.raises(RuntimeError, match=f"split part 2 of {len(parts)} is missing: .*{missing.name}"):
        _core.Model(str(first), json.dumps(load_config(ckpt)))
    # Opening a later part names the first one.
    with pytest.raises(ConfigError, match="open the first part"):
        Engine(str(tmp_path / parts[2].name))
