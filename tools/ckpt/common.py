"""Shared pieces of the Hugging Face-layout checkpoint writers: tensor plans, random draws and
per-format encoding. The exact casts, the FP8 block quantiser and the streaming safetensors
writer (never more than one tensor in memory) are gateway.checkpoints', shared with the runtime
demo; they are re-exported here under their historical names.

Every architecture module describes its checkpoint as a list of `TensorSpec`s (name, shape,
role). The role decides how the tensor is drawn and which on-disk dtype each `--format` gives
it, so the same plan serves a tiny checkpoint (checked against transformers) and a multi-GB
bench checkpoint (generated straight into the shard files).
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np

# gateway.checkpoints holds the numpy machinery shared with the runtime demo; from a checkout
# (tools/make_checkpoint.py run directly) it is importable once python/ is on the path.
_CHECKOUT_PYTHON = str(Path(__file__).resolve().parents[2] / "python")
if _CHECKOUT_PYTHON not in sys.path:
    sys.path.insert(0, _CHECKOUT_PYTHON)

from gateway.checkpoints.numerics import (  # noqa: E402,F401  (re-exported for the tests and writers)
    FP8_E4M3_MAX,
    FP8_E4M3_VALUES,
    bf16_bits_to_f32,
    dequantize_fp8_blocks,
    dequantize_fp8_channel,
    f32_to_bf16_bits,
    f32_to_fp8_e4m3_bits,
    quantize_fp8_blocks,
    quantize_fp8_channel,
)
from gateway.checkpoints.shards import (  # noqa: E402,F401
    DTYPE_BYTES,
    Entry as StoredTensor,
    shard_file_name,
    tensor_rng,
    write_json,
)
from gateway.checkpoints import shards as _shards  # noqa: E402

FP8_BLOCK = (128, 128)
SIZES = ("tiny", "bench")
# fp8: 128x128 block scales (`weight_scale_inv`, the Qwen -FP8 repos); fp8-channel: one scale per
# output row (`weight_scale` [out, 1], compressed-tensors "channel", the GLM-4.5-FP8 repos).
FORMATS = ("f32", "bf16", "fp8", "fp8-channel", "native")
FP8_FORMATS = ("fp8", "fp8-channel")


class Role(str, Enum):
    """What a tensor is; decides its random draw, on-disk dtype and whether FP8 quantises it."""

    EMBED = "embed"  # token embedding [V, d]
    HEAD = "head"  # lm_head [V, d]
    LINEAR = "linear"  # projection weight [out, in]; the only role FP8 quantises
    LINEAR_KEEP = "linear_keep"  # projection that real FP8 checkpoints keep in bf16 (MTP eh_proj)
    ROUTER = "router"  # MoE router weight [E, d]; bf16 in FP8 checkpoints
    ROUTER_BIAS = "router_bias"  # e_score_correction_bias [E]; float32 in every real checkpoint
    NORM = "norm"  # RMSNorm weight
    BIAS = "bias"  # projection bias


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    role: Role


def scale_name(weight_name: str) -> str:
    """Name of the FP8 block-scale tensor of `weight_name` (the official repos' convention)."""
    return weight_name + "_scale_inv"


def channel_scale_name(weight_name: str) -> str:
    """Name of the per-channel scale of `weight_name` (compressed-tensors: `<module>.weight_scale`)."""
    return weight_name + "_scale"


def scale_grid(shape: tuple[int, ...], block: tuple[int, int] = FP8_BLOCK) -> tuple[int, int]:
    """Scale tensor shape [ceil(out/128), ceil(in/128)]: partial edge blocks get their own scale."""
    rows, cols = shape
    return (-(-rows // block[0]), -(-cols // block[1]))


def stored_entries(spec: TensorSpec, fmt: str) -> list[StoredTensor]:
    """The tensor(s) that `spec` becomes on disk in format `fmt`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    if spec.role is Role.ROUTER_BIAS or fmt == "f32":
        return [StoredTensor(spec.name, "F32", spec.shape)]
    if fmt == "fp8" and spec.role is Role.LINEAR:
        return [
            StoredTensor(spec.name, "F8_E4M3", spec.shape),
            StoredTensor(scale_name(spec.name), "F32", scale_grid(spec.shape)),
        ]
    if fmt == "fp8-channel" and spec.role is Role.LINEAR:
        # Scales in the model dtype (bf16), as llm-compressor writes them; the engine also reads F32.
        return [
            StoredTensor(spec.name, "F8_E4M3", spec.shape),
            StoredTensor(channel_scale_name(spec.name), "BF16", (spec.shape[0], 1)),
        ]
    return [StoredTensor(spec.name, "BF16", spec.shape)]


# ----------------------------------------------------------------------------------------------
# Random draws


def draw_tensor(spec: TensorSpec, seed: int) -> np.ndarray:
    """Random float32 values large enough that routing, attention and logits are non-trivial.

    Projections use std 1.6/sqrt(fan_in) (0.2 for fan_in 64): activations keep their scale
    through each layer, router logits spread over several units so different tokens pick
    different experts, and logits vary by a few units across the vocabulary.
    """
    return _draw(spec, tensor_rng(seed, spec.name), spec.shape)


def draw_tensor_rows(spec: TensorSpec, seed: int, max_elements: int | None = 1 << 24) -> Iterator[np.ndarray]:
    """The same values as `draw_tensor`, yielded in blocks of rows of at most `max_elements`
    (numpy consumes its stream element by element, so chunking does not change the values)."""
    rng = tensor_rng(seed, spec.name)
    rows = spec.shape[0]
    row_elements = max(1, math.prod(spec.shape[1:]))
    step = rows if max_elements is None else max(1, max_elements // row_elements)
    for start in range(0, rows, step):
        yield _draw(spec, rng, (min(step, rows - start), *spec.shape[1:]))


def _draw(spec: TensorSpec, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    if spec.role in (Role.LINEAR, Role.LINEAR_KEEP, Role.ROUTER, Role.HEAD):
        std = 1.6 / math.sqrt(spec.shape[-1])
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    if spec.role is Role.EMBED:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5)
    if spec.role is Role.NORM:
        # Not all-ones: an engine that forgets a norm weight must produce different logits.
        return (1.0 + 0.15 * rng.standard_normal(shape)).astype(np.float32)
    if spec.role in (Role.BIAS, Role.ROUTER_BIAS):
        # Router bias: comparable to the spread of sigmoid scores, so it changes which experts win.
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
    raise ValueError(f"no draw rule for role {spec.role}")


# ----------------------------------------------------------------------------------------------
# Encoding (the casts and quantisers live in gateway.checkpoints.numerics)


def encode_tensor(spec: TensorSpec, values: np.ndarray, fmt: str) -> dict[str, bytes]:
    """On-disk bytes of every entry that `spec` becomes in format `fmt`."""
    entries = stored_entries(spec, fmt)
    if tuple(values.shape) != spec.shape:
        raise ValueError(f"{spec.name}: drew shape {values.shape}, plan says {spec.shape}")
    if len(entries) == 2 and fmt == "fp8-channel":
        bits, scale = quantize_fp8_channel(values)
        return {entries[0].name: bits.tobytes(), entries[1].name: encode_plain(scale, entries[1].dtype)}
    if len(entries) == 2:
        bits, scale = quantize_fp8_blocks(values)
        return {entries[0].name: bits.tobytes(), entries[1].name: scale.astype("<f4").tobytes()}
    return {entries[0].name: encode_plain(values, entries[0].dtype)}


def encode_plain(values: np.ndarray, dtype: str) -> bytes:
    """Bytes of an unquantised tensor (or a block of its rows) in F32 or BF16."""
    if dtype == "F32":
        return np.ascontiguousarray(values, dtype="<f4").tobytes()
    return f32_to_bf16_bits(values).astype("<u2").tobytes()


# ----------------------------------------------------------------------------------------------
# Sharded, streaming safetensors output


def plan_shards(specs: list[TensorSpec], fmt: str, max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Split the plan into shards of at most `max_shard_bytes` (a weight and its scale stay together)."""
    return _shards.plan_shards(specs, lambda spec: stored_entries(spec, fmt), max_shard_bytes)


def write_shards(
    out_dir: Path,
    specs: list[TensorSpec],
    fmt: str,
    values_of: Callable[[TensorSpec], np.ndarray | Iterable[np.ndarray]],
    max_shard_bytes: int,
    on_bytes_written: Callable[[int], None] | None = None,
) -> dict[str, str]:
    """Write the plan as model-XXXXX-of-YYYYY.safetensors + model.safetensors.index.json.

    Tensors are drawn one at a time by `values_of` and written straight to the file, so memory
    stays at one tensor whatever the checkpoint size; `values_of` may also return an iterable of
    row blocks, which unquantised tensors (the large embedding and head) are written from.
    `on_bytes_written` drives a progress bar. Returns the index's weight_map.
    """

    def chunks_of(spec: TensorSpec) -> Iterator[tuple[str, bytes]]:
        return ((entry.name, data) for entry, data in _encoded_pieces(spec, values_of(spec), fmt))

    return _shards.write_shards(out_dir, specs, lambda spec: stored_entries(spec, fmt), chunks_of,
                                max_shard_bytes, on_bytes_written)


def _encoded_pieces(
    spec: TensorSpec, values: np.ndarray | Iterable[np.ndarray], fmt: str
) -> Iterator[tuple[StoredTensor, bytes]]:
    """(entry, bytes) pieces in file order; checks each entry gets exactly its planned size."""
    entries = stored_entries(spec, fmt)
    if isinstance(values, np.ndarray) or len(entries) == 2:
        array = values if isinstance(values, np.ndarray) else np.concatenate(list(values), axis=0)
        encoded = encode_tensor(spec, array, fmt)
        for entry in entries:
            if len(encoded[entry.name]) != entry.nbytes:
                raise AssertionError(f"{entry.name}: {len(encoded[entry.name])} bytes, {entry.nbytes} planned")
            yield entry, encoded[entry.name]
        return
    (entry,) = entries
    written = 0
    for block in values:
        data = encode_plain(block, entry.dtype)
        written += len(data)
        yield entry, data
    if written != entry.nbytes:
        raise AssertionError(f"{entry.name}: {written} bytes, {entry.nbytes} planned")


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def planned_bytes(specs: list[TensorSpec], fmt: str) -> int:
    return sum(entry.nbytes for spec in specs for entry in stored_entries(spec, fmt))
