"""One request from spec to events, shared by every API.

    ChatSpec -> the family's encoder (prompt text) -> token ids -> scheduler job (engine)
             -> TextEvents -> streaming tool-call parser (ChatOutput) -> Delta ... Finish

The events a run yields are the one vocabulary from the generation loop to the wire: Queued
(first, at once), generate.ProgressEvent while prefilling, then Delta ... Finish (chat) or
generate.TextEvent ... GenerationResult (raw completions); each API's protocol module writes them.

Everything that can be the client's fault (bad messages, context overflow, a full queue) is raised
as ApiError by `start_chat` / `JobRun(...)` *before* a route opens its response, so those errors
keep their real HTTP status even on streaming requests.

Forced tool calls (tool_choice required / named) prefill the dialect's call opener after the
prompt and start the parser inside the call; from there every token is sampled under the call's
grammar (server/constrained.py), as is every token of a response_format JSON reply.
"""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from ..generate import GenerationRequest, GenerationResult, TextEvent
from ..sampling import SamplingParams
from ..scheduler import Done, Failed, QueueFull, ShuttingDown
from . import constrained
from .errors import ApiError, bad_request
from .offload import off_loop
from .spec import ChatSpec
from .state import ServerState
from .thinking_budget import ThinkingBudget

log = logging.getLogger("moegate.server")


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @classmethod
    def of(cls, result: GenerationResult | None) -> "Usage":
        if result is None:
            return cls()
        return cls(result.prompt_tokens, result.completion_tokens, result.cached_tokens)

    def add_choice(self, choice: "Usage", index: int) -> "Usage":
        """With choice `index` added: the prompt counts once (as OpenAI reports n > 1),
        completion tokens add up."""
        if index == 0:
            return Usage(choice.prompt_tokens, choice.completion_tokens, choice.cached_tokens)
        return Usage(self.prompt_tokens, self.completion_tokens + choice.completion_tokens, self.cached_tokens)


@dataclass
class Queued:
    """Always the first event, sent at once: lets a streaming route open its response (and start
    keepalives) before a long wait.  `ahead` counts jobs that run first (0: starting now)."""
    ahead: int
    prompt_tokens: int


@dataclass
class Delta:
    """One OpenAI-style delta of the parsed output ({"content"}, {"reasoning_content"} or
    {"tool_calls"}), with the logprobs of the token that produced it."""

    delta: dict
    logprobs: list[dict] = field(default_factory=list)


@dataclass
class Finish:
    """The last event of a chat run: the whole parsed message and why it ended."""

    finish_reason: str  # stop | length | tool_calls
    usage: Usage
    message: dict
    stop_string: str | None = None


@dataclass
class PreparedChat:
    """What a chat request needs beyond its spec: the prompt as ids, how to read the output."""

    prompt_ids: list[int]
    dialect: str | None
    in_reasoning: bool
    start_in_call: str | None  # the forced-call opener appended to the prompt, if any
    constraint: Any = None  # gateway.structured.Constraint when every token is grammar-constrained


# OpenAI's default max_tokens of the legacy completions endpoint.
COMPLETION_DEFAULT_MAX_TOKENS = 16


def check_context(state: ServerState, ids: list[int], param: str) -> None:
    """The one context check of a request (the engine keeps its own guard)."""
    if len(ids) >= state.max_ctx:
        raise bad_request(f"the prompt has {len(ids)} tokens but the context holds {state.max_ctx}",
                          param, code="context_length_exceeded")


def check_room(state: ServerState, prompt_tokens: int, max_tokens: int | None, param: str) -> None:
    """A max_tokens the client set must fit after the prompt, as vLLM checks it: a request that
    cannot be honoured is refused rather than cut short (docs/reference/gateway-wire.md §2.4).
    The server's own default is clamped instead (generation_request)."""
    room = state.max_ctx - prompt_tokens
    if max_tokens is not None and max_tokens > room:
        raise bad_request(f"'{param}' must be at most {max(room, 0)} here: the prompt has {prompt_tokens} tokens "
                          f"and the context holds {state.max_ctx}", param, code="context_length_exceeded")


def prepare_chat(state: ServerState, spec: ChatSpec, *, constrain: bool = False,
                 limit: bool = True) -> PreparedChat:
    """Renders and tokenises the prompt; raises ApiError for anything the client got wrong.
    `constrain`: also build the grammar constraint the request needs (forced call, JSON reply);
    this compiles a grammar, so callers on the event loop run it in a worker thread.  `limit`
    False skips the context check (counting endpoints count any prompt)."""
    from ..chat.types import ChatEncodingError

    family = state.chat.family
    forced = spec.forces_call
    try:
        enc = state.chat.encode(spec.messages, spec.active_tools or None,
                                add_generation_prompt=True,
                                # a forced call starts right after the prompt: no reasoning first
                                thinking=False if forced else spec.thinking,
                                reasoning_effort=spec.reasoning_effort, control=state.tokenizer)
    except ChatEncodingError as exc:
        raise bad_request(str(exc), "messages") from None
    prompt = enc.prompt
    assert prompt is not None
    start_in_call = None
    in_reasoning = enc.prompt_opens_reasoning
    if forced:
        if family.calls is None:
            raise bad_request("tool_choice cannot be forced: this chat template has no known tool-call syntax",
                              "tool_choice")
        start_in_call = family.calls.opener(spec.forced_name)
        prompt = prompt.append(start_in_call, family.calls.opener(prompt.neutral_of(spec.forced_name)))
        in_reasoning = False
    ids = state.tokenizer.encode_prompt(prompt)  # the client's text stays text (gateway.chat.untrusted)
    if limit:
        check_context(state, ids, "messages")
    prep = PreparedChat(ids, family.tool_dialect if spec.active_tools else None, in_reasoning, start_in_call)
    if constrain:
        prep.constraint = constrained.build_for_request(state, spec, in_reasoning=in_reasoning)
        if prep.constraint is not None and not forced:
            prep.dialect = None  # a JSON reply: tool-call markup inside a string is just text
    return prep


def generation_request(state: ServerState, prompt_ids: list[int], max_tokens: int | None,
                       sampling: SamplingParams, stop: list[str], *, stop_ids: frozenset[int] | None = None,
                       stop_texts: tuple[str, ...] = (), ignore_eos: bool = False,
                       constraint: Any = None, default_max_tokens: int | None = None,
                       max_tokens_param: str = "max_tokens") -> GenerationRequest:
    """`stop` are the client's stop strings; `stop_ids` the tokens that end the turn (default: the
    server's), `stop_texts` the chat family's stop strings that are no single token.  `ignore_eos`
    drops every stop token (benchmarks, tests).  With a `constraint` the grammar decides where the reply ends: it allows the stop tokens
    exactly when the structure is complete, so the loop stops on those same ids, and no stop
    string may cut the structure short.  A `max_tokens` the client set that does not fit after
    the prompt is a 400 (check_room); the default (`default_max_tokens`, else the server's) is
    clamped to the room left."""
    check_room(state, len(prompt_ids), max_tokens, max_tokens_param)
    room = state.max_ctx - len(prompt_ids)
    budget = min(max_tokens or default_max_tokens or state.default_max_tokens, room)
    stop_ids = state.stop_token_ids if stop_ids is None else stop_ids
    request = GenerationRequest(prompt_ids=prompt_ids, max_tokens=budget, sampling=sampling,
                                stop_token_ids=frozenset() if ignore_eos and constraint is None else stop_ids,
                                stop_strings=tuple(stop) + tuple(stop_texts))
    if constraint is not None:
        request.stop_strings = ()
        request.token_mask = constraint.token_mask_hook(request.max_tokens)
    return request


def logprob_entries(state: ServerState, event: TextEvent) -> list[dict]:
    """OpenAI `logprobs.content` items for one sampled token."""
    tok = event.token
    if tok is None or tok.logprob is None:
        return []

    def entry(tid: int, lp: float) -> dict:
        text = state.tokenizer.decode([tid])
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    item = entry(tok.token_id, tok.logprob)
    item["top_logprobs"] = [entry(t, lp) for t, lp in tok.top]
    return [item]


def shutting_down(state: ServerState, exc: Exception) -> ApiError:
    """503 with Retry-After: the request never ran; another instance (or this one, restarted)
    can take it."""
    return ApiError(503, f"{exc}; retry shortly", code="shutting_down", retry_after=state.retry_after_seconds)


class JobRun:
    """One submitted generation job.  Construction submits (429 when the queue is full);
    `events()` yields Queued, ProgressEvent, TextEvent ... and finally the GenerationResult.

    Whoever stops consuming early (the client went away: the handler task is cancelled or a
    write fails) must leave through `close()`, which cancels the job: a queued one leaves the
    queue, a running one stops at the next prefill layer or token.  `events()` calls it in its
    own `finally`, so closing the generator (or cancelling the task inside it) is enough."""

    def __init__(self, state: ServerState, request: GenerationRequest) -> None:
        self.state = state
        self.request = request
        try:
            self.job = state.scheduler.submit(request)
        except QueueFull as exc:
            state.metrics.rejected += 1
            raise ApiError(429, str(exc), retry_after=state.retry_after_seconds) from None
        except ShuttingDown as exc:
            raise shutting_down(state, exc) from None

    async def events(self) -> AsyncIterator[object]:
        try:
            yield Queued(self.state.scheduler.position(self.job), len(self.request.prompt_ids))
            while True:
                event = await self.job.events.get()
                if isinstance(event, Done):
                    yield event.result
                    return
                if isinstance(event, Failed):
                    if isinstance(event.error, ShuttingDown):
                        raise shutting_down(self.state, event.error)
                    raise ApiError(500, f"generation failed: {event.error}")
                yield event
        finally:
            self.close()

    def stop(self) -> None:
        """The server has all it needs (e.g. the first tool call): stop generating, still
        receive the result (usage)."""
        self.state.scheduler.cancel(self.job, by="server")

    def close(self) -> None:
        if not self.job.finished:
            self.state.scheduler.cancel(self.job, by="client")


class ChatOutput:
    """Model text -> OpenAI-style deltas and the final message, through the dialect's streaming
    parser.  Engine-free, so recorded model text can drive it in tests.

    parallel_tool_calls=false keeps the first call only: once a second call starts, `cut`
    turns true and the caller stops the generation.

    `streamed`: the reply goes out as a stream, so a long string value may start streaming
    before its block is checked (toolcalls.make_parser's stream_long_values; a block that then
    fails leaves a failed call, which does not make the finish reason "tool_calls").  A whole
    reply never does this: it follows the tool-call contract exactly."""

    def __init__(self, dialect: str | None, tools: list[dict], *, in_reasoning: bool = False,
                 start_in_call: str | None = None, parallel_tool_calls: bool = True, id_salt: str = "",
                 streamed: bool = False) -> None:
        from ..toolcalls import make_parser

        self.parser = make_parser(dialect, tools if dialect else [], in_reasoning,
                                  start_in_call=start_in_call, id_salt=id_salt,
                                  stream_long_values=streamed)
        self.single_call = not parallel_tool_calls
        self.cut = False

    def _filter(self, deltas: list[dict]) -> list[dict]:
        if not self.single_call:
            return deltas
        out = []
        for d in deltas:
            if "tool_calls" in d:
                kept = [c for c in d["tool_calls"] if c["index"] == 0]
                if len(kept) < len(d["tool_calls"]):
                    self.cut = True
                if not kept:
                    continue
                d = dict(d, tool_calls=kept)
            out.append(d)
        return out

    def feed(self, text: str) -> list[dict]:
        if self.cut or not text:
            return []
        return self._filter(self.parser.feed(text))

    def finish(self, natural: str) -> list[dict]:
        """`natural` is how generation ended: stop | length (a cut counts as stop)."""
        return self._filter(self.parser.finish("stop" if self.cut else natural))

    def message(self) -> dict:
        message = self.parser.message()
        if self.single_call and message.get("tool_calls"):
            message["tool_calls"] = message["tool_calls"][:1]
        return message

    def finish_reason(self, natural: str) -> str:
        calls = len(self.message().get("tool_calls", []))
        failed = sum(1 for i in self.parser.failed_calls if i < calls)
        return "tool_calls" if calls > failed else ("stop" if self.cut else natural)

    @property
    def counters(self) -> dict[str, int]:
        return dict(self.parser.counters)


class ChatRun:
    """A chat request that passed validation and sits in the scheduler."""

    def __init__(self, state: ServerState, spec: ChatSpec, prep: PreparedChat, id_salt: str = "") -> None:
        self.state, self.spec, self.prep = state, spec, prep
        request = generation_request(state, prep.prompt_ids, spec.max_tokens, spec.sampling, spec.stop,
                                     stop_texts=state.stop_texts,
                                     ignore_eos=spec.ignore_eos, constraint=prep.constraint,
                                     max_tokens_param=spec.max_tokens_param)
        if spec.thinking_budget is not None and not prep.start_in_call:
            request.token_mask = ThinkingBudget(state.tokenizer, spec.thinking_budget,
                                                state.chat.family.reasoning_markers,
                                                in_reasoning=prep.in_reasoning,
                                                n_vocab=constrained.engine_vocab(state), inner=request.token_mask)
        self.output = ChatOutput(prep.dialect, spec.active_tools, in_reasoning=prep.in_reasoning,
                                 start_in_call=prep.start_in_call,
                                 # a named function is one call (issue 16.3), as OpenAI does
                                 parallel_tool_calls=spec.parallel_tool_calls and spec.forced_name is None,
                                 id_salt=id_salt, streamed=spec.stream)
        self.job = JobRun(state, request)

    def close(self) -> None:
        self.job.close()

    async def finish(self) -> "Finish":
        """Runs to the end and returns the Finish (non-streaming replies need nothing else)."""
        finish: Finish | None = None
        async with aclosing(self.events()) as events:
            async for item in events:
                if isinstance(item, Finish):
                    finish = item
        assert finish is not None
        return finish

    async def events(self) -> AsyncIterator[object]:
        """Yields Queued, ProgressEvent, Delta ... then exactly one Finish."""
        result: GenerationResult | None = None
        out = self.output
        want_logprobs = self.spec.sampling.logprobs
        events = self.job.events()
        try:
            async for event in events:
                if isinstance(event, TextEvent):
                    if out.cut:
                        continue  # draining a server-side stop: only the result matters now
                    lps = logprob_entries(self.state, event) if want_logprobs else []
                    deltas = out.feed(event.text)
                    for i, d in enumerate(deltas):
                        yield Delta(d, lps if i == 0 else [])
                    if not deltas and lps:
                        yield Delta({}, lps)
                    if out.cut:
                        self.job.stop()
                elif isinstance(event, GenerationResult):
                    result = event
                else:  # Queued, ProgressEvent
                    yield event
        finally:
            await events.aclose()
        natural = "length" if result is not None and result.finish_reason == "length" else "stop"
        complete = self._structure_complete(result)
        if complete is not None and natural == "length":
            # max_tokens ran out: a structure that closed on the last token is a finished reply;
            # one that did not (the budget was below its shortest completion) stays "length",
            # whatever the parser salvaged from it.
            natural = "stop" if complete else "length"
        for d in out.finish(natural):
            yield Delta(d)
        counters = out.counters
        self.state.metrics.reasoning_calls_delivered += counters.get("reasoning_calls_delivered", 0)
        self.state.metrics.reasoning_calls_kept_as_text += counters.get("reasoning_calls_kept_as_text", 0)
        reason = "length" if complete is False else out.finish_reason(natural)
        yield Finish(reason, Usage.of(result), out.message(), result.stop_string if result else None)

    def _structure_complete(self, result: GenerationResult | None) -> bool | None:
        """Whether the constrained output is a complete call / JSON value (None: unconstrained).
        The mask hook only sees tokens before each step, so the last sampled one is fed here."""
        constraint = self.prep.constraint
        if constraint is None:
            return None
        self.state.metrics.record_constraint(constraint.stats)
        if result is None:
            return False
        for tid in result.token_ids[len(constraint.tokens):]:
            constraint.advance(tid)
        complete = constraint.is_complete()
        if not complete and result.finish_reason == "length":
            log.info("constrained reply cut at %d tokens (shortest completion from the start: %s; %s)",
                     result.completion_tokens, constraint.initial_need, constraint.stats)
        return complete


async def start_chat(state: ServerState, spec: ChatSpec, id_salt: str = "") -> ChatRun:
    """Validates, renders, tokenises and queues a chat request (ApiError on any problem).
    Rendering, tokenizing and grammar compilation run in a worker thread (they grow with the
    body: about 1 s per MB of prompt, seconds for a large tool schema's grammar), so the event
    loop keeps serving other clients; queueing stays on the loop."""
    prep = await off_loop(prepare_chat, state, spec, constrain=constrained.wants_constraint(spec))
    return ChatRun(state, spec, prep, id_salt)
