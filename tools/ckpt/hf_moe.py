"""Checkpoint writer for the two Hugging Face MoE architectures `glm4_moe` and `qwen3_moe`.

The on-disk layout follows the official releases (GLM-4.5/4.5-Air, Qwen3-30B-A3B and their FP8
repos): per-expert tensor names, several shards plus model.safetensors.index.json, a config.json
with top-level rope_theta / partial_rotary_factor, generation_config.json, tokenizer.json and
tokenizer_config.json with the family's chat template.

`tiny` checkpoints go through transformers' own model class (the weights written are the
class's state dict, so names and shapes are exactly what transformers reads); `bench`
checkpoints are drawn tensor by tensor straight into the shard files.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .common import (
    FP8_BLOCK,
    FP8_FORMATS,
    Role,
    TensorSpec,
    draw_tensor,
    draw_tensor_rows,
    planned_bytes,
    round_up,
    write_json,
    write_shards,
)
from .tokenizer import FAMILIES, MIN_LEARNED_TOKENS, Family, TokenizerFiles, write_tokenizer

TINY_TOKENIZER_SIZE = 1000
VOCAB_PAD = 128  # real vocabularies are padded past the tokenizer (151552, 151936 are multiples of 128)
BENCH_SHARD_BYTES = 1 << 30
TRANSFORMERS_VERSION_WRITTEN = "4.54.0"  # the version string the official configs carry

# config.json contents in the form the official repos use (top-level rope_theta and
# partial_rotary_factor, not transformers 5's rope_parameters). Values are chosen away from
# transformers' defaults (rope_theta, eps, scaling) so an engine that ignores a field fails.
GLM_TINY: dict[str, Any] = {
    "hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "partial_rotary_factor": 0.5, "rope_theta": 50000.0,
    "attention_bias": True, "use_qk_norm": True, "first_k_dense_replace": 1, "moe_intermediate_size": 48,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "num_nextn_predict_layers": 1,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
}
GLM_BENCH: dict[str, Any] = {
    "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "partial_rotary_factor": 0.5, "rope_theta": 1000000.0,
    "attention_bias": True, "use_qk_norm": False, "first_k_dense_replace": 1, "moe_intermediate_size": 256,
    "n_routed_experts": 64, "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 1.0, "norm_topk_prob": True, "num_nextn_predict_layers": 1,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "vocab_size": 151552,
}
QWEN_TINY: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "rope_theta": 50000.0, "attention_bias": False,
    "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
}
QWEN_BENCH: dict[str, Any] = {
    "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "rope_theta": 1000000.0, "attention_bias": False,
    "moe_intermediate_size": 256, "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
    "vocab_size": 151936,
}


@dataclass(frozen=True)
class ArchInfo:
    arch: str
    hf_class: str
    family: Family
    defaults: dict[str, dict[str, Any]]
    common: dict[str, Any]  # fields every config of this arch carries


ARCHS = {
    "glm4_moe": ArchInfo(
        "glm4_moe", "Glm4MoeForCausalLM", FAMILIES["glm4"], {"tiny": GLM_TINY, "bench": GLM_BENCH},
        {"hidden_act": "silu", "attention_dropout": 0.0, "initializer_range": 0.02, "rope_scaling": None,
         "tie_word_embeddings": False, "use_cache": True},
    ),
    "qwen3_moe": ArchInfo(
        "qwen3_moe", "Qwen3MoeForCausalLM", FAMILIES["qwen3"], {"tiny": QWEN_TINY, "bench": QWEN_BENCH},
        {"hidden_act": "silu", "attention_dropout": 0.0, "initializer_range": 0.02, "rope_scaling": None,
         "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False, "sliding_window": None,
         "output_router_logits": False, "router_aux_loss_coef": 0.001},
    ),
}


# ----------------------------------------------------------------------------------------------
# Which layers are MoE, and the tensor plan


def n_experts(config: dict[str, Any]) -> int:
    return int(config["n_routed_experts"] if config["model_type"] == "glm4_moe" else config["num_experts"])


def is_moe_layer(config: dict[str, Any], layer: int) -> bool:
    if config["model_type"] == "glm4_moe":
        return layer >= config["first_k_dense_replace"]
    step = config.get("decoder_sparse_step", 1)
    return layer not in (config.get("mlp_only_layers") or []) and n_experts(config) > 0 and (layer + 1) % step == 0


def _layer_specs(config: dict[str, Any], layer: int, moe: bool) -> list[TensorSpec]:
    d = config["hidden_size"]
    head_dim = config["head_dim"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim
    prefix = f"model.layers.{layer}."
    specs = [
        TensorSpec(prefix + "self_attn.q_proj.weight", (q_out, d), Role.LINEAR),
        TensorSpec(prefix + "self_attn.k_proj.weight", (kv_out, d), Role.LINEAR),
        TensorSpec(prefix + "self_attn.v_proj.weight", (kv_out, d), Role.LINEAR),
        TensorSpec(prefix + "self_attn.o_proj.weight", (d, q_out), Role.LINEAR),
    ]
    if config.get("attention_bias"):
        specs += [
            TensorSpec(prefix + "self_attn.q_proj.bias", (q_out,), Role.BIAS),
            TensorSpec(prefix + "self_attn.k_proj.bias", (kv_out,), Role.BIAS),
            TensorSpec(prefix + "self_attn.v_proj.bias", (kv_out,), Role.BIAS),
        ]
    if config["model_type"] == "qwen3_moe" or config.get("use_qk_norm"):
        specs += [
            TensorSpec(prefix + "self_attn.q_norm.weight", (head_dim,), Role.NORM),
            TensorSpec(prefix + "self_attn.k_norm.weight", (head_dim,), Role.NORM),
        ]
    if moe:
        experts = n_experts(config)
        width = config["moe_intermediate_size"]
        specs.append(TensorSpec(prefix + "mlp.gate.weight", (experts, d), Role.ROUTER))
        if config["model_type"] == "glm4_moe":
            specs.append(TensorSpec(prefix + "mlp.gate.e_score_correction_bias", (experts,), Role.ROUTER_BIAS))
        for expert in range(experts):
            specs += _mlp_specs(f"{prefix}mlp.experts.{expert}.", d, width)
        if config["model_type"] == "glm4_moe" and config.get("n_shared_experts", 0) > 0:
            specs += _mlp_specs(prefix + "mlp.shared_experts.", d, width * config["n_shared_experts"])
    else:
        specs += _mlp_specs(prefix + "mlp.", d, config["intermediate_size"])
    specs += [
        TensorSpec(prefix + "input_layernorm.weight", (d,), Role.NORM),
        TensorSpec(prefix + "post_attention_layernorm.weight", (d,), Role.NORM),
    ]
    return specs


def _mlp_specs(prefix: str, d: int, width: int) -> list[TensorSpec]:
    return [
        TensorSpec(prefix + "gate_proj.weight", (width, d), Role.LINEAR),
        TensorSpec(prefix + "up_proj.weight", (width, d), Role.LINEAR),
        TensorSpec(prefix + "down_proj.weight", (d, width), Role.LINEAR),
    ]


def mtp_layer_indices(config: dict[str, Any]) -> list[int]:
    """GLM stores its multi-token-prediction layers after the decoder layers (46 for Air)."""
    if config["model_type"] != "glm4_moe":
        return []
    first = config["num_hidden_layers"]
    return list(range(first, first + int(config.get("num_nextn_predict_layers", 0))))


def tensor_specs(config: dict[str, Any]) -> list[TensorSpec]:
    """Every tensor of the checkpoint, in the order transformers' state dict lists them."""
    d, vocab = config["hidden_size"], config["vocab_size"]
    specs = [TensorSpec("model.embed_tokens.weight", (vocab, d), Role.EMBED)]
    for layer in range(config["num_hidden_layers"]):
        specs += _layer_specs(config, layer, is_moe_layer(config, layer))
    specs += [TensorSpec("model.norm.weight", (d,), Role.NORM), TensorSpec("lm_head.weight", (vocab, d), Role.HEAD)]
    for layer in mtp_layer_indices(config):
        # An MTP block = a full MoE decoder layer plus its input projections and norms. Real
        # checkpoints keep eh_proj unquantised; transformers and a plain decoder ignore them.
        prefix = f"model.layers.{layer}."
        specs += _layer_specs(config, layer, moe=True)
        specs += [
            TensorSpec(prefix + "enorm.weight", (d,), Role.NORM),
            TensorSpec(prefix + "hnorm.weight", (d,), Role.NORM),
            TensorSpec(prefix + "eh_proj.weight", (d, 2 * d), Role.LINEAR_KEEP),
            TensorSpec(prefix + "shared_head.norm.weight", (d,), Role.NORM),
        ]
    return specs


# ----------------------------------------------------------------------------------------------
# config.json / generation_config.json


def build_config(arch: ArchInfo, size: str, overrides: dict[str, Any], tokenizer: TokenizerFiles) -> dict[str, Any]:
    config: dict[str, Any] = {"architectures": [arch.hf_class], "model_type": arch.arch}
    config.update(arch.common)
    config.update(arch.defaults[size])
    config.update(overrides)
    config.setdefault("vocab_size", round_up(tokenizer.size, VOCAB_PAD))
    if config["vocab_size"] < tokenizer.size:
        raise ValueError(f"vocab_size {config['vocab_size']} is smaller than the tokenizer ({tokenizer.size} ids)")
    family = arch.family
    ids = tokenizer.ids
    if arch.arch == "glm4_moe":
        config.update(pad_token_id=ids[family.pad_token], eos_token_id=[ids[t] for t in family.stop_tokens])
    else:
        config.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids[family.eos_token])
    _validate(config)
    return dict(sorted(config.items()))


def _validate(config: dict[str, Any]) -> None:
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    rotary = config["head_dim"] * config.get("partial_rotary_factor", 1.0)
    if rotary != int(rotary) or int(rotary) % 2:
        raise ValueError(f"head_dim * partial_rotary_factor = {rotary} must be an even integer")
    experts = n_experts(config)
    if config["num_experts_per_tok"] > experts:
        raise ValueError("num_experts_per_tok exceeds the number of experts")
    if config["model_type"] == "glm4_moe":
        groups = config.get("n_group", 1)
        if experts % groups or config.get("topk_group", 1) > groups:
            raise ValueError(f"{experts} experts cannot form {groups} groups with topk_group {config.get('topk_group')}")
        if config["num_experts_per_tok"] > config.get("topk_group", 1) * experts // groups:
            raise ValueError("num_experts_per_tok exceeds the experts left after group selection")


def _unquantised_modules(config: dict[str, Any], *, embeddings: bool) -> list[str]:
    """Modules FP8 checkpoints keep in bf16: the head, the routers, MTP's eh_proj (and the
    embedding where the format lists it; compressed-tensors only targets Linear layers)."""
    keep = ["lm_head", "model.embed_tokens"] if embeddings else ["lm_head"]
    for layer in range(config["num_hidden_layers"]):
        if is_moe_layer(config, layer):
            keep.append(f"model.layers.{layer}.mlp.gate")
    for layer in mtp_layer_indices(config):
        keep += [f"model.layers.{layer}.mlp.gate", f"model.layers.{layer}.eh_proj"]
    return keep


def quantization_config(config: dict[str, Any], fmt: str = "fp8") -> dict[str, Any]:
    """The quantization_config of the official FP8 repos: block FP8 (`fp8`, Qwen's -FP8 form)
    or compressed-tensors per-channel FP8 (`fp8-channel`, GLM-4.5-FP8's form)."""
    if fmt == "fp8-channel":
        return compressed_tensors_config(config)
    keep = _unquantised_modules(config, embeddings=True)
    return {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "modules_to_not_convert": keep,
        "quant_method": "fp8",
        "weight_block_size": list(FP8_BLOCK),
    }


def compressed_tensors_config(config: dict[str, Any]) -> dict[str, Any]:
    """compressed-tensors "float-quantized" config: FP8 E4M3 weights with one static scale per
    output channel, activations quantised dynamically per token (which the engine ignores: it
    multiplies fp32 activations), every Linear layer except the `ignore` list."""
    fp8_args = {"actorder": None, "block_structure": None, "group_size": None, "num_bits": 8,
                "observer_kwargs": {}, "symmetric": True, "type": "float"}
    return {
        "config_groups": {
            "group_0": {
                "input_activations": {**fp8_args, "dynamic": True, "observer": None, "strategy": "token"},
                "output_activations": None,
                "targets": ["Linear"],
                "weights": {**fp8_args, "dynamic": False, "observer": "minmax", "strategy": "channel"},
            }
        },
        "format": "float-quantized",
        "global_compression_ratio": None,
        "ignore": _unquantised_modules(config, embeddings=False),
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }


def generation_config(arch: ArchInfo, config: dict[str, Any], tokenizer: TokenizerFiles) -> dict[str, Any]:
    stops = [tokenizer.ids[token] for token in arch.family.stop_tokens]
    if arch.arch == "glm4_moe":
        return {"_from_model_config": True, "eos_token_id": stops, "pad_token_id": config["pad_token_id"],
                "transformers_version": TRANSFORMERS_VERSION_WRITTEN}
    return {"bos_token_id": config["bos_token_id"], "do_sample": True, "eos_token_id": stops,
            "pad_token_id": tokenizer.ids["<|endoftext|>"], "temperature": 0.6, "top_k": 20, "top_p": 0.95,
            "transformers_version": TRANSFORMERS_VERSION_WRITTEN}


# ----------------------------------------------------------------------------------------------
# Weights


def hf_config_object(config: dict[str, Any]):
    """transformers' config for `config` (config.json form), set up for exact fp32 reference runs."""
    import transformers

    fields = {key: value for key, value in config.items() if key not in ("quantization_config", "architectures")}
    cls = transformers.Glm4MoeConfig if config["model_type"] == "glm4_moe" else transformers.Qwen3MoeConfig
    hf_config = cls.from_dict(fields, attn_implementation="eager", experts_implementation="eager")
    hf_config.dtype = "float32"
    return hf_config


def hf_model_class(config: dict[str, Any]):
    import transformers

    return getattr(transformers, ARCHS[config["model_type"]].hf_class)


def fuse_experts(tensors: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Per-expert names -> transformers 5's in-memory layout (gate_up_proj [E, 2f, d], down_proj [E, d, f])."""
    import torch

    fused: dict[str, Any] = {}
    for layer in range(config["num_hidden_layers"]):
        if not is_moe_layer(config, layer):
            continue
        prefix = f"model.layers.{layer}.mlp.experts."
        gate_up, down = [], []
        for expert in range(n_experts(config)):
            e = f"{prefix}{expert}."
            gate_up.append(torch.cat([tensors.pop(e + "gate_proj.weight"), tensors.pop(e + "up_proj.weight")], dim=0))
            down.append(tensors.pop(e + "down_proj.weight"))
        fused[prefix + "gate_up_proj"] = torch.stack(gate_up)
        fused[prefix + "down_proj"] = torch.stack(down)
    fused.update(tensors)
    return fused


def unfuse_experts(state: dict[str, Any], config: dict[str, Any]) -> dict[str, np.ndarray]:
    """transformers' state dict -> per-expert names as float32 numpy arrays."""
    out: dict[str, np.ndarray] = {}
    width = config["moe_intermediate_size"]
    for name, tensor in state.items():
        array = tensor.detach().to("cpu").float().numpy()
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            for expert in range(array.shape[0]):
                out[f"{prefix}{expert}.gate_proj.weight"] = array[expert, :width]
                out[f"{prefix}{expert}.up_proj.weight"] = array[expert, width:]
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for expert in range(array.shape[0]):
                out[f"{prefix}{expert}.down_proj.weight"] = array[expert]
        else:
            out[name] = array
    return out


def tiny_weights(config: dict[str, Any], specs: list[TensorSpec], seed: int) -> dict[str, np.ndarray]:
    """Draw the weights, load them into transformers' model class, and read its state dict back.

    Loading with strict=True proves the plan has exactly the class's names and shapes; the values
    written are the class's own parameters (MTP tensors, which the class does not have, aside).
    """
    import torch

    draws = {spec.name: draw_tensor(spec, seed) for spec in specs}
    mtp_prefixes = tuple(f"model.layers.{layer}." for layer in mtp_layer_indices(config))
    decoder = {name: torch.from_numpy(value) for name, value in draws.items() if not name.startswith(mtp_prefixes)}
    hf_config = hf_config_object(config)
    with torch.device("meta"):
        model = hf_model_class(config)(hf_config)
    model.load_state_dict(fuse_experts(decoder, config), strict=True, assign=True)
    from_model = unfuse_experts(model.state_dict(), config)
    return {name: from_model.get(name, draws[name]) for name in draws}


def start_checkpoint(arch_name: str, size: str, out_dir: Path, overrides: dict[str, Any],
                     tokenizer_size: int = TINY_TOKENIZER_SIZE,
                     corpus: Iterable[str] | None = None) -> tuple[dict[str, Any], TokenizerFiles]:
    """Write the tokenizer files (trained on `corpus`, by default the built-in text) and return
    the config (config.json form) sized to it."""
    arch = ARCHS[arch_name]
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_override = overrides.get("vocab_size")
    smallest = len(arch.family.added) + MIN_LEARNED_TOKENS
    if vocab_override is not None and vocab_override < smallest:
        raise ValueError(f"vocab_size {vocab_override} too small: the {arch_name} tokenizer needs at least {smallest} ids")
    tokenizer_size = min(tokenizer_size, vocab_override) if vocab_override else tokenizer_size
    tokenizer = write_tokenizer(out_dir, arch.family, tokenizer_size, corpus)
    return build_config(arch, size, overrides, tokenizer), tokenizer


def finish_checkpoint(config: dict[str, Any], tokenizer: TokenizerFiles, fmt: str, out_dir: Path) -> None:
    """config.json (with the format's quantization_config) and generation_config.json."""
    on_disk = dict(config)
    on_disk["torch_dtype"] = "float32" if fmt == "f32" else "bfloat16"
    on_disk["transformers_version"] = TRANSFORMERS_VERSION_WRITTEN
    if fmt in FP8_FORMATS:
        on_disk["quantization_config"] = quantization_config(config, fmt)
    write_json(out_dir / "config.json", dict(sorted(on_disk.items())))
    write_json(out_dir / "generation_config.json", generation_config(ARCHS[config["model_type"]], config, tokenizer))


def write_checkpoint(arch_name: str, size: str, fmt: str, out_dir: Path, seed: int, overrides: dict[str, Any]) -> Path:
    config, tokenizer = start_checkpoint(arch_name, size, out_dir, overrides)
    specs = tensor_specs(config)
    total = planned_bytes(specs, fmt)
    if size == "tiny":
        weights = tiny_weights(config, specs, seed)
        # Three or four shards, like a real multi-shard repo, whatever the format.
        write_shards(out_dir, specs, fmt, lambda spec: weights[spec.name], max(1, math.ceil(total / 3)))
    else:
        from tqdm import tqdm

        with tqdm(total=total, unit="B", unit_scale=True, desc=f"{arch_name} {size} {fmt}") as bar:
            write_shards(out_dir, specs, fmt, lambda spec: draw_tensor_rows(spec, seed), BENCH_SHARD_BYTES, bar.update)
    finish_checkpoint(config, tokenizer, fmt, out_dir)
    return out_dir
