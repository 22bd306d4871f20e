"""Per-request CPU work off the event loop, in daemon threads.

Parsing a large body, rendering and tokenizing its prompt, compiling a grammar and decoding ids
grow with the body (about 1 s per MB): on the event loop they would freeze /health and every
running stream.  Each call gets a daemon thread of its own rather than a pool worker: at
shutdown the process must exit within seconds, and Python joins pool threads at exit (asyncio's
default executor too), so one 16 MB body still being tokenized would hold the exit for as long
as that takes.  A daemon thread is dropped at exit; its result has nobody left to go to.

At shutdown `abandon` answers every handler still waiting on such a thread at once (the server
turns it into 503 with Retry-After): aiohttp would otherwise wait out its grace period twice
for a handler that has not even queued its generation yet.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


# The futures handlers are awaiting (one event loop per server process).
_waiting: set[asyncio.Future] = set()


def abandon(error: Callable[[], BaseException]) -> int:
    """Shutdown: every handler waiting on a request thread gets `error()` raised now; the
    threads run on as daemons and their results are dropped.  Returns how many were waiting."""
    abandoned = 0
    for future in list(_waiting):
        if not future.done():
            future.set_exception(error())
            abandoned += 1
    _waiting.clear()
    return abandoned


def _settle(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.done():  # cancelled, or abandoned at shutdown
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


async def off_loop(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Runs `fn(*args, **kwargs)` in a daemon thread; the event loop serves others meanwhile."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def work() -> None:
        try:
            outcome = (True, fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting handler
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(_settle, future, *outcome)
        except RuntimeError:  # the loop is closed: the server is exiting
            pass

    _waiting.add(future)
    try:
        threading.Thread(target=work, name="moegate-request", daemon=True).start()
        return await future
    finally:
        _waiting.discard(future)
