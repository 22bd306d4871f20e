"""DeepSeek-V4: DSML prompts and tool calls (docs/reference/dsml.md).

Thinking: off by default (chat mode, the generation prompt closes `</think>`); `thinking=True` or a
reasoning_effort opens `<think>` after `<｜Assistant｜>`, the effort adding its prefix.
Options in `extra`: `effort_table` ("preview" | "0731"), `drop_thinking` (bool),
`response_format` (object, appended to the system turn).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..chat import dsml
from ..chat.types import Message
from ..structured.grammars import dsml_grammar
from ..toolcalls.dialects import dsml as dsml_dialect
from ..toolcalls.dialects.dsml import INVOKE, MARKER
from .record import CallSyntax, Family

STOP_STRINGS = (dsml.EOS, dsml.USER, dsml.ASSISTANT)


def opener(name: str | None = None) -> str:
    """The block as the reference encoder lays it out, up to the invoke's name (docs/reference/dsml.md §8.2)."""
    text = f'\n\n{MARKER}\n{INVOKE} name="'
    return f'{text}{name}">\n' if name else text


def encode(messages: list[Message], tools: list[dict[str, Any]], *, add_generation_prompt: bool,
           thinking: bool | None, reasoning_effort: str | None, extra: Mapping[str, Any],
           chat_template: str | None) -> tuple[str, bool | None]:
    think = thinking if thinking is not None else reasoning_effort not in (None, "none")
    # Client messages may not smuggle internal DSML fields (task, wo_eos, tools...).
    clean = [Message(m.role, m.content, m.parts, m.reasoning, m.tool_calls, m.tool_call_id, m.name)
             for m in messages]
    clean = dsml.attach_tools(clean, tools)
    if extra.get("response_format") is not None:
        if clean[0].role != "system":
            clean.insert(0, Message("system", ""))
        clean[0] = Message("system", clean[0].content, clean[0].parts,
                           extras={**clean[0].extras, "response_format": extra["response_format"]})
    text = dsml.encode_dsml_messages(
        clean, thinking=think, drop_thinking=bool(extra.get("drop_thinking", True)),
        reasoning_effort=reasoning_effort, effort_table=str(extra.get("effort_table", "preview")),
        add_generation_prompt=add_generation_prompt,
    )
    return text, think


CALLS = CallSyntax("dsml", opener, dsml_grammar, markup=(
    MARKER, dsml_dialect.CLOSE, INVOKE, dsml_dialect.INVOKE_CLOSE, dsml_dialect.PARAM, dsml_dialect.PARAM_CLOSE))
def recognizes(model_types: frozenset[str], template: str | None) -> bool:
    """Every DeepSeek-V4 checkpoint: its releases ship no jinja template (the encoding is code)."""
    return any(t.startswith("deepseek_v4") for t in model_types)


FAMILY = Family("dsml", encode, STOP_STRINGS, CALLS, recognizes=recognizes)
