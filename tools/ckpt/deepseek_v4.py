"""DeepSeek-V4 (Flash) checkpoints for tests and benchmarks, in the exact on-disk form of the
published release (see gateway.checkpoints.deepseek_v4, which holds the tensor inventory, the
quantisers and the numpy writer shared with the runtime demo).

`tiny` is built through transformers' DeepseekV4ForCausalLM (so every name and shape is checked
against the reference model), filled with random values, and quantised; the transformers model
holding the *dequantised* values is the oracle (tests/oracle_dsv4.py rebuilds it from the files).
`bench` has Flash's real widths with few layers and experts, drawn shard by shard in numpy.
"""
from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from . import common  # noqa: F401  (puts the checkout's python/ on sys.path for gateway.checkpoints)
from gateway.checkpoints.deepseek_v4 import (  # noqa: F401  (re-exported: tests use writer.<name>)
    Dims,
    Tensor,
    config_json,
    copy_tokenizer,
    dims_dict,
    dims_from_config,
    dims_with,
    draw_tensor,
    encode,
    layer_kind,
    stored_entries,
    tensor_plan,
    write_metadata,
)
from gateway.checkpoints.numerics import (  # noqa: F401
    FP4_GROUP,
    FP4_MAGNITUDES,
    FP4_MAX,
    FP4_VALUES,
    FP8_BLOCK,
    FP8_E4M3_MAX as FP8_MAX,
    FP8_E4M3_VALUES,
    dequantize_fp4_ue8m0 as dequantize_fp4,
    dequantize_fp8_ue8m0 as dequantize_fp8,
    quantize_fp4_ue8m0 as quantize_fp4,
    quantize_fp8_ue8m0 as quantize_fp8,
)
from gateway.checkpoints.shards import DTYPE_BYTES, Entry as Stored, planned_bytes, tensor_rng, write_shards as _write_shards  # noqa: F401

SIZES = ("tiny", "bench")
FORMATS = ("native",)
_draw = draw_tensor  # the tests' historical name


# ----------------------------------------------------------------------------------------------
# Sizes

TINY = Dims(
    vocab_size=129280,  # the real tokenizer's vocabulary
    hidden_size=128,
    # Flash's schedule in miniature: two sliding-only layers, then CSA / HCA alternating.
    # HCA uses ratio 8 (Flash: 128) so ~60-token prompts close several windows of each kind.
    compress_ratios=(0, 0, 4, 8, 4, 8),
    num_hash_layers=3,  # layers 0-2 hash-routed (as Flash), 3-5 score-routed
    num_attention_heads=4,
    head_dim=64,
    qk_rope_head_dim=16,
    q_lora_rank=128,
    o_groups=2,
    o_lora_rank=128,  # wo_a [256, 128] and wo_b [128, 256]: 2x1 and 1x2 FP8 scale grids
    sliding_window=8,
    n_routed_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=64,
    index_n_heads=16,  # enough heads that indexer scores are never exactly tied (spec §8.4)
    index_head_dim=32,
    index_topk=4,  # fewer than the compressed rows of a 60-token prompt: selection matters
)

# DeepSeek-V4-Flash as released (config.json as published, checked against transformers'
# DeepseekV4Config): 43 layers = 2 sliding-only + CSA (ratio 4) / HCA (ratio 128) alternating
# from layer 2 (21 CSA, 20 HCA), 3 hash-routed layers, 256 routed experts (top-6) of width 2048
# + 1 shared, vocab 129280.  The other Dims defaults (hc_mult 4, 20 Sinkhorn iterations, eps
# 1e-6, scaling 1.5, swiglu_limit 10, rope 10000 / compress 160000 with YaRN x16 over 65536, 1M
# positions) are Flash's own values.  tools/rehearse.py writes it whole, as a sparse checkpoint.
FLASH = Dims(
    vocab_size=129280,
    hidden_size=4096,
    compress_ratios=(0, 0) + (4, 128) * 20 + (4,),
    num_hash_layers=3,
    num_attention_heads=64,
    head_dim=512,
    qk_rope_head_dim=64,
    q_lora_rank=1024,
    o_groups=8,
    o_lora_rank=1024,
    sliding_window=128,
    n_routed_experts=256,
    num_experts_per_tok=6,
    moe_intermediate_size=2048,
    index_n_heads=64,
    index_head_dim=128,
    index_topk=512,
)

# Flash's widths with four layers (sliding, CSA, HCA, CSA) and 32 experts: a few GB, written whole.
BENCH = dims_with(FLASH, compress_ratios=(0, 4, 128, 4), num_hash_layers=1, n_routed_experts=32)

DIMS = {"tiny": TINY, "bench": BENCH}


# ----------------------------------------------------------------------------------------------
# transformers model <-> original names


def hf_config(d: Dims):
    """transformers' DeepseekV4Config of these dims (fp32, eager attention)."""
    from transformers import DeepseekV4Config

    kinds = [layer_kind(r) for r in d.compress_ratios]
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    for kind, r in zip(kinds, d.compress_ratios):
        if r:
            rates[kind] = r
    cfg = DeepseekV4Config(
        vocab_size=d.vocab_size,
        hidden_size=d.hidden_size,
        moe_intermediate_size=d.moe_intermediate_size,
        num_hidden_layers=d.n_layers,
        num_attention_heads=d.num_attention_heads,
        num_key_value_heads=1,
        head_dim=d.head_dim,
        q_lora_rank=d.q_lora_rank,
        num_experts_per_tok=d.num_experts_per_tok,
        n_routed_experts=d.n_routed_experts,
        n_shared_experts=1,
        routed_scaling_factor=d.routed_scaling_factor,
        rope_theta=d.rope_theta,
        compress_rope_theta=d.compress_rope_theta,
        rope_parameters={k: v for k, v in d.rope_scaling.items() if k != "type"} | {"rope_type": d.rope_scaling["type"]},
        partial_rotary_factor=d.qk_rope_head_dim / d.head_dim,
        layer_types=kinds,
        compress_rates=rates,
        mlp_layer_types=["hash_moe" if n < d.num_hash_layers else "moe" for n in range(d.n_layers)],
        hc_mult=d.hc_mult,
        hc_sinkhorn_iters=d.hc_sinkhorn_iters,
        hc_eps=d.hc_eps,
        rms_norm_eps=d.rms_norm_eps,
        swiglu_limit=d.swiglu_limit,
        sliding_window=d.sliding_window,
        o_groups=d.o_groups,
        o_lora_rank=d.o_lora_rank,
        index_n_heads=d.index_n_heads,
        index_head_dim=d.index_head_dim,
        index_topk=d.index_topk,
        max_position_embeddings=d.max_position_embeddings,
        tie_word_embeddings=False,
        num_nextn_predict_layers=0,
    )
    cfg._attn_implementation = "eager"
    return cfg


_LAYER_RENAMES = [  # original suffix -> transformers suffix, first match wins
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("hc_attn_fn", "attn_hc.fn"), ("hc_attn_base", "attn_hc.base"), ("hc_attn_scale", "attn_hc.scale"),
    ("hc_ffn_fn", "ffn_hc.fn"), ("hc_ffn_base", "ffn_hc.base"), ("hc_ffn_scale", "ffn_hc.scale"),
    ("attn.wq_a.weight", "self_attn.q_a_proj.weight"),
    ("attn.q_norm.weight", "self_attn.q_a_norm.weight"),
    ("attn.wq_b.weight", "self_attn.q_b_proj.weight"),
    ("attn.wkv.weight", "self_attn.kv_proj.weight"),
    ("attn.kv_norm.weight", "self_attn.kv_norm.weight"),
    ("attn.wo_a.weight", "self_attn.o_a_proj.weight"),
    ("attn.wo_b.weight", "self_attn.o_b_proj.weight"),
    ("attn.attn_sink", "self_attn.sinks"),
    ("attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"),
    ("attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"),
    ("attn.compressor.ape", "self_attn.compressor.position_bias"),
    ("attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"),
    ("attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"),
    ("attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"),
    ("attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"),
    ("attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"),
    ("attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"),
    ("attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"),
    ("ffn.gate.weight", "mlp.gate.weight"),
    ("ffn.gate.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn.gate.tid2eid", "mlp.gate.tid2eid"),
    ("ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"),
    ("ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"),
    ("ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"),
]
_GLOBAL_RENAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}


def hf_target(name: str, d: Dims) -> tuple[str, tuple | None]:
    """Where original tensor `name` lives in DeepseekV4ForCausalLM: (state key, index or None).

    Routed experts are slices of the stacked tensors: w1 = gate_up_proj[e, :I], w3 =
    gate_up_proj[e, I:], w2 = down_proj[e]."""
    if name in _GLOBAL_RENAMES:
        return _GLOBAL_RENAMES[name], None
    _, n, rest = name.split(".", 2)
    prefix = f"model.layers.{n}."
    if rest.startswith("ffn.experts."):
        _, _, e, w, _ = rest.split(".")
        e, I = int(e), d.moe_intermediate_size
        if w == "w2":
            return prefix + "mlp.experts.down_proj", (e,)
        rows = slice(0, I) if w == "w1" else slice(I, 2 * I)
        return prefix + "mlp.experts.gate_up_proj", (e, rows)
    for original, hf in _LAYER_RENAMES:
        if rest == original:
            return prefix + hf, None
    raise KeyError(f"{name}: no transformers counterpart")


def load_into_hf(model, d: Dims, values: dict[str, np.ndarray]) -> None:
    """Copies original-named float values into the transformers model (every tensor once)."""
    import torch

    state = model.state_dict()
    seen: set[str] = set()
    with torch.no_grad():
        for name, v in values.items():
            key, index = hf_target(name, d)
            target = state[key]
            view = target[index] if index is not None else target
            if tuple(view.shape) != v.shape:
                raise ValueError(f"{name} -> {key}{index or ''}: shape {tuple(view.shape)} != {v.shape}")
            view.copy_(torch.from_numpy(np.ascontiguousarray(v)).to(view.dtype))
            seen.add(key)
    missing = sorted(k for k in state if k not in seen and "rotary_emb" not in k)
    if missing:
        raise ValueError(f"transformers tensors never written: {missing[:5]}")


# ----------------------------------------------------------------------------------------------
# Sharded output


def write_shards(
    out_dir: Path,
    plan: list[Tensor],
    chunks_of: Callable[[Tensor], Iterator[tuple[str, bytes]]],
    max_shard_bytes: int,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """model-XXXXX-of-YYYYY.safetensors + index of `plan`; `chunks_of(t)` yields (entry, bytes)."""
    _write_shards(out_dir, plan, stored_entries, chunks_of, max_shard_bytes, on_bytes)


# ----------------------------------------------------------------------------------------------
# tiny: through transformers, quantised, dequantised values loaded back


def build_tiny(d: Dims = TINY, seed: int = 0) -> tuple[dict[str, dict[str, bytes]], dict[str, np.ndarray]]:
    """Random tiny weights: ({tensor: {entry: bytes}}, {tensor: dequantised float32}).

    The transformers model is instantiated first so every planned name and shape is checked
    against the reference implementation (load_into_hf raises on any mismatch)."""
    import torch
    from transformers import DeepseekV4ForCausalLM

    encoded: dict[str, dict[str, bytes]] = {}
    values: dict[str, np.ndarray] = {}
    for t in tensor_plan(d):
        encoded[t.name], values[t.name] = encode(t, draw_tensor(t, d, seed))
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(hf_config(d)).float().eval()
    load_into_hf(model, d, values)
    return encoded, values


def write_tiny(out_dir: Path, d: Dims = TINY, seed: int = 0, max_shard_bytes: int = 8 << 20) -> None:
    encoded, _ = build_tiny(d, seed)
    write_shards(out_dir, tensor_plan(d), lambda t: iter(encoded[t.name].items()), max_shard_bytes)


# ----------------------------------------------------------------------------------------------
# bench: Flash widths, drawn per tensor in numpy chunks (no torch model)

_CHUNK_ELEMS = 1 << 22


@functools.cache  # one table for every fp8 tensor of a checkpoint (read only)
def _fp8_gaussian_codes(sigma: float = 64.0, size: int = 1 << 20) -> np.ndarray:
    """A quantile table of e4m3 codes: entry i is the code of the (i + 0.5) / size quantile of
    N(0, sigma^2), so a uniform index draws codes with the probabilities of rounded normal values
    (resolution 1 / size) without making a float per weight."""
    values = FP8_E4M3_VALUES[:0x7F].astype(np.float64)  # codes 0 .. 0x7E: 0 .. 448, ascending
    edges = (values[1:] + values[:-1]) / 2  # a magnitude rounds to the nearest code
    cdf = np.array([math.erf(e / (sigma * math.sqrt(2.0))) for e in edges])  # P(|v| < edge)
    q = (np.arange(size, dtype=np.float64) + 0.5) / size  # quantile of |v| ...
    magnitude = np.searchsorted(cdf, q).astype(np.uint8)
    sign = (np.arange(size) % 2 == 1).astype(np.uint8) << 7  # ... with alternating signs
    table = magnitude | sign
    table.flags.writeable = False
    return table


def _bench_chunks(t: Tensor, d: Dims, seed: int) -> Iterator[tuple[str, bytes]]:
    """Random bit patterns with sane magnitudes: weights ~ 1/sqrt(fan_in), never NaN/inf."""
    rng = tensor_rng(seed, t.name)
    entries = stored_entries(t)
    fan_in_log2 = math.log2(max(t.shape[-1], 1)) / 2 if len(t.shape) == 2 else 0.0

    def random_bytes(count: int, make: Callable[[int], np.ndarray]) -> Iterator[bytes]:
        for start in range(0, count, _CHUNK_ELEMS):
            yield make(min(_CHUNK_ELEMS, count - start)).tobytes()

    main, *scale = entries
    n = math.prod(main.shape)
    if t.kind == "fp8":
        # the codes of N(0, 64^2) values rounded to e4m3, as block-scaled fp8 of normal weights
        # (the largest of a 128x128 block near 4 sigma = 256 of 448): about 2e-4 of them are
        # subnormal codes, which some CPUs multiply slowly (mg_cpu_features.denormal_assists)
        table = _fp8_gaussian_codes()

        def fp8(k: int) -> np.ndarray:
            return table[rng.integers(0, table.size, k, dtype=np.uint32)]

        yield from ((main.name, b) for b in random_bytes(n, fp8))
        s = np.full(scale[0].shape, 127 - round(fan_in_log2) - 6, dtype=np.uint8)
        yield scale[0].name, s.tobytes()
    elif t.kind == "fp4":
        yield from ((main.name, b) for b in random_bytes(n, lambda k: rng.integers(0, 256, k, dtype=np.uint8)))
        s = np.full(scale[0].shape, 127 - round(fan_in_log2) - 1, dtype=np.uint8)
        yield scale[0].name, s.tobytes()
    elif t.kind == "bf16":
        base = 127 - round(fan_in_log2) if t.init in ("linear", "router") else 127
        if t.init == "norm":
            base = 127

        def bf16(k: int) -> np.ndarray:
            r = rng.integers(0, 1 << 16, k, dtype=np.uint32)
            sign = 0 if t.init == "norm" else (r & 0x8000)
            exp = base - 1 + ((r >> 7) & 1) if t.init != "norm" else np.full(k, base, np.uint32)
            return (sign | (exp << 7) | (r & 0x7F)).astype("<u2")

        yield from ((main.name, b) for b in random_bytes(n, bf16))
    else:
        yield main.name, encode(t, draw_tensor(t, d, seed))[0][main.name]


def write_bench(out_dir: Path, d: Dims = BENCH, seed: int = 0, max_shard_bytes: int = 1 << 30, progress: bool = True) -> None:
    plan = tensor_plan(d)
    total = planned_bytes(plan, stored_entries)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="B", unit_scale=True, desc="deepseek_v4 bench", file=sys.stderr)
    try:
        write_shards(out_dir, plan, lambda t: _bench_chunks(t, d, seed), max_shard_bytes, bar.update if bar else None)
    finally:
        if bar:
            bar.close()


# ----------------------------------------------------------------------------------------------
# Entry point used by tools/make_checkpoint.py


def write_checkpoint(arch: str, size: str, fmt: str, out_dir: str | Path, seed: int = 0,
                     overrides: dict | None = None, *, progress: bool = True) -> Path:
    """Writes a complete checkpoint folder (weights, config.json, tokenizer) and returns it.

    `overrides` replaces dims by their config.json names (e.g. {"hidden_size": 256})."""
    if arch != "deepseek_v4":
        raise ValueError(f"this writer makes deepseek_v4 checkpoints, not {arch!r}")
    if size not in SIZES:
        raise ValueError(f"deepseek_v4: unknown size {size!r}; expected one of {SIZES}")
    if fmt not in FORMATS:
        raise ValueError(f"deepseek_v4 is stored as the release ships it: --format native (got {fmt!r})")
    d = DIMS.get(size)
    try:
        d = dims_with(d, **(overrides or {})) if d is not None else None
    except TypeError as exc:
        raise ValueError(f"deepseek_v4: bad config override: {exc}") from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if size == "tiny":
        write_tiny(out, d, seed)
    else:
        write_bench(out, d, seed, progress=progress)
    write_metadata(out, d)
    return out


