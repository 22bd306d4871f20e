"""The serving core every API's routes share: SSE framing, keepalives, the stream loop with its
one error tail, and the n-choices plumbing.

A streaming route opens the response through `stream(request, state, runs, writer)`: `runs`
yields (choice index, run) pairs, each run's `events()` the pipeline's event vocabulary
(Queued, ProgressEvent, then Delta ... Finish for chat, TextEvent ... GenerationResult for raw
completions); the API's `StreamWriter` (in its protocol module) turns each into frames.  Errors
after the status line was sent travel in the stream, in the API's shape, and the server keeps
serving.

Per-request CPU work that grows with the body (JSON parsing, rendering the prompt, tokenizing,
compiling a grammar, decoding ids) runs through `offload.off_loop`, in a worker thread: on the event
loop it costs about 1 s per MB, during which /health and every running stream would freeze.
The body itself is bounded by app.MAX_BODY_BYTES (413 above it).
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import replace
from typing import Protocol, TypeVar

from aiohttp import web

from ..generate import ProgressEvent
from ..sampling import SamplingParams
from .errors import ApiError
from .pipeline import Queued
from .state import ServerState

log = logging.getLogger("moegate.server")


class Comment(str):
    """An SSE comment line (clients ignore it): keepalives, queue position, prefill progress."""


# (SSE event name or None, data) or a comment.
Frame = tuple[str | None, dict | str] | Comment


def frame_bytes(frame: Frame) -> bytes:
    if isinstance(frame, Comment):
        return f": {frame}\n\n".encode("utf-8")
    event, payload = frame
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode("utf-8")


class StreamWriter:
    """What one API writes on a stream.  Every method returns the frames to send."""

    def start(self) -> list[Frame]:
        """Before anything else (the stream just opened)."""
        return []

    def choice(self, index: int) -> list[Frame]:
        """Choice `index` begins (n > 1 streams the choices one after another)."""
        return []

    def waiting(self, item: Queued | ProgressEvent | None) -> list[Frame]:
        """Queued, prefill progress, or None (`keepalive_seconds` passed without an event).  By
        default SSE comments, which clients ignore: they keep the connection alive and say why
        the stream is quiet (queue position, prefill progress)."""
        if item is None:
            return [Comment("keepalive")]
        if isinstance(item, Queued):
            return [Comment(f"queued ahead={item.ahead}")] if item.ahead else []
        if item.layer is not None:
            return [Comment(f"prefill {item.done}/{item.total} layer {item.layer}/{item.n_layers} "
                            f"of the next {item.window}")]
        return [Comment(f"prefill {item.done}/{item.total}")]

    def item(self, item: object) -> list[Frame]:
        """Any other event of a run."""
        return []

    def end(self) -> list[Frame]:
        """After the last choice."""
        return []

    def error(self, exc: ApiError) -> list[Frame]:
        """An error after the stream opened."""
        return []

    def done(self) -> list[Frame]:
        """The very last frames, after an error too."""
        return []


class Run(Protocol):
    def events(self) -> AsyncIterator[object]: ...
    def close(self) -> None: ...


R = TypeVar("R", bound=Run)


async def stream(request: web.Request, state: ServerState, runs: AsyncIterator[tuple[int, Run]],
                 writer: StreamWriter, ident: str) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)

    async def send(frames: list[Frame]) -> None:
        for frame in frames:
            await resp.write(frame_bytes(frame))

    try:
        await send(writer.start())
        async with aclosing(runs) as numbered:
            async for index, run in numbered:
                await send(writer.choice(index))
                async with aclosing(keepalive(run.events(), state.keepalive_seconds)) as items:
                    async for item in items:
                        if item is None or isinstance(item, (Queued, ProgressEvent)):
                            await send(writer.waiting(item))
                        else:
                            await send(writer.item(item))
        await send(writer.end())
    except ApiError as exc:  # the status line is gone: the error travels in the stream
        await send(writer.error(exc))
    except ConnectionResetError:  # the client hung up mid-stream (the runs were closed on the way out)
        return client_gone(request, resp)
    except Exception as exc:  # a bug after the stream opened: report it in the stream, keep serving
        log.exception("error while streaming %s", ident)
        await send(writer.error(ApiError(500, f"internal error: {type(exc).__name__}")))
    try:
        await send(writer.done())
        await resp.write_eof()
    except ConnectionResetError:  # the client hung up after the last event it needed
        return client_gone(request, resp)
    return resp


# Set on a request whose client hung up during its stream (the middleware counts it as 499).
CLIENT_GONE = "moegate.client_gone"


def client_gone(request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
    """Nothing more can reach the client: its stream ends here, quietly (aiohttp's own final
    write_eof of a closed connection is no error)."""
    request[CLIENT_GONE] = True
    return resp


async def keepalive(source: AsyncIterator[object], interval: float) -> AsyncIterator[object | None]:
    """Re-yields items from source, and None whenever `interval` seconds pass without one
    (the caller writes an SSE comment or ping so clients and proxies keep the connection).
    Closing this generator closes `source`."""
    it = source.__aiter__()
    pending: asyncio.Future | None = None
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
                item = task.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            try:
                await pending
            except BaseException:  # noqa: BLE001 - the source is being torn down either way
                pass
        aclose = getattr(it, "aclose", None)
        if aclose:
            await aclose()


def choice_sampling(sampling: SamplingParams, index: int) -> SamplingParams:
    """With a seed, choice i samples with seed + i: the choices differ and each one reproduces."""
    return sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + index)


async def one_after_another(first: R, start: Callable[[int], Awaitable[R]] | None = None,
                            n: int = 1) -> AsyncIterator[tuple[int, R]]:
    """The n choices of a request in the single slot: choice i > 0 is queued (`start(i)`) only
    when the one before has finished (the slot still holds the prompt, so it prefills nothing
    new), and closed when the consumer moves on.  `first` is the caller's to close."""
    yield 0, first
    for index in range(1, n):
        assert start is not None
        run = await start(index)
        try:
            yield index, run
        finally:
            run.close()
