"""Qwen3-Coder: ChatML turns, XML tool calls, no reasoning mode."""
from __future__ import annotations

from ..chat import qwen
from ..structured.grammars import qwen_xml_grammar
from ..toolcalls.dialects import qwen_xml
from ..toolcalls.dialects.qwen_xml import FUNCTION, MARKER
from .qwen3 import STOP_STRINGS
from .record import CallSyntax, Family, text_encoder


def opener(name: str | None = None) -> str:
    """`<tool_call>\\n<function=NAME>\\n`, or up to the name."""
    return f"{MARKER}\n{FUNCTION}" + (f"{name}>\n" if name else "")


CALLS = CallSyntax("qwen_xml", opener, qwen_xml_grammar, (
    MARKER, qwen_xml.CLOSE, FUNCTION, qwen_xml.FUNCTION_CLOSE, qwen_xml.PARAM, qwen_xml.PARAM_CLOSE))
FAMILY = Family("qwen3_coder", text_encoder(qwen.encode_qwen3_coder, takes_thinking=False), STOP_STRINGS, CALLS,
                reference_template="Qwen3-Coder.jinja")
