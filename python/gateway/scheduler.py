"""One sequence at a time: a bounded FIFO queue in front of the engine's single slot.

Handlers submit a job and read its events from an asyncio queue.  The engine runs in one worker
thread so the event loop (health checks, other clients, keepalives) never blocks on it.
Cancelling a job (client gone) removes it from the queue, or stops its prefill/decode at the next
layer or token, freeing the slot at once.

At shutdown `drain()` ends everything at once: queued jobs fail with ShuttingDown (the server
answers 503 with Retry-After), the running one stops at the next layer or token and its result
reads finish_reason "length" (the reply was cut before its end, as max_tokens cuts it, so
clients see a proper final event), and later submissions fail with ShuttingDown too.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .generate import GenerationRequest, GenerationResult, Slot

log = logging.getLogger("moegate.scheduler")


class QueueFull(Exception):
    """The wait queue is at its cap; the server answers 429 with Retry-After."""


class ShuttingDown(Exception):
    """The server is shutting down: the job will never run (503 with Retry-After)."""


@dataclass
class Done:
    result: GenerationResult


@dataclass
class Failed:
    error: BaseException


@dataclass
class Job:
    request: GenerationRequest
    cancel: threading.Event = field(default_factory=threading.Event)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False
    # Who asked to stop it: "client" (went away), "server" (e.g. parallel_tool_calls=false
    # after the first call) or "shutdown" (drain).  Only client cancellations count as
    # cancelled in the metrics.
    cancelled_by: str | None = None


# Called on the event loop once per job that ran: (job, result or None when it failed).
ResultHook = Callable[[Job, GenerationResult | None], None]


class Scheduler:
    def __init__(self, slot: Slot, max_queue: int = 16, on_result: ResultHook | None = None,
                 on_dropped: Callable[[Job], None] | None = None) -> None:
        self.slot = slot
        self.max_queue = max_queue
        self.on_result = on_result
        self.on_dropped = on_dropped  # a queued job cancelled before it ran
        self._pending: deque[Job] = deque()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moegate-engine")
        self._task: asyncio.Task | None = None
        self.running: Job | None = None
        self.draining = False

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="moegate-scheduler")

    async def stop(self) -> None:
        if self.running:
            self.running.cancel.set()
        for job in self._pending:
            job.cancel.set()
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=True, cancel_futures=True)

    def drain(self) -> None:
        """Shutdown: refuses every queued job and new submissions (ShuttingDown), and stops the
        running job at its next layer or token (its result still arrives)."""
        self.draining = True
        while self._pending:
            job = self._pending.popleft()
            job.cancelled_by = "shutdown"
            job.cancel.set()
            job.finished = True
            job.events.put_nowait(Failed(ShuttingDown("the server is shutting down")))
        if self.running is not None:
            if self.running.cancelled_by is None:
                self.running.cancelled_by = "shutdown"
            self.running.cancel.set()

    def submit(self, request: GenerationRequest) -> Job:
        if self.draining:
            raise ShuttingDown("the server is shutting down")
        if len(self._pending) >= self.max_queue:
            raise QueueFull(f"{len(self._pending)} requests are waiting; try again shortly")
        job = Job(request)
        self._pending.append(job)
        self._wakeup.set()
        return job

    def position(self, job: Job) -> int:
        """How many jobs run before this one: 0 means it is running or starts next."""
        try:
            index = self._pending.index(job)
        except ValueError:
            return 0
        return index + (1 if self.running is not None else 0)

    def cancel(self, job: Job, by: str = "client") -> None:
        """Stops a job: a queued one leaves the queue at once, a running one stops at the next
        prefill layer or token (its result still arrives, with finish_reason "cancelled")."""
        if job.finished:
            return
        if job.cancelled_by is None:
            job.cancelled_by = by
        job.cancel.set()
        try:
            self._pending.remove(job)
        except ValueError:
            return
        job.finished = True
        if self.on_dropped:
            self.on_dropped(job)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            job = self._pending.popleft()
            if job.cancel.is_set():
                continue
            self.running = job
            job.started.set()

            def emit(event: object, job: Job = job) -> None:
                loop.call_soon_threadsafe(job.events.put_nowait, event)

            result: GenerationResult | None = None
            try:
                result = await loop.run_in_executor(
                    self._executor, self.slot.generate, job.request, job.cancel, emit)
                if result.finish_reason == "cancelled" and job.cancelled_by == "shutdown":
                    result.finish_reason = "length"  # cut before its end: the client gets a final event
                job.events.put_nowait(Done(result))
            except asyncio.CancelledError:
                job.cancel.set()
                raise
            except Exception as exc:  # reported to the client in the API's error shape
                job.events.put_nowait(Failed(exc))
            finally:
                job.finished = True
                self.running = None
            if self.on_result:
                try:
                    self.on_result(job, result)
                except Exception:  # bookkeeping must never stop the queue
                    log.exception("result hook failed")
