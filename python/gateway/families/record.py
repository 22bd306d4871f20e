"""The record that defines one chat family: how its prompts are written, where its output ends,
how it writes a tool call, and the grammar that forces one.

A family file (families/<name>.py) builds one `Family`; families/registry.py lists them.
Everything downstream (the server's request path, the tool-call parser, the constrained decoder)
reads these fields and never branches on a family's name.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..chat.normalize import require_text_only
from ..chat.types import Message
from ..structured.grammars import GrammarText, Markup, ToolSpec
from ..toolcalls.core import THINK_CLOSE, THINK_OPEN

# (messages, tools, *, add_generation_prompt, thinking, reasoning_effort, extra, chat_template)
#   -> (prompt text, the effective thinking switch)
Encoder = Callable[..., tuple[str, "bool | None"]]
# (markup, declared tools, forced name or None, parallel) -> the calls that follow the opener
CallGrammar = Callable[[Markup, Sequence[ToolSpec], "str | None", bool], GrammarText]
# (the config's model types, its chat template or None) -> whether the checkpoint speaks this family
Recognizer = Callable[[frozenset[str], "str | None"], bool]


@dataclass(frozen=True)
class CallSyntax:
    """How a family writes tool calls.

    dialect  the gateway.toolcalls dialect that reads them back (its marker and block parser)
    opener   the one text that forces a call: appended where the answer starts, to the named
             function when given (the model continues with the name otherwise)
    grammar  the constrained-decoding grammar of what may follow that opener
    markup   the tags the dialect's parser reads in the output: generated control tokens that
             spell part of one stay in the text for it (every other one is dropped)
    """

    dialect: str
    opener: Callable[[str | None], str]
    grammar: CallGrammar
    markup: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    """One chat family.

    name                the format name (`/props` chat_format, `ChatSetup.format`)
    encode              the prompt encoder (see `Encoder`)
    stop_strings        special-token texts that end generation
    calls               its tool-call syntax (None: it writes none the server knows)
    reasoning_opened    the generation prompt opens `<think>` by default (thinking=None)
    reference_template  bundled template (gateway/chat/templates) the encoder is byte-identical to
    for_template        families that render the checkpoint's own template: the family as that
                        template uses it (its call syntax and stop strings read off the template)
    recognizes          whether a checkpoint (config model types, chat template or None) speaks
                        this family (families/checkpoint.py detect_format asks each in registry
                        order; at most one hand-written family says yes, jinja is the fallback)
    reasoning_markers   the texts that open and close a reasoning block (a thinking budget
                        closes it by writing the second)
    """

    name: str
    encode: Encoder
    stop_strings: tuple[str, ...]
    calls: CallSyntax | None
    reasoning_opened: bool = False
    reference_template: str | None = None
    for_template: Callable[[Family, str, Mapping[str, Any]], Family] | None = None
    recognizes: Recognizer | None = None
    reasoning_markers: tuple[str, str] = ("<think>", "</think>")

    @property
    def tool_dialect(self) -> str | None:
        return self.calls.dialect if self.calls is not None else None

    @property
    def output_markup(self) -> tuple[str, ...]:
        """What the output parser reads (and never shows): the think tags and the call markup.
        Generated control tokens outside it are left out of the text (`Tokenizer.hidden_ids`)."""
        return (THINK_OPEN, THINK_CLOSE) + (self.calls.markup if self.calls is not None else ())

    def bind(self, chat_template: str | None, template_vars: Mapping[str, Any]) -> Family:
        """The family as one checkpoint (its template and special tokens) uses it."""
        if self.for_template is None:
            return self
        return self.for_template(self, chat_template or "", template_vars)


def text_encoder(render: Callable[..., str], *, takes_thinking: bool = True) -> Encoder:
    """The `Encoder` of a hand-written encoder for text-only messages that takes (messages, tools,
    add_generation_prompt[, thinking]) and no options."""
    def encode(messages: list[Message], tools: list[dict[str, Any]], *, add_generation_prompt: bool,
               thinking: bool | None, reasoning_effort: str | None, extra: Mapping[str, Any],
               chat_template: str | None) -> tuple[str, bool | None]:
        require_text_only(messages)
        if not takes_thinking:
            return render(messages, tools, add_generation_prompt=add_generation_prompt), None
        return render(messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking), thinking
    return encode
