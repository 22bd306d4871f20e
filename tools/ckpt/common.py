"""Shared pieces of the checkpoint writers: tensor plans, random draws, dtype conversion, FP8
block quantisation and a streaming safetensors writer that never holds more than one tensor.

Every architecture module describes its checkpoint as a list of `TensorSpec`s (name, shape,
role). The role decides how the tensor is drawn and which on-disk dtype each `--format` gives
it, so the same plan serves a tiny checkpoint (checked against transformers) and a multi-GB
bench checkpoint (generated straight into the shard files).
"""
from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np

FP8_E4M3_MAX = 448.0
FP8_BLOCK = (128, 128)
SIZES = ("tiny", "bench")
FORMATS = ("f32", "bf16", "fp8", "native")


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


@dataclass(frozen=True)
class StoredTensor:
    """One entry of a safetensors file: name, safetensors dtype tag and shape."""

    name: str
    dtype: str  # "F32" | "BF16" | "F8_E4M3"
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


DTYPE_BYTES = {"F32": 4, "BF16": 2, "F8_E4M3": 1}


def scale_name(weight_name: str) -> str:
    """Name of the FP8 block-scale tensor of `weight_name` (the official repos' convention)."""
    return weight_name + "_scale_inv"


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
    return [StoredTensor(spec.name, "BF16", spec.shape)]


# ----------------------------------------------------------------------------------------------
# Random draws


def tensor_rng(seed: int, name: str) -> np.random.Generator:
    """A generator that depends only on (seed, tensor name), so draws do not depend on order."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))


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
# dtype conversion (exact round-to-nearest-even, same as torch casts)


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16) with round-to-nearest-even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    rounded = ((bits + rounding) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = np.uint16(0x7FC0)
    return rounded


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _fp8_e4m3_table() -> np.ndarray:
    """float32 value of each of the 256 e4m3fn bit patterns (NaN for 0x7F/0xFF)."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    normal = (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7.0)
    subnormal = (man / 8.0) * np.exp2(-6.0)
    table = sign * np.where(exp == 0, subnormal, normal)
    table[(exp == 0xF) & (man == 0x7)] = np.nan
    return table.astype(np.float32)


FP8_E4M3_VALUES = _fp8_e4m3_table()


def f32_to_fp8_e4m3_bits(values: np.ndarray) -> np.ndarray:
    """float32 (already within +-448) -> e4m3fn bit patterns, round to nearest, ties to even."""
    import torch  # the cast is exact RNE in torch; a numpy re-implementation would be a liability

    clipped = np.clip(np.ascontiguousarray(values, dtype=np.float32), -FP8_E4M3_MAX, FP8_E4M3_MAX)
    return torch.from_numpy(clipped).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def quantize_fp8_blocks(weight: np.ndarray, block: tuple[int, int] = FP8_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Block-wise FP8: per block scale = amax/448 and q = e4m3(W/scale); returns (q bits, scale).

    Dequantisation is q * scale (the official `weight_scale_inv` name notwithstanding). Edge
    blocks smaller than 128x128 get their own scale; an all-zero block gets scale 1.
    """
    rows, cols = weight.shape
    grid_rows, grid_cols = scale_grid(weight.shape, block)
    pad_rows, pad_cols = grid_rows * block[0] - rows, grid_cols * block[1] - cols
    padded = np.pad(weight.astype(np.float32), ((0, pad_rows), (0, pad_cols)))
    tiles = padded.reshape(grid_rows, block[0], grid_cols, block[1])
    amax = np.abs(tiles).max(axis=(1, 3))
    scale = np.where(amax > 0, amax / np.float32(FP8_E4M3_MAX), np.float32(1.0)).astype(np.float32)
    scaled = (tiles / scale[:, None, :, None]).reshape(padded.shape)[:rows, :cols]
    return f32_to_fp8_e4m3_bits(scaled), scale


def dequantize_fp8_blocks(bits: np.ndarray, scale: np.ndarray, block: tuple[int, int] = FP8_BLOCK) -> np.ndarray:
    """Inverse of `quantize_fp8_blocks`: float32(q) * scale of its block, computed in float32."""
    rows, cols = bits.shape
    values = FP8_E4M3_VALUES[bits.astype(np.intp)]
    expanded = np.repeat(np.repeat(scale, block[0], axis=0), block[1], axis=1)[:rows, :cols]
    return (values * expanded).astype(np.float32)


def encode_tensor(spec: TensorSpec, values: np.ndarray, fmt: str) -> dict[str, bytes]:
    """On-disk bytes of every entry that `spec` becomes in format `fmt`."""
    entries = stored_entries(spec, fmt)
    if tuple(values.shape) != spec.shape:
        raise ValueError(f"{spec.name}: drew shape {values.shape}, plan says {spec.shape}")
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
    shards: list[list[TensorSpec]] = [[]]
    used = 0
    for spec in specs:
        size = sum(entry.nbytes for entry in stored_entries(spec, fmt))
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(spec)
        used += size
    return shards


def shard_file_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def _header_bytes(entries: list[StoredTensor]) -> bytes:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for entry in entries:
        header[entry.name] = {"dtype": entry.dtype, "shape": list(entry.shape), "data_offsets": [offset, offset + entry.nbytes]}
        offset += entry.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as the reference writer does
    return struct.pack("<Q", len(raw)) + raw


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
    row blocks, which unquantised tensors (the large embedding and head) are written from. `on_bytes_written` drives a progress bar.
    Returns the index's weight_map.
    """
    shards = plan_shards(specs, fmt, max_shard_bytes)
    weight_map: dict[str, str] = {}
    total_bytes = 0
    for shard_index, shard in enumerate(shards):
        file_name = shard_file_name(shard_index, len(shards))
        entries = [entry for spec in shard for entry in stored_entries(spec, fmt)]
        with open(out_dir / file_name, "wb") as handle:
            handle.write(_header_bytes(entries))
            for spec in shard:
                for entry, data in _encoded_pieces(spec, values_of(spec), fmt):
                    handle.write(data)
                    weight_map[entry.name] = file_name
                    total_bytes += len(data)
                    if on_bytes_written:
                        on_bytes_written(len(data))
            if handle.tell() != len(_header_bytes(entries)) + sum(entry.nbytes for entry in entries):
                raise AssertionError(f"{file_name}: bytes written do not match the header")
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    write_json(out_dir / "model.safetensors.index.json", index)
    return weight_map


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


def write_json(path: Path, payload: object) -> None:
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def planned_bytes(specs: list[TensorSpec], fmt: str) -> int:
    return sum(entry.nbytes for spec in specs for entry in stored_entries(spec, fmt))
