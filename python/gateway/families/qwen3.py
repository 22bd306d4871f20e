"""Qwen3 hybrid: ChatML turns, hermes JSON tool calls.

Thinking: the model opens its own `<think>`; `thinking=False` pre-fills an empty block.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..chat import qwen
from ..chat.normalize import require_text_only
from ..chat.types import Message
from ..structured.grammars import hermes_grammar
from ..toolcalls.dialects.hermes import MARKER
from .record import CallSyntax, Family

STOP_STRINGS = ("<|im_end|>", "<|endoftext|>")


def opener(name: str | None = None) -> str:
    """Inside the JSON object, at the name's value (or past it, at the arguments)."""
    return f'{MARKER}\n{{"name": "' + (f'{name}", "arguments": ' if name else "")


def encode(messages: list[Message], tools: list[dict[str, Any]], *, add_generation_prompt: bool,
           thinking: bool | None, reasoning_effort: str | None, extra: Mapping[str, Any],
           chat_template: str | None) -> tuple[str, bool | None]:
    require_text_only(messages)
    return qwen.encode_qwen3(messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking), thinking


CALLS = CallSyntax("hermes", opener, hermes_grammar)
FAMILY = Family("qwen3", encode, STOP_STRINGS, CALLS, reference_template="Qwen3.jinja")
