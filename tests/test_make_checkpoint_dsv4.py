"""DeepSeek-V4 checkpoint writer: the exact on-disk form of the release (original names, FP8 +
ue8m0 128x128 scales, packed FP4 experts + ue8m0 per-32 scales, BF16/F32/I64 tensors, shards +
index, published config.json, the real tokenizer), and a tiny config that exercises every path.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tools.ckpt import deepseek_v4 as writer

import oracle_dsv4 as oracle

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return writer.write_checkpoint("deepseek_v4", "tiny", "native", tmp_path_factory.mktemp("dsv4_ck"), progress=False)


@pytest.fixture(scope="module")
def raw(tiny_dir):
    return oracle.read_raw(tiny_dir)


@pytest.fixture(scope="module")
def config(tiny_dir) -> dict:
    return json.loads((tiny_dir / "config.json").read_text())


def expected_tensors(cfg: dict) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) straight from the spec's inventory (dsv4-arch.md §3)."""
    d, H, D, q = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"], cfg["q_lora_rank"]
    G, R, I, E = cfg["o_groups"], cfg["o_lora_rank"], cfg["moe_intermediate_size"], cfg["n_routed_experts"]
    V, hc, K = cfg["vocab_size"], cfg["hc_mult"], cfg["num_experts_per_tok"]
    HI, DI = cfg["index_n_heads"], cfg["index_head_dim"]
    mix = (2 + hc) * hc
    out: dict[str, tuple[str, tuple[int, ...]]] = {}

    def fp8(name: str, rows: int, cols: int) -> None:
        out[name + ".weight"] = ("F8_E4M3", (rows, cols))
        out[name + ".scale"] = ("F8_E8M0", (math.ceil(rows / 128), math.ceil(cols / 128)))

    def fp4(name: str, rows: int, cols: int) -> None:
        out[name + ".weight"] = ("I8", (rows, cols // 2))
        out[name + ".scale"] = ("F8_E8M0", (rows, cols // 32))

    out["embed.weight"] = ("BF16", (V, d))
    out["head.weight"] = ("BF16", (V, d))
    out["norm.weight"] = ("BF16", (d,))
    out["hc_head_fn"] = ("F32", (hc, hc * d))
    out["hc_head_base"] = ("F32", (hc,))
    out["hc_head_scale"] = ("F32", (1,))
    for n, ratio in enumerate(cfg["compress_ratios"][: cfg["num_hidden_layers"]]):
        p = f"layers.{n}."
        out[p + "attn_norm.weight"] = ("BF16", (d,))
        out[p + "ffn_norm.weight"] = ("BF16", (d,))
        for part in ("attn", "ffn"):
            out[p + f"hc_{part}_fn"] = ("F32", (mix, hc * d))
            out[p + f"hc_{part}_base"] = ("F32", (mix,))
            out[p + f"hc_{part}_scale"] = ("F32", (3,))
        a = p + "attn."
        fp8(a + "wq_a", q, d)
        out[a + "q_norm.weight"] = ("BF16", (q,))
        fp8(a + "wq_b", H * D, q)
        fp8(a + "wkv", D, d)
        out[a + "kv_norm.weight"] = ("BF16", (D,))
        fp8(a + "wo_a", G * R, H * D // G)
        fp8(a + "wo_b", d, G * R)
        out[a + "attn_sink"] = ("F32", (H,))
        if ratio:
            width = 2 * D if ratio == 4 else D
            out[a + "compressor.wkv.weight"] = ("BF16", (width, d))
            out[a + "compressor.wgate.weight"] = ("BF16", (width, d))
            out[a + "compressor.ape"] = ("F32", (ratio, width))
            out[a + "compressor.norm.weight"] = ("BF16", (D,))
        if ratio == 4:
            fp8(a + "indexer.wq_b", HI * DI, q)
            out[a + "indexer.weights_proj.weight"] = ("BF16", (HI, d))
            out[a + "indexer.compressor.wkv.weight"] = ("BF16", (2 * DI, d))
            out[a + "indexer.compressor.wgate.weight"] = ("BF16", (2 * DI, d))
            out[a + "indexer.compressor.ape"] = ("F32", (ratio, 2 * DI))
            out[a + "indexer.compressor.norm.weight"] = ("BF16", (DI,))
        f = p + "ffn."
        out[f + "gate.weight"] = ("BF16", (E, d))
        if n < cfg["num_hash_layers"]:
            out[f + "gate.tid2eid"] = ("I64", (V, K))
        else:
            out[f + "gate.bias"] = ("F32", (E,))
        fp8(f + "shared_experts.w1", I, d)
        fp8(f + "shared_experts.w3", I, d)
        fp8(f + "shared_experts.w2", d, I)
        for e in range(E):
            fp4(f + f"experts.{e}.w1", I, d)
            fp4(f + f"experts.{e}.w3", I, d)
            fp4(f + f"experts.{e}.w2", d, I)
    return out


def test_every_tensor_has_the_release_name_dtype_and_shape(raw, config):
    want = expected_tensors(config)
    got = {name: (dtype, tuple(arr.shape)) for name, (dtype, arr) in raw.items()}
    assert set(got) == set(want), (sorted(set(got) - set(want))[:5], sorted(set(want) - set(got))[:5])
    wrong = {n: (got[n], want[n]) for n in want if got[n] != want[n]}
    assert not wrong


def test_shards_and_index(tiny_dir, raw):
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3
    assert sorted(p.name for p in tiny_dir.glob("*.safetensors")) == shards
    assert set(index["weight_map"]) == set(raw)
    assert index["metadata"]["total_size"] == sum(arr.nbytes for _, arr in raw.values())
    # a weight and its scale live in the same shard
    for name, shard in index["weight_map"].items():
        if name.endswith(".scale"):
            assert index["weight_map"][name[: -len(".scale")] + ".weight"] == shard


def test_quantised_codes_are_valid(raw):
    for name, (dtype, arr) in raw.items():
        if dtype == "F8_E8M0":
            assert arr.max() < 255, f"{name}: NaN scale"
        if dtype == "F8_E4M3":
            assert not np.isin(arr, [0x7F, 0xFF]).any(), f"{name}: NaN code"
            assert (arr & 0x7F).max() > 0x70, f"{name}: the block range is not used"


def test_fp4_nibble_order_and_scales(raw):
    """Decode one expert by hand: low nibble = even column; value = e2m1 * 2^(scale - 127)."""
    _, packed = raw["layers.3.ffn.experts.5.w2.weight"]
    _, scale = raw["layers.3.ffn.experts.5.w2.scale"]
    table = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    byte = int(packed[7, 3]) & 0xFF
    col_even, col_odd = 6, 7
    s = 2.0 ** (int(scale[7, col_even // 32]) - 127)
    values = oracle.dequantised({k: raw[k] for k in ("layers.3.ffn.experts.5.w2.weight", "layers.3.ffn.experts.5.w2.scale")})
    deq = values["layers.3.ffn.experts.5.w2.weight"]
    assert deq[7, col_even] == table[byte & 15] * s
    assert deq[7, col_odd] == table[byte >> 4] * s
    assert np.abs(deq).max() > 0


def test_quantisation_error_is_small():
    """Quantised weights stay close to the random draw (the oracle uses the dequantised values)."""
    d = writer.TINY
    plan = {t.name: t for t in writer.tensor_plan(d)}
    for name, limit in (("layers.2.attn.wq_b.weight", 0.05), ("layers.4.ffn.experts.3.w1.weight", 0.2)):
        t = plan[name]
        w = writer._draw(t, d, 0)
        _, deq = writer.encode(t, w)
        rel = np.sqrt(np.mean((deq - w) ** 2) / np.mean(w**2))
        assert 0 < rel < limit, (name, rel)


def test_tid2eid_routes_to_distinct_valid_experts(raw, config):
    for n in range(config["num_hash_layers"]):
        dtype, table = raw[f"layers.{n}.ffn.gate.tid2eid"]
        assert dtype == "I64"
        assert table.min() >= 0 and table.max() < config["n_routed_experts"]
        s = np.sort(table, axis=1)
        assert (s[:, 1:] != s[:, :-1]).all(), "a token routes twice to one expert"


def test_config_is_the_published_form(config):
    assert config["model_type"] == "deepseek_v4"
    assert config["architectures"] == ["DeepseekV4ForCausalLM"]
    assert config["quantization_config"] == {
        "quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128], "activation_scheme": "dynamic",
    }
    assert config["expert_dtype"] == "fp4"
    assert len(config["compress_ratios"]) >= config["num_hidden_layers"]
    ratios = config["compress_ratios"]
    assert 0 in ratios and 4 in ratios and any(r not in (0, 4) for r in ratios), "all three attention types"
    assert 0 < config["num_hash_layers"] < config["num_hidden_layers"], "hash and score-routed layers"
    assert config["vocab_size"] == 129280
    for key in ("qk_rope_head_dim", "rope_scaling", "compress_rope_theta", "o_groups", "index_topk", "hc_mult"):
        assert key in config


def test_config_normalises_for_the_engine(tiny_dir):
    from gateway.model_config import load_config

    cfg = load_config(tiny_dir)
    assert cfg["arch"] == "deepseek_v4"
    assert cfg["attn_kinds"] == [0, 0, 1, 2, 1, 2]
    assert cfg["compress_ratios"] == [0, 0, 4, 8, 4, 8]
    assert cfg["n_hash_layers"] == 3
    assert cfg["rope_dim"] == 16 and cfg["yarn_factor"] == 16.0


def test_normaliser_reads_transformers_form_and_rejects_bad_input():
    from gateway.model_config import ConfigError, normalise

    published = writer.config_json(writer.BENCH)
    hf_form = {k: v for k, v in published.items() if k not in ("compress_ratios", "num_hash_layers")}
    hf_form["layer_types"] = [writer.layer_kind(r) for r in writer.BENCH.compress_ratios]
    hf_form["mlp_layer_types"] = ["hash_moe"] + ["moe"] * 3
    a, b = normalise(published), normalise(hf_form)
    assert a == b
    assert a["compress_ratios"] == [0, 4, 128, 4] and a["attn_kinds"] == [0, 1, 2, 1]
    for bad in ({"num_key_value_heads": 2}, {"scoring_func": "softmax"}, {"compress_ratios": [0, 4]}):
        with pytest.raises(ConfigError):
            normalise({**published, **bad})


def test_tokenizer_is_the_real_one(tiny_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    assert 128000 < tok.get_vocab_size() <= 129280
    ids = tok.encode("Hello world, this is DeepSeek.").ids
    assert ids and max(ids) < 129280
    cfg = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    assert "begin" in json.dumps(cfg["bos_token"])


def test_transformers_model_holds_the_dequantised_values(tiny_dir, raw):
    model = oracle.hf_model(tiny_dir)
    state = model.state_dict()
    values = oracle.dequantised(raw)
    I = writer.TINY.moe_intermediate_size
    assert torch.equal(state["lm_head.weight"], torch.from_numpy(values["head.weight"]))
    assert torch.equal(state["model.layers.2.self_attn.q_b_proj.weight"], torch.from_numpy(values["layers.2.attn.wq_b.weight"]))
    assert torch.equal(state["model.layers.4.mlp.experts.gate_up_proj"][3, I:], torch.from_numpy(values["layers.4.ffn.experts.3.w3.weight"]))
    assert torch.equal(state["model.layers.3.self_attn.compressor.kv_norm.weight"], torch.from_numpy(values["layers.3.attn.compressor.norm.weight"]))


def test_tiny_config_exercises_every_path(tiny_dir, raw):
    """Indexer selection, the window and score routing all change the reference logits."""
    from transformers import DeepseekV4ForCausalLM

    cfg = json.loads((tiny_dir / "config.json").read_text())
    base = writer.dims_from_config(cfg)
    values = oracle.dequantised(raw)
    tokens = [0] + np.random.default_rng(5).integers(2, base.vocab_size, 60).tolist()

    def logits(d: writer.Dims, hook=None) -> np.ndarray:
        model = DeepseekV4ForCausalLM(writer.hf_config(d)).float().eval()
        writer.load_into_hf(model, d, values)
        if hook:
            for layer in model.model.layers:
                layer.mlp.gate.register_forward_hook(hook)
        return oracle.full_logits(model, tokens)

    chosen: list[np.ndarray] = []
    ref = logits(base, lambda mod, args, out: chosen.append(out[2].numpy()))
    # score-routed layers spread tokens over many experts, in varying combinations
    for idx in chosen[base.num_hash_layers :]:
        assert len(np.unique(idx)) >= base.n_routed_experts // 2
        assert len({tuple(sorted(row)) for row in idx}) > len(tokens) // 2
    assert oracle.rel_error(logits(writer.dims_with(base, index_topk=64)), ref) > 1e-2, "indexer top-k has no effect"
    assert oracle.rel_error(logits(writer.dims_with(base, sliding_window=64)), ref) > 1e-2, "window has no effect"


def test_bench_plan_has_flash_widths_and_a_few_gigabytes():
    plan = {t.name: t for t in writer.tensor_plan(writer.BENCH)}
    entries = {e.name: e for t in plan.values() for e in writer.stored_entries(t)}
    assert entries["layers.1.attn.wq_b.weight"].shape == (32768, 1024)
    assert entries["layers.1.attn.wq_b.scale"].shape == (256, 8)
    assert entries["layers.1.attn.wo_a.weight"].shape == (8192, 4096)
    assert entries["layers.2.attn.compressor.ape"].shape == (128, 512)
    assert entries["layers.1.attn.compressor.ape"].shape == (4, 1024)
    assert entries["layers.1.attn.indexer.wq_b.weight"].shape == (8192, 1024)
    assert entries["layers.3.ffn.experts.0.w2.weight"].shape == (4096, 1024)
    assert entries["layers.3.ffn.experts.0.w2.scale"].shape == (4096, 64)
    assert entries["layers.0.ffn.gate.tid2eid"].shape == (129280, 6)
    total = sum(e.nbytes for e in entries.values())
    assert 3e9 < total < 8e9, total


def test_bench_writer_streams_valid_shards(tmp_path):
    """The numpy bench path on small dims: every planned byte written, codes valid, values sane."""
    d = writer.dims_with(writer.TINY, vocab_size=2000, n_routed_experts=4, num_experts_per_tok=2)
    writer.write_bench(tmp_path, d, max_shard_bytes=1 << 20, progress=False)
    raw = oracle.read_raw(tmp_path)
    planned = {e.name: e for t in writer.tensor_plan(d) for e in writer.stored_entries(t)}
    assert {n: (dt, tuple(a.shape)) for n, (dt, a) in raw.items()} == {n: (e.dtype, e.shape) for n, e in planned.items()}
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    values = oracle.dequantised(raw)
    for name, v in values.items():
        if v.dtype == np.float32:
            assert np.isfinite(v).all(), name
            assert np.abs(v).max() < 64, name


def test_cli_writes_the_same_checkpoint(tiny_dir, tmp_path):
    """`tools/make_checkpoint.py --arch deepseek_v4 --size tiny --format native` (deterministic)."""
    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "make_checkpoint.py"), "--arch", "deepseek_v4", "--size", "tiny",
         "--format", "native", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for path in sorted(tiny_dir.iterdir()):
        assert (out / path.name).read_bytes() == path.read_bytes(), path.name
