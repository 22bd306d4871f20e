"""Qwen3-Coder: ChatML turns, XML tool calls, no reasoning mode."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..chat import qwen
from ..chat.normalize import require_text_only
from ..chat.types import Message
from ..structured.grammars import qwen_xml_grammar
from ..toolcalls.dialects.qwen_xml import FUNCTION, MARKER
from .qwen3 import STOP_STRINGS
from .record import CallSyntax, Family


def opener(name: str | None = None) -> str:
    """`<tool_call>\\n<function=NAME>\\n`, or up to the name."""
    return f"{MARKER}\n{FUNCTION}" + (f"{name}>\n" if name else "")


def encode(messages: list[Message], tools: list[dict[str, Any]], *, add_generation_prompt: bool,
           thinking: bool | None, reasoning_effort: str | None, extra: Mapping[str, Any],
           chat_template: str | None) -> tuple[str, bool | None]:
    require_text_only(messages)
    return qwen.encode_qwen3_coder(messages, tools, add_generation_prompt=add_generation_prompt), None


CALLS = CallSyntax("qwen_xml", opener, qwen_xml_grammar)
FAMILY = Family("qwen3_coder", encode, STOP_STRINGS, CALLS, reference_template="Qwen3-Coder.jinja")
