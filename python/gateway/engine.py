"""The inference engine: one loaded checkpoint with one sequence slot (its KV cache).

    from gateway.engine import Engine
    engine = Engine("/models/Qwen3-30B-A3B", threads=8)
    logits = engine.eval([151644, 872], last_only=True)   # float32 [1, vocab]
    engine.truncate(1)                                     # keep the first token only

The forward passes run in the C core (gateway._core.Model); this wrapper parses config.json
into the normalised config the core reads, validates arguments, turns core errors into
EngineError and keeps throughput statistics.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from .model_config import ConfigError, load_config
from .model_path import ModelPathError, resolve_model_path


class EngineError(RuntimeError):
    """A load or evaluation error reported by the engine (the message names files/tensors)."""


class EvalCancelled(Exception):
    """An eval's progress callback asked to stop.  `done` tokens of the call were kept: the slot
    holds them (n_past grew by that many: whole prefill windows), the rest never happened."""

    def __init__(self, done: int) -> None:
        super().__init__(f"eval cancelled; {done} tokens kept")
        self.done = done


EXPERT_HISTORY_NAME = ".moegate-expert-usage"

# How the KV state stores its rows: "f32" (exact, what the oracle tests compare) or "bf16"
# (round-to-nearest-even, read back into fp32 for the dot products: half the bytes per token).
KV_DTYPES = ("f32", "bf16")
# Activations of the GGUF block-format linears and of native FP4 experts (e2m1 with ue8m0 scales
# per 32: DeepSeek-V4's): f32 (exact; logits equal transformers' on the dequantised weights) or
# int8 (each input row quantised once per call to blocks of 32, integer dot products: faster
# decode, ~1e-2 relative error per product, as llama.cpp's).  Under int8, the prefill of bf16 and
# fp8 weights (those with power-of-two or row scales) rounds x to bf16 on CPUs with AVX512_BF16.
ACTIVATIONS = ("f32", "int8")


def default_expert_history(model_dir: Path) -> Path:
    """Where a budgeted run keeps its routing history: beside the model when that folder is
    writable, else in the user's cache folder under a name keyed by the model's full path (so
    two read-only copies of different models never share one).  For a GGUF file, "beside" is
    NAME.gguf.moegate-expert-usage in the file's folder (two files there never share one)."""
    model_dir = Path(model_dir).resolve()
    if model_dir.is_file():
        folder, beside = model_dir.parent, model_dir.parent / f"{model_dir.name}{EXPERT_HISTORY_NAME}"
    else:
        folder, beside = model_dir, model_dir / EXPERT_HISTORY_NAME
    if os.access(folder, os.W_OK) and (not beside.exists() or os.access(beside, os.W_OK)):
        return beside
    cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = hashlib.sha256(str(model_dir).encode()).hexdigest()[:16]
    folder = cache_root / "moegate" / "expert-usage"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{model_dir.name}-{key}"


class Engine:
    """One model, one sequence slot.  Not re-entrant: one eval at a time (a lock enforces it)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ram_gb: float | None = None,
        threads: int | None = None,
        kernels: str | None = None,
        max_ctx: int | None = None,
        routing_trace: str | os.PathLike[str] | None = None,
        expert_history: str | os.PathLike[str] | bool | None = None,
        expert_prefetch: bool = True,
        kv_dtype: str = "f32",
        prefill_window: int | None = None,
        activations: str = "f32",
        emulate_disk_gbps: float | None = None,
    ) -> None:
        """ram_gb: budget for the whole process (experts are then cached and read from disk).
        routing_trace: record every expert fetch to this file (tools/routing_trace.py reads it).
        expert_history: with ram_gb, the routing-history file that seeds the cache policy and
        its hot set read in at start, rewritten at exit; None: beside the model (or a cache folder when that is read-only),
        False: none.  expert_prefetch (on by default): with ram_gb, read-ahead: at each decode
        step the next layer's router, applied one layer early, hints the experts it will pick;
        the store reads the hinted ones it lacks while the current layer computes, as far as its
        disk would otherwise sit idle (ranks of hint right less than 70 % of the time are not
        read).  A higher hit rate for some wasted reads; False: demand reads only, whose hits
        and misses tools/routing_trace.py replays exactly (docs/ARCHITECTURE.md,
        tools/traces/README.md).
        kv_dtype: "f32" (default) or "bf16": the KV cache's storage (info["kv_bytes_per_token"]
        is what one position costs; a ram_gb budget counts max_ctx of it).
        prefill_window: tokens a prefill evaluates layer by layer at once (each routed expert is
        fetched once per layer per window; rounded up to the architecture's chunk); None: sized
        from ram_gb (a fixed default without it).  info["prefill_window"] is the one in use.
        activations: "f32" (default: exact) or "int8": the linears of GGUF block-format weights
        and of native FP4 ones (e2m1 with ue8m0 scales per 32 columns, DeepSeek-V4's experts)
        quantise each input row to int8 once and dot in integers (faster; logits differ from
        f32's by the activation rounding).  Decode always; prefill too where the kernels have an
        int8 GEMM (every x86 CPU with AVX2, arm64 with the dot product; info["int8_prefill"]),
        else prefill keeps f32.  Other weight formats (f32, bf16, f16, FP8) keep fp32 x, except
        that on a CPU with AVX512_BF16 the prefill of bf16 and FP8 weights exact in bf16
        (unscaled, power-of-two block or row scales) rounds x to bf16 (2x the fp32 tiles'
        multiply-adds per instruction; about 1e-2 relative change in the logits, as int8).
        info["activations"] is the one in use.
        emulate_disk_gbps: rehearsals only (tools/rehearse.py), with ram_gb: the expert store's
        reads complete no sooner than on a single-queue disk of this many GB/s (the bytes still
        come from the files; reads that come back faster, as a sparse file's holes do, are held).
        Wall time then shows how much of that disk's read time decode hides behind compute.
        None (the default, and always in the server): reads run at the machine's speed."""
        from . import _core  # imported here so config errors surface even without a built core

        try:  # a folder holding one GGUF model stands for that file
            self.path = resolve_model_path(path)
        except ModelPathError as exc:
            raise EngineError(str(exc)) from None
        is_gguf = self.path.is_file() and self.path.suffix.lower() == ".gguf"
        if not self.path.exists():
            raise EngineError(f"{self.path}: not a model folder or a .gguf file (nothing is there)")
        if not self.path.is_dir() and not is_gguf:
            raise EngineError(f"{self.path}: not a model folder or a .gguf file")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        if max_ctx is not None and (not isinstance(max_ctx, int) or max_ctx < 1):
            raise ValueError(f"max_ctx must be a positive integer, got {max_ctx!r}")
        if ram_gb is not None and not ram_gb > 0:
            raise ValueError(f"ram_gb must be > 0, got {ram_gb!r}")
        if prefill_window is not None and (isinstance(prefill_window, bool) or not isinstance(prefill_window, int)
                                           or prefill_window < 1):
            raise ValueError(f"prefill_window must be a positive integer, got {prefill_window!r}")
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
        if emulate_disk_gbps is not None and (isinstance(emulate_disk_gbps, bool)
                                              or not isinstance(emulate_disk_gbps, (int, float))
                                              or not 0 < emulate_disk_gbps < float("inf")):
            raise ValueError(f"emulate_disk_gbps must be a positive number of GB/s, got {emulate_disk_gbps!r}")
        if emulate_disk_gbps is not None and ram_gb is None:
            raise ValueError("emulate_disk_gbps needs ram_gb: without a budget no expert is read from disk")
        # ConfigError is a ValueError: unknown model_type / bad fields fail before C is called.
        self.config: dict[str, Any] = load_config(self.path)
        started = time.perf_counter()
        try:
            self._handle: Any = _core.Model(
                str(self.path),
                json.dumps(self.config),
                threads=threads or 0,
                kernels=kernels or "",
                max_ctx=max_ctx or 0,
                ram_gb=float(ram_gb or 0.0),
                kv_dtype=kv_dtype,
                prefill_window=prefill_window or 0,
                activations=activations,
            )
        except RuntimeError as exc:
            raise EngineError(str(exc)) from None
        history: Path | None = None
        self.read_ahead = False  # expert_prefetch took effect (a budget with a cache)
        try:
            # the disk model first, so that the history's hot set read at start is paced too
            if emulate_disk_gbps is not None and self._has_cache():
                self._model.emulate_disk(float(emulate_disk_gbps) * 1e9)
            if ram_gb is not None and expert_history is not False and self._has_cache():
                history = default_expert_history(self.path) if expert_history in (None, True) else Path(expert_history)
                self._model.use_expert_history(str(history))
            if ram_gb is not None and expert_prefetch and self._has_cache():
                self._model.set_expert_prefetch(int(self._model.info().get("n_experts_per_tok") or 0))
                self.read_ahead = True
            if routing_trace is not None:
                self._model.trace_routing(str(routing_trace))
        except (RuntimeError, OSError) as exc:
            self._handle = None
            raise EngineError(str(exc)) from None
        self.load_seconds = time.perf_counter() - started
        self.info: dict[str, Any] = dict(self._model.info())
        self.info["expert_history"] = str(history) if history else None
        self.info["path"] = str(self.path)
        self.vocab_size: int = int(self.info["vocab_size"])
        self.max_ctx: int = int(self.info["max_ctx"])
        self._lock = threading.Lock()
        self._stats = {
            "prefill_tokens": 0, "prefill_seconds": 0.0, "prefill_calls": 0,
            "decode_tokens": 0, "decode_seconds": 0.0,
        }

    # ---- lifetime ------------------------------------------------------------------------

    @property
    def _model(self) -> Any:
        if self._handle is None:
            raise EngineError("the engine is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Releases the model now (mapped files, expert cache, worker threads) and writes the
        routing history of a budgeted run, instead of whenever the garbage collector runs;
        later calls raise EngineError.  Closing twice is harmless."""
        with self._lock:
            self._handle = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- sequence slot -------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        """Tokens currently held by the slot (positions 0 .. n_past-1)."""
        return int(self._model.n_past)

    def eval(self, tokens: Iterable[int], last_only: bool = False, *,
             progress: Callable[[int, int, int, int], object] | None = None) -> np.ndarray:
        """Appends tokens to the slot and returns float32 logits: [len(tokens), vocab], or
        [1, vocab] for the last token with last_only (the head runs for that token alone).

        A prefill runs layer by layer over windows of info["prefill_window"] tokens.
        progress(layer, n_layers, done, window), when given, is called after each layer of the
        window covering tokens [done, done + window) of this call (tokens before `done` are
        complete, and after the last layer so is the window); a truthy return stops the eval
        with EvalCancelled, keeping the complete windows (its `done`; n_past grew by that many).
        An exception it raises stops the eval the same way and propagates.  When `progress`
        has a `poll` attribute, poll(layer, n_layers, done, window) is also called inside a
        layer (between its dense sub-chunks and groups of routed experts, `layer` being the one
        in progress), so a cancel takes effect within about a sub-chunk's time rather than a
        layer's (at full DeepSeek-V4-Flash size a layer of a long window takes a minute); a
        truthy return cancels the same way.  Both run in the calling thread and must not call
        into this engine."""
        ids = self._token_list(tokens)
        if not ids:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        with self._lock:
            started, before = time.perf_counter(), self._model.n_past
            try:
                if progress is None:
                    logits = self._model.eval(ids, bool(last_only))
                else:
                    logits, kept = self._model.eval_hooked(ids, bool(last_only), progress)
                    if logits is None:
                        raise EvalCancelled(kept)
            except RuntimeError as exc:
                raise EngineError(str(exc)) from None
            finally:  # what the slot kept counts (all of it, or the windows before a cancel)
                self._count(len(ids), self._model.n_past - before, time.perf_counter() - started)
        return logits

    def _count(self, n: int, kept: int, elapsed: float) -> None:
        if not kept:
            return
        key = "decode" if n == 1 else "prefill"
        self._stats[f"{key}_tokens"] += kept
        self._stats[f"{key}_seconds"] += elapsed
        if key == "prefill":
            self._stats["prefill_calls"] += 1

    def truncate(self, n: int) -> None:
        """Keeps the first n tokens; evaluating after this equals a fresh run on them."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"truncate needs an integer, got {type(n).__name__}")
        if n < 0 or n > self.n_past:
            raise EngineError(f"cannot truncate to {n} tokens: the slot holds {self.n_past}")
        with self._lock:
            try:
                self._model.truncate(int(n))
            except RuntimeError as exc:
                raise EngineError(str(exc)) from None

    def save_prefix(self, n: int | None = None) -> np.ndarray:
        """The slot's state for its first n tokens (default: all it holds) as one snapshot
        (uint8 array).  restore_prefix(snapshot) brings exactly that prefix back later, in this
        engine or another one on the same checkpoint and KV dtype, without prefilling again."""
        n = self.n_past if n is None else n
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"save_prefix needs an integer, got {type(n).__name__}")
        with self._lock:
            try:
                return self._model.save_prefix(int(n))
            except RuntimeError as exc:
                raise EngineError(str(exc)) from None

    def prefix_bytes(self, n: int | None = None) -> int:
        """The size save_prefix(n) will have (to make room before taking it)."""
        n = self.n_past if n is None else n
        with self._lock:
            try:
                return int(self._model.prefix_bytes(int(n)))
            except RuntimeError as exc:
                raise EngineError(str(exc)) from None

    def restore_prefix(self, snapshot: Any) -> int:
        """Replaces the slot with a snapshot from save_prefix; returns its length in tokens.
        Evaluating after it gives the same logits as a fresh run on those tokens.  A snapshot
        of another model or KV dtype, or a damaged one, is an EngineError (the slot is then
        empty)."""
        with self._lock:
            try:
                return int(self._model.restore_prefix(snapshot))
            except (RuntimeError, ValueError, TypeError) as exc:
                raise EngineError(str(exc)) from None

    def reset(self) -> None:
        """Empties the slot."""
        with self._lock:
            self._model.reset()

    def set_routing_trace(self, path: str | os.PathLike[str] | None) -> None:
        """Starts recording expert fetches to `path` (replacing any trace being written), or
        with None stops and closes the file so it can be read."""
        with self._lock:
            try:
                self._model.trace_routing(None if path is None else str(path))
            except RuntimeError as exc:
                raise EngineError(str(exc)) from None

    def _has_cache(self) -> bool:
        return int(self._model.expert_stats()["slots"]) > 0

    # ---- reporting -----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        s = dict(self._stats)
        s["tokens_evaluated"] = s["prefill_tokens"] + s["decode_tokens"]
        s["prefill_tok_per_s"] = s["prefill_tokens"] / s["prefill_seconds"] if s["prefill_seconds"] else 0.0
        s["decode_tok_per_s"] = s["decode_tokens"] / s["decode_seconds"] if s["decode_seconds"] else 0.0
        s["n_past"] = self.n_past
        s["load_seconds"] = self.load_seconds
        experts = dict(self._model.expert_stats())
        lookups = experts["hits"] + experts["misses"]
        experts["hit_rate"] = experts["hits"] / lookups if lookups else 0.0
        seconds = experts["read_seconds"]
        experts["read_gb_s"] = experts["bytes_read"] / seconds / 1e9 if seconds else 0.0
        s["experts"] = experts
        return s

    def _token_list(self, tokens: Iterable[int]) -> list[int]:
        if isinstance(tokens, np.ndarray):
            if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
                raise TypeError("tokens must be a 1-D sequence of integer ids")
            ids = [int(t) for t in tokens]
        else:
            ids = []
            for t in tokens:
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                    raise TypeError(f"token ids must be integers, got {t!r}")
                ids.append(int(t))
        return ids  # ids outside the vocabulary, and a context overflow, are the core's to refuse

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"n_past={self.n_past}"
        return f"Engine({str(self.path)!r}, arch={self.info['arch']}, {state})"


__all__ = ["Engine", "EngineError", "EvalCancelled", "ConfigError", "KV_DTYPES"]
