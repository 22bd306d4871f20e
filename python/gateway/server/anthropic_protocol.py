"""The Anthropic Messages API's protocol: request bodies into a ChatSpec, and the exact wire payloads.

Parsing translates Anthropic messages, tools and tool_choice into the OpenAI chat form, so
everything after this point speaks one dialect.  Writing follows docs/reference/gateway-wire.md
§2.2: strictly sequential content blocks indexed 0, 1, 2..., a thinking block closed with a
signature, tool_use started with `input: {}`.  The builders are plain dicts (no I/O), so tests
feed them to the SDK's own stream accumulator; `MessagesStream` is what serving.stream writes.
"""
from __future__ import annotations

import json
from typing import Any

from ..generate import ProgressEvent
from .errors import ApiError, bad_request
from .pipeline import Delta, Finish, Queued, Usage
from .serving import Frame, StreamWriter
from .spec import (
    MIN_THINKING_BUDGET,
    ChatSpec,
    Kind,
    apply_tool_choice,
    check_fields,
    check_tools,
    expect,
    field_of,
    json_format,
    no_schema_member,
    positive_int,
    sampling_params,
    stop_list,
)

THINKING_SIGNATURE = "moegate-local"  # clients replay thinking blocks with it; any is accepted back


# --------------------------------------------------------------------------- parse

# What a text-only model is told in place of a picture or a file a tool returned: an agent's
# tool (Claude Code's Read on a screenshot, say) must not fail the whole loop with a 400.
_OMITTED_BLOCK = "[{kind} omitted: this model reads text only]"


def _text_of_blocks(content: Any, where: str, placeholders: bool = False) -> str:
    """The text of a string or a list of text blocks.  With `placeholders` (tool results),
    image and document blocks become a short note instead of an error."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    expect(content, list, where)
    parts = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(expect(block.get("text", ""), str, where))
        elif placeholders and kind in ("image", "document"):
            parts.append(_OMITTED_BLOCK.format(kind=kind))
        else:
            raise bad_request(f"{where}: only text blocks are supported here", where)
    return "".join(parts)


# Members of a content block as the OpenAPI document types them, whatever the block's type: a
# member is typed where it is read and also where it is not (a "signature" on a text block).
_BLOCK_FIELDS: dict[str, Kind] = {"text": str, "thinking": str, "signature": str, "id": str, "name": str,
                                  "input": dict, "tool_use_id": str, "is_error": bool, "content": (str, list)}


def anthropic_messages_to_openai(body: dict) -> list[dict]:
    out: list[dict] = []
    system = _text_of_blocks(body.get("system"), "system")
    if system:
        out.append({"role": "system", "content": system})
    messages = expect(body.get("messages"), list, "messages")
    if not messages:
        raise bad_request("'messages' must not be empty", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_request(f"messages[{i}].role must be 'user' or 'assistant'", "messages")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        expect(content, list, f"messages[{i}].content")
        for j, block in enumerate(content):
            if isinstance(block, dict):
                check_fields(block, _BLOCK_FIELDS, f"messages[{i}].content[{j}].")
        if m["role"] == "user":
            text: list[str] = []
            for block in content:
                kind = block.get("type") if isinstance(block, dict) else None
                if kind == "text":
                    text.append(expect(block.get("text", ""), str, "messages"))
                elif kind == "tool_result":
                    result = block.get("content", "")
                    body_text = _text_of_blocks(result, f"messages[{i}].content.tool_result", placeholders=True)
                    if field_of(block, "is_error", bool, False, param="messages"):
                        body_text = f"Error: {body_text}"
                    out.append({"role": "tool", "tool_call_id": field_of(block, "tool_use_id", str, "",
                                                                         param="messages"),
                                "content": body_text})
                else:
                    raise bad_request(f"messages[{i}]: content block type '{kind}' is not supported", "messages")
            if text:
                out.append({"role": "user", "content": "".join(text)})
        else:
            msg: dict = {"role": "assistant", "content": None}
            texts, reasoning, calls = [], [], []
            for block in content:
                kind = block.get("type") if isinstance(block, dict) else None
                if kind == "text":
                    texts.append(expect(block.get("text", ""), str, "messages"))
                elif kind == "thinking":
                    reasoning.append(expect(block.get("thinking", ""), str, "messages"))
                elif kind == "redacted_thinking":
                    continue
                elif kind == "tool_use":
                    name = expect(block.get("name"), str, "messages")
                    calls.append({"id": field_of(block, "id", str, "", param="messages"), "type": "function",
                                  "function": {"name": name,
                                               "arguments": json.dumps(field_of(block, "input", dict, {},
                                                                                param="messages"),
                                                                       ensure_ascii=False)}})
                else:
                    raise bad_request(f"messages[{i}]: content block type '{kind}' is not supported", "messages")
            if texts:
                msg["content"] = "".join(texts)
            if reasoning:
                msg["reasoning_content"] = "".join(reasoning)
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


# Fields accepted without acting on them: type-checked all the same.
MESSAGES_UNUSED_FIELDS: dict[str, Kind] = {"metadata": dict, "service_tier": str, "container": str,
                                           "mcp_servers": list, "context_management": dict}


def parse_anthropic(body: Any) -> ChatSpec:
    expect(body, dict, "body")
    check_fields(body, MESSAGES_UNUSED_FIELDS)
    check_fields(field_of(body, "metadata", dict, {}), {"user_id": str}, "metadata.")
    spec = ChatSpec(messages=anthropic_messages_to_openai(body), model=field_of(body, "model", str, ""))
    tools = []
    for i, tool in enumerate(field_of(body, "tools", list, [])):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise bad_request(f"tools[{i}].name is required", "tools")
        if tool.get("type") not in (None, "custom"):
            continue  # a server tool (web_search_..., code_execution_...): nothing here runs it
        tools.append({"type": "function", "function": {
            "name": tool["name"], "description": field_of(tool, "description", str, "", param=f"tools[{i}].description"),
            "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}})
    spec.tools = check_tools(tools)
    choice = body.get("tool_choice")
    if choice is not None:
        expect(choice, dict, "tool_choice")
        kind = field_of(choice, "type", str, param="tool_choice")  # a dict here was a TypeError (500)
        mapped: Any = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
        if kind == "tool":
            mapped = {"type": "function", "function": {"name": choice.get("name")}}
        if mapped is None:
            raise bad_request("'tool_choice.type' must be auto, any, tool or none", "tool_choice")
        apply_tool_choice(spec, mapped)
        spec.parallel_tool_calls = not field_of(choice, "disable_parallel_tool_use", bool, False,
                                                param="tool_choice.disable_parallel_tool_use")
    expect(body.get("max_tokens"), int, "max_tokens")  # required here
    spec.max_tokens = positive_int(body, "max_tokens")
    spec.sampling = sampling_params({k: body.get(k) for k in ("temperature", "top_p", "top_k")})
    spec.stop = stop_list(body.get("stop_sequences"), "stop_sequences", single_string=False)
    spec.stream = field_of(body, "stream", bool, False)
    spec.ignore_eos = field_of(body, "ignore_eos", bool, False)
    thinking = body.get("thinking")
    if thinking is not None:
        expect(thinking, dict, "thinking")
        kind = thinking.get("type")
        if kind not in ("enabled", "adaptive", "disabled"):
            raise bad_request("'thinking.type' must be enabled, adaptive or disabled", "thinking")
        spec.thinking = kind != "disabled"
        display = field_of(thinking, "display", str, param="thinking.display")
        if display not in (None, "summarized", "omitted"):
            raise bad_request("'thinking.display' must be summarized or omitted", "thinking.display")
        spec.omit_thinking = display == "omitted"
        spec.thinking_budget = thinking_budget(thinking, kind, spec.max_tokens or 0)
    config = field_of(body, "output_config", dict)
    if config is not None:
        spec.reasoning_effort = field_of(config, "effort", str, param="output_config.effort")
        fmt = config.get("format")
        if fmt is not None:
            expect(fmt, dict, "output_config.format")
            if fmt.get("type") == "json_schema":
                if fmt.get("schema") is None:
                    raise bad_request("'output_config.format' json_schema needs a 'schema'", "output_config.format")
                spec.response_format = json_format(fmt.get("schema"), "output_config.format")
            elif fmt.get("type") in ("text", "json_object"):
                no_schema_member(fmt, "schema", "output_config.format")
                if fmt["type"] == "json_object":
                    spec.response_format = json_format(None, "output_config.format")
            else:
                raise bad_request("'output_config.format.type' must be json_schema", "output_config.format")
    return spec


def thinking_budget(thinking: dict, kind: str, max_tokens: int) -> int | None:
    """thinking.budget_tokens checked as Anthropic does: required with type "enabled", at least
    1024 and below max_tokens.  The reasoning is closed when it is spent (thinking_budget.py)."""
    budget = field_of(thinking, "budget_tokens", int, param="thinking.budget_tokens")
    if kind == "disabled":
        return None
    if budget is None:
        if kind == "enabled":
            raise bad_request("'thinking.budget_tokens' is required when thinking is enabled",
                              "thinking.budget_tokens")
        return None
    if budget < MIN_THINKING_BUDGET:
        raise bad_request(f"'thinking.budget_tokens' must be at least {MIN_THINKING_BUDGET}", "thinking.budget_tokens")
    if budget >= max_tokens:
        raise bad_request(f"'thinking.budget_tokens' ({budget}) must be less than 'max_tokens' ({max_tokens})",
                          "thinking.budget_tokens")
    return budget


def anthropic_tool_id(call_id: str) -> str:
    """Anthropic tool-use ids start with "toolu_"; the parser's are "call_<hex>" (kept as they come
    when a client already sent one)."""
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


def anthropic_stop_reason(finish_reason: str, stop_string: str | None) -> tuple[str, str | None]:
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if stop_string is not None:
        return "stop_sequence", stop_string
    return "end_turn", None


def anthropic_content(message: dict, omit_thinking: bool = False) -> list[dict]:
    """Non-streaming content blocks: thinking, text, then tool_use blocks.  `omit_thinking`
    (thinking.display "omitted") keeps the thinking block but not its text."""
    blocks: list[dict] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": "" if omit_thinking else message["reasoning_content"],
                       "signature": THINKING_SIGNATURE})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        try:
            args = json.loads(call["function"]["arguments"] or "{}")
        except json.JSONDecodeError:
            args = {}
        if not isinstance(args, dict):
            args = {"value": args}
        blocks.append({"type": "tool_use", "id": anthropic_tool_id(call["id"]), "name": call["function"]["name"],
                       "input": args})
    return blocks


Event = tuple[str, dict]  # (SSE event name, data)


class AnthropicBlocks:
    """Maps OpenAI-style deltas onto strictly sequential Anthropic content-block events."""

    def __init__(self, omit_thinking: bool = False) -> None:
        self.omit_thinking = omit_thinking  # thinking.display "omitted": open the block, send no text
        self.index = -1
        self.kind: str | None = None
        self.call_index: int | None = None

    def _start(self, kind: str, block: dict) -> list[Event]:
        events = self.close()
        self.index += 1
        self.kind = kind
        events.append(("content_block_start", {"type": "content_block_start", "index": self.index,
                                               "content_block": block}))
        return events

    def _delta(self, delta: dict) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def close(self) -> list[Event]:
        """Ends the open block, if any."""
        if self.kind is None:
            return []
        events: list[Event] = []
        if self.kind == "thinking":
            events.append(self._delta({"type": "signature_delta", "signature": THINKING_SIGNATURE}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.kind = None
        self.call_index = None
        return events

    def delta(self, delta: dict) -> list[Event]:
        events: list[Event] = []
        if delta.get("reasoning_content"):
            if self.kind != "thinking":
                events += self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            if not self.omit_thinking:
                events.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
        if delta.get("content"):
            if self.kind != "text":
                events += self._start("text", {"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if self.kind != "tool_use" or self.call_index != call["index"]:
                events += self._start("tool_use", {"type": "tool_use",
                                                   "id": anthropic_tool_id(call.get("id") or str(call["index"])),
                                                   "name": fn.get("name") or "", "input": {}})
                self.call_index = call["index"]
            if fn.get("arguments"):
                events.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return events


def anthropic_message_start(ident: str, model: str, input_tokens: int) -> Event:
    return ("message_start", {"type": "message_start", "message": {
        "id": ident, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0}}})


def anthropic_message_end(stop_reason: str, stop_sequence: str | None, usage: dict) -> list[Event]:
    return [("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                               "usage": usage}),
            ("message_stop", {"type": "message_stop"})]


def anthropic_usage(usage: Usage) -> dict:
    # Anthropic counts cache reads apart from input_tokens.
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "output_tokens": usage.completion_tokens,
            "cache_read_input_tokens": usage.cached_tokens, "cache_creation_input_tokens": 0}


def message_reply(ident: str, model: str, finish: Finish, omit_thinking: bool) -> dict:
    """The non-streaming reply."""
    stop_reason, stop_sequence = anthropic_stop_reason(finish.finish_reason, finish.stop_string)
    return {"id": ident, "type": "message", "role": "assistant", "model": model,
            "content": anthropic_content(finish.message, omit_thinking),
            "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": anthropic_usage(finish.usage)}


class MessagesStream(StreamWriter):
    """message_start, content blocks, message_delta + message_stop; ping while waiting; an
    `error` event after the stream opened."""

    def __init__(self, ident: str, model: str, input_tokens: int, omit_thinking: bool) -> None:
        self.ident, self.model, self.input_tokens = ident, model, input_tokens
        self.blocks = AnthropicBlocks(omit_thinking)

    def start(self) -> list[Frame]:
        return [anthropic_message_start(self.ident, self.model, self.input_tokens)]

    def waiting(self, item: Queued | ProgressEvent | None) -> list[Frame]:
        if item is None:
            return [("ping", {"type": "ping"})]
        # Unknown event types pass through the SDKs (docs/reference/gateway-wire.md §5.2).
        if isinstance(item, Queued):
            return [("prefill_progress", {"type": "prefill_progress", "queue_ahead": item.ahead})]
        event: dict[str, object] = {"type": "prefill_progress", "done": item.done, "total": item.total}
        if item.layer is not None:
            event.update(layer=item.layer, n_layers=item.n_layers, window=item.window)
        return [("prefill_progress", event)]

    def item(self, item: object) -> list[Frame]:
        if isinstance(item, Delta):
            return list(self.blocks.delta(item.delta))
        if isinstance(item, Finish):
            stop_reason, stop_sequence = anthropic_stop_reason(item.finish_reason, item.stop_string)
            return [*self.blocks.close(), *anthropic_message_end(stop_reason, stop_sequence,
                                                                   anthropic_usage(item.usage))]
        return []

    def error(self, exc: ApiError) -> list[Frame]:
        return [("error", exc.anthropic_body())]
