"""Streaming, sharded safetensors output: model-XXXXX-of-YYYYY.safetensors files plus
model.safetensors.index.json, written one tensor at a time so memory stays at one tensor
whatever the checkpoint size.

A piece may be a `Hole` instead of bytes: the writer seeks past it, so on a file system with
sparse files those bytes read back as zeros and take no disk (tools/rehearse.py writes
full-size releases that way).

A checkpoint is described as a list of *items* (logical tensors); each item becomes one or more
stored `Entry`s (a weight and its scale), which always land in the same shard.
"""
from __future__ import annotations

import json
import math
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

DTYPE_BYTES = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I32": 4, "I64": 8}
INDEX_FILE = "model.safetensors.index.json"

Item = TypeVar("Item")


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file: name, safetensors dtype tag and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Hole:
    """`nbytes` zero bytes that are not written: the file gets a hole there (sparse file)."""

    nbytes: int


def tensor_rng(seed: int, name: str) -> np.random.Generator:
    """A generator that depends only on (seed, tensor name), so draws do not depend on order."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))


def header_bytes(entries: Sequence[Entry]) -> bytes:
    """The length prefix and JSON header of a safetensors file holding `entries` in order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for entry in entries:
        header[entry.name] = {"dtype": entry.dtype, "shape": list(entry.shape), "data_offsets": [offset, offset + entry.nbytes]}
        offset += entry.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as the reference writer does
    return struct.pack("<Q", len(raw)) + raw


def shard_file_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def plan_shards(items: Sequence[Item], entries_of: Callable[[Item], list[Entry]], max_shard_bytes: int) -> list[list[Item]]:
    """Split `items` in order into shards of at most `max_shard_bytes` (an oversized item gets a
    shard of its own; an item's entries are never split)."""
    shards: list[list[Item]] = [[]]
    used = 0
    for item in items:
        size = sum(entry.nbytes for entry in entries_of(item))
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(item)
        used += size
    return shards


def planned_bytes(items: Iterable[Item], entries_of: Callable[[Item], list[Entry]]) -> int:
    return sum(entry.nbytes for item in items for entry in entries_of(item))


def write_shards(
    out_dir: Path,
    items: Sequence[Item],
    entries_of: Callable[[Item], list[Entry]],
    chunks_of: Callable[[Item], Iterable[tuple[str, bytes | Hole]]],
    max_shard_bytes: int,
    on_bytes: Callable[[int], None] | None = None,
    *,
    shards: Sequence[Sequence[Item]] | None = None,
) -> dict[str, str]:
    """Write the shards and the index; returns the index's weight_map (entry name -> file).

    `chunks_of(item)` yields (entry name, bytes or Hole) pieces in entry order; every entry's
    pieces must add up to exactly its planned size (checked, since the header was written
    first).  `on_bytes` is called with each piece's size (a progress bar).  `shards` fixes the
    grouping of items into files (a release's own layout, e.g. one layer per shard) instead of
    filling files up to `max_shard_bytes`.
    """
    out_dir = Path(out_dir)
    if shards is None:
        shards = plan_shards(items, entries_of, max_shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for shard_index, shard in enumerate(shards):
        file_name = shard_file_name(shard_index, len(shards))
        with open(out_dir / file_name, "wb") as handle:
            handle.write(header_bytes([entry for item in shard for entry in entries_of(item)]))
            for item in shard:
                entries = entries_of(item)
                total += _write_item(handle, entries, chunks_of(item), on_bytes)
                for entry in entries:
                    weight_map[entry.name] = file_name
            handle.truncate()  # a shard that ends in a hole still gets its full length
    write_json(out_dir / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    return weight_map


def _write_item(handle, entries: list[Entry], chunks: Iterable[tuple[str, bytes | Hole]],
                on_bytes: Callable[[int], None] | None) -> int:
    """Writes one item's pieces, checking they come in entry order with exactly planned sizes."""
    position = 0  # index of the entry being written
    written = 0
    for name, data in chunks:
        while position < len(entries) and name != entries[position].name:
            if written != entries[position].nbytes:
                raise AssertionError(f"{entries[position].name}: wrote {written} bytes, planned {entries[position].nbytes}")
            position, written = position + 1, 0
        if position == len(entries):
            raise AssertionError(f"{name}: not an expected entry here (expected {[e.name for e in entries]})")
        if isinstance(data, Hole):
            handle.seek(data.nbytes, os.SEEK_CUR)
            size = data.nbytes
        else:
            handle.write(data)
            size = len(data)
        written += size
        if on_bytes:
            on_bytes(size)
    if position != len(entries) - 1 or written != entries[-1].nbytes:
        got = entries[position].name if position < len(entries) else "?"
        raise AssertionError(f"{got}: item ended after {written} bytes of entry {position + 1}/{len(entries)} "
                             f"(planned {[e.nbytes for e in entries]})")
    return sum(entry.nbytes for entry in entries)


def write_json(path: Path, payload: object) -> None:
    Path(path).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
