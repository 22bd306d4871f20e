"""One sequence at a time: a bounded FIFO queue in front of the engine's single slot.

Handlers submit a job and read its events from an asyncio queue.  The engine runs in one worker
thread so the event loop (health checks, other clients, keepalives) never blocks on it.
Cancelling a job (client gone) removes it from the queue, or stops its prefill/decode at the next
chunk or token, freeing the slot at once.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .generate import GenerationRequest, GenerationResult, Slot


class QueueFull(Exception):
    """The wait queue is at its cap; the server answers 429 with Retry-After."""


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


class Scheduler:
    def __init__(self, slot: Slot, max_queue: int = 16) -> None:
        self.slot = slot
        self.max_queue = max_queue
        self._pending: deque[Job] = deque()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moegate-engine")
        self._task: asyncio.Task | None = None
        self.running: Job | None = None

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

    def submit(self, request: GenerationRequest) -> Job:
        if len(self._pending) >= self.max_queue:
            raise QueueFull(f"{len(self._pending)} requests are waiting; try again shortly")
        job = Job(request)
        self._pending.append(job)
        self._wakeup.set()
        return job

    def position(self, job: Job) -> int:
        """0 while running, 1.. while queued."""
        try:
            return self._pending.index(job) + 1
        except ValueError:
            return 0

    def cancel(self, job: Job) -> None:
        job.cancel.set()
        try:
            self._pending.remove(job)
        except ValueError:
            return
        job.finished = True

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

            try:
                result = await loop.run_in_executor(
                    self._executor, self.slot.generate, job.request, job.cancel, emit)
                job.events.put_nowait(Done(result))
            except asyncio.CancelledError:
                job.cancel.set()
                raise
            except Exception as exc:  # reported to the client in the API's error shape
                job.events.put_nowait(Failed(exc))
            finally:
                job.finished = True
                self.running = None
