"""The environment of a Python child process that imports the same gateway package (and built
extension) as the tests, for checks that need a process of their own: an environment variable
the kernels read once, when their tables are built (MOEGATE_AVXVNNI, the vendor rules)."""
from __future__ import annotations

import os
from pathlib import Path

from gateway import _core


def gateway_child_env(unset: str | None = None, **values: str) -> dict[str, str]:
    """This process's environment without the variable `unset`, with `values` set, and the
    folder holding the gateway package first on PYTHONPATH."""
    environ = {k: v for k, v in os.environ.items() if k != unset}
    package_root = str(Path(_core.__file__).resolve().parents[1])
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, environ.get("PYTHONPATH")]))
    environ.update(values)
    return environ
