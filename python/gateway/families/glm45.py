"""GLM-4.5 / GLM-4.6: `<|role|>\\n` turns, tool calls one tag per line.

Thinking: the model opens its own `<think>`; `thinking=False` appends `/nothink` to user turns
and pre-fills an empty `<think></think>`.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from ..chat import glm
from ..chat.normalize import require_text_only
from ..chat.types import Message
from ..structured.grammars import glm_grammar
from ..toolcalls.dialects.glm import MARKER
from .record import CallSyntax, Family

STOP_STRINGS = ("<|endoftext|>", "<|user|>", "<|observation|>")


def opener(name: str | None = None) -> str:
    """`\\n<tool_call>NAME\\n`: the 4.5/4.6 layout, a newline before the call and after the name."""
    return f"\n{MARKER}" + (f"{name}\n" if name else "")


def encode(messages: list[Message], tools: list[dict[str, Any]], *, add_generation_prompt: bool,
           thinking: bool | None, reasoning_effort: str | None, extra: Mapping[str, Any],
           chat_template: str | None) -> tuple[str, bool | None]:
    require_text_only(messages)
    return glm.encode_glm45(messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking), thinking


CALLS = CallSyntax("glm", opener, partial(glm_grammar, newlines=True))
FAMILY = Family("glm45", encode, STOP_STRINGS, CALLS, reference_template="GLM-4.5.jinja")
