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
def recognizes(model_types: frozenset[str], template: str | None) -> bool:
    """Qwen3 MoE with XML `<function=` calls and no thinking (Qwen3-Coder)."""
    return ("qwen3_moe" in model_types and template is not None and "<function=" in template
            and "<think>" not in template)


FAMILY = Family("qwen3_coder", text_encoder(qwen.encode_qwen3_coder, takes_thinking=False), STOP_STRINGS, CALLS,
                reference_template="Qwen3-Coder.jinja", recognizes=recognizes)
