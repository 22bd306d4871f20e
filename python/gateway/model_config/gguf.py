"""Normalised configs from GGUF metadata: llama.cpp's ``qwen3moe``, ``glm4moe`` and ``deepseek4``
files.

The scalar keys of the first file (docs/reference/gguf.md §4) are translated into the raw
config.json fields of ``qwen3_moe`` / ``glm4_moe`` / ``deepseek_v4`` (DeepSeek's published form),
which then go through the same normalisers as a checkpoint folder.  What the metadata does not say is read off the tensors:
the vocabulary (the token embedding's rows), q/k/v biases and q/k norms (whether layer 0 has
them), a tied output (no ``output.weight``) and which qwen3moe layers are dense (no router).
The C side (c/io/gguf_checkpoint.c) reads the same file under the Hugging Face tensor names.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from . import ConfigError, normalise

# general.architecture -> the model_type whose normaliser applies.
GGUF_ARCHS: dict[str, str] = {"qwen3moe": "qwen3_moe", "glm4moe": "glm4_moe", "deepseek4": "deepseek_v4"}

# Numeric arrays up to this length are read with the scalars (deepseek4's per-layer compress
# ratios and SwiGLU clamps); the token lists stay in the file.
SMALL_ARRAYS = 4096

SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

# expert_gating_func values (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*).
GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_weight", 4: "sqrtsoftplus"}


def is_gguf_path(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".gguf"


def split_parts(path: Path, metadata: dict[str, Any]) -> list[Path]:
    """Every part of the set `path` opens (itself alone unless split.count > 1)."""
    count = int(metadata.get("split.count", 1) or 1)
    match = SPLIT_NAME.match(path.name)
    if match and int(match["no"]) != 1:
        raise ConfigError(f"{path}: part {int(match['no'])} of a split set; open the first part "
                          f"({match['prefix']}-00001-of-{match['count']}.gguf)")
    if count <= 1:
        return [path]
    if not match or int(match["count"]) != count:
        raise ConfigError(f"{path}: split.count is {count}, but the file is not named NAME-00001-of-{count:05d}.gguf")
    parts = [path.with_name(f"{match['prefix']}-{k:05d}-of-{count:05d}.gguf") for k in range(1, count + 1)]
    for k, part in enumerate(parts, start=1):
        if not part.is_file():
            raise ConfigError(f"{path}: split part {k} of {count} is missing: {part}")
    return parts


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """(scalar metadata of the first part, {tensor name: ggml-order shape} over every part)."""
    from .. import _core

    try:
        info = _core.gguf_inspect(str(path), arrays=False, small_arrays=SMALL_ARRAYS)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    metadata = info["metadata"]
    tensors = {t["name"]: list(t["shape"]) for t in info["tensors"]}
    for part in split_parts(path, metadata)[1:]:
        try:
            tensors.update({t["name"]: list(t["shape"]) for t in _core.gguf_inspect(str(part), arrays=False)["tensors"]})
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return metadata, tensors


def raw_config(metadata: dict[str, Any], tensors: dict[str, list[int]], where: str = "") -> dict[str, Any]:
    """The config.json fields of the GGUF's architecture (raises ConfigError)."""
    arch = metadata.get("general.architecture")
    if arch not in GGUF_ARCHS:
        raise ConfigError(f"{where}GGUF architecture {arch!r} is not supported; supported: {', '.join(sorted(GGUF_ARCHS))}")
    model_type = GGUF_ARCHS[arch]
    if model_type == "deepseek_v4":
        return _deepseek4_raw(metadata, tensors, where)

    def key(name: str, default: Any = None, required: bool = False) -> Any:
        value = metadata.get(f"{arch}.{name}", default)
        if value is None and required:
            raise ConfigError(f"{where}GGUF key {arch}.{name} is missing")
        if isinstance(value, float):
            # Stored as f32: 1e-06 reads back as 9.99999997e-07; the shortest decimal that
            # rounds to the same f32 is the value the converter was given.
            value = float(str(np.float32(value)))
        return value

    embd = tensors.get("token_embd.weight")
    if embd is None or len(embd) != 2:
        raise ConfigError(f"{where}GGUF tensor token_embd.weight is missing or not 2-D")
    n_heads = key("attention.head_count", required=True)
    hidden = key("embedding_length", required=True)
    head_dim = key("attention.key_length", hidden // n_heads if isinstance(n_heads, int) and n_heads else None)
    block_count = key("block_count", required=True)
    nextn = key("nextn_predict_layers", 0) or 0
    n_layers = block_count - nextn
    rope_dims = key("rope.dimension_count", head_dim)
    raw: dict[str, Any] = {
        "model_type": model_type,
        "hidden_act": "silu",
        "vocab_size": embd[1],
        "hidden_size": hidden,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": key("attention.head_count_kv", n_heads),
        "head_dim": head_dim,
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", required=True),
        "rope_theta": key("rope.freq_base", 10000.0),
        "partial_rotary_factor": rope_dims / head_dim if isinstance(rope_dims, int) and head_dim else 1.0,
        "max_position_embeddings": key("context_length", 4096),
        "tie_word_embeddings": "output.weight" not in tensors,
        "moe_intermediate_size": _one_value(key("expert_feed_forward_length", required=True), n_layers,
                                            f"{where}GGUF key deepseek4.expert_feed_forward_length"),
        "num_experts_per_tok": key("expert_used_count", required=True),
        "attention_bias": "blk.0.attn_q.bias" in tensors,
    }
    raw["intermediate_size"] = key("feed_forward_length", raw["moe_intermediate_size"])
    n_experts = key("expert_count", required=True)
    gating = key("expert_gating_func")
    if model_type == "qwen3_moe":
        if gating not in (None, 1):
            raise ConfigError(f"{where}qwen3moe with expert_gating_func {GATING.get(gating, gating)!r} is not supported (softmax only)")
        raw.update({
            "num_experts": n_experts,
            # llama.cpp's qwen3moe always normalises the top-k weights; a file may say otherwise.
            "norm_topk_prob": bool(key("expert_weights_norm", True)),
            "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i in range(n_layers) if f"blk.{i}.ffn_gate_inp.weight" not in tensors],
        })
    else:
        if gating not in (None, 2):
            raise ConfigError(f"{where}glm4moe with expert_gating_func {GATING.get(gating, gating)!r} is not supported (sigmoid only)")
        raw.update({
            "n_routed_experts": n_experts,
            "norm_topk_prob": bool(key("expert_weights_norm", True)),
            "routed_scaling_factor": key("expert_weights_scale", 1.0),
            "n_shared_experts": key("expert_shared_count", 1),
            "first_k_dense_replace": key("leading_dense_block_count", 1),
            "n_group": key("expert_group_count", 1) or 1,
            "topk_group": key("expert_group_used_count", 1) or 1,
            "use_qk_norm": "blk.0.attn_q_norm.weight" in tensors,
            "num_nextn_predict_layers": nextn,
        })
    return raw


def _one_value(value: Any, n_layers: int, what: str) -> Any:
    """A key llama.cpp reads as a scalar or one value per layer (get_key_or_arr): the one value
    every layer shares; layers of different widths are not supported."""
    if not isinstance(value, list):
        return value
    values = set(value[:n_layers])
    if len(value) < n_layers or len(values) != 1:
        raise ConfigError(f"{what}: one value for every layer is supported, got {value}")
    return values.pop()


def _deepseek4_raw(metadata: dict[str, Any], tensors: dict[str, list[int]], where: str) -> dict[str, Any]:
    """DeepSeek-V4's published config.json fields from a ``deepseek4`` file.

    The keys llama.cpp's loader reads without a default (src/models/deepseek4.cpp) are required
    here too.  The generic ones it defaults (src/llama-model.cpp load_hparams), and so do we:
    rope.freq_base 10000; rope.scaling.type "linear" with factor 1 (no scaling; a real linear
    factor is refused by the normaliser, V4 uses YaRN); rope.scaling.original_context_length =
    context_length; yarn_beta_fast 32, yarn_beta_slow 1; attention.head_count_kv = head_count;
    attention.key_length = embedding_length / head_count; nextn_predict_layers 0; swiglu_clamp_shexp
    = swiglu_clamp_exp.
    """

    def key(name: str, default: Any = None, required: bool = False) -> Any:
        value = metadata.get(f"deepseek4.{name}", default)
        if value is None and required:
            raise ConfigError(f"{where}GGUF key deepseek4.{name} is missing")
        if isinstance(value, float):
            value = float(str(np.float32(value)))  # the f32 the converter was given, as decimal
        return value

    def tensor(name: str) -> list[int]:
        shape = tensors.get(name)
        if shape is None:
            raise ConfigError(f"{where}GGUF tensor {name} is missing")
        return shape

    embd = tensor("token_embd.weight")
    if len(embd) != 2:
        raise ConfigError(f"{where}GGUF tensor token_embd.weight is not 2-D")
    hidden = key("embedding_length", required=True)
    n_heads = key("attention.head_count", required=True)
    n_layers = key("block_count", required=True) - (key("nextn_predict_layers", 0) or 0)
    ratios = key("attention.compress_ratios", required=True)
    if not isinstance(ratios, list) or len(ratios) < n_layers:
        raise ConfigError(f"{where}GGUF key deepseek4.attention.compress_ratios needs {n_layers} entries (one per layer)")
    gating = key("expert_gating_func", required=True)
    if gating != 4:
        raise ConfigError(f"{where}deepseek4 with expert_gating_func {GATING.get(gating, gating)!r} is not supported "
                          "(sqrtsoftplus only)")
    # One SwiGLU limit for routed and shared experts, as the release has.
    clamp = key("swiglu_clamp_exp", required=True)
    clamp_shared = key("swiglu_clamp_shexp", clamp)
    limits = {float(str(np.float32(v))) for c in (clamp, clamp_shared) for v in (c if isinstance(c, list) else [c])[:n_layers]}
    if len(limits) != 1:
        raise ConfigError(f"{where}GGUF keys deepseek4.swiglu_clamp_exp/_shexp: one limit for every layer and both "
                          f"expert kinds is supported, got {sorted(limits)}")
    scaling = key("rope.scaling.type", "linear")
    factor = key("rope.scaling.factor", 0.0) or 1.0
    if scaling == "yarn":
        rope_scaling = {
            "type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": key("rope.scaling.original_context_length",
                                                    key("context_length", required=True)),
            "beta_fast": key("rope.scaling.yarn_beta_fast", 32.0),
            "beta_slow": key("rope.scaling.yarn_beta_slow", 1.0),
        }
    elif scaling in ("linear", "none") and factor == 1.0:
        rope_scaling = {"type": "default"}
    else:
        raise ConfigError(f"{where}GGUF key deepseek4.rope.scaling.type {scaling!r} (factor {factor}) is not "
                          "supported: DeepSeek-V4 uses yarn")
    raw: dict[str, Any] = {
        "model_type": "deepseek_v4",
        "vocab_size": embd[1],
        "hidden_size": hidden,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": key("attention.head_count_kv", n_heads),
        "head_dim": key("attention.key_length", hidden // n_heads if isinstance(n_heads, int) and n_heads else None),
        "qk_rope_head_dim": key("rope.dimension_count", required=True),
        "q_lora_rank": key("attention.q_lora_rank", required=True),
        "o_groups": key("attention.output_group_count", required=True),
        "o_lora_rank": key("attention.output_lora_rank", required=True),
        "sliding_window": key("attention.sliding_window", required=True),
        "compress_ratios": list(ratios[:n_layers]),
        "compress_rope_theta": key("attention.compress_rope_freq_base", required=True),
        "rope_theta": key("rope.freq_base", 10000.0),
        "rope_scaling": rope_scaling,
        "max_position_embeddings": key("context_length", required=True),
        "index_n_heads": key("attention.indexer.head_count", required=True),
        "index_head_dim": key("attention.indexer.key_length", required=True),
        "index_topk": key("attention.indexer.top_k", required=True),
        "hc_mult": key("hyper_connection.count", required=True),
        "hc_sinkhorn_iters": key("hyper_connection.sinkhorn_iterations", required=True),
        "hc_eps": key("hyper_connection.epsilon", required=True),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", required=True),
        "n_routed_experts": key("expert_count", required=True),
        "num_experts_per_tok": key("expert_used_count", required=True),
        "n_shared_experts": key("expert_shared_count", required=True),
        "moe_intermediate_size": _one_value(key("expert_feed_forward_length", required=True), n_layers,
                                            f"{where}GGUF key deepseek4.expert_feed_forward_length"),
        "num_hash_layers": key("hash_layer_count", required=True),
        "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": bool(key("expert_weights_norm", required=True)),
        "routed_scaling_factor": key("expert_weights_scale", required=True),
        "swiglu_limit": limits.pop(),
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id", 0),
        "eos_token_id": metadata.get("tokenizer.ggml.eos_token_id", 1),
    }
    return raw


def load_gguf_config(path: str | Path) -> dict[str, Any]:
    """The normalised config of a `.gguf` file (the first part of a split set)."""
    path = Path(path)
    metadata, tensors = read_gguf(path)
    try:
        return normalise(raw_config(metadata, tensors))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
