"""Normalised model configs: config.json -> one explicit dict per architecture.

Every architecture module exposes ``NORMALISERS: dict[model_type, fn(raw) -> dict]``.  The
normalised dict has every field the C loader reads, with defaults made explicit, and names the
architecture in ``"arch"``.  A module is imported only when its model_type is asked for, so
adding an architecture is one line in ``_MODULES`` plus its module.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Callable

Normaliser = Callable[[dict[str, Any]], dict[str, Any]]

# model_type (as written in config.json) -> module of this package that normalises it.
_MODULES: dict[str, str] = {
    "qwen3_moe": "hf_moe",
    "glm4_moe": "hf_moe",
    "deepseek_v4": "deepseek_v4",
}


class ConfigError(ValueError):
    """config.json is unreadable, names an unknown architecture, or has bad values."""


def supported_model_types() -> list[str]:
    return sorted(_MODULES)


def _normaliser_for(model_type: str) -> Normaliser:
    module_name = _MODULES.get(model_type)
    if module_name is None:
        raise ConfigError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(supported_model_types())}"
        )
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{module_name}":
            raise
        raise ConfigError(f"model_type {model_type!r} is not available in this build") from exc
    return module.NORMALISERS[model_type]


def normalise(raw: dict[str, Any]) -> dict[str, Any]:
    """The normalised config of a parsed config.json (raises ConfigError)."""
    if not isinstance(raw, dict):
        raise ConfigError("config.json must hold a JSON object")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError(
            f"config.json has no model_type; supported: {', '.join(supported_model_types())}"
        )
    return _normaliser_for(model_type)(raw)


def load_config(model_dir: str | Path) -> dict[str, Any]:
    """Reads and normalises ``model_dir/config.json``, or the metadata of a ``.gguf`` file
    (model_config/gguf.py)."""
    if Path(model_dir).suffix.lower() == ".gguf" and not Path(model_dir).is_dir():
        from .gguf import load_gguf_config

        return load_gguf_config(model_dir)
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no config.json in the model folder") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config.json: {exc}") from exc
    try:
        return normalise(raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
