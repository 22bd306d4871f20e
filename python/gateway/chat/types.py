"""Value types shared by every chat encoder: the normalised message model and the result."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ChatEncodingError(ValueError):
    """The request's messages/tools cannot be rendered (bad shape, bad tool-call arguments,
    a role the format does not accept, a template's raise_exception).  Maps to HTTP 400."""


class ChatTemplateError(RuntimeError):
    """The checkpoint's chat template itself is broken (syntax error, sandbox violation).
    This is a server configuration problem, not the client's fault."""


@dataclass(frozen=True)
class ContentPart:
    """One element of a list-form `content`.  `kind` is "text" or the part's declared type."""

    kind: str
    text: str = ""


@dataclass(frozen=True)
class ToolCall:
    """An assistant tool call from the history.

    `arguments` is always a decoded JSON object (key order kept).  `arguments_text` is the
    JSON string exactly as the client sent it (None when it arrived as an object); templates
    that insert arguments verbatim (Qwen3 hermes, DeepSeek-V3.1) use it so that the echo of a
    model's own call stays byte-identical to what the model generated."""

    id: str | None
    name: str
    arguments: dict[str, Any]
    arguments_text: str | None = None


@dataclass(frozen=True)
class Message:
    """A normalised chat message.

    `content` is the text of the message with list parts concatenated (the Hugging Face
    template convention); `parts` keeps the list form (None when content was a string or
    null) for encoders that join parts differently (DSML joins with a blank line).
    `reasoning` is None when the client sent no reasoning field (templates distinguish
    "absent" from "empty")."""

    role: str
    content: str
    parts: tuple[ContentPart, ...] | None = None
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
