"""Session fixtures: tiny checkpoints written once per test session into a temporary directory,
and transformers reference results computed once per checkpoint."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
for path in (TESTS_DIR, REPO_ROOT, REPO_ROOT / "python"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def _key(arch: str, fmt: str, overrides: dict[str, Any] | None, seed: int) -> str:
    return json.dumps([arch, fmt, overrides or {}, seed], sort_keys=True)


@pytest.fixture(scope="session")
def build_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """build_checkpoint(arch, fmt, overrides=None, seed=0) -> directory of a tiny checkpoint.

    Each distinct request is written once per session; later requests reuse the directory, so
    tests must treat the files as read-only.
    """
    from tools.ckpt import write_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    built: dict[str, Path] = {}

    def build(arch: str, fmt: str, overrides: dict[str, Any] | None = None, seed: int = 0) -> Path:
        key = _key(arch, fmt, overrides, seed)
        if key not in built:
            out = root / f"{arch}-{fmt}-{len(built)}"
            built[key] = write_checkpoint(arch, "tiny", fmt, out, seed=seed, overrides=overrides)
        return built[key]

    return build


@pytest.fixture(scope="session")
def reference_for() -> Callable[[Path, str, str], Any]:
    """reference_for(ckpt, arch, fmt) -> oracle.Reference, computed once per checkpoint."""
    import oracle

    cache: dict[Path, oracle.Reference] = {}

    def compute(ckpt: Path, arch: str, fmt: str) -> oracle.Reference:
        if ckpt not in cache:
            model = oracle.load_reference_model(ckpt)
            tokens = oracle.sequence_tokens(ckpt, arch)
            full = oracle.full_logits(model, tokens)
            # A tie closer than twice the allowed error could flip legitimately: avoid such prompts.
            min_margin = 2 * oracle.TOLERANCE[fmt] * float(np.abs(full).max())
            prompt, ids, rows = oracle.choose_greedy_prompt(model, tokens, oracle.GREEDY_STEPS, min_margin)
            cache[ckpt] = oracle.Reference(ckpt, oracle.read_config(ckpt), model, tokens, full, prompt, ids, rows)
        return cache[ckpt]

    return compute


@pytest.fixture(scope="session")
def engine_for() -> Callable[[Path], Any]:
    """engine_for(ckpt) -> gateway.engine.Engine, one per checkpoint per session.
    An import failure (a broken build of gateway._core, say) is an error, never a skip."""
    from gateway.engine import Engine

    engines: dict[Path, Any] = {}

    def open_engine(ckpt: Path) -> Any:
        if ckpt not in engines:
            engines[ckpt] = Engine(str(ckpt))
        return engines[ckpt]

    return open_engine
