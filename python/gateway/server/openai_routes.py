"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import replace
from typing import TypeVar

from aiohttp import web

from ..generate import GenerationResult, TextEvent
from ..sampling import SamplingParams
from . import constrained, sse
from .chat_request import (MAX_CHOICES, ChatSpec, _int, _sampling, _stop_list, extension_format, parse_json_body,
                           parse_openai_chat)
from .errors import ApiError, bad_request
from .pipeline import (ChatRun, Delta, Finish, JobRun, Usage, generation_request, keepalive, send_waiting_comment,
                       start_chat_async)
from .state import ServerState
from .wire import OpenAIChunks, openai_message

STATE_KEY = web.AppKey("state", ServerState)
log = logging.getLogger("moegate.server")
R = TypeVar("R", ChatRun, JobRun)  # a queued choice (closeable)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    spec = parse_openai_chat(parse_json_body(await request.read()))
    ident = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    model = spec.model or state.model_id
    first = await start_chat_async(state, spec, id_salt=ident)  # 400/429 here, before any response is opened
    runs = one_after_another(first, lambda i: start_chat_async(
        state, replace(spec, sampling=choice_sampling(spec.sampling, i)), id_salt=f"{ident}-{i}"), spec.n)
    try:
        if spec.stream:
            return await _stream_chat(request, state, spec, runs, OpenAIChunks(ident, created, model,
                                                                             state.reasoning_field_mirror))
        choices: list[dict] = []
        usage = Usage()
        async with aclosing(runs) as numbered:
            async for index, run in numbered:
                logprobs: list[dict] = []
                finish: Finish | None = None
                async with aclosing(run.events()) as events:
                    async for item in events:
                        if isinstance(item, Delta):
                            logprobs += item.logprobs
                        elif isinstance(item, Finish):
                            finish = item
                assert finish is not None
                choices.append({"index": index,
                                "message": openai_message(finish.message, state.reasoning_field_mirror),
                                "finish_reason": finish.finish_reason,
                                "logprobs": {"content": logprobs} if spec.sampling.logprobs else None})
                usage = _add_choice_usage(usage, finish.usage, index)
        return web.json_response({"id": ident, "object": "chat.completion", "created": created, "model": model,
                                  "choices": choices, "usage": usage.openai()})
    finally:
        first.close()


def choice_sampling(sampling: SamplingParams, index: int) -> SamplingParams:
    """With a seed, choice i samples with seed + i: the choices differ and each one reproduces."""
    return sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + index)


async def one_after_another(first: R, start: Callable[[int], Awaitable[R]], n: int) -> AsyncIterator[tuple[int, R]]:
    """The n choices of a request in the single slot: choice i > 0 is queued (`start(i)`) only
    when the one before has finished (the slot still holds the prompt, so it prefills nothing
    new), and closed when the consumer moves on.  `first` is the caller's to close."""
    yield 0, first
    for index in range(1, n):
        run = await start(index)
        try:
            yield index, run
        finally:
            run.close()


def _add_choice_usage(total: Usage, choice: Usage, index: int) -> Usage:
    """The prompt counts once (as OpenAI reports n > 1); completion tokens add up."""
    if index == 0:
        return Usage(choice.prompt_tokens, choice.completion_tokens, choice.cached_tokens)
    return Usage(total.prompt_tokens, total.completion_tokens + choice.completion_tokens, total.cached_tokens)


async def _stream_chat(request: web.Request, state: ServerState, spec: ChatSpec,
                       runs: AsyncIterator[tuple[int, ChatRun]], chunks: OpenAIChunks) -> web.StreamResponse:
    resp = await sse.open_stream(request)
    usage = Usage()
    try:
        async with aclosing(runs) as numbered:
            async for index, run in numbered:
                chunks.index = index
                await sse.send_data(resp, chunks.role())
                async with aclosing(keepalive(run.events(), state.keepalive_seconds)) as items:
                    async for item in items:
                        if await send_waiting_comment(resp, item):
                            continue
                        if isinstance(item, Delta):
                            if item.delta or item.logprobs:
                                await sse.send_data(resp, chunks.delta(item.delta, item.logprobs))
                        elif isinstance(item, Finish):
                            await sse.send_data(resp, chunks.finish(item.finish_reason))
                            usage = _add_choice_usage(usage, item.usage, index)
        if spec.include_usage:
            await sse.send_data(resp, chunks.usage(usage.openai()))
    except ApiError as exc:  # the status line is gone: the error travels in the stream (§2.3)
        await sse.send_data(resp, exc.openai_body())
    except ConnectionResetError:
        raise
    except Exception as exc:  # a bug after the stream opened: report it in the stream, keep serving
        log.exception("error while streaming %s", chunks.ident)
        await sse.send_data(resp, ApiError(500, f"internal error: {type(exc).__name__}").openai_body())
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
    n = _int(body, "n", 1)
    if n is None or not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"'n' must be between 1 and {MAX_CHOICES}", "n")
    max_tokens = _int(body, "max_tokens", 16)
    if max_tokens is None or max_tokens < 1:
        raise bad_request("'max_tokens' must be at least 1", "max_tokens")
    sampling = _sampling({k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")})
    logprobs_n = body.get("logprobs")
    if isinstance(logprobs_n, int) and not isinstance(logprobs_n, bool) and logprobs_n > 0:
        sampling.logprobs, sampling.top_logprobs = True, min(logprobs_n, 20)
    stop = _stop_list(body.get("stop"), "stop")
    fmt = extension_format(body)

    async def job(index: int) -> JobRun:
        """Choice `index` (seed + index, its own grammar state), queued now."""
        req = generation_request(state, ids, max_tokens, choice_sampling(sampling, index), stop,
                                 ignore_eos=bool(body.get("ignore_eos", False)))
        if fmt is not None:  # vLLM's guided_* / llama.cpp's grammar: the continuation follows it
            constraint = await asyncio.to_thread(constrained.build_reply_constraint, state, fmt, req.stop_token_ids)
            req.stop_strings = ()  # the grammar decides where the text ends
            req.token_mask = constraint.token_mask_hook(req.max_tokens)
        return JobRun(state, req)

    echo_text = state.tokenizer.decode(ids) if body.get("echo") else ""
    ident = f"cmpl-{uuid.uuid4().hex[:24]}"
    created, model = int(time.time()), str(body.get("model") or state.model_id)
    want_logprobs = sampling.logprobs

    def choice(index: int, text: str, finish: str | None, lps: list[TextEvent] | None = None) -> dict:
        return {"index": index, "text": text,
                "logprobs": _completion_logprobs(state, lps) if want_logprobs else None, "finish_reason": finish}

    def finish_of(r: GenerationResult) -> str:
        return "length" if r.finish_reason == "length" else "stop"

    first = await job(0)  # 400/429 here, before any response is opened

    try:
        if not body.get("stream"):
            choices, usage = [], Usage()
            async with aclosing(one_after_another(first, job, n)) as runs:
                async for index, run in runs:
                    text, events, result = [echo_text], [], None
                    async with aclosing(run.events()) as items:
                        async for item in items:
                            if isinstance(item, TextEvent):
                                text.append(item.text)
                                events.append(item)
                            elif isinstance(item, GenerationResult):
                                result = item
                    assert result is not None
                    choices.append(choice(index, "".join(text), finish_of(result), events))
                    usage = _add_choice_usage(usage, Usage.of(result), index)
            return web.json_response({"id": ident, "object": "text_completion", "created": created, "model": model,
                                      "choices": choices, "usage": usage.openai()})
        resp = await sse.open_stream(request)
        base = {"id": ident, "object": "text_completion", "created": created, "model": model}
        usage = Usage()
        try:
            async with aclosing(one_after_another(first, job, n)) as runs:
                async for index, run in runs:
                    if echo_text:
                        await sse.send_data(resp, dict(base, choices=[choice(index, echo_text, None, [])]))
                    async with aclosing(keepalive(run.events(), state.keepalive_seconds)) as items:
                        async for item in items:
                            if item is None:
                                await sse.send_comment(resp, "keepalive")
                            elif isinstance(item, TextEvent) and (item.text or want_logprobs):
                                await sse.send_data(resp, dict(base, choices=[choice(index, item.text, None, [item])]))
                            elif isinstance(item, GenerationResult):
                                await sse.send_data(resp, dict(base, choices=[choice(index, "", finish_of(item), [])]))
                                usage = _add_choice_usage(usage, Usage.of(item), index)
            opts = body.get("stream_options") or {}
            if isinstance(opts, dict) and opts.get("include_usage"):
                await sse.send_data(resp, dict(base, choices=[], usage=usage.openai()))
        except ApiError as exc:
            await sse.send_data(resp, exc.openai_body())
        except ConnectionResetError:
            raise
        except Exception as exc:  # a bug after the stream opened: report it in the stream
            log.exception("error while streaming %s", ident)
            await sse.send_data(resp, ApiError(500, f"internal error: {type(exc).__name__}").openai_body())
        await sse.send_data(resp, "[DONE]")
        await resp.write_eof()
        return resp
    finally:
        first.close()


def _completion_logprobs(state: ServerState, events: list[TextEvent] | None) -> dict:
    """Legacy completions logprobs: parallel lists per sampled token."""
    tokens, lps, tops, offsets = [], [], [], []
    offset = 0
    for ev in events or []:
        tok = ev.token
        if tok is None or tok.logprob is None:
            continue
        text = state.tokenizer.decode([tok.token_id])
        tokens.append(text)
        lps.append(tok.logprob)
        tops.append({state.tokenizer.decode([t]): lp for t, lp in tok.top} if tok.top else None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


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
