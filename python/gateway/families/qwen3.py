"""Qwen3 hybrid: ChatML turns, hermes JSON tool calls.

Thinking: the model opens its own `<think>`; `thinking=False` pre-fills an empty block.
"""
from __future__ import annotations

from ..chat import qwen
from ..structured.grammars import hermes_grammar
from ..toolcalls.dialects.hermes import CLOSE, MARKER
from .record import CallSyntax, Family, text_encoder

STOP_STRINGS = ("<|im_end|>", "<|endoftext|>")


def opener(name: str | None = None) -> str:
    """Inside the JSON object, at the name's value (or past it, at the arguments)."""
    return f'{MARKER}\n{{"name": "' + (f'{name}", "arguments": ' if name else "")


CALLS = CallSyntax("hermes", opener, hermes_grammar, (MARKER, CLOSE))
def recognizes(model_types: frozenset[str], template: str | None) -> bool:
    """Qwen3 MoE with hermes JSON calls (or without a template); `<function=` templates are
    qwen3_coder's and qwen35's."""
    if "qwen3_moe" not in model_types:
        return False
    return template is None or (("<tool_call>" in template or "<|im_start|>" in template)
                                and "<function=" not in template)


FAMILY = Family("qwen3", text_encoder(qwen.encode_qwen3), STOP_STRINGS, CALLS, reference_template="Qwen3.jinja",
                recognizes=recognizes)
