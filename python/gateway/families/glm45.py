"""GLM-4.5 / GLM-4.6: `<|role|>\\n` turns, tool calls one tag per line.

Thinking: the model opens its own `<think>`; `thinking=False` appends `/nothink` to user turns
and pre-fills an empty `<think></think>`.
"""
from __future__ import annotations

from functools import partial

from ..chat import glm
from ..structured.grammars import glm_grammar
from ..toolcalls.dialects import glm as glm_dialect
from ..toolcalls.dialects.glm import MARKER
from .record import CallSyntax, Family, text_encoder

STOP_STRINGS = ("<|endoftext|>", "<|user|>", "<|observation|>")


def opener(name: str | None = None) -> str:
    """`\\n<tool_call>NAME\\n`: the 4.5/4.6 layout, a newline before the call and after the name."""
    return f"\n{MARKER}" + (f"{name}\n" if name else "")


MARKUP = (MARKER, glm_dialect.CLOSE, glm_dialect.KEY_OPEN, glm_dialect.KEY_CLOSE, glm_dialect.VALUE_OPEN,
          glm_dialect.VALUE_CLOSE)
CALLS = CallSyntax("glm", opener, partial(glm_grammar, newlines=True), MARKUP)
GLM_TYPES = frozenset({"glm4_moe", "glm4_moe_lite"})


def writes_glm47_calls(template: str) -> bool:
    """GLM-4.7's template: calls without newlines between key and value, and clear_thinking."""
    return "<arg_value>{arg-value-1}</arg_value><arg_key>" in template or "clear_thinking" in template


def recognizes(model_types: frozenset[str], template: str | None) -> bool:
    """GLM-4.5/4.6 templates (one tag per line) on either GLM MoE type; glm4_moe without one."""
    if template is None:
        return "glm4_moe" in model_types
    return bool(GLM_TYPES & model_types) and "<arg_key>" in template and not writes_glm47_calls(template)


FAMILY = Family("glm45", text_encoder(glm.encode_glm45), STOP_STRINGS, CALLS, reference_template="GLM-4.5.jinja",
                recognizes=recognizes)
