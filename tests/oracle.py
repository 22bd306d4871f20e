"""Reference side of the oracle tests: a checkpoint written by tools/make_checkpoint.py, loaded
into Hugging Face transformers' own model class and run in float32.

The weights are read from the files (not from the writer's memory): bf16 tensors are upcast,
FP8 tensors are dequantised exactly as the engine must: block-wise (float32(q) * scale of the
128x128 block, edge blocks included; `weight_scale_inv`) or per output channel
(float32(q) * scale of the row; compressed-tensors `weight_scale` [out, 1]). MTP layers stored after the decoder layers are skipped,
as transformers itself does.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools.ckpt.common import FP8_BLOCK, dequantize_fp8_blocks, dequantize_fp8_channel  # noqa: E402
from tools.ckpt.hf_moe import fuse_experts, hf_model_class, is_moe_layer  # noqa: E402

SCALE_SUFFIX = "_scale_inv"  # block scales (fine-grained FP8)
CHANNEL_SCALE_SUFFIX = "_scale"  # per-row scales (compressed-tensors)

# Tiny matrices on a shared 2-core machine: one thread is 10-100x faster than two contending ones.
torch.set_num_threads(1)


def read_config(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / "config.json").read_text(encoding="utf-8"))


def weight_files(ckpt: Path) -> dict[str, str]:
    """tensor name -> shard file, from model.safetensors.index.json."""
    index = json.loads((Path(ckpt) / "model.safetensors.index.json").read_text(encoding="utf-8"))
    return index["weight_map"]


def read_raw_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint as stored (F32, BF16 or F8_E4M3 torch tensors)."""
    tensors: dict[str, torch.Tensor] = {}
    by_file: dict[str, list[str]] = {}
    for name, file_name in weight_files(ckpt).items():
        by_file.setdefault(file_name, []).append(name)
    for file_name, names in sorted(by_file.items()):
        with safe_open(str(Path(ckpt) / file_name), framework="pt") as handle:
            for name in names:
                tensors[name] = handle.get_tensor(name)
    return tensors


def dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """FP8 block dequantisation, float32(q) * scale, through the writer's reference routine."""
    bits = weight.view(torch.uint8).numpy()
    return torch.from_numpy(dequantize_fp8_blocks(bits, scale.float().numpy(), block))


def dequantize_channel(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per-output-channel FP8 dequantisation, float32(q) * scale of the row ([out, 1])."""
    if tuple(scale.shape) != (weight.shape[0], 1):
        raise ValueError(f"channel scale shape {tuple(scale.shape)}, expected {(weight.shape[0], 1)}")
    bits = weight.view(torch.uint8).numpy()
    return torch.from_numpy(dequantize_fp8_channel(bits, scale.float().numpy()))


def read_float32_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors in float32: upcast bf16, dequantised FP8, scale tensors consumed."""
    config = read_config(ckpt)
    quant = config.get("quantization_config", {})
    per_channel = quant.get("quant_method") == "compressed-tensors"
    block = tuple(quant.get("weight_block_size", FP8_BLOCK))
    suffix = CHANNEL_SCALE_SUFFIX if per_channel else SCALE_SUFFIX
    raw = read_raw_tensors(ckpt)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in raw.items():
        if name.endswith(".weight" + suffix):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            scale_key = name + suffix
            if scale_key not in raw:
                raise KeyError(f"{ckpt}: FP8 tensor {name} has no {scale_key}")
            scale = raw[scale_key]
            out[name] = dequantize_channel(tensor, scale) if per_channel else dequantize(tensor, scale, block)
        else:
            out[name] = tensor.float()
    return out


def hf_config_from_files(ckpt: Path):
    """transformers' own parse of config.json (top-level rope_theta etc.), for an eager fp32 run."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(str(ckpt), attn_implementation="eager", experts_implementation="eager")
    if hasattr(hf_config, "quantization_config"):
        # The reference runs on dequantised float32 weights, never on transformers' FP8 kernels.
        del hf_config.quantization_config
    hf_config.dtype = "float32"
    return hf_config


def load_reference_model(ckpt: Path) -> torch.nn.Module:
    """transformers' model class for the checkpoint, holding its float32 (dequantised) weights."""
    config = read_config(ckpt)
    tensors = read_float32_tensors(ckpt)
    n_layers = config["num_hidden_layers"]
    decoder = {
        name: tensor
        for name, tensor in tensors.items()
        if not (name.startswith("model.layers.") and int(name.split(".")[2]) >= n_layers)
    }
    torch.manual_seed(0)  # the constructor's random init is overwritten below; keep it quiet and fast
    model = hf_model_class(config)(hf_config_from_files(ckpt)).float()
    model.load_state_dict(fuse_experts(decoder, config), strict=True)
    return model.eval()


def moe_layers(config: dict[str, Any]) -> list[int]:
    return [layer for layer in range(config["num_hidden_layers"]) if is_moe_layer(config, layer)]


@torch.no_grad()
def full_logits(model: torch.nn.Module, tokens: list[int]) -> np.ndarray:
    """Logits [n, vocab] of one forward pass over the whole sequence (no cache)."""
    ids = torch.tensor([tokens], dtype=torch.long)
    return model(input_ids=ids, use_cache=False).logits[0].float().numpy()


@torch.no_grad()
def incremental_logits(model: torch.nn.Module, tokens: list[int], chunks: list[int]) -> np.ndarray:
    """Logits [n, vocab] computed chunk by chunk through a KV cache (sum(chunks) == len(tokens))."""
    from transformers import DynamicCache

    if sum(chunks) != len(tokens):
        raise ValueError(f"chunks {chunks} do not cover {len(tokens)} tokens")
    cache = DynamicCache(config=model.config)
    rows, start = [], 0
    for size in chunks:
        ids = torch.tensor([tokens[start : start + size]], dtype=torch.long)
        rows.append(model(input_ids=ids, cache=cache, use_cache=True).logits[0].float().numpy())
        start += size
    return np.concatenate(rows, axis=0)


@torch.no_grad()
def greedy_ids(
    model: torch.nn.Module, prompt: list[int], steps: int, give_up_below_margin: float | None = None
) -> tuple[list[int], np.ndarray]:
    """Greedy continuation of `prompt` through a KV cache: (new ids, logits row that chose each).

    With `give_up_below_margin`, stops early (returning fewer ids) at the first near-tie."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt], dtype=torch.long)
    chosen: list[int] = []
    rows: list[np.ndarray] = []
    for _ in range(steps):
        last = model(input_ids=ids, cache=cache, use_cache=True).logits[0, -1].float().numpy()
        rows.append(last)
        chosen.append(int(np.argmax(last)))
        if give_up_below_margin is not None and top2_margin(last) < give_up_below_margin:
            break
        ids = torch.tensor([[chosen[-1]]], dtype=torch.long)
    return chosen, np.stack(rows)


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |actual - expected| / max |expected| (the oracle metric)."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise AssertionError(f"shape {actual.shape} != expected {expected.shape}")
    if not np.all(np.isfinite(actual)):
        raise AssertionError("non-finite values in the compared logits")
    return float(np.max(np.abs(actual - expected)) / max(float(np.max(np.abs(expected))), 1e-30))


TOLERANCE = {"f32": 1e-4, "bf16": 1e-3, "fp8": 1e-3, "fp8-channel": 1e-3}


def top2_margin(row: np.ndarray) -> float:
    """Gap between the best and second-best logit (how close a greedy choice was to a tie)."""
    top = np.partition(np.asarray(row, dtype=np.float64), -2)[-2:]
    return float(top[1] - top[0])


# ----------------------------------------------------------------------------------------------
# The checkpoints the oracle tests run on


ARCHS = ("glm4_moe", "qwen3_moe")
FORMATS = ("f32", "bf16", "fp8", "fp8-channel")  # fp8: 128x128 block scales; fp8-channel: per-row scales

# Configs nobody tuned the engine for: odd widths (FP8 edge blocks wider than one block), odd
# head counts, MQA/GQA ratios, vocab sizes that are not multiples of 8, group-limited routing,
# no qk-norm, several shared experts, unnormalised top-k, dense layers in the middle.
UNTUNED_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "glm4_moe-odd": (
        "glm4_moe",
        {
            "hidden_size": 80, "num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 20,
            "partial_rotary_factor": 0.5, "rope_theta": 1000000.0, "use_qk_norm": False, "num_hidden_layers": 3,
            "first_k_dense_replace": 2, "intermediate_size": 144, "moe_intermediate_size": 40,
            "n_routed_experts": 12, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3, "n_shared_experts": 2,
            "routed_scaling_factor": 1.0, "norm_topk_prob": False, "vocab_size": 1001, "rms_norm_eps": 1e-6,
        },
    ),
    "qwen3_moe-odd": (
        "qwen3_moe",
        {
            "hidden_size": 136, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 48,
            "rope_theta": 1000000.0, "num_hidden_layers": 4, "mlp_only_layers": [2], "intermediate_size": 200,
            "moe_intermediate_size": 144, "num_experts": 10, "num_experts_per_tok": 3, "norm_topk_prob": False,
            "vocab_size": 777,
        },
    ),
}


def oracle_cases() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(case id, arch, format, config overrides) for every checkpoint the oracle tests cover."""
    cases = [(f"{arch}-{fmt}", arch, fmt, {}) for arch in ARCHS for fmt in FORMATS]
    cases += [(f"{name}-{fmt}", arch, fmt, overrides) for name, (arch, overrides) in UNTUNED_CONFIGS.items() for fmt in FORMATS]
    return cases


PROMPT_TEXT = {
    "glm4_moe": "[gMASK]<sop><|user|>\nWhat is the weather in Zürich? Answer in JSON: {\"city\": \"Zürich\", \"days\": 3}<|assistant|>\n<think>",
    "qwen3_moe": "<|im_start|>user\nWhat is the weather in Zürich? Answer in JSON: {\"city\": \"Zürich\", \"days\": 3}<|im_end|>\n<|im_start|>assistant\n<think>",
}
SEQUENCE_LENGTH = 64


def sequence_tokens(ckpt: Path, arch: str, length: int = SEQUENCE_LENGTH, seed: int = 7) -> list[int]:
    """A realistic chat prefix from the checkpoint's tokenizer, then random ids anywhere in the
    vocabulary (including the padded rows past the tokenizer) up to `length`."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(ckpt) / "tokenizer.json"))
    ids = tokenizer.encode(PROMPT_TEXT[arch]).ids[: length // 2]
    vocab = read_config(ckpt)["vocab_size"]
    rng = np.random.default_rng(seed)
    ids += [int(x) for x in rng.integers(0, vocab, length - len(ids))]
    return ids


def choose_greedy_prompt(model: torch.nn.Module, tokens: list[int], steps: int, min_margin: float,
                         candidates: int = 8) -> tuple[list[int], list[int], np.ndarray]:
    """A prompt (a prefix of `tokens` or a deterministic shuffle of it) whose greedy path never
    comes within `min_margin` of a tie, so that identical ids are a fair demand at the format's
    tolerance. Falls back to the candidate with the widest margin."""
    rng = np.random.default_rng(11)
    prompts = [tokens[: 6 + attempt] if attempt % 2 == 0 else [int(x) for x in rng.permutation(tokens)[:9]]
               for attempt in range(candidates)]
    for prompt in prompts:
        ids, rows = greedy_ids(model, prompt, steps, give_up_below_margin=min_margin)
        if len(ids) == steps and min(top2_margin(row) for row in rows) >= min_margin:
            return prompt, ids, rows
    # No candidate is clear of near-ties: take the one whose closest call is the least close.
    scored = []
    for prompt in prompts:
        ids, rows = greedy_ids(model, prompt, steps)
        scored.append((min(top2_margin(row) for row in rows), prompt, ids, rows))
    _, prompt, ids, rows = max(scored, key=lambda item: item[0])
    return prompt, ids, rows


GREEDY_STEPS = 32


@dataclass
class Reference:
    """transformers' results for one checkpoint (float32, dequantised weights)."""

    ckpt: Path
    config: dict[str, Any]
    model: torch.nn.Module
    tokens: list[int]  # SEQUENCE_LENGTH ids
    full: np.ndarray  # logits [len(tokens), vocab] of one full-sequence pass
    greedy_prompt: list[int]
    greedy_ids: list[int]  # GREEDY_STEPS greedy ids after greedy_prompt
    greedy_rows: np.ndarray  # logits row that chose each greedy id
