"""Where the tests' reference data lives: tests/data/ (its README.md says where each file came
from) and the specs in docs/reference/, copied once into the repository, so a clone tests itself
with nothing beside it."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "tests" / "data"
TEMPLATES_DIR = DATA_DIR / "templates"                   # real chat templates + golden-renders.json
DSML_SPEC = REPO_ROOT / "docs" / "reference" / "dsml.md"  # the DSML spec, worked examples in §9


def template_text(name: str) -> str:
    """The text of one reference chat template (tests/data/templates/<name>)."""
    return (TEMPLATES_DIR / name).read_text(encoding="utf-8")
