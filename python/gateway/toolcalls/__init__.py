"""Streaming tool-call parsers for the gateway (toolcall contract, dialects dsml/glm/qwen_xml/hermes).

    from gateway.toolcalls import make_parser
    p = make_parser("glm", tools, in_reasoning=False)
    for text in pieces:
        deltas = p.feed(text)          # OpenAI stream `delta` dicts
    deltas = p.finish("stop")          # text held back, calls from the reasoning
    p.message()                        # the final assistant message
    p.counters                         # reasoning_calls_delivered, reasoning_calls_kept_as_text, ...

One streaming core (core.py) holds the state machine; each dialect (dialects/*.py) is a small
description: its block marker and a block parser for its argument syntax.  How a chat family
forces a call in its dialect (the opener the server prefills) is that family's record
(gateway.families).  Design decisions are documented in core.py.

Notes for the server:

* Feed the detokenised text with the tool markers kept (they are special tokens in Qwen/GLM),
  but do not feed the stop token's own text (e.g. DeepSeek's EOS): it would become content.
* `finish(reason)`: only "stop" (stop token or stop string) delivers calls written inside the
  reasoning; pass "length", "cancelled", ... otherwise.  Calls in the answer never depend on it.
* `parser.tool_calls_emitted > 0` means the response's finish_reason should be "tool_calls"
  (it does not count `parser.failed_calls`, which only a streamed response can have).
* Pass `stream_long_values=True` for streamed responses, never for whole ones (see make_parser).
* `message()["content"]` is None when no visible text remains (only calls, or reasoning that
  never closed); `reasoning_content` is omitted when there was none.  Both are trimmed.
* Call ids are deterministic for a given output; pass `id_salt` (e.g. the request id) so ids
  differ between requests.
* `counters` can be summed into /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .blocks import BlockParser
from .core import StreamParser, TrimWriter
from .dialects import dsml, glm, hermes, qwen_xml
from .schema_coerce import ToolCatalog, coerce, schema_types


@dataclass(frozen=True)
class Dialect:
    """What the core needs to know about one tool-call syntax."""

    name: str
    marker: str  # the string that opens a call block
    block: type[BlockParser]  # reads one block, from its marker on


DIALECTS: dict[str, Dialect] = {d.name: d for d in (
    Dialect("dsml", dsml.MARKER, dsml.DsmlBlock),
    Dialect("glm", glm.MARKER, glm.GlmBlock),
    Dialect("qwen_xml", qwen_xml.MARKER, qwen_xml.QwenXmlBlock),
    Dialect("hermes", hermes.MARKER, hermes.HermesBlock),
)}


def _dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call dialect {name!r}; "
                         f"expected one of {', '.join(sorted(DIALECTS))}") from None


def make_parser(dialect: str | None, tools: list[dict[str, Any]] | None,
                in_reasoning: bool = False, *, start_in_call: str | None = None,
                id_salt: str = "", stream_long_values: bool = False) -> StreamParser:
    """A streaming parser for one completion.

    dialect        "dsml", "glm", "qwen_xml" or "hermes"; None only splits reasoning.
    tools          the request's OpenAI tools list; empty/None parses no calls at all.
    in_reasoning   the prompt already opened <think> (the output starts inside reasoning).
    start_in_call  the exact text the server prefilled to force a call (the family's opener); the
                   output is read as if it followed that text, which itself is never shown.
                   The output then starts in the answer, whatever `in_reasoning` says.
    id_salt        mixed into the deterministic call ids; pass something unique per request.
    stream_long_values
                   for streamed responses only: a call whose raw string value grows past
                   core.STREAM_AFTER_CHARS starts streaming before its block is checked.  Off
                   (the default, for whole responses), the contract holds exactly: a block is a
                   call only once it is complete and well formed, whatever its length.  On, a
                   block that then fails leaves a *failed call* in the stream (core.py's module
                   docstring says exactly what the stream shows).
    """
    if dialect is None:
        return StreamParser(None, None, tools, in_reasoning, start_in_call, id_salt)
    spec = _dialect(dialect)
    return StreamParser(spec.marker, spec.block, tools, in_reasoning, start_in_call, id_salt,
                        stream_long_values=stream_long_values)


__all__ = ["DIALECTS", "Dialect", "StreamParser", "ToolCatalog", "TrimWriter", "coerce",
           "make_parser", "schema_types"]
