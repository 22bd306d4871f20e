"""The smallest `ram_gb` an engine takes for a model: what its too-small-budget error names.
Shared by the budget tests of every checkpoint kind (folders and GGUF files)."""
from __future__ import annotations

import os
import re

import pytest


def stated_minimum_gb(path: str | os.PathLike[str]) -> float:
    """The minimum budget the too-small error names (rounded up to 0.01 GB by the engine)."""
    from gateway.engine import Engine, EngineError

    # A plain try, not pytest.raises: the kept ExceptionInfo would hold this frame's callers
    # (and the engines they return) alive until a garbage collection.
    try:
        Engine(str(path), ram_gb=0.001, threads=1)
    except EngineError as exc:
        message = str(exc)
    else:
        pytest.fail("a 1 MB budget loaded")
    found = re.search(r"minimum is ([0-9.]+) GB", message)
    assert found, f"too-small budget error does not state the minimum: {message}"
    return float(found.group(1))
