"""Anthropic-compatible endpoints: /v1/messages (streaming and not) and /v1/messages/count_tokens."""
from __future__ import annotations

import sys
import uuid

from aiohttp import web

from .anthropic_protocol import MessagesStream, message_reply, parse_anthropic
from .body import read_json
from .offload import off_loop
from .pipeline import prepare_chat, start_chat
from .serving import one_after_another, stream
from .state import STATE_KEY, ServerState


async def messages(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    spec = await off_loop(parse_anthropic, await read_json(request))
    ident = f"msg_{uuid.uuid4().hex[:24]}"
    model = spec.model or state.model_id
    run = await start_chat(state, spec, id_salt=ident)  # 400/429 here, before any response is opened
    try:
        if spec.stream:
            writer = MessagesStream(ident, model, len(run.prep.prompt_ids), spec.omit_thinking)
            return await stream(request, state, one_after_another(run), writer, ident)
        return web.json_response(message_reply(ident, model, await run.finish(), spec.omit_thinking))
    finally:
        run.close()


async def count_tokens(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.json_response({"input_tokens": await off_loop(_count_tokens, state, await read_json(request))})


def _count_tokens(state: ServerState, body: object) -> int:
    if isinstance(body, dict) and "max_tokens" not in body:
        # count_tokens takes no max_tokens; any budget_tokens below it then passes, as at Anthropic.
        body = dict(body, max_tokens=sys.maxsize)
    # A count, not a generation: a prompt longer than the context is counted too.
    return len(prepare_chat(state, parse_anthropic(body), limit=False).prompt_ids)
