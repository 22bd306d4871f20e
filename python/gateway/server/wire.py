"""Wire shapes of both APIs, as plain dicts (no I/O, so tests can feed them to the SDKs' own
stream accumulators).

OpenAI chunks follow docs/reference/gateway-wire.md §2.1: every chunk carries `object`,
the same `id`, `created`, `model` and `choices[].index`; a tool call's id/type/name come once, in
its first fragment.  Anthropic events follow §2.2: strictly sequential content blocks indexed
0, 1, 2..., a thinking block closed with a signature, tool_use started with `input: {}`.
"""
from __future__ import annotations

import json

THINKING_SIGNATURE = "moegate-local"  # clients replay thinking blocks with it; any is accepted back


class OpenAIChunks:
    """Builds `chat.completion.chunk` objects for one response."""

    def __init__(self, ident: str, created: int, model: str, mirror_reasoning: bool = False) -> None:
        self.ident, self.created, self.model = ident, created, model
        self.mirror_reasoning = mirror_reasoning
        self.index = 0  # the choice being streamed (n > 1 streams the choices one after another)

    def _base(self, choices: list[dict]) -> dict:
        return {"id": self.ident, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": choices}

    def role(self) -> dict:
        return self.delta({"role": "assistant", "content": None})

    def delta(self, delta: dict, logprobs: list[dict] | None = None) -> dict:
        if self.mirror_reasoning and "reasoning_content" in delta:
            delta = dict(delta, reasoning=delta["reasoning_content"])
        return self._base([{"index": self.index, "delta": delta,
                            "logprobs": {"content": logprobs} if logprobs else None, "finish_reason": None}])

    def finish(self, finish_reason: str) -> dict:
        return self._base([{"index": self.index, "delta": {}, "logprobs": None, "finish_reason": finish_reason}])

    def usage(self, usage: dict) -> dict:
        return dict(self._base([]), usage=usage)


def openai_message(message: dict, mirror_reasoning: bool = False) -> dict:
    """The non-streaming `choices[0].message` from the parser's final message."""
    out = {"role": "assistant", "content": message.get("content")}
    if message.get("reasoning_content") is not None:
        out["reasoning_content"] = message["reasoning_content"]
        if mirror_reasoning:
            out["reasoning"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


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
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": args})
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
                                                   "id": call.get("id") or f"toolu_{call['index']}",
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
