"""Invariants behind the decode-bandwidth numbers of tools/bench_models.py (no timings asserted).

The bench divides weight bytes per token by time; the bytes come from the engine's own
accounting: the census of bound matrices plus the routed experts the expert store fetched.  These
tests pin down what that accounting relies on: a decode step fetches exactly the experts the
router picked (top-k distinct per score-routed MoE layer, the distinct tid2eid entries on hash
layers) and nothing else, and the bench's per-token figure is built from them.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from gateway.engine import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import bench_models  # noqa: E402

MODELS = (("qwen3_moe", "bf16"), ("glm4_moe", "bf16"), ("deepseek_v4", "native"))
PROMPT = [5, 17, 300, 2, 99, 64, 128, 7]


def moe_layers(config: dict) -> list[int]:
    """Layer indices that run routed experts, from the checkpoint's own config.json."""
    n = int(config["num_hidden_layers"])
    kind = config["model_type"]
    if kind == "glm4_moe":
        return list(range(int(config["first_k_dense_replace"]), n))
    if kind == "qwen3_moe":
        step = int(config.get("decoder_sparse_step", 1))
        skip = set(config.get("mlp_only_layers") or [])
        return [i for i in range(n) if i not in skip and (i + 1) % step == 0]
    return list(range(n))  # deepseek_v4: every layer is MoE


def tid2eid_row(ckpt: Path, layer: int, token: int) -> np.ndarray:
    name = f"layers.{layer}.ffn.gate.tid2eid"
    for shard in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(shard), framework="numpy") as f:
            if name in f.keys():
                return f.get_tensor(name)[token]
    raise KeyError(name)


def expected_experts(ckpt: Path, token: int) -> int:
    """Distinct experts one decode step of `token` must fetch, summed over layers."""
    config = json.loads((ckpt / "config.json").read_text())
    k = int(config["num_experts_per_tok"])
    n_hash = int(config.get("num_hash_layers", 0)) if config["model_type"] == "deepseek_v4" else 0
    return sum(len(set(tid2eid_row(ckpt, i, token).tolist())) if i < n_hash else k for i in moe_layers(config))


@pytest.fixture(scope="module", params=MODELS, ids=[m[0] for m in MODELS])
def ckpt(request: pytest.FixtureRequest, build_checkpoint: Callable[..., Path]) -> Path:
    arch, fmt = request.param
    return build_checkpoint(arch, fmt)


def test_decode_fetches_exactly_the_routed_experts(ckpt: Path) -> None:
    engine = Engine(ckpt, threads=2)
    engine.eval(PROMPT, last_only=True)
    for token in (3, 250, 41):
        before = engine.stats()["experts"]
        engine.eval([token], last_only=True)
        after = engine.stats()["experts"]
        n_moe = len(moe_layers(json.loads((ckpt / "config.json").read_text())))
        assert after["fetches"] - before["fetches"] == n_moe  # one batched fetch per MoE layer
        assert after["hits"] - before["hits"] == expected_experts(ckpt, token)


def test_weight_account_splits_the_census(ckpt: Path) -> None:
    engine = Engine(ckpt, threads=1)
    account = bench_models.weight_account(engine)
    sizes = bench_models.tensor_bytes(ckpt)
    census = sum(int(v) for v in engine.info["weight_bytes"].values())
    expert_total = sum(n for name, n in sizes.items() if bench_models.EXPERT_TENSOR.search(name))
    n_expert_units = len({(name[: m.start()], m.group(2)) for name in sizes
                          if (m := bench_models.EXPERT_TENSOR.search(name))})
    assert account.expert_bytes * n_expert_units == pytest.approx(expert_total)
    config = json.loads((ckpt / "config.json").read_text())
    k = int(config["num_experts_per_tok"])
    per_token = account.per_token(k * len(moe_layers(config)))
    # every expert touched + the rest of the census would be the whole census minus the unused
    # experts and all but one embedding row
    assert account.embed_row_bytes > 0
    assert 0 < per_token < census
    assert account.fixed_bytes + expert_total <= census


def test_bench_quick_run_reports_consistent_rows(tmp_path: Path) -> None:
    opts = argparse.Namespace(quick=True, bench_dir=str(tmp_path), models="glm4_moe,deepseek_v4",
                              prompt_tokens=8, threads=2, reps=1)
    results = bench_models.run_model_benches(opts)
    assert [r.name for r in results] == ["glm4_moe", "deepseek_v4"]
    for r in results:
        ckpt = tmp_path / next(p.name for p in tmp_path.iterdir() if p.name.startswith(r.name))
        config = json.loads((ckpt / "config.json").read_text())
        if r.name == "glm4_moe":  # score-routed everywhere: exactly k per MoE layer
            assert r.experts_per_token == int(config["num_experts_per_tok"]) * len(moe_layers(config))
        assert r.bytes_per_token > 0
        assert all(t > 0 for t in r.step_seconds) and all(b > 0 for b in r.read_gbs)
        assert len(r.row()) == len(bench_models.HEADER)
