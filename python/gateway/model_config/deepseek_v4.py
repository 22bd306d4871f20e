"""DeepSeek-V4 (Flash / Pro) config.json -> the normalised config the C forward pass reads.

Accepts the published form (legacy keys `compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`,
`rope_scaling`) and transformers' form (`layer_types`, `compress_rates`, `mlp_layer_types`,
nested `rope_parameters`).  Every field the C side reads is explicit in the result.
"""
from __future__ import annotations

import math
from typing import Any

from . import ConfigError

ATTN_SLIDING, ATTN_CSA, ATTN_HCA = 0, 1, 2
_KIND_OF_LAYER_TYPE = {
    "sliding_attention": ATTN_SLIDING,
    "compressed_sparse_attention": ATTN_CSA,
    "heavily_compressed_attention": ATTN_HCA,
}
_DEFAULT_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def _int(raw: dict[str, Any], key: str, default: int | None = None, minimum: int = 0) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{key}: must be >= {minimum}, got {value}")
    return value


def _num(raw: dict[str, Any], key: str, default: float | None = None) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    return float(value)


def _layer_schedule(raw: dict[str, Any], n_layers: int) -> tuple[list[int], list[int]]:
    """(attention kind per layer, compression ratio per layer)."""
    layer_types = raw.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) < n_layers:
            raise ConfigError(f"layer_types: expected a list of {n_layers} entries")
        rates = dict(_DEFAULT_RATES)
        rates.update(raw.get("compress_rates") or {})
        kinds, ratios = [], []
        for t in layer_types[:n_layers]:
            if t not in _KIND_OF_LAYER_TYPE:
                raise ConfigError(f"layer_types: unknown layer type {t!r}")
            kinds.append(_KIND_OF_LAYER_TYPE[t])
            ratios.append(0 if t == "sliding_attention" else int(rates[t]))
        return kinds, ratios
    ratios_raw = raw.get("compress_ratios")
    if not isinstance(ratios_raw, list) or len(ratios_raw) < n_layers:
        raise ConfigError(f"compress_ratios: expected a list of at least {n_layers} integers (one per layer)")
    # The published list has one more entry (the MTP block), which this engine does not run.
    ratios = [int(r) for r in ratios_raw[:n_layers]]
    if any(r < 0 for r in ratios):
        raise ConfigError("compress_ratios: negative ratio")
    # DeepSeek's rule: ratio 4 = overlapping compressor + lightning indexer (CSA), others HCA.
    kinds = [ATTN_SLIDING if r == 0 else ATTN_CSA if r == 4 else ATTN_HCA for r in ratios]
    return kinds, ratios


def _hash_layers(raw: dict[str, Any], n_layers: int) -> int:
    mlp_types = raw.get("mlp_layer_types")
    if isinstance(mlp_types, list):
        n_hash = sum(1 for t in mlp_types[:n_layers] if t == "hash_moe")
        if mlp_types[:n_hash] != ["hash_moe"] * n_hash:
            raise ConfigError("mlp_layer_types: hash_moe layers must come first")
        return n_hash
    return min(_int(raw, "num_hash_layers", 3), n_layers)


def _rope(raw: dict[str, Any]) -> dict[str, float]:
    """YaRN parameters of the compressed layers (factor 1 = none)."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("compress"), dict):
        scaling = params["compress"]
    else:
        scaling = raw.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("yarn", "default"):
        raise ConfigError(f"rope_scaling: unsupported type {kind!r} (DeepSeek-V4 uses yarn)")
    if kind == "default":
        return {"yarn_factor": 1.0, "yarn_original_max_position": 0.0, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0}
    attention_factor = scaling.get("attention_factor", 1.0)
    if attention_factor not in (None, 1, 1.0):
        raise ConfigError("rope_scaling: DeepSeek-V4 applies no YaRN attention factor")
    return {
        "yarn_factor": _num(scaling, "factor"),
        "yarn_original_max_position": _num(scaling, "original_max_position_embeddings"),
        "yarn_beta_fast": _num(scaling, "beta_fast", 32.0),
        "yarn_beta_slow": _num(scaling, "beta_slow", 1.0),
    }


def normalise_deepseek_v4(raw: dict[str, Any]) -> dict[str, Any]:
    n_layers = _int(raw, "num_hidden_layers", minimum=1)
    hidden = _int(raw, "hidden_size", minimum=1)
    n_heads = _int(raw, "num_attention_heads", minimum=1)
    head_dim = _int(raw, "head_dim", minimum=2)
    if _int(raw, "num_key_value_heads", 1) != 1:
        raise ConfigError("num_key_value_heads: DeepSeek-V4 has one shared K=V head")
    if "qk_rope_head_dim" in raw:
        rope_dim = _int(raw, "qk_rope_head_dim", minimum=2)
    else:
        rope_dim = int(head_dim * _num(raw, "partial_rotary_factor", 0.125))
    o_groups = _int(raw, "o_groups", minimum=1)
    if rope_dim % 2 or rope_dim > head_dim or n_heads % o_groups:
        raise ConfigError("qk_rope_head_dim / o_groups do not fit the heads")
    scoring = raw.get("scoring_func", "sqrtsoftplus")
    if scoring != "sqrtsoftplus":
        raise ConfigError(f"scoring_func: only sqrtsoftplus is supported, got {scoring!r}")
    if _int(raw, "n_shared_experts", 1) != 1:
        raise ConfigError("n_shared_experts: DeepSeek-V4 has exactly one shared expert")
    kinds, ratios = _layer_schedule(raw, n_layers)
    for kind, ratio in zip(kinds, ratios):
        if kind != ATTN_SLIDING and ratio < 1:
            raise ConfigError("compress_ratios: compressed layers need a ratio >= 1")
    index_head_dim = _int(raw, "index_head_dim", 128, minimum=2)
    if ATTN_CSA in kinds and rope_dim > index_head_dim:
        raise ConfigError("index_head_dim must hold the rope dims")
    cfg: dict[str, Any] = {
        "arch": "deepseek_v4",
        "vocab_size": _int(raw, "vocab_size", minimum=1),
        "hidden_size": hidden,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "head_dim": head_dim,
        "rope_dim": rope_dim,
        "q_lora_rank": _int(raw, "q_lora_rank", minimum=1),
        "o_groups": o_groups,
        "o_lora_rank": _int(raw, "o_lora_rank", minimum=1),
        "sliding_window": _int(raw, "sliding_window", 128, minimum=1),
        "attn_kinds": kinds,  # 0 sliding only, 1 CSA (overlapping compressor + indexer), 2 HCA
        "compress_ratios": ratios,
        "n_hash_layers": _hash_layers(raw, n_layers),
        "n_experts": _int(raw, "n_routed_experts", minimum=1),
        "n_experts_per_tok": _int(raw, "num_experts_per_tok", minimum=1),
        "moe_intermediate_size": _int(raw, "moe_intermediate_size", minimum=1),
        "index_n_heads": _int(raw, "index_n_heads", 64, minimum=1),
        "index_head_dim": index_head_dim,
        "index_topk": _int(raw, "index_topk", 512, minimum=1),
        "hc_mult": _int(raw, "hc_mult", 4, minimum=1),
        "hc_sinkhorn_iters": _int(raw, "hc_sinkhorn_iters", 20, minimum=1),
        "hc_eps": _num(raw, "hc_eps", 1e-6),
        "rms_norm_eps": _num(raw, "rms_norm_eps", 1e-6),
        "routed_scaling_factor": _num(raw, "routed_scaling_factor", 1.5),
        "norm_topk_prob": bool(raw.get("norm_topk_prob", True)),
        "swiglu_limit": _num(raw, "swiglu_limit", 10.0),
        "rope_theta": _num(raw, "rope_theta", 10000.0),
        "compress_rope_theta": _num(raw, "compress_rope_theta", 160000.0),
        "max_position_embeddings": _int(raw, "max_position_embeddings", 1048576, minimum=1),
        "bos_token_id": raw.get("bos_token_id", 0),
        "eos_token_id": raw.get("eos_token_id", 1),
        "expert_dtype": str(raw.get("expert_dtype") or (raw.get("quantization_config") or {}).get("expert_dtype") or "fp8"),
    }
    if cfg["n_experts_per_tok"] > cfg["n_experts"]:
        raise ConfigError("num_experts_per_tok exceeds n_routed_experts")
    cfg.update(_rope(raw))
    return cfg


NORMALISERS = {"deepseek_v4": normalise_deepseek_v4}
