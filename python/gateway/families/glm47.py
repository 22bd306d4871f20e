"""GLM-4.7: the GLM turns packed without newlines, tool calls likewise.

Thinking: the generation prompt opens `<think>`; `thinking=False` writes `</think>`.  Option in
`extra`: `clear_thinking` (False keeps the reasoning of older turns).
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
from .glm45 import GLM_TYPES, MARKUP, STOP_STRINGS, writes_glm47_calls
from .record import CallSyntax, Family


def opener(name: str | None = None) -> str:
    """`<tool_call>NAME`: the compact layout."""
    return MARKER + (name or "")


def encode(messages: list[Message], tools: list[dict[str, Any]], *, add_generation_prompt: bool,
           thinking: bool | None, reasoning_effort: str | None, extra: Mapping[str, Any],
           chat_template: str | None) -> tuple[str, bool | None]:
    require_text_only(messages)
    clear = extra.get("clear_thinking")
    text = glm.encode_glm47(messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking,
                            clear_thinking=clear if isinstance(clear, bool) else None)
    return text, thinking


CALLS = CallSyntax("glm", opener, partial(glm_grammar, newlines=False), MARKUP)
def recognizes(model_types: frozenset[str], template: str | None) -> bool:
    """GLM-4.7 templates on either GLM MoE type; the lite (Flash) type when none is shipped."""
    if template is None:
        return "glm4_moe_lite" in model_types
    return bool(GLM_TYPES & model_types) and writes_glm47_calls(template)


FAMILY = Family("glm47", encode, STOP_STRINGS, CALLS, reasoning_opened=True,
                reference_template="GLM-4.7-Flash.jinja", recognizes=recognizes)
