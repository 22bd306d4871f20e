"""Qwen3.5: ChatML turns, the Qwen3-Coder XML tool calls, thinking on by default.

Thinking: the generation prompt opens `<think>`; `thinking=False` pre-fills an empty block.
"""
from __future__ import annotations

from ..chat import qwen
from .qwen3 import STOP_STRINGS
from .qwen3_coder import CALLS
from .record import Family, text_encoder

QWEN35_TYPES = frozenset({"qwen3_5_moe", "qwen3_5_moe_text"})


def recognizes(model_types: frozenset[str], template: str | None) -> bool:
    """Qwen3.5 MoE (XML calls, thinking), and a Qwen3 MoE whose template writes both."""
    if QWEN35_TYPES & model_types:
        return template is None or "<function=" in template
    return "qwen3_moe" in model_types and template is not None and "<function=" in template and "<think>" in template


FAMILY = Family("qwen35", text_encoder(qwen.encode_qwen35), STOP_STRINGS, CALLS, reasoning_opened=True,
                reference_template="Qwen3.5.jinja", recognizes=recognizes)
