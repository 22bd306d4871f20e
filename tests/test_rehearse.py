"""tools/rehearse.py on truncated depth, full width: the same writer and measuring code as the
full-size rehearsals (docs/REHEARSALS.md), two DeepSeek-V4-Flash layers and one GLM / Qwen layer.

Each test writes a sparse checkpoint (tens of GB apparent for GLM, ~9 GB for V4, ~1.5 GB on
disk), checks every stored tensor against the project's tensor plan and that the large matrices
really are holes, then loads it under a 20 GB budget and checks the reported numbers cohere.
"""
from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tools"))
import rehearse  # noqa: E402
from ckpt import common, hf_moe  # noqa: E402

from gateway.checkpoints import deepseek_v4 as dsv4  # noqa: E402
from gateway.checkpoints.shards import INDEX_FILE, Entry  # noqa: E402

RAM_GB = 20.0
DISK_BPS = 3.5e9


def stored_headers(folder: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """name -> (dtype, shape, shard) from every shard's safetensors header; checks that each
    file is exactly header + data long and that the index agrees."""
    found: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with open(shard, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        header.pop("__metadata__", None)
        end = max(info["data_offsets"][1] for info in header.values())
        assert shard.stat().st_size == 8 + length + end, shard.name
        for name, info in header.items():
            assert name not in found, f"{name} stored twice"
            found[name] = (info["dtype"], tuple(info["shape"]), shard.name)
    weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
    assert weight_map == {name: where for name, (_, _, where) in found.items()}
    return found


def check_against_plan(folder: Path, planned: list[Entry]) -> None:
    found = stored_headers(folder)
    assert set(found) == {e.name for e in planned}
    for entry in planned:
        dtype, shape, _ = found[entry.name]
        assert (dtype, shape) == (entry.dtype, entry.shape), entry.name


def check_sparse(written: rehearse.Written) -> None:
    apparent, allocated = rehearse.measure_disk(written.path)
    assert apparent >= written.apparent_bytes  # + the headers
    # Holes cost nothing: what is allocated is the values (plus block rounding), a small part.
    assert allocated < 0.3 * apparent, (allocated, apparent)
    assert 0.9 * written.value_bytes < allocated < 1.1 * written.value_bytes + (64 << 20)


def check_result(result: rehearse.Result, prompt: int, decode: int) -> None:
    assert result.finite
    assert 0 < result.peak_rss < RAM_GB * rehearse.GB
    assert result.cache_slots > 0
    (run,) = result.runs
    prefill, dec = run["prefill"], run["decode"]
    assert prefill["tokens"] == prompt and dec["tokens"] == decode
    assert prefill["bytes_read"] > 0 and prefill["misses"] > 0 and prefill["fetches"] > 0
    for phase in (prefill, dec):
        assert 0.0 <= phase["hit_rate"] <= 1.0
        assert 0.0 <= phase["compute_s"] <= phase["wall_s"]
        assert phase["read_s"] >= 0.0
        assert math.isclose(phase["disk_floor_s"], phase["bytes_read"] / DISK_BPS)
        assert math.isclose(phase["projected_s"], phase["compute_s"] + phase["disk_floor_s"])
        # the time split: the MoE's compute and waits are measured, dense is the rest of the wall
        assert phase["expert_s"] > 0.0 and phase["wait_s"] >= 0.0
        assert phase["expert_s"] + phase["wait_s"] <= phase["wall_s"]
        assert math.isclose(phase["dense_s"] + phase["expert_s"] + phase["wait_s"], phase["wall_s"], rel_tol=1e-9)
        assert phase["overlapped_s"] == max(phase["compute_s"], phase["disk_floor_s"]) <= phase["projected_s"]
        assert math.isclose(phase["measured_ratio"], phase["wall_s"] / phase["overlapped_s"])
        if phase["emulated"]:  # the disk model: reads went through one queue at DISK_BPS
            assert phase["wall_s"] >= phase["disk_floor_s"] and phase["read_s"] >= phase["disk_floor_s"] * (1 - 1e-9)
        assert phase["slot_bytes"] > 0 and phase["reads_per_lookup"] >= 0.0
        assert phase["direct_reads"] + phase["buffered_reads"] >= (1 if phase["bytes_read"] else 0)
    table = rehearse.table([result], DISK_BPS / 1e9)
    assert table.count(result.family) == 2
    assert rehearse.time_split([result], DISK_BPS / 1e9).count(result.family) == 2


def test_deepseek_v4_two_layers_full_width(tmp_path):
    written = rehearse.write_dsv4(tmp_path / "v4", layers=2, quiet=True)
    d = rehearse.flash_dims(2)
    assert (d.hidden_size, d.n_routed_experts, d.moe_intermediate_size, d.vocab_size) == (4096, 256, 2048, 129280)
    check_against_plan(written.path, [e for t in dsv4.tensor_plan(d) for e in dsv4.stored_entries(t)])
    # The release's cut: embedding, one shard per layer, the globals.
    assert sorted(p.name for p in written.path.glob("*.safetensors")) == [
        f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
    check_sparse(written)
    config = json.loads((written.path / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["n_routed_experts"] == 256
    tokenizer = json.loads((written.path / "tokenizer.json").read_text())
    ids = list(tokenizer["model"]["vocab"].values()) + [t["id"] for t in tokenizer["added_tokens"]]
    assert max(ids) < config["vocab_size"]  # the real V4 tokenizer: every id has an embedding row

    result = rehearse.rehearse(rehearse.RELEASES["deepseek_v4"], written, prompts=[64], decode=2, ram_gb=RAM_GB,
                               kv_dtype="bf16", disk_bps=DISK_BPS, log=lambda _: None, emulate_disk=True)
    check_result(result, 64, 2)
    assert result.runs[0]["decode"]["emulated"]
    # A cold prefill reads each expert it asks for once: bytes read = lookups x one expert's.
    assert math.isclose(result.runs[0]["prefill"]["reads_per_lookup"], 1.0, rel_tol=1e-3)
    # Hash-routed layers 0-1 pick 6 of 256 experts per token from real random tables: a
    # 64-token prompt asks for well over a hundred distinct experts per layer.
    assert result.runs[0]["prefill"]["misses"] > 200


@pytest.mark.parametrize("family", ["glm4_moe", "qwen3_moe"])
def test_hf_family_one_layer_full_width(tmp_path, family):
    written = rehearse.write_hf(family, tmp_path / family, layers=1, quiet=True)
    config = json.loads((written.path / "config.json").read_text())
    release = rehearse.HF_RELEASES[family]
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "moe_intermediate_size", "vocab_size"):
        assert config[key] == release[key], key
    assert config["quantization_config"]["weight_block_size"] == [128, 128]
    specs = hf_moe.tensor_specs(config)
    check_against_plan(written.path, [e for s in specs for e in common.stored_entries(s, rehearse.HF_FORMAT)])
    assert hf_moe.is_moe_layer(config, 0)  # a truncated GLM keeps its one layer a MoE layer
    check_sparse(written)

    result = rehearse.rehearse(rehearse.RELEASES[family], written, prompts=[32], decode=1, ram_gb=RAM_GB,
                               kv_dtype="bf16", disk_bps=DISK_BPS, log=lambda _: None)
    check_result(result, 32, 1)


def test_random_bytes_are_finite_and_spread():
    rng = np.random.default_rng(0)
    bits = np.frombuffer(b"".join(rehearse.random_bf16(rng, 100_000, 127)), dtype="<u2").astype(np.uint32)
    values = (bits << 16).view(np.float32)
    assert np.isfinite(values).all() and 0.5 <= np.abs(values).min() and np.abs(values).max() < 2.0
    assert 0.4 < (values < 0).mean() < 0.6
    scales = np.frombuffer(rehearse.random_ue8m0(rng, Entry("s", "F8_E8M0", (64, 64)), 4096, 7), dtype=np.uint8)
    assert set(np.unique(scales)) <= {113, 114, 115}


def test_arguments():
    args = rehearse.parse_args(["serve", "--layers", "2"])
    assert args.serve and args.families == ["deepseek_v4"] and args.layers == 2
    args = rehearse.parse_args(["qwen3_moe", "--prompt", "256,512"])
    assert not args.serve and args.families == ["qwen3_moe"] and args.prompt == [256, 512]
    assert rehearse.parse_args([]).families == list(rehearse.RELEASES)
    defaults = rehearse.parse_args([])
    assert defaults.emulate_disk and defaults.read_ahead  # rehearsals read through the disk model
    off = rehearse.parse_args(["--no-emulate-disk", "--no-read-ahead"])
    assert not off.emulate_disk and not off.read_ahead
    with pytest.raises(SystemExit):
        rehearse.parse_args(["llama"])
    with pytest.raises(SystemExit):
        rehearse.parse_args(["serve", "glm4_moe"])
    with pytest.raises(ValueError):
        rehearse.flash_dims(44)
