"""Normalisers for the Hugging Face MoE transformers: ``qwen3_moe`` and ``glm4_moe``.

Both are pre-norm decoder stacks with GQA attention, RoPE (neox rotate-half layout) and SwiGLU
experts; they differ in the router (softmax vs grouped sigmoid with a correction bias), the
shared expert, biases and which layers are dense.  Defaults follow transformers' config classes.
"""
from __future__ import annotations

from typing import Any

from . import ConfigError


def _int(raw: dict[str, Any], key: str, default: int | None = None, *, minimum: int = 1) -> int:
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"config field {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config field {key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"config field {key!r} must be >= {minimum}, got {value}")
    return value


def _float(raw: dict[str, Any], key: str, default: float, *, positive: bool = True) -> float:
    value = raw.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"config field {key!r} must be a number, got {value!r}")
    if positive and not value > 0:
        raise ConfigError(f"config field {key!r} must be > 0, got {value}")
    return float(value)


def _bool(raw: dict[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"config field {key!r} must be true or false, got {value!r}")
    return value


def _rope(raw: dict[str, Any], default_partial: float) -> tuple[float, float]:
    """(theta, partial_rotary_factor) from either the transformers-5 ``rope_parameters`` form or
    the top-level ``rope_theta`` / ``partial_rotary_factor`` of released checkpoints."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise ConfigError("rope_parameters / rope_scaling must be objects")
    for source in (params, scaling):
        rope_type = source.get("rope_type", source.get("type", "default"))
        if rope_type not in ("default", None):
            raise ConfigError(f"unsupported RoPE type {rope_type!r} (only 'default' is implemented)")
    merged = {**raw, **{k: v for k, v in params.items() if v is not None}}
    theta = _float(merged, "rope_theta", 10000.0)
    partial = _float(merged, "partial_rotary_factor", default_partial)
    if partial > 1.0:
        raise ConfigError(f"partial_rotary_factor must be <= 1, got {partial}")
    return theta, partial


def _common(raw: dict[str, Any], arch: str, *, default_partial: float, default_max_pos: int,
            default_eps: float, default_vocab: int) -> dict[str, Any]:
    hidden_act = raw.get("hidden_act", "silu")
    if hidden_act != "silu":
        raise ConfigError(f"unsupported hidden_act {hidden_act!r} (only 'silu')")
    n_heads = _int(raw, "num_attention_heads")
    n_kv = _int(raw, "num_key_value_heads", n_heads)
    if n_heads % n_kv:
        raise ConfigError(f"num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv}")
    hidden = _int(raw, "hidden_size")
    head_dim = raw.get("head_dim") or hidden // n_heads
    head_dim = _int({"head_dim": head_dim}, "head_dim")
    theta, partial = _rope(raw, default_partial)
    rot_dim = int(head_dim * partial)
    if rot_dim % 2:
        raise ConfigError(f"rotary dims head_dim*partial_rotary_factor = {rot_dim} must be even")
    return {
        "arch": arch,
        "vocab_size": _int(raw, "vocab_size", default_vocab),
        "hidden_size": hidden,
        "num_hidden_layers": _int(raw, "num_hidden_layers"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "rope_theta": theta,
        "partial_rotary_factor": partial,
        "rotary_dim": rot_dim,
        "rms_norm_eps": _float(raw, "rms_norm_eps", default_eps),
        "max_position_embeddings": _int(raw, "max_position_embeddings", default_max_pos),
        "tie_word_embeddings": _bool(raw, "tie_word_embeddings", False),
        "intermediate_size": _int(raw, "intermediate_size"),
        "moe_intermediate_size": _int(raw, "moe_intermediate_size"),
        "num_experts_per_tok": _int(raw, "num_experts_per_tok"),
        "norm_topk_prob": _bool(raw, "norm_topk_prob", False),
        "weight_quant": _weight_quant(raw),
    }


def _weight_quant(raw: dict[str, Any]) -> str:
    """Which quantised weight layout quantization_config announces ("none", "fp8_block128" or
    "fp8_channel").  The tensors themselves decide how each matrix is bound (and a bf16 router
    or head next to FP8 projections is normal: the configs' ignore lists); this check turns a
    layout the engine cannot read into one clear error instead of a missing-tensor one."""
    quant = raw.get("quantization_config")
    if quant is None:
        return "none"
    if not isinstance(quant, dict):
        raise ConfigError("config field 'quantization_config' must be an object")
    method = quant.get("quant_method")
    if method == "fp8":
        # transformers' fine-grained FP8 (Qwen -FP8 repos): weight + weight_scale_inv per 128x128 block.
        block = quant.get("weight_block_size")
        if block is not None and list(block) != [128, 128]:
            raise ConfigError(f"quantization_config: fp8 weight_block_size {block!r} is not supported (only [128, 128])")
        return "fp8_block128"
    if method == "compressed-tensors":
        # compressed-tensors FP8 (GLM-4.5-FP8): weight + weight_scale [out, 1]; activation
        # quantisation is ignored (the engine multiplies fp32 activations).
        fmt = quant.get("format")
        if fmt != "float-quantized":
            raise ConfigError(
                f"quantization_config: compressed-tensors format {fmt!r} is not supported (only 'float-quantized' FP8)"
            )
        groups = quant.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            raise ConfigError("quantization_config: compressed-tensors config_groups is missing or empty")
        for name, group in groups.items():
            weights = group.get("weights") if isinstance(group, dict) else None
            if not isinstance(weights, dict):
                raise ConfigError(f"quantization_config: config group {name!r} has no weights scheme")
            scheme = (weights.get("num_bits"), weights.get("type"), weights.get("strategy"))
            if scheme != (8, "float", "channel"):
                raise ConfigError(
                    f"quantization_config: config group {name!r} quantises weights as num_bits={scheme[0]!r} "
                    f"type={scheme[1]!r} strategy={scheme[2]!r}; only 8-bit float per-channel FP8 is supported"
                )
        return "fp8_channel"
    raise ConfigError(
        f"quantization_config: quant_method {method!r} is not supported "
        "(supported: 'fp8' with 128x128 blocks, 'compressed-tensors' per-channel FP8)"
    )


def _check_experts(cfg: dict[str, Any]) -> None:
    if cfg["num_experts_per_tok"] > cfg["n_routed_experts"]:
        raise ConfigError(
            f"num_experts_per_tok {cfg['num_experts_per_tok']} exceeds the {cfg['n_routed_experts']} routed experts"
        )


def normalise_qwen3_moe(raw: dict[str, Any]) -> dict[str, Any]:
    if raw.get("use_sliding_window"):
        raise ConfigError("qwen3_moe with use_sliding_window=true is not supported")
    cfg = _common(raw, "qwen3_moe", default_partial=1.0, default_max_pos=32768,
                  default_eps=1e-6, default_vocab=151936)
    n_layers = cfg["num_hidden_layers"]
    n_experts = _int(raw, "num_experts", raw.get("num_local_experts", 128), minimum=0)
    step = _int(raw, "decoder_sparse_step", 1)
    mlp_only = raw.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in mlp_only):
        raise ConfigError("config field 'mlp_only_layers' must be a list of layer indices")
    bias = _bool(raw, "attention_bias", False)
    cfg.update({
        "n_routed_experts": n_experts,
        "layer_is_moe": [int(i not in mlp_only and n_experts > 0 and (i + 1) % step == 0) for i in range(n_layers)],
        "attention_bias": bias,
        "o_proj_bias": bias,  # qwen3_moe's o_proj follows attention_bias, unlike glm4_moe
        "use_qk_norm": True,
        "router": "softmax",
        "n_shared_experts": 0,
        "routed_scaling_factor": 1.0,
        "n_group": 1,
        "topk_group": 1,
        "score_correction_bias": False,
    })
    if n_experts:
        _check_experts(cfg)
    return cfg


def normalise_glm4_moe(raw: dict[str, Any]) -> dict[str, Any]:
    cfg = _common(raw, "glm4_moe", default_partial=0.5, default_max_pos=131072,
                  default_eps=1e-5, default_vocab=151552)
    n_layers = cfg["num_hidden_layers"]
    n_experts = _int(raw, "n_routed_experts", raw.get("num_local_experts", 128))
    first_dense = _int(raw, "first_k_dense_replace", 1, minimum=0)
    n_group = _int(raw, "n_group", 1)
    topk_group = _int(raw, "topk_group", 1)
    if n_experts % n_group:
        raise ConfigError(f"n_routed_experts {n_experts} is not a multiple of n_group {n_group}")
    if topk_group > n_group:
        raise ConfigError(f"topk_group {topk_group} exceeds n_group {n_group}")
    if n_group > 1 and n_experts // n_group < 2:
        raise ConfigError("grouped routing needs at least 2 experts per group")
    cfg.update({
        "n_routed_experts": n_experts,
        "layer_is_moe": [int(i >= first_dense) for i in range(n_layers)],
        "attention_bias": _bool(raw, "attention_bias", False),
        "o_proj_bias": False,
        "use_qk_norm": _bool(raw, "use_qk_norm", False),
        "router": "sigmoid",
        "n_shared_experts": _int(raw, "n_shared_experts", 1, minimum=0),
        "routed_scaling_factor": _float(raw, "routed_scaling_factor", 1.0),
        "n_group": n_group,
        "topk_group": topk_group,
        "score_correction_bias": True,
    })
    _check_experts(cfg)
    return cfg


NORMALISERS = {
    "qwen3_moe": normalise_qwen3_moe,
    "glm4_moe": normalise_glm4_moe,
}
