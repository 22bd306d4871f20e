"""A fresh clone builds and tests itself: the Makefile installs what the build needs, and nothing
in the repository reaches outside it for data."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _makefile_build_requires() -> list[str]:
    text = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^BUILD_REQUIRES := (.+)$", text, re.MULTILINE)
    assert match, "Makefile defines BUILD_REQUIRES"
    return match.group(1).split()


def test_makefile_installs_what_pyproject_builds_with() -> None:
    """`pip install --no-build-isolation` builds with what the Makefile installed, so the two
    lists must agree (a setuptools too old for PEP 639's license string failed on a fresh
    machine)."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert sorted(_makefile_build_requires()) == sorted(pyproject["build-system"]["requires"])
    setuptools = [r for r in pyproject["build-system"]["requires"] if r.startswith("setuptools")]
    assert setuptools == ["setuptools>=77"], "PEP 639 license strings need setuptools >= 77"


def _tracked_sources() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py", "*.c", "*.h", "*.cpp", "*.sh", "Makefile"],
                         cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    return [REPO_ROOT / line for line in out.splitlines() if line]


def test_nothing_reads_outside_the_repository() -> None:
    """Tests and code read fixtures from tests/data and docs/reference, never from a folder
    beside the clone (the reference folder existed only on the developers' machines)."""
    folder = "sha" + "red"  # spelled in two parts so this guard does not match itself
    outside = re.compile(rf"""\.\./{folder}|parent\s*/\s*["']{folder}["']|/work/{folder}|{folder}/(reference|templates)""")
    offenders = [f"{path.relative_to(REPO_ROOT)}:{n}" for path in _tracked_sources()
                 for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
                 if outside.search(line)]
    assert not offenders, offenders
