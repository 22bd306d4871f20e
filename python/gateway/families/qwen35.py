"""Qwen3.5: ChatML turns, the Qwen3-Coder XML tool calls, thinking on by default.

Thinking: the generation prompt opens `<think>`; `thinking=False` pre-fills an empty block.
"""
from __future__ import annotations

from ..chat import qwen
from .qwen3 import STOP_STRINGS
from .qwen3_coder import CALLS
from .record import Family, text_encoder

FAMILY = Family("qwen35", text_encoder(qwen.encode_qwen35), STOP_STRINGS, CALLS, reasoning_opened=True,
                reference_template="Qwen3.5.jinja")
