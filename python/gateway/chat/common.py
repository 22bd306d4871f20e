"""Small helpers shared by the hand-written encoders (JSON and Jinja-compatible spellings)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def tojson(value: Any) -> str:
    """Exactly what Hugging Face's `tojson` filter prints with default arguments."""
    return json.dumps(value, ensure_ascii=False)


def jinja_string(value: Any) -> str:
    """Jinja's `| string` / `~` spelling of a value: Python's str() (True, None, 1e-07)."""
    return value if isinstance(value, str) else str(value)


def is_jinja_sequence_container(value: Any) -> bool:
    """The templates' `x is mapping or (x is sequence and x is not string)` test for JSON values."""
    return isinstance(value, (Mapping, list, tuple))


def split_inline_reasoning(content: str) -> tuple[str, str]:
    """The templates' fallback when a message carries no reasoning field but its content holds
    `<think>...</think>`: returns (reasoning, content) with the templates' exact trimming."""
    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    rest = content.split("</think>")[-1].lstrip("\n")
    return reasoning, rest
