"""Anthropic-compatible endpoints: /v1/messages (streaming and not) and /v1/messages/count_tokens."""
from __future__ import annotations

import json
import uuid

from aiohttp import web

from . import sse
from .chat_request import parse_anthropic, parse_json_body
from .errors import ApiError, bad_request
from .openai_routes import STATE_KEY
from .pipeline import Delta, Finish, Progress, Queued, keepalive, prepare_chat, run_chat

THINKING_SIGNATURE = "moegate-local"  # clients replay thinking blocks with it; we accept any


def _stop_reason(finish: Finish) -> tuple[str, str | None]:
    if finish.finish_reason == "tool_calls":
        return "tool_use", None
    if finish.finish_reason == "length":
        return "max_tokens", None
    if finish.stop_string is not None:
        return "stop_sequence", finish.stop_string
    return "end_turn", None


def _usage(finish: Finish) -> dict:
    u = finish.usage
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0}


def _content_blocks(message: dict) -> list[dict]:
    blocks: list[dict] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": THINKING_SIGNATURE})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        try:
            args = json.loads(call["function"]["arguments"] or "{}")
        except json.JSONDecodeError:
            args = {}
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": args})
    return blocks


async def messages(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    spec = parse_anthropic(parse_json_body(await request.read()))
    if spec.response_format is not None:
        raise bad_request("output_config.format needs grammar-constrained decoding, which this server does "
                          "not have yet", "output_config")
    ident = f"msg_{uuid.uuid4().hex[:24]}"
    model = spec.model or state.model_id
    if not spec.stream:
        finish = None
        async for item in run_chat(state, spec):
            if isinstance(item, Finish):
                finish = item
        assert finish is not None
        stop_reason, stop_sequence = _stop_reason(finish)
        return web.json_response({"id": ident, "type": "message", "role": "assistant", "model": model,
                                  "content": _content_blocks(finish.message), "stop_reason": stop_reason,
                                  "stop_sequence": stop_sequence, "usage": _usage(finish)})
    events = run_chat(state, spec)
    first = await events.__anext__()  # prompt errors still get a real 4xx status

    async def replay():
        yield first
        async for item in events:
            yield item

    resp = await sse.open_stream(request)
    await sse.send_data(resp, {"type": "message_start", "message": {
        "id": ident, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0}}}, event="message_start")
    blocks = _BlockWriter(resp)
    try:
        async for item in keepalive(replay(), state.keepalive_seconds):
            if item is None:
                await sse.send_data(resp, {"type": "ping"}, event="ping")
            elif isinstance(item, (Queued, Progress)):
                # Unknown event types pass through the SDKs: progress during queueing and prefill.
                info = {"type": "prefill_progress"}
                if isinstance(item, Queued):
                    info["queue_position"] = item.position
                else:
                    info.update(done=item.done, total=item.total)
                await sse.send_data(resp, info, event="prefill_progress")
            elif isinstance(item, Delta):
                await blocks.delta(item.delta)
            elif isinstance(item, Finish):
                await blocks.close()
                stop_reason, stop_sequence = _stop_reason(item)
                await sse.send_data(resp, {"type": "message_delta",
                                           "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                           "usage": _usage(item)}, event="message_delta")
                await sse.send_data(resp, {"type": "message_stop"}, event="message_stop")
    except ApiError as exc:
        await sse.send_data(resp, exc.anthropic_body(), event="error")
    await resp.write_eof()
    return resp


class _BlockWriter:
    """Maps OpenAI-style deltas onto strictly sequential Anthropic content blocks."""

    def __init__(self, resp: web.StreamResponse) -> None:
        self.resp = resp
        self.index = -1
        self.kind: str | None = None
        self.call_index: int | None = None

    async def _start(self, kind: str, block: dict) -> None:
        await self.close()
        self.index += 1
        self.kind = kind
        await sse.send_data(self.resp, {"type": "content_block_start", "index": self.index, "content_block": block},
                            event="content_block_start")

    async def _delta(self, delta: dict) -> None:
        await sse.send_data(self.resp, {"type": "content_block_delta", "index": self.index, "delta": delta},
                            event="content_block_delta")

    async def close(self) -> None:
        if self.kind is None:
            return
        if self.kind == "thinking":
            await self._delta({"type": "signature_delta", "signature": THINKING_SIGNATURE})
        await sse.send_data(self.resp, {"type": "content_block_stop", "index": self.index},
                            event="content_block_stop")
        self.kind = None
        self.call_index = None

    async def delta(self, delta: dict) -> None:
        if delta.get("reasoning_content"):
            if self.kind != "thinking":
                await self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            await self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]})
        if delta.get("content"):
            if self.kind != "text":
                await self._start("text", {"type": "text", "text": ""})
            await self._delta({"type": "text_delta", "text": delta["content"]})
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call.get("id") is not None or self.call_index != call["index"]:
                await self._start("tool_use", {"type": "tool_use", "id": call.get("id") or f"toolu_{call['index']}",
                                               "name": fn.get("name", ""), "input": {}})
                self.call_index = call["index"]
            if fn.get("arguments"):
                await self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]})


async def count_tokens(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    body = parse_json_body(await request.read())
    if isinstance(body, dict) and "max_tokens" not in body:
        body = dict(body, max_tokens=1)
    spec = parse_anthropic(body)
    return web.json_response({"input_tokens": len(prepare_chat(state, spec).prompt_ids)})
