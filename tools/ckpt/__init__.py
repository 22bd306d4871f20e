"""Random-weight checkpoints in the real on-disk layout, one writer module per architecture.

`WRITERS` maps `--arch` to the module (inside this package) that writes it. Each module has
`write_checkpoint(arch, size, fmt, out_dir, seed, overrides) -> Path`. Modules are imported only
when their arch is asked for, so one writer's dependencies never burden another. Adding an
architecture is one line here plus its module.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from .common import FORMATS, SIZES

WRITERS: dict[str, str] = {
    "deepseek_v4": "deepseek_v4",
    "glm4_moe": "hf_moe",
    "qwen3_moe": "hf_moe",
}


def write_checkpoint(
    arch: str, size: str, fmt: str, out_dir: Path | str, *, seed: int = 0, overrides: dict[str, Any] | None = None
) -> Path:
    """Write a checkpoint of `arch` into `out_dir` and return the directory."""
    if arch not in WRITERS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(WRITERS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    module = importlib.import_module(f".{WRITERS[arch]}", __name__)
    return module.write_checkpoint(arch, size, fmt, Path(out_dir), seed, dict(overrides or {}))


__all__ = ["WRITERS", "FORMATS", "SIZES", "write_checkpoint"]
