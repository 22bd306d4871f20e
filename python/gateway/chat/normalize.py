"""Turn OpenAI-style wire messages into `Message` values every encoder can rely on.

Accepted input (what the server hands us, after it converted Anthropic requests):
* `content`: a string, null, or a list of parts (`{"type": "text", "text": ...}` or bare
  strings).  Other part types (images, ...) are kept as non-text parts; text-only encoders
  reject them.
* assistant `tool_calls[].function.arguments`: a JSON string (the wire form) or an object.
  An empty string means no arguments.  Anything that does not decode to a JSON object is
  rejected: the GLM/Qwen-XML templates need a mapping and guessing would change the prompt.
* assistant reasoning under `reasoning_content`, `reasoning` or `thinking` (first non-null
  wins, like transformers' aliasing).
* role `developer` is the OpenAI name of the system role and becomes `system`.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .types import ChatEncodingError, ContentPart, Message, ToolCall

STANDARD_ROLES = frozenset({"system", "user", "assistant", "tool"})
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
# Keys we understand; anything else on a message is kept in `extras` (DSML reads a few).
_KNOWN_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name", *_REASONING_KEYS})


def _where(index: int) -> str:
    return f"messages[{index}]"


def _parse_parts(value: Sequence[Any], where: str) -> tuple[ContentPart, ...]:
    parts: list[ContentPart] = []
    for j, item in enumerate(value):
        if isinstance(item, str):
            parts.append(ContentPart("text", item))
        elif isinstance(item, Mapping):
            kind = item.get("type", "text" if "text" in item else None)
            if kind == "text":
                text = item.get("text")
                if not isinstance(text, str):
                    raise ChatEncodingError(f"{where}.content[{j}]: text part without a string 'text'")
                parts.append(ContentPart("text", text))
            elif isinstance(kind, str) and kind:
                parts.append(ContentPart(kind))
            else:
                raise ChatEncodingError(f"{where}.content[{j}]: content part without a 'type'")
        else:
            raise ChatEncodingError(f"{where}.content[{j}]: expected an object or a string")
    return tuple(parts)


def _parse_content(value: Any, where: str) -> tuple[str, tuple[ContentPart, ...] | None]:
    if value is None:
        return "", None
    if isinstance(value, str):
        return value, None
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        parts = _parse_parts(value, where)
        return "".join(p.text for p in parts if p.kind == "text"), parts
    raise ChatEncodingError(f"{where}.content: expected a string, null or a list of parts")


def decode_arguments(arguments: Any, where: str) -> tuple[dict[str, Any], str | None]:
    """Decode a tool call's `arguments` into an object; also return the original text."""
    if arguments is None:
        return {}, None
    if isinstance(arguments, Mapping):
        return dict(arguments), None
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}, None
        try:
            decoded = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise ChatEncodingError(f"{where}: arguments are not valid JSON ({exc.msg} at char {exc.pos})") from None
        if not isinstance(decoded, dict):
            raise ChatEncodingError(f"{where}: arguments must be a JSON object, got {type(decoded).__name__}")
        return decoded, arguments
    raise ChatEncodingError(f"{where}: arguments must be a JSON string or an object")


def _parse_tool_calls(value: Any, where: str) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise ChatEncodingError(f"{where}.tool_calls: expected a list")
    calls: list[ToolCall] = []
    for j, call in enumerate(value):
        cw = f"{where}.tool_calls[{j}]"
        if not isinstance(call, Mapping):
            raise ChatEncodingError(f"{cw}: expected an object")
        function = call.get("function", call)
        if not isinstance(function, Mapping):
            raise ChatEncodingError(f"{cw}.function: expected an object")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ChatEncodingError(f"{cw}.function.name: expected a non-empty string")
        arguments, text = decode_arguments(function.get("arguments"), f"{cw}.function")
        call_id = call.get("id")
        calls.append(ToolCall(call_id if isinstance(call_id, str) else None, name, arguments, text))
    return tuple(calls)


def normalize_messages(messages: Any, *, extra_roles: frozenset[str] = frozenset()) -> list[Message]:
    """Validate and normalise a `messages` list.  Raises ChatEncodingError naming the message."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise ChatEncodingError("messages: expected a list")
    if not messages:
        raise ChatEncodingError("messages: the list is empty")
    allowed = STANDARD_ROLES | extra_roles
    out: list[Message] = []
    for i, raw in enumerate(messages):
        where = _where(i)
        if not isinstance(raw, Mapping):
            raise ChatEncodingError(f"{where}: expected an object")
        role = raw.get("role")
        if role == "developer" and "developer" not in allowed:
            role = "system"
        if not isinstance(role, str) or role not in allowed:
            raise ChatEncodingError(f"{where}.role: unsupported role {role!r}")
        content, parts = _parse_content(raw.get("content"), where)
        reasoning = None
        tool_calls: tuple[ToolCall, ...] = ()
        if role == "assistant":
            for key in _REASONING_KEYS:
                value = raw.get(key)
                if value is not None:
                    if not isinstance(value, str):
                        raise ChatEncodingError(f"{where}.{key}: expected a string")
                    reasoning = value
                    break
            tool_calls = _parse_tool_calls(raw.get("tool_calls"), where)
        tool_call_id = raw.get("tool_call_id")
        name = raw.get("name")
        extras = {k: v for k, v in raw.items() if k not in _KNOWN_KEYS}
        out.append(
            Message(
                role=role,
                content=content,
                parts=parts,
                reasoning=reasoning,
                tool_calls=tool_calls,
                tool_call_id=tool_call_id if isinstance(tool_call_id, str) else None,
                name=name if isinstance(name, str) else None,
                extras=extras,
            )
        )
    return out


def require_text_only(messages: Sequence[Message]) -> None:
    """Text-only encoders cannot place images/audio: refuse them with a clear message."""
    for i, m in enumerate(messages):
        for part in m.parts or ():
            if part.kind != "text":
                raise ChatEncodingError(f"{_where(i)}.content: '{part.kind}' parts are not supported by this text-only model")


def normalize_tools(tools: Any) -> list[dict[str, Any]]:
    """Validate an OpenAI `tools` list; elements are returned unchanged (templates print them)."""
    if tools is None:
        return []
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise ChatEncodingError("tools: expected a list")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise ChatEncodingError(f"tools[{i}]: expected an object")
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function.get("name"):
            raise ChatEncodingError(f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}}")
        out.append(dict(tool))
    return out


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]
