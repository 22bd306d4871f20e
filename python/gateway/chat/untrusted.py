"""Client text inside a prompt: a control-token spelling in it stays text.

A chat prompt is the family's markers (its control tokens: turn openers, think tags, call markup)
around text from the request: message content, reasoning sent back, tool results, tool names,
descriptions and schemas.  Tokenising the whole render with added tokens recognised would read
`<｜User｜>` written inside a tool result as the real turn marker, so a pasted file could forge
turns.  So, before rendering, every control-token spelling inside request text is replaced by a
placeholder (one private-use character per spelling, absent from the request and the template);
the encoder renders as usual; every control token left in that render is the template's own.
`Tokenizer.encode_prompt` reads those as markers and turns each stretch between them back into
the client's text, tokenised with no control token recognised.

Nearly every request spells no control token: nothing is replaced, and the render and its ids
are exactly what they were.  A request that does spell one renders the same text, except where
a template decides something on the markup inside content (Qwen's "is this user turn a wrapped
`<tool_response>`", GLM's "does it end in `/nothink`"): there the template sees text.  The think
tags inside an assistant message's content are left alone (`KEPT_IN_ASSISTANT_CONTENT`): that
is the model's own output coming back, and the templates split an inline `<think>...</think>`
off into the reasoning.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .types import Message

KEPT_IN_ASSISTANT_CONTENT = ("<think>", "</think>")

# Placeholders: the BMP private-use area, then plane 15's.
_PLACEHOLDER_RANGES = (range(0xE000, 0xF900), range(0xF0000, 0xFFFFE))


class ControlScanner(Protocol):
    """Where a text spells a control token (gateway.tokenizer.Tokenizer is one)."""

    def find_control(self, text: str) -> list[tuple[int, int]]: ...


def _json_escaped(text: str) -> str:
    """`text` as json.dumps(ensure_ascii=True) writes it inside a string literal."""
    return json.dumps(text)[1:-1]


@dataclass(frozen=True)
class PromptText:
    """A rendered prompt.

    text          the render, as the template writes it (what /tokenize shows, what is logged)
    neutral       the same render with the client's control-token spellings still placeholders;
                  equal to `text` when there were none
    placeholders  (placeholder, original) pairs, raw and JSON-escaped, that `restore` undoes
    renamed       request strings that changed -> their neutral form (for text the server adds
                  after rendering, such as a forced call's function name)
    """

    text: str
    neutral: str
    placeholders: tuple[tuple[str, str], ...] = ()
    renamed: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def trusted(cls, text: str) -> PromptText:
        return cls(text, text)

    def restore(self, neutral_text: str) -> str:
        for placeholder, original in self.placeholders:
            neutral_text = neutral_text.replace(placeholder, original)
        return neutral_text

    def neutral_of(self, request_text: str | None) -> str | None:
        return None if request_text is None else self.renamed.get(request_text, request_text)

    def append(self, text: str, neutral: str | None = None) -> PromptText:
        """The prompt with template text added (`neutral`: its form with client strings
        neutralised, when it holds any)."""
        return dataclasses.replace(self, text=self.text + text,
                                   neutral=self.neutral + (text if neutral is None else neutral))


def _map_json(value: Any, fn: Callable[[str], str]) -> Any:
    """`value` (a JSON-like tree) with `fn` applied to every string, keys included."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        return {fn(k) if isinstance(k, str) else k: _map_json(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_json(v, fn) for v in value)
    return value


def _map_message(m: Message, fn: Callable[[str], str], content_fn: Callable[[str], str]) -> Message:
    """`m` with every client string mapped (`content_fn` for the content of assistant turns)."""
    content = content_fn if m.role == "assistant" else fn
    return dataclasses.replace(
        m,
        content=content(m.content),
        parts=None if m.parts is None else tuple(dataclasses.replace(p, text=content(p.text)) for p in m.parts),
        reasoning=None if m.reasoning is None else fn(m.reasoning),
        tool_calls=tuple(dataclasses.replace(
            c, id=None if c.id is None else fn(c.id), name=fn(c.name), arguments=_map_json(c.arguments, fn),
            arguments_text=None if c.arguments_text is None else fn(c.arguments_text)) for c in m.tool_calls),
        tool_call_id=None if m.tool_call_id is None else fn(m.tool_call_id),
        name=None if m.name is None else fn(m.name),
        extras=_map_json(m.extras, fn),
    )


def _placeholders(originals: Sequence[str], avoid: str) -> Iterator[tuple[str, str]]:
    """One placeholder per original, none of them (nor its JSON escape) found in `avoid`."""
    avoid_lower = avoid.lower()
    candidates = (chr(cp) for r in _PLACEHOLDER_RANGES for cp in r)
    for original in originals:
        for ch in candidates:
            if ch not in avoid and _json_escaped(ch) not in avoid_lower:
                yield ch, original
                break
        else:  # pragma: no cover - needs ~71,000 distinct private-use characters in one request
            raise ValueError("no free placeholder character for the request's control-token spellings")


@dataclass
class Neutralized:
    """The request with its control-token spellings replaced; `prompt(render)` completes it."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    extra: dict[str, Any]
    placeholders: tuple[tuple[str, str], ...] = ()
    renamed: dict[str, str] = field(default_factory=dict)

    def prompt(self, neutral_render: str) -> PromptText:
        if not self.placeholders:
            return PromptText.trusted(neutral_render)
        text = PromptText("", "", self.placeholders).restore(neutral_render)
        return PromptText(text, neutral_render, self.placeholders, self.renamed)


# Options a family reads from `extra` that hold client text (DSML appends the JSON reply schema).
CLIENT_EXTRA_KEYS = ("response_format",)


def neutralize(messages: list[Message], tools: list[dict[str, Any]], extra: Mapping[str, Any],
               scanner: ControlScanner, template: str = "") -> Neutralized:
    """Replace every control-token spelling in the request's strings by a placeholder.
    `template`: the text the encoder renders from (its own characters are never placeholders)."""
    found: dict[str, list[tuple[int, int]]] = {}
    found_in_content: dict[str, list[tuple[int, int]]] = {}
    seen: list[str] = []

    def scan(text: str) -> str:
        seen.append(text)
        if text not in found:
            found[text] = scanner.find_control(text)
        return text

    def scan_content(text: str) -> str:
        seen.append(text)
        if text not in found_in_content:
            found_in_content[text] = [(a, b) for a, b in scanner.find_control(text)
                                      if text[a:b] not in KEPT_IN_ASSISTANT_CONTENT]
        return text

    client_extra = {k: extra[k] for k in CLIENT_EXTRA_KEYS if k in extra}
    for m in messages:
        _map_message(m, scan, scan_content)
    _map_json(tools, scan)
    _map_json(client_extra, scan)
    spans = {t: s for t, s in found.items() if s}
    content_spans = {t: s for t, s in found_in_content.items() if s}
    if not spans and not content_spans:
        return Neutralized(list(messages), list(tools), dict(extra))

    spellings = sorted({t[a:b] for table in (spans, content_spans) for t, s in table.items() for a, b in s})
    pairs = list(_placeholders(spellings, "\n".join(seen) + "\n" + template))
    placeholder_of = {original: ch for ch, original in pairs}

    def rewrite(text: str, where: list[tuple[int, int]]) -> str:
        out, pos = [], 0
        for a, b in where:
            out += [text[pos:a], placeholder_of[text[a:b]]]
            pos = b
        out.append(text[pos:])
        return "".join(out)

    renamed: dict[str, str] = {}

    def replace(text: str) -> str:
        where = spans.get(text)
        if not where:
            return text
        renamed[text] = neutral = rewrite(text, where)
        return neutral

    def replace_content(text: str) -> str:
        where = content_spans.get(text)
        return rewrite(text, where) if where else text

    restore = tuple(pairs) + tuple((_json_escaped(ch), _json_escaped(original)) for ch, original in pairs)
    return Neutralized(
        messages=[_map_message(m, replace, replace_content) for m in messages],
        tools=_map_json(list(tools), replace),
        extra={**extra, **_map_json(client_extra, replace)},
        placeholders=restore, renamed=renamed)
