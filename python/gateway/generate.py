"""The generation loop over the engine's single sequence slot.

One `Slot` wraps the engine and remembers which tokens its KV state holds.  A request reuses the
longest common prefix (a second chat turn pays only for its new tokens), prefills the rest in one
engine call (which runs it layer by layer over windows of info["prefill_window"] tokens; its
progress hook checks for cancellation between layers and, polled, inside them, and reports each
finished window), then decodes token by token with the lm head computed for the last position
only.  Runs in a worker thread; everything it reports goes through the `emit` callback.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .engine import EvalCancelled
from .prefix_cache import MIN_SNAPSHOT_TOKENS, PrefixCache, common_prefix
from .prefix_disk import DiskSnapshots
from .sampling import SampledToken, Sampler, SamplingParams
from .snapshots import ConversationSnapshots
from .tokenizer import IncrementalDecoder, Tokenizer

log = logging.getLogger("moegate.generate")

class Cancelled(Exception):
    """The client went away; the slot keeps whatever prefix was already evaluated."""


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    # Optional token mask hook for constrained decoding: called with the ids generated so far,
    # returns a bool mask over the vocabulary (or None for no constraint).
    token_mask: Callable[[list[int]], np.ndarray | None] | None = None


@dataclass
class GenerationResult:
    finish_reason: str = "stop"  # stop | length | cancelled
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    stop_string: str | None = None
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    token_ids: list[int] = field(default_factory=list)


@dataclass
class TextEvent:
    text: str
    token: SampledToken | None = None


@dataclass
class ProgressEvent:
    """Prefill progress: `done` of the `total` prompt tokens still to evaluate have every layer
    computed.  With `layer` set, the window after them (tokens [done, done + window)) has
    finished `layer` of its `n_layers` layers: at full size one layer of a window takes about
    a minute, so a client sees the prefill move between windows (Slot.progress_seconds apart)."""

    done: int
    total: int
    layer: int | None = None
    n_layers: int | None = None
    window: int | None = None


class StopStringFilter:
    """Holds back text that could still become a stop string, so none is ever leaked."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._buf = ""
        self.matched: str | None = None

    def push(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to release, stopped)."""
        if not self._stops:
            return text, False
        self._buf += text
        # The match that completes first wins (then the longer one): that is what token-by-token
        # generation would have stopped on, so the result does not depend on how text is chunked.
        hits = [(pos + len(s), pos, s) for s in self._stops if (pos := self._buf.find(s)) >= 0]
        if hits:
            _, pos, stop = min(hits)
            out, self._buf, self.matched = self._buf[:pos], "", stop
            return out, True
        hold = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(self._buf)), hold, -1):
                if self._buf.endswith(s[:k]):
                    hold = k
                    break
        cut = len(self._buf) - hold
        out, self._buf = self._buf[:cut], self._buf[cut:]
        return out, False

    def flush(self) -> str:
        out, self._buf = self._buf, ""
        return out


# Restore a snapshot only when it saves at least this many prefill tokens over the slot itself.
MIN_RESTORE_GAIN = 64


class _PrefillHook:
    """Slot.prefill's progress hook for Engine.eval.  Called after each layer of a window: reports
    finished windows (and layers, at most every progress_seconds) and answers whether to cancel.
    `poll` is what the engine calls inside a layer, between its dense sub-chunks and groups of
    experts (one layer of a long window takes a minute on a big model): a cancel there stops
    the eval within about one sub-chunk, dropping the window."""

    def __init__(self, cancel: threading.Event, progress: Callable[[ProgressEvent], None] | None, total: int,
                 progress_seconds: float) -> None:
        self.cancel, self.progress, self.total = cancel, progress, total
        self.progress_seconds = progress_seconds
        self.last_report = time.perf_counter()

    def __call__(self, layer: int, n_layers: int, done: int, window: int) -> bool:
        # A window's tokens are done after its last layer; a cancel there keeps them.
        if self.progress and layer == n_layers - 1:
            self.progress(ProgressEvent(done + window, self.total))
            self.last_report = time.perf_counter()
        elif self.progress and time.perf_counter() - self.last_report >= self.progress_seconds:
            self.progress(ProgressEvent(done, self.total, layer + 1, n_layers, window))
            self.last_report = time.perf_counter()
        return self.cancel.is_set()

    def poll(self, layer: int, n_layers: int, done: int, window: int) -> bool:
        return self.cancel.is_set()


class Slot:
    """The engine plus the token ids its KV state holds (and, optionally, snapshots of the
    conversations it left: gateway.snapshots.ConversationSnapshots)."""

    def __init__(self, engine, tokenizer: Tokenizer, max_ctx: int, prefix_cache: PrefixCache | None = None,
                 prefix_disk: DiskSnapshots | None = None, budgeted: bool = False,
                 hidden_token_ids: frozenset[int] = frozenset(), progress_seconds: float = 1.0) -> None:
        self.engine = engine
        # Layer progress inside a prefill window is reported at most this often (window ends always).
        self.progress_seconds = progress_seconds
        self.tokenizer = tokenizer
        # Generated tokens that give no text: control tokens other than the markup the output
        # parser reads (Tokenizer.hidden_ids), as vLLM skips special tokens by default.
        self.hidden_token_ids = hidden_token_ids
        self.max_ctx = max_ctx
        self.tokens: list[int] = []
        self.lock = threading.Lock()
        self.prefix_hits = 0
        self.cached_tokens_total = 0
        self.snapshots = ConversationSnapshots(prefix_cache, prefix_disk, budgeted)

    @property
    def prefix_cache(self) -> PrefixCache | None:
        return self.snapshots.ram

    @property
    def prefix_disk(self) -> DiskSnapshots | None:
        return self.snapshots.disk

    @property
    def snapshot_restores(self) -> int:
        return self.snapshots.restores

    @property
    def snapshot_restored_tokens(self) -> int:
        return self.snapshots.restored_tokens

    def _common_prefix(self, ids: Sequence[int]) -> int:
        return common_prefix(self.tokens, ids)

    def persist(self) -> None:
        """Writes the slot's own state to the disk snapshots (at shutdown: the next process
        starts from it)."""
        if self.prefix_disk is not None:
            with self.lock:
                self.snapshots.keep(self.engine, self.tokens, to_ram=False)

    def _switch_conversation(self, prompt: Sequence[int], common: int) -> int:
        """Before the slot truncates to `common`: restore a snapshot that shares more with the
        prompt, or keep the slot's state when it is leaving a long conversation.  Returns the
        tokens the slot now shares with the prompt."""
        snapshots = self.snapshots
        if not snapshots.enabled:
            return common
        load, shared = snapshots.best(prompt)
        if load is not None and shared >= common + MIN_RESTORE_GAIN:
            snapshots.keep(self.engine, self.tokens)
            try:
                tokens, state = load()
            except (OSError, ValueError) as exc:  # a disk snapshot went bad: prefill instead
                log.warning("prefix snapshot unreadable, prefilling instead: %s", exc)
                return common
            try:
                self.engine.restore_prefix(state)
            except Exception:
                self.tokens = []
                self.engine.reset()
                raise
            self.tokens = list(tokens)
            snapshots.restores += 1
            snapshots.restored_tokens += shared
            return shared
        dropped = len(self.tokens) - common
        if dropped >= MIN_SNAPSHOT_TOKENS and common < len(self.tokens) // 2:
            snapshots.keep(self.engine, self.tokens)  # leaving this conversation, not editing its tail
        return common

    def _eval(self, ids: list[int], progress: Callable[[int, int, int, int], object] | None = None) -> np.ndarray:
        try:
            logits = self.engine.eval(ids, last_only=True, progress=progress)
        except EvalCancelled as stop:
            self.tokens.extend(ids[:stop.done])  # the windows finished before the cancel stay
            raise Cancelled() from None
        except Exception:
            # The engine's state after a failed eval is unknown: forget the cached prefix.
            self.tokens = []
            self.engine.reset()
            raise
        self.tokens.extend(ids)
        return logits[-1]

    def prefill(self, prompt: list[int], cancel: threading.Event,
                progress: Callable[[ProgressEvent], None] | None = None) -> tuple[np.ndarray, int]:
        """Brings the slot to exactly `prompt`; returns (logits of the last token, cached tokens)."""
        common = self._switch_conversation(prompt, self._common_prefix(prompt))
        if common == len(prompt):
            common -= 1  # the last token must be evaluated again to get its logits
        cached = max(common, 0)
        self.engine.truncate(cached)
        del self.tokens[cached:]
        if cached:
            self.prefix_hits += 1
            self.cached_tokens_total += cached
        if cancel.is_set():
            raise Cancelled()
        rest = prompt[cached:]

        hook = _PrefillHook(cancel, progress, len(rest), self.progress_seconds)
        return self._eval(rest, hook), cached

    def generate(self, req: GenerationRequest, cancel: threading.Event,
                 emit: Callable[[object], None]) -> GenerationResult:
        """Runs one request to completion (or cancellation), emitting TextEvents."""
        res = GenerationResult(prompt_tokens=len(req.prompt_ids))
        if not req.prompt_ids:
            raise ValueError("the prompt is empty")
        if len(req.prompt_ids) >= self.max_ctx:
            raise ValueError(f"the prompt has {len(req.prompt_ids)} tokens; the context holds {self.max_ctx}")
        with self.lock:
            t0 = time.perf_counter()
            try:
                logits, res.cached_tokens = self.prefill(
                    req.prompt_ids, cancel, emit)
            except Cancelled:
                res.finish_reason = "cancelled"
                return res
            res.prefill_seconds = time.perf_counter() - t0
            sampler = Sampler(req.sampling)
            decoder = IncrementalDecoder(self.tokenizer, hidden=self.hidden_token_ids)
            stops = StopStringFilter(req.stop_strings)
            t1 = time.perf_counter()
            generated: list[int] = []
            while True:
                if cancel.is_set():
                    res.finish_reason = "cancelled"
                    break
                if len(generated) >= req.max_tokens or len(self.tokens) >= self.max_ctx:
                    res.finish_reason = "length"
                    break
                mask = req.token_mask(generated) if req.token_mask else None
                tok = sampler.sample(logits, mask)
                generated.append(tok.token_id)
                res.completion_tokens += 1
                if tok.token_id in req.stop_token_ids:
                    res.finish_reason = "stop"
                    break
                text, stopped = stops.push(decoder.push(tok.token_id))
                emit(TextEvent(text, tok))
                if stopped:
                    res.finish_reason = "stop"
                    res.stop_string = stops.matched
                    break
                logits = self._eval([tok.token_id])
            if res.stop_string is None:
                # Release what was held back: an unfinished character, text that never became a stop string.
                tail, stopped = stops.push(decoder.flush())
                if stopped:
                    res.finish_reason, res.stop_string = "stop", stops.matched
                else:
                    tail += stops.flush()
                if tail:
                    emit(TextEvent(tail))
            res.decode_seconds = time.perf_counter() - t1
            res.token_ids = generated
            return res
