"""Qwen3.5: ChatML turns, the Qwen3-Coder XML tool calls, thinking on by default.

Thinking: the generation prompt opens `<think>`; `thinking=False` pre-fills an empty block.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..chat import qwen
from ..chat.normalize import require_text_only
from ..chat.types import Message
from .qwen3 import STOP_STRINGS
from .qwen3_coder import CALLS
from .record import Family


def encode(messages: list[Message], tools: list[dict[str, Any]], *, add_generation_prompt: bool,
           thinking: bool | None, reasoning_effort: str | None, extra: Mapping[str, Any],
           chat_template: str | None) -> tuple[str, bool | None]:
    require_text_only(messages)
    return qwen.encode_qwen35(messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking), thinking


FAMILY = Family("qwen35", encode, STOP_STRINGS, CALLS, reasoning_opened=True, reference_template="Qwen3.5.jinja")
