"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models."""
from __future__ import annotations

import time
import uuid
from contextlib import aclosing
from dataclasses import replace

from aiohttp import web

from ..generate import GenerationResult, TextEvent
from . import constrained
from .body import read_json
from .errors import ApiError, bad_request
from .offload import off_loop
from .openai_protocol import (
    ChatStream,
    Completions,
    CompletionSpec,
    CompletionStream,
    OpenAIChunks,
    add_completion_usage,
    chat_choice,
    chat_completion,
    completion_finish,
    model_card,
    openai_usage,
    parse_completion,
    parse_openai_chat,
)
from .pipeline import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    Delta,
    Finish,
    JobRun,
    Usage,
    check_context,
    check_room,
    generation_request,
    start_chat,
)
from .serving import choice_sampling, one_after_another, stream
from .spec import check_token_ids
from .state import STATE_KEY, ServerState


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    spec = await off_loop(parse_openai_chat, await read_json(request))
    ident = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    model = spec.model or state.model_id
    first = await start_chat(state, spec, id_salt=ident)  # 400/429 here, before any response is opened
    runs = one_after_another(first, lambda i: start_chat(
        state, replace(spec, sampling=choice_sampling(spec.sampling, i)), id_salt=f"{ident}-{i}"), spec.n)
    try:
        if spec.stream:
            chunks = OpenAIChunks(ident, created, model, state.reasoning_field_mirror)
            return await stream(request, state, runs, ChatStream(chunks, spec.include_usage), ident)
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
                choices.append(chat_choice(index, finish, logprobs if spec.sampling.logprobs else None,
                                           state.reasoning_field_mirror))
                usage = usage.add_choice(finish.usage, index)
        return web.json_response(chat_completion(ident, created, model, choices, usage))
    finally:
        first.close()


async def completions(request: web.Request) -> web.StreamResponse:
    """Legacy text completions: the prompt is raw text (or token ids), no chat template.  A list
    of prompts gives n choices per prompt, indexed prompt * n + choice, one after another."""
    state = request.app[STATE_KEY]
    spec = await off_loop(parse_completion, await read_json(request))
    prompt_ids, echo_texts = await off_loop(_completion_prompts, state, spec)
    stop_ids = frozenset() if spec.ignore_eos else state.stop_token_ids

    async def job(index: int) -> JobRun:
        """Choice `index` (its prompt's; seed + choice, its own grammar state), queued now."""
        constraint = None
        if spec.response_format is not None:  # vLLM's guided_* / llama.cpp's grammar: the continuation follows it
            constraint = await off_loop(constrained.build_reply_constraint, state, spec.response_format,
                                                 stop_ids)
        return JobRun(state, generation_request(state, prompt_ids[index // spec.n], spec.max_tokens,
                                                choice_sampling(spec.sampling, index % spec.n), spec.stop,
                                                stop_ids=stop_ids, constraint=constraint,
                                                default_max_tokens=COMPLETION_DEFAULT_MAX_TOKENS))

    for ids in prompt_ids[1:]:  # the first job checks its own prompt's room, the others' before it runs
        check_room(state, len(ids), spec.max_tokens, "max_tokens")
    ident = f"cmpl-{uuid.uuid4().hex[:24]}"
    out = Completions(ident, int(time.time()), spec.model or state.model_id, state.tokenizer, spec.sampling.logprobs)
    first = await job(0)  # 400/429 here, before any response is opened
    runs = one_after_another(first, job, spec.n * len(prompt_ids))
    try:
        if spec.stream:
            return await stream(request, state, runs, CompletionStream(out, echo_texts, spec.n, spec.include_usage),
                                ident)
        choices, usage = [], Usage()
        async with aclosing(runs) as numbered:
            async for index, run in numbered:
                text, events, result = [echo_texts[index // spec.n]], [], None
                async with aclosing(run.events()) as items:
                    async for item in items:
                        if isinstance(item, TextEvent):
                            text.append(item.text)
                            events.append(item)
                        elif isinstance(item, GenerationResult):
                            result = item
                assert result is not None
                choices.append(out.choice(index, "".join(text), completion_finish(result), events))
                usage = add_completion_usage(usage, Usage.of(result), index, spec.n)
        return web.json_response(out.chunk(choices, usage=openai_usage(usage)))
    finally:
        first.close()


def _completion_prompts(state: ServerState, spec: CompletionSpec) -> tuple[list[list[int]], list[str]]:
    """Every prompt as checked ids (all before anything runs), and the echoed texts (empty
    without echo).  Tokenizing runs here, off the event loop."""
    prompt_ids: list[list[int]] = []
    for i, prompt in enumerate(spec.prompts):
        if isinstance(prompt, str):
            ids = state.tokenizer.encode(prompt)
        else:
            ids = prompt
            check_token_ids(ids, state.tokenizer.vocab_size, "prompt")
        if not ids:
            raise bad_request("'prompt' is empty" if len(spec.prompts) == 1 else f"prompt[{i}] is empty", "prompt")
        check_context(state, ids, "prompt")
        prompt_ids.append(ids)
    return prompt_ids, [state.tokenizer.decode(ids) if spec.echo else "" for ids in prompt_ids]


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.json_response({"object": "list", "data": [model_card(state.model_id, state.metrics.started,
                                                                    state.max_ctx)]})


async def get_model(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    model_id = request.match_info["model_id"]
    if model_id != state.model_id:
        raise ApiError(404, f"model '{model_id}' is not served here; this server serves '{state.model_id}'",
                       param="model", code="model_not_found")
    return web.json_response(model_card(state.model_id, state.metrics.started, state.max_ctx))
