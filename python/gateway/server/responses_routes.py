"""OpenAI Responses endpoint: POST /v1/responses, stateless (Codex CLI, `client.responses.*`).

The request is translated into the chat form (chat_request.parse_responses) and runs through
the same pipeline as /v1/chat/completions: queueing, cancellation when the client leaves,
keepalive comments while queued or prefilling, grammar-constrained forced calls and JSON formats.
Nothing is stored: previous_response_id and friends are refused with a 400.
"""
from __future__ import annotations

import logging
import uuid
from contextlib import aclosing

from aiohttp import web

from . import sse
from .chat_request import parse_json_body, parse_responses, responses_function_tools
from .errors import ApiError
from .openai_routes import STATE_KEY
from .pipeline import ChatRun, Delta, Finish, Usage, keepalive, send_waiting_comment, start_chat_async
from .responses_wire import ResponseEvents, ResponseObject, output_items, responses_usage, status_of
from .state import ServerState

log = logging.getLogger("moegate.server")


def _usage(state: ServerState, usage: Usage, message: dict) -> dict:
    # The engine counts sampled tokens, not which of them were reasoning: re-tokenising the
    # reasoning text gives that share (capped at the output count in responses_usage).
    reasoning = message.get("reasoning_content") or ""
    reasoning_tokens = len(state.tokenizer.encode(reasoning)) if reasoning else 0
    return responses_usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, reasoning_tokens)


async def create_response(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    body = parse_json_body(await request.read())
    spec = parse_responses(body)
    _, namespaces = responses_function_tools(body.get("tools") or [])
    ident = f"resp_{uuid.uuid4().hex[:24]}"
    response = ResponseObject(ident, spec.model or state.model_id, body,
                              temperature=spec.sampling.temperature, top_p=spec.sampling.top_p)
    run = await start_chat_async(state, spec, id_salt=ident)  # 400/429 here, before any response is opened
    try:
        if spec.stream:
            return await _stream_response(request, state, run, ResponseEvents(response, namespaces))
        finish = await run.finish()
        status, reason = status_of(finish.finish_reason)
        return web.json_response(response.snapshot(
            status, output_items(finish.message, "incomplete" if status == "incomplete" else "completed",
                                 namespaces),
            usage=_usage(state, finish.usage, finish.message), incomplete_reason=reason))
    finally:
        run.close()


async def _stream_response(request: web.Request, state: ServerState, run: ChatRun,
                           events: ResponseEvents) -> web.StreamResponse:
    resp = await sse.open_stream(request)

    async def send(batch: list) -> None:
        for name, data in batch:
            await sse.send_data(resp, data, event=name)

    await send(events.start())
    try:
        async with aclosing(keepalive(run.events(), state.keepalive_seconds)) as items:
            async for item in items:
                if await send_waiting_comment(resp, item):
                    continue
                if isinstance(item, Delta):
                    await send(events.delta(item.delta))
                elif isinstance(item, Finish):
                    await send(events.end(item.finish_reason, _usage(state, item.usage, item.message)))
    except ApiError as exc:  # the status line is gone: the error travels in the stream
        await send(events.fail(exc.openai_body()["error"]))
    except ConnectionResetError:
        raise
    except Exception as exc:  # a bug after the stream opened: report it in the stream, keep serving
        log.exception("error while streaming %s", events.response.ident)
        await send(events.fail(ApiError(500, f"internal error: {type(exc).__name__}").openai_body()["error"]))
    await resp.write_eof()
    return resp

