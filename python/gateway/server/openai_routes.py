"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models."""
from __future__ import annotations

import time
import uuid

from aiohttp import web

from ..sampling import SamplingParams
from ..generate import TextEvent, GenerationResult
from . import sse
from .chat_request import _int, _number, _sampling, _stop_list, parse_json_body, parse_openai_chat
from .errors import ApiError, bad_request
from .pipeline import Delta, Finish, Progress, Queued, generation_request, keepalive, run_chat, run_job
from .state import ServerState

STATE_KEY = web.AppKey("state", ServerState)


def _mirror_reasoning(state: ServerState, delta: dict) -> dict:
    if state.reasoning_field_mirror and "reasoning_content" in delta:
        delta = dict(delta, reasoning=delta["reasoning_content"])
    return delta


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    spec = parse_openai_chat(parse_json_body(await request.read()))
    if spec.response_format is not None:
        raise bad_request("response_format json_object/json_schema needs grammar-constrained decoding, "
                          "which this server does not have yet", "response_format")
    ident = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    model = spec.model or state.model_id
    if spec.stream:
        return await _stream_chat(request, state, spec, ident, created, model)
    message: dict = {}
    logprobs: list[dict] = []
    finish: Finish | None = None
    async for item in run_chat(state, spec):
        if isinstance(item, Delta):
            logprobs += item.logprobs
        elif isinstance(item, Finish):
            finish = item
    assert finish is not None
    message = {"role": "assistant", "content": finish.message.get("content")}
    if finish.message.get("reasoning_content") is not None:
        message["reasoning_content"] = finish.message["reasoning_content"]
        if state.reasoning_field_mirror:
            message["reasoning"] = message["reasoning_content"]
    if finish.message.get("tool_calls"):
        message["tool_calls"] = finish.message["tool_calls"]
    body = {"id": ident, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish.finish_reason,
                         "logprobs": {"content": logprobs} if spec.sampling.logprobs else None}],
            "usage": finish.usage.openai()}
    return web.json_response(body)


async def _stream_chat(request: web.Request, state: ServerState, spec, ident: str, created: int,
                       model: str) -> web.StreamResponse:
    # Prompt problems are found before the stream opens, so they still get a proper 4xx status.
    events = run_chat(state, spec)
    first = await events.__anext__()

    async def replay():
        yield first
        async for item in events:
            yield item

    resp = await sse.open_stream(request)

    def chunk(delta: dict, finish_reason: str | None = None, logprobs: list | None = None) -> dict:
        return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": {"content": logprobs} if logprobs else None,
                             "finish_reason": finish_reason}]}

    await sse.send_data(resp, chunk({"role": "assistant", "content": None}))
    try:
        async for item in keepalive(replay(), state.keepalive_seconds):
            if item is None:
                await sse.send_comment(resp, "keepalive")
            elif isinstance(item, Queued):
                if item.position:
                    await sse.send_comment(resp, f"queued position={item.position}")
            elif isinstance(item, Progress):
                await sse.send_comment(resp, f"prefill {item.done}/{item.total}")
            elif isinstance(item, Delta):
                if item.delta or item.logprobs:
                    await sse.send_data(resp, chunk(_mirror_reasoning(state, item.delta), None, item.logprobs))
            elif isinstance(item, Finish):
                await sse.send_data(resp, chunk({}, item.finish_reason))
                if spec.include_usage:
                    await sse.send_data(resp, {"id": ident, "object": "chat.completion.chunk", "created": created,
                                               "model": model, "choices": [], "usage": item.usage.openai()})
    except ApiError as exc:
        await sse.send_data(resp, exc.openai_body())
    await sse.send_data(resp, "[DONE]")
    await resp.write_eof()
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    """Legacy text completions: the prompt is raw text (or token ids), no chat template."""
    state = request.app[STATE_KEY]
    body = parse_json_body(await request.read())
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = state.tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
        if any(t < 0 or t >= state.tokenizer.vocab_size for t in ids):
            raise bad_request("'prompt' holds a token id outside the vocabulary", "prompt")
    else:
        raise bad_request("'prompt' must be a string or a list of token ids", "prompt")
    if not ids:
        raise bad_request("'prompt' is empty", "prompt")
    if len(ids) >= state.max_ctx:
        raise bad_request(f"the prompt has {len(ids)} tokens but the context holds {state.max_ctx}",
                          "prompt", code="context_length_exceeded")
    if _int(body, "n", 1) != 1:
        raise bad_request("only n=1 is supported", "n")
    max_tokens = _int(body, "max_tokens", 16)
    if max_tokens is None or max_tokens < 1:
        raise bad_request("'max_tokens' must be at least 1", "max_tokens")
    sampling = _sampling(body)
    logprobs_n = body.get("logprobs")
    if isinstance(logprobs_n, int) and not isinstance(logprobs_n, bool) and logprobs_n > 0:
        sampling.logprobs, sampling.top_logprobs = True, min(logprobs_n, 20)
    req = generation_request(state, ids, max_tokens, sampling, _stop_list(body.get("stop"), "stop"))
    echo = bool(body.get("echo", False))
    ident = f"cmpl-{uuid.uuid4().hex[:24]}"
    created, model = int(time.time()), str(body.get("model") or state.model_id)

    def choice(text: str, finish: str | None) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def usage(r: GenerationResult) -> dict:
        return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                "total_tokens": r.prompt_tokens + r.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": r.cached_tokens}}

    if not body.get("stream"):
        text, result = [state.tokenizer.decode(ids)] if echo else [], None
        async for item in run_job(state, req):
            if isinstance(item, TextEvent):
                text.append(item.text)
            elif isinstance(item, GenerationResult):
                result = item
        assert result is not None
        finish = "length" if result.finish_reason == "length" else "stop"
        return web.json_response({"id": ident, "object": "text_completion", "created": created, "model": model,
                                  "choices": [choice("".join(text), finish)], "usage": usage(result)})
    resp = await sse.open_stream(request)
    base = {"id": ident, "object": "text_completion", "created": created, "model": model}
    try:
        if echo:
            await sse.send_data(resp, dict(base, choices=[choice(state.tokenizer.decode(ids), None)]))
        async for item in keepalive(run_job(state, req), state.keepalive_seconds):
            if item is None:
                await sse.send_comment(resp, "keepalive")
            elif isinstance(item, TextEvent) and item.text:
                await sse.send_data(resp, dict(base, choices=[choice(item.text, None)]))
            elif isinstance(item, GenerationResult):
                finish = "length" if item.finish_reason == "length" else "stop"
                await sse.send_data(resp, dict(base, choices=[choice("", finish)]))
                opts = body.get("stream_options") or {}
                if isinstance(opts, dict) and opts.get("include_usage"):
                    await sse.send_data(resp, dict(base, choices=[], usage=usage(item)))
    except ApiError as exc:
        await sse.send_data(resp, exc.openai_body())
    await sse.send_data(resp, "[DONE]")
    await resp.write_eof()
    return resp


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_id, "object": "model", "created": int(state.metrics.started), "owned_by": "moegate",
            "max_model_len": state.max_ctx}


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.json_response({"object": "list", "data": [_model_card(state)]})


async def get_model(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    model_id = request.match_info["model_id"]
    if model_id != state.model_id:
        raise ApiError(404, f"model '{model_id}' is not served here; this server serves '{state.model_id}'",
                       param="model", code="model_not_found")
    return web.json_response(_model_card(state))
