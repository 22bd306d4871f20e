"""Everything a running server holds, built once at startup and shared by the handlers."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

from ..families import ChatSetup
from ..generate import GenerationResult, Slot
from ..scheduler import Job, Scheduler
from ..tokenizer import Tokenizer


@dataclass
class Metrics:
    started: float = field(default_factory=time.time)
    requests: Counter = field(default_factory=Counter)  # (endpoint, status) -> count
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    last_decode_tps: float = 0.0
    last_prefill_tps: float = 0.0
    rejected: int = 0
    cancelled: int = 0
    reasoning_calls_delivered: int = 0
    reasoning_calls_kept_as_text: int = 0
    failed: int = 0
    constrained_requests: int = 0
    constraint_masks: int = 0          # grammar masks computed (one per constrained token)
    constraint_mask_seconds: float = 0.0
    constraint_steered: int = 0        # tokens chosen under max_tokens steering

    def record_constraint(self, stats: object) -> None:
        """A finished constrained request's gateway.structured ConstraintStats."""
        self.constrained_requests += 1
        self.constraint_masks += getattr(stats, "masks", 0)
        self.constraint_mask_seconds += getattr(stats, "mask_seconds", 0.0) + getattr(stats, "plan_seconds", 0.0)
        self.constraint_steered += getattr(stats, "steered", 0)

    def record_job(self, job: Job, r: GenerationResult | None) -> None:
        """Scheduler hook: every job that ran, whether or not its client is still there."""
        if r is None:
            self.failed += 1
            return
        self.record(r, client_cancelled=job.cancelled_by == "client")

    def record_dropped(self, job: Job) -> None:
        """Scheduler hook: a queued job whose client left before it ran."""
        self.cancelled += 1

    def record(self, r: GenerationResult, client_cancelled: bool = False) -> None:
        self.prompt_tokens += r.prompt_tokens
        self.cached_tokens += r.cached_tokens
        self.completion_tokens += r.completion_tokens
        self.prefill_seconds += r.prefill_seconds
        self.decode_seconds += r.decode_seconds
        if r.finish_reason == "cancelled" and client_cancelled:
            self.cancelled += 1
        new_prompt = r.prompt_tokens - r.cached_tokens
        if r.prefill_seconds > 0 and new_prompt > 0:
            self.last_prefill_tps = new_prompt / r.prefill_seconds
        if r.decode_seconds > 0 and r.completion_tokens > 1:
            self.last_decode_tps = (r.completion_tokens - 1) / r.decode_seconds


@dataclass
class ServerState:
    engine: object
    tokenizer: Tokenizer
    slot: Slot
    scheduler: Scheduler
    chat: ChatSetup  # the checkpoint's chat family (bound to its template) and defaults
    model_id: str
    model_path: str
    max_ctx: int
    stop_token_ids: frozenset[int]  # every token that ends a turn (the chat family's among them)
    stop_texts: tuple[str, ...] = ()  # the chat family's stop strings that are no single token
    default_max_tokens: int = 4096
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    reasoning_field_mirror: bool = False  # also send `reasoning` next to `reasoning_content`
    keepalive_seconds: float = 10.0  # SSE comment / Anthropic ping while queued or prefilling
    retry_after_seconds: int = 5
    demo: bool = False
    ram_gb: float | None = None  # --ram (the whole process), for the startup summary
    metrics: Metrics = field(default_factory=Metrics)
    ready: bool = True


STATE_KEY = web.AppKey("state", ServerState)  # request.app[STATE_KEY]: the handlers' way to the state
