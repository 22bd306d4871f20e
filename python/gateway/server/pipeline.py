"""One chat request from spec to events, shared by both APIs.

    ChatSpec -> chat encoder (prompt text) -> token ids -> scheduler job (engine) -> text pieces
             -> streaming tool-call parser -> OpenAI-style deltas -> the API's own wire format

Forced tool calls (tool_choice required / named) prefill the dialect's call opener after the
prompt and start the parser inside the call, so the model can only continue the call.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..generate import GenerationRequest, GenerationResult, ProgressEvent, TextEvent
from ..scheduler import Done, Failed, QueueFull
from .chat_request import ChatSpec
from .errors import ApiError, bad_request
from .state import ServerState


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def openai(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


@dataclass
class Progress:
    done: int
    total: int


@dataclass
class Queued:
    position: int


@dataclass
class Delta:
    delta: dict
    logprobs: list[dict] = field(default_factory=list)


@dataclass
class Finish:
    finish_reason: str  # stop | length | tool_calls
    usage: Usage
    message: dict
    stop_string: str | None = None


@dataclass
class PreparedChat:
    prompt_ids: list[int]
    prompt_text: str
    dialect: str | None
    in_reasoning: bool
    start_in_call: str | None
    stop_strings: tuple[str, ...]


def prepare_chat(state: ServerState, spec: ChatSpec) -> PreparedChat:
    """Renders and tokenises the prompt; raises ApiError for anything the client got wrong."""
    from ..chat.types import ChatEncodingError

    forced = spec.forces_call
    try:
        enc = state.chat.encode(spec.messages, spec.active_tools or None,
                     add_generation_prompt=True,
                     thinking=False if forced else spec.thinking,
                     reasoning_effort=spec.reasoning_effort,
                     tool_choice=(spec.forced_name if spec.tool_choice == "function" else spec.tool_choice)
                     if spec.active_tools else None)
    except ChatEncodingError as exc:
        raise bad_request(str(exc), "messages") from None
    text = enc.text
    start_in_call = None
    in_reasoning = enc.prompt_opens_reasoning
    if forced:
        if not enc.forced_call_prefix:
            raise bad_request(f"tool_choice '{spec.tool_choice}' cannot be honoured: the chat format "
                              f"'{enc.format}' has no tool-call opener", "tool_choice")
        start_in_call = enc.forced_call_prefix
        text += start_in_call
        in_reasoning = False
    ids = state.tokenizer.encode(text)
    if len(ids) >= state.max_ctx:
        raise bad_request(f"the prompt has {len(ids)} tokens but the context holds {state.max_ctx}",
                          "messages", code="context_length_exceeded")
    return PreparedChat(ids, text, enc.tool_dialect if spec.active_tools else None, in_reasoning,
                        start_in_call, tuple(enc.stop_strings))


def generation_request(state: ServerState, prompt_ids: list[int], spec_max_tokens: int | None,
                       sampling, stop: list[str], extra_stop_strings: tuple[str, ...] = ()) -> GenerationRequest:
    room = state.max_ctx - len(prompt_ids)
    max_tokens = min(spec_max_tokens or state.default_max_tokens, room)
    stop_ids = set(state.stop_token_ids)
    text_stops = list(stop)
    for s in extra_stop_strings:
        tid = state.tokenizer.token_id(s)
        if tid is not None:
            stop_ids.add(tid)
        else:
            text_stops.append(s)
    return GenerationRequest(prompt_ids=prompt_ids, max_tokens=max_tokens, sampling=sampling,
                             stop_token_ids=frozenset(stop_ids), stop_strings=tuple(text_stops))


def _logprob_entries(state: ServerState, event: TextEvent) -> list[dict]:
    tok = event.token
    if tok is None or tok.logprob is None:
        return []
    def entry(tid: int, lp: float) -> dict:
        text = state.tokenizer.decode([tid])
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}
    item = entry(tok.token_id, tok.logprob)
    item["top_logprobs"] = [entry(t, lp) for t, lp in tok.top]
    return [item]


async def run_job(state: ServerState, request: GenerationRequest) -> AsyncIterator[object]:
    """Submits a generation job and yields Queued/Progress/TextEvent items, then the result.
    Cancels the job when the consumer stops early (client gone)."""
    try:
        job = state.scheduler.submit(request)
    except QueueFull as exc:
        state.metrics.rejected += 1
        raise ApiError(429, str(exc), retry_after=state.retry_after_seconds) from None
    try:
        # Always first, and at once: lets a streaming handler open its response (and start
        # keepalives) before a long prefill.  Position 0 means running now.
        yield Queued(state.scheduler.position(job))
        while True:
            event = await job.events.get()
            if isinstance(event, Done):
                state.metrics.record(event.result)
                yield event.result
                return
            if isinstance(event, Failed):
                raise ApiError(500, f"generation failed: {event.error}")
            yield event
    finally:
        if not job.finished:
            state.scheduler.cancel(job)


async def run_chat(state: ServerState, spec: ChatSpec) -> AsyncIterator[object]:
    """Yields Queued, Progress, Delta ... then one Finish."""
    from ..toolcalls import make_parser

    prep = prepare_chat(state, spec)
    request = generation_request(state, prep.prompt_ids, spec.max_tokens, spec.sampling, spec.stop,
                                 prep.stop_strings)
    parser = make_parser(prep.dialect or "hermes", spec.active_tools if prep.dialect else [],
                         in_reasoning=prep.in_reasoning, start_in_call=prep.start_in_call)
    result: GenerationResult | None = None
    calls_seen: set[int] = set()
    single_call = not spec.parallel_tool_calls
    cut_after_first_call = False

    def filtered(deltas: list[dict]) -> list[dict]:
        """parallel_tool_calls=false: drop any call after the first (and stop generating)."""
        nonlocal cut_after_first_call
        out = []
        for d in deltas:
            if single_call and "tool_calls" in d:
                kept = [c for c in d["tool_calls"] if c["index"] == 0]
                if len(kept) < len(d["tool_calls"]):
                    cut_after_first_call = True
                if not kept:
                    continue
                d = {"tool_calls": kept}
            for c in d.get("tool_calls", []):
                calls_seen.add(c["index"])
            out.append(d)
        return out

    agen = run_job(state, request)
    try:
        async for event in agen:
            if isinstance(event, (Queued, ProgressEvent)):
                yield event if isinstance(event, Queued) else Progress(event.done, event.total)
            elif isinstance(event, TextEvent):
                lps = _logprob_entries(state, event) if spec.sampling.logprobs else []
                deltas = filtered(parser.feed(event.text)) if event.text else []
                for i, d in enumerate(deltas):
                    yield Delta(d, lps if i == 0 else [])
                if not deltas and lps:
                    yield Delta({}, lps)
                if cut_after_first_call:
                    break
            elif isinstance(event, GenerationResult):
                result = event
    finally:
        await agen.aclose()
    natural = "stop" if result is None or result.finish_reason in ("stop", "cancelled") or cut_after_first_call \
        else result.finish_reason
    for d in filtered(parser.finish(natural)):
        yield Delta(d)
    message = parser.message()
    if single_call and message.get("tool_calls"):
        message["tool_calls"] = message["tool_calls"][:1]
    finish = "tool_calls" if message.get("tool_calls") else natural
    usage = Usage()
    if result is not None:
        usage = Usage(result.prompt_tokens, result.completion_tokens, result.cached_tokens)
    yield Finish(finish, usage, message, result.stop_string if result else None)


async def keepalive(source: AsyncIterator[object], interval: float) -> AsyncIterator[object | None]:
    """Re-yields items from source, and None whenever `interval` seconds pass without one
    (the caller writes an SSE comment or ping so clients and proxies keep the connection)."""
    it = source.__aiter__()
    pending: asyncio.Task | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            task, pending = pending, None
            try:
                yield task.result()
            except StopAsyncIteration:
                return
    finally:
        if pending is not None:
            pending.cancel()
            try:
                await pending
            except (asyncio.CancelledError, StopAsyncIteration):
                pass
            except Exception:
                pass
        aclose = getattr(it, "aclose", None)
        if aclose:
            await aclose()
