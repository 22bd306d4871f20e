"""Anthropic-compatible endpoints: /v1/messages (streaming and not) and /v1/messages/count_tokens."""
from __future__ import annotations

import logging
import uuid
from contextlib import aclosing

from aiohttp import web

from . import sse
from .chat_request import parse_anthropic, parse_json_body
from .errors import ApiError
from .openai_routes import STATE_KEY
from .pipeline import ChatRun, Delta, Finish, Progress, Queued, keepalive, prepare_chat, start_chat_async
from .state import ServerState
from .wire import (AnthropicBlocks, anthropic_content, anthropic_message_end, anthropic_message_start,
                   anthropic_stop_reason)

log = logging.getLogger("moegate.server")


async def messages(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    spec = parse_anthropic(parse_json_body(await request.read()))
    ident = f"msg_{uuid.uuid4().hex[:24]}"
    model = spec.model or state.model_id
    run = await start_chat_async(state, spec, id_salt=ident)  # 400/429 here, before any response is opened
    try:
        if not spec.stream:
            finish = await run.finish()
            stop_reason, stop_sequence = anthropic_stop_reason(finish.finish_reason, finish.stop_string)
            return web.json_response({"id": ident, "type": "message", "role": "assistant", "model": model,
                                      "content": anthropic_content(finish.message, spec.omit_thinking),
                                      "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                                      "usage": finish.usage.anthropic()})
        return await _stream_messages(request, state, run, ident, model)
    finally:
        run.close()


async def _stream_messages(request: web.Request, state: ServerState, run: ChatRun, ident: str,
                           model: str) -> web.StreamResponse:
    resp = await sse.open_stream(request)

    async def send(events: list) -> None:
        for name, data in events:
            await sse.send_data(resp, data, event=name)

    await send([anthropic_message_start(ident, model, len(run.prep.prompt_ids))])
    blocks = AnthropicBlocks(run.spec.omit_thinking)
    try:
        async with aclosing(keepalive(run.events(), state.keepalive_seconds)) as items:
            async for item in items:
                if item is None:
                    await send([("ping", {"type": "ping"})])
                elif isinstance(item, Queued):
                    # Unknown event types pass through the SDKs (gateway-wire.md §5.2).
                    await send([("prefill_progress", {"type": "prefill_progress", "queue_ahead": item.ahead})])
                elif isinstance(item, Progress):
                    await send([("prefill_progress", {"type": "prefill_progress", "done": item.done,
                                                      "total": item.total})])
                elif isinstance(item, Delta):
                    await send(blocks.delta(item.delta))
                elif isinstance(item, Finish):
                    await send(blocks.close())
                    stop_reason, stop_sequence = anthropic_stop_reason(item.finish_reason, item.stop_string)
                    await send(anthropic_message_end(stop_reason, stop_sequence, item.usage.anthropic()))
    except ApiError as exc:
        await send([("error", exc.anthropic_body())])
    except ConnectionResetError:
        raise
    except Exception as exc:  # a bug after the stream opened: report it in the stream, keep serving
        log.exception("error while streaming %s", ident)
        await send([("error", ApiError(500, f"internal error: {type(exc).__name__}").anthropic_body())])
    await resp.write_eof()
    return resp


async def count_tokens(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    body = parse_json_body(await request.read())
    if isinstance(body, dict) and "max_tokens" not in body:
        body = dict(body, max_tokens=1)
    spec = parse_anthropic(body)
    return web.json_response({"input_tokens": len(prepare_chat(state, spec).prompt_ids)})
