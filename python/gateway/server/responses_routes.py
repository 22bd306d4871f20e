"""OpenAI Responses endpoint: POST /v1/responses, stateless (Codex CLI, `client.responses.*`).

The request is translated into the chat form (responses_protocol.parse_responses) and runs
through the same pipeline as /v1/chat/completions: queueing, cancellation when the client leaves,
keepalive comments while queued or prefilling, grammar-constrained forced calls and JSON formats.
Nothing is stored: previous_response_id and friends are refused with a 400.
"""
from __future__ import annotations

import uuid

from aiohttp import web

from .body import read_json
from .offload import off_loop
from .pipeline import start_chat
from .responses_protocol import ResponseEvents, ResponseObject, ResponsesStream, parse_responses, response_reply
from .serving import one_after_another, stream
from .state import STATE_KEY


async def create_response(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    body = await read_json(request)
    spec = await off_loop(parse_responses, body)
    ident = f"resp_{uuid.uuid4().hex[:24]}"
    response = ResponseObject(ident, spec.model or state.model_id, body,
                              temperature=spec.sampling.temperature, top_p=spec.sampling.top_p)
    run = await start_chat(state, spec, id_salt=ident)  # 400/429 here, before any response is opened
    try:
        if spec.stream:
            writer = ResponsesStream(ResponseEvents(response, spec.tool_namespaces), state.tokenizer)
            return await stream(request, state, one_after_another(run), writer, ident)
        return web.json_response(response_reply(response, await run.finish(), spec.tool_namespaces, state.tokenizer))
    finally:
        run.close()
