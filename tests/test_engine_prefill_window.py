"""Layer-major prefill (issue 14, item 2): a prompt runs layer by layer over windows of many
tokens, so under a RAM budget each routed expert is read at most once per layer per window.

- A budgeted prompt of several hundred tokens in one window misses each (layer, expert) it
  routes to at most once, and reads at most 1.1x those experts' bytes; the same prompt fed in
  chunk-sized calls (what every prefill did before) reads several times that.
- Logits are bitwise the same whatever the window: one call, windows of one chunk, chunk-sized
  calls (the old path), resident or budgeted.
- The progress hook runs between layers; a cancel keeps exactly the complete windows, and the
  slot then continues bitwise as if the call had been cut there.  The generation Slot reports
  finished windows and stops at a layer boundary.

Checkpoints are the budget tests' (tests/test_expert_budget.py): experts dominate the bytes.
"""
from __future__ import annotations

import json
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from gateway.engine import Engine, EvalCancelled
from gateway.generate import Cancelled, ProgressEvent, Slot
from gateway.tokenizer import Tokenizer
from test_expert_budget import dsv4_small_checkpoint, open_with_slots, small_checkpoint

PROMPT_TOKENS = 600
MAX_CTX = 1024
EXPERT_PREFIX = {"qwen3_moe": "model.layers.{}.mlp.experts.{}.", "deepseek_v4": "layers.{}.ffn.experts.{}."}


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prefill_window")


def prompt_for(engine: Engine, n: int, seed: int = 7) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(1, engine.vocab_size, n)]


def chunk_of(ckpt: Path) -> int:
    """The architecture's dense sub-chunk: a window of 1 token rounds up to it."""
    engine = Engine(str(ckpt), max_ctx=MAX_CTX, prefill_window=1)
    try:
        return int(engine.info["prefill_window"])
    finally:
        engine.close()


def in_calls(engine: Engine, prompt: list[int], size: int) -> np.ndarray:
    engine.reset()
    return np.concatenate([engine.eval(prompt[i:i + size]) for i in range(0, len(prompt), size)])


def tensor_bytes(ckpt: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for shard in ckpt.glob("*.safetensors"):
        with open(shard, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        sizes.update({k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()})
    return sizes


def routed_expert_bytes(ckpt: Path, arch: str, trace_path: Path) -> tuple[int, int]:
    """(distinct (layer, expert) pairs the traced run fetched, their bytes in the files)."""
    from tools.routing_trace import read_trace

    trace = read_trace(trace_path)
    pairs = {(layer, int(e)) for layer, batch in zip(trace.layers, trace.batches) for e in batch}
    sizes = tensor_bytes(ckpt)
    total = 0
    for layer, e in pairs:
        prefix = EXPERT_PREFIX[arch].format(layer, e)
        total += sum(v for k, v in sizes.items() if k.startswith(prefix))
    return len(pairs), total


def check_reads_each_expert_once(ckpt: Path, arch: str, tmp_path: Path) -> None:
    n_experts = int(Engine(str(ckpt), max_ctx=MAX_CTX).info["n_experts"])
    # About 1.5 layers of slots: a pass per chunk must read a layer's experts again each chunk.
    # A cache this small would size the window at a chunk or two (it takes at most a quarter of
    # the cache): the window is asked for, and counted under the budget.
    engine = open_with_slots(ckpt, 3 * n_experts // 2, max_ctx=MAX_CTX, prefill_window=MAX_CTX)
    prompt = prompt_for(engine, PROMPT_TOKENS)
    assert engine.info["prefill_window"] == MAX_CTX, engine.info
    chunk = chunk_of(ckpt)
    trace = tmp_path / "prompt.trace"
    engine.set_routing_trace(trace)
    before = engine.stats()["experts"]
    got = engine.eval(prompt)
    engine.set_routing_trace(None)
    after = engine.stats()["experts"]
    misses, read = after["misses"] - before["misses"], after["bytes_read"] - before["bytes_read"]
    distinct, distinct_bytes = routed_expert_bytes(ckpt, arch, trace)
    assert misses <= distinct, (misses, distinct)
    assert read <= 1.1 * distinct_bytes, (read, distinct_bytes)

    # The old path: one pass over the layers per chunk, the same logits bitwise, many more reads.
    start = engine.stats()["experts"]
    old = in_calls(engine, prompt, chunk)
    end = engine.stats()["experts"]
    old_read = end["bytes_read"] - start["bytes_read"]
    print(f"{arch}: {PROMPT_TOKENS} tokens, chunk {chunk}: one window read {read / 1e6:.2f} MB "
          f"({misses} misses, {distinct} experts routed, {distinct_bytes / 1e6:.2f} MB), "
          f"chunk by chunk {old_read / 1e6:.2f} MB ({end['misses'] - start['misses']} misses)")
    assert old_read > 1.5 * read, (old_read, read)
    assert np.array_equal(got, old)
    engine.close()

    resident = Engine(str(ckpt), max_ctx=MAX_CTX)
    resident.reset()
    assert np.array_equal(resident.eval(prompt), got)


def test_budgeted_prefill_reads_each_expert_once_qwen(ckpt_root: Path, tmp_path: Path) -> None:
    check_reads_each_expert_once(small_checkpoint(ckpt_root, "qwen3_moe", "bf16"), "qwen3_moe", tmp_path)


@pytest.mark.rss  # budgets sized for an uninstrumented process (make sanitize skips these)
def test_budgeted_prefill_reads_each_expert_once_deepseek_v4(ckpt_root: Path, tmp_path: Path) -> None:
    check_reads_each_expert_once(dsv4_small_checkpoint(ckpt_root), "deepseek_v4", tmp_path)


# ---- windows never change a bit --------------------------------------------------------------

ARCHS = [("qwen3_moe", "bf16"), ("glm4_moe", "fp8"), ("deepseek_v4", "native")]


@pytest.fixture(scope="module", params=ARCHS, ids=[a for a, _ in ARCHS])
def tiny(request, build_checkpoint) -> Path:
    arch, fmt = request.param
    return build_checkpoint(arch, fmt)


def test_logits_are_bitwise_the_same_for_any_window(tiny: Path) -> None:
    chunk = chunk_of(tiny)
    whole = Engine(str(tiny), max_ctx=MAX_CTX)
    prompt = prompt_for(whole, 2 * chunk + 37, seed=3)
    want = whole.eval(prompt)
    assert np.array_equal(in_calls(whole, prompt, chunk), want)  # the old path: a pass per chunk
    whole.reset()
    last = whole.eval(prompt, last_only=True)  # the head for the last row alone, as the old last chunk
    for window in (1, chunk + 1, 3 * chunk):
        engine = Engine(str(tiny), max_ctx=MAX_CTX, prefill_window=window)
        assert engine.info["prefill_window"] % chunk == 0
        assert np.array_equal(engine.eval(prompt), want), f"window {window}"
        engine.reset()
        assert np.array_equal(engine.eval(prompt, last_only=True), last), f"window {window}, last_only"
        engine.close()


# ---- the progress hook and cancellation ----------------------------------------------------------


def test_progress_runs_between_layers_and_cancel_keeps_whole_windows(tiny: Path) -> None:
    chunk = chunk_of(tiny)
    engine = Engine(str(tiny), max_ctx=MAX_CTX, prefill_window=chunk)
    n_layers = int(engine.info["n_layers"])
    head, rest = prompt_for(engine, 5, seed=1), prompt_for(engine, 3 * chunk + 11, seed=2)
    engine.eval(head)
    fresh = engine.eval(rest)

    calls: list[tuple[int, int, int, int]] = []
    engine.reset()
    engine.eval(head)
    logits = engine.eval(rest, progress=lambda *a: calls.append(a))
    assert np.array_equal(logits, fresh)
    windows = [(t0, min(chunk, len(rest) - t0)) for t0 in range(0, len(rest), chunk)]
    assert calls == [(li, n_layers, t0, m) for t0, m in windows for li in range(n_layers)]

    def cut_at(kept: int) -> np.ndarray:
        """What the slot gives after the whole call is cut back to `kept` of its tokens (for
        DeepSeek-V4 a cut off its compression period replays the tail, as a cancel does)."""
        engine.reset()
        engine.eval(head)
        engine.eval(rest)
        engine.truncate(len(head) + kept)
        return engine.eval(rest[kept:])

    # Cancelled inside the second window: the first window stays; continuing is bitwise a cut.
    for stop_layer, kept in ((0, chunk), (n_layers - 1, 2 * chunk)):
        want = cut_at(kept)
        engine.reset()
        engine.eval(head)
        with pytest.raises(EvalCancelled) as info:
            engine.eval(rest, progress=lambda li, n, done, w, s=stop_layer: done == chunk and li == s)
        assert info.value.done == kept and engine.n_past == len(head) + kept
        assert np.array_equal(engine.eval(rest[kept:]), want), f"cancelled at layer {stop_layer}"
    # From an empty slot (window ends on the compression period) it continues as if never cut.
    engine.reset()
    uncut = engine.eval(head + rest)
    engine.reset()
    with pytest.raises(EvalCancelled) as info:
        engine.eval(head + rest, progress=lambda li, n, done, w: done == chunk)
    assert info.value.done == chunk and engine.n_past == chunk
    assert np.array_equal(engine.eval((head + rest)[chunk:]), uncut[chunk:])

    # Cancelled in the first window: nothing of the call happened.
    want = cut_at(0)
    engine.reset()
    engine.eval(head)
    with pytest.raises(EvalCancelled) as info:
        engine.eval(rest, progress=lambda *a: True)
    assert info.value.done == 0 and engine.n_past == len(head)
    assert np.array_equal(engine.eval(rest), want)

    # An exception in the callback stops the eval the same way and reaches the caller.
    def boom(li: int, n: int, done: int, w: int) -> None:
        if done == 2 * chunk:
            raise KeyError("from the callback")

    want = cut_at(2 * chunk)
    engine.reset()
    engine.eval(head)
    with pytest.raises(KeyError, match="from the callback"):
        engine.eval(rest, progress=boom)
    assert engine.n_past == len(head) + 2 * chunk
    assert np.array_equal(engine.eval(rest[2 * chunk:]), want)
    engine.close()


class Recorder:
    """A progress hook with a poll: records every call as (kind, layer, done) and cancels at the
    in-layer poll number `cancel_at` (1-based, counted over the whole eval, or over the polls of
    (layer, done) `where`; 0: never)."""

    def __init__(self, cancel_at: int = 0, where: tuple[int, int] | None = None) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.cancel_at, self.where, self.polls, self.cancelled_at = cancel_at, where, 0, -1

    def __call__(self, layer: int, n_layers: int, done: int, window: int) -> bool:
        self.calls.append(("layer", layer, done))
        return False

    def poll(self, layer: int, n_layers: int, done: int, window: int) -> bool:
        self.calls.append(("poll", layer, done))
        if self.where is not None and (layer, done) != self.where:
            return False
        self.polls += 1
        if self.polls == self.cancel_at:
            self.cancelled_at = len(self.calls)
        return self.polls == self.cancel_at


def test_cancel_polled_inside_a_layer_stops_before_it_ends(tiny: Path) -> None:
    """Issue 16 item 2: one layer of a long window takes a minute at full size, so the hook is
    polled inside a layer too (between dense sub-chunks and between groups of experts).  A
    cancel at any of those polls returns at once (no call after it: no sub-chunk or expert group
    computed after it), drops the window whose layer was in progress, and the slot then equals
    a fresh engine fed only the kept tokens, bitwise."""
    chunk = chunk_of(tiny)
    engine = Engine(str(tiny), max_ctx=MAX_CTX, prefill_window=2 * chunk)
    n_layers = int(engine.info["n_layers"])
    head, rest = prompt_for(engine, 5, seed=1), prompt_for(engine, 3 * chunk + 11, seed=2)
    engine.eval(head)
    whole = Recorder()
    assert np.array_equal(engine.eval(rest, progress=whole), _fresh(tiny, head, rest, window=2 * chunk))
    # Every layer of a window polls between its 2 sub-chunks; a MoE layer also before its
    # experts and between their groups (about one sub-chunk's assignments each).
    per_layer = [sum(1 for kind, li, done in whole.calls if kind == "poll" and li == layer and done == 0)
                 for layer in range(n_layers)]
    assert min(per_layer) >= 1 and max(per_layer) > 2, per_layer
    assert [c for c in whole.calls if c[0] == "layer"] == [
        ("layer", li, t0) for t0 in (0, 2 * chunk) for li in range(n_layers)]

    def cut_at(kept: int) -> np.ndarray:
        """The whole call cut back to `kept` of its tokens, continued (as the between-layer test
        above: on DeepSeek-V4 a cut off its compression period replays the tail, as a cancel does)."""
        engine.reset()
        engine.eval(head)
        engine.eval(rest)
        engine.truncate(len(head) + kept)
        return engine.eval(rest[kept:])

    prompt = head + rest
    layer = n_layers - 1  # the last layer: a cancel after it would have kept the window
    # (tokens before the call, the call, the window with the cancel = the tokens kept, reference)
    cases = [(head, rest, 0, _fresh(tiny, head, rest, window=2 * chunk)),
             (head, rest, 2 * chunk, cut_at(2 * chunk)),
             ([], prompt, 2 * chunk, _fresh(tiny, prompt[:2 * chunk], prompt[2 * chunk:], window=2 * chunk))]
    for before, call, kept, want in cases:
        engine.reset()
        if before:
            engine.eval(before)
        probe = Recorder()
        engine.eval(call, progress=probe)
        polls = [n + 1 for n, c in enumerate(c for c in probe.calls if c[0] == "poll") if c[1:] == (layer, kept)]
        assert len(polls) >= 2, probe.calls
        for cancel_at in polls:
            engine.reset()
            if before:
                engine.eval(before)
            rec = Recorder(cancel_at)
            with pytest.raises(EvalCancelled) as info:
                engine.eval(call, progress=rec)
            assert rec.cancelled_at == len(rec.calls), "the hook was called after the cancel"
            assert ("layer", layer, kept) not in rec.calls  # the layer never finished
            assert info.value.done == kept and engine.n_past == len(before) + kept
            assert np.array_equal(engine.eval(call[kept:]), want), f"cancelled at poll {cancel_at}"
    engine.close()


@pytest.mark.rss  # a budget sized for an uninstrumented process (make sanitize skips it)
def test_cancel_polled_while_experts_are_read(ckpt_root: Path) -> None:
    """Under a budget a layer's missing experts are computed as their reads land, a poll before
    each: a cancel there closes the fetch batch (the reads in flight land in the cache) and the
    slot continues bitwise as a resident engine fed only the kept tokens."""
    ckpt = small_checkpoint(ckpt_root, "qwen3_moe", "bf16")
    chunk = chunk_of(ckpt)
    n_experts = int(Engine(str(ckpt), max_ctx=MAX_CTX).info["n_experts"])
    engine = open_with_slots(ckpt, 3 * n_experts // 2, max_ctx=MAX_CTX, prefill_window=2 * chunk)
    assert engine.info["prefill_window"] == 2 * chunk and engine.stats()["experts"]["slots"] > 0
    prompt = prompt_for(engine, 3 * chunk + 11, seed=4)
    n_layers = int(engine.info["n_layers"])
    want = _fresh(ckpt, prompt[:2 * chunk], prompt[2 * chunk:], window=2 * chunk)
    # The polls of a layer depend on what the cache holds (one per landed read): the first three
    # are there whatever it holds (between the sub-chunks, before the experts, between groups);
    # this layer reads over a dozen experts (cold or warm), so the tenth is one before a landed read.
    for cancel_at in (1, 2, 3, 10):
        engine.reset()
        misses = engine.stats()["experts"]["misses"]
        rec = Recorder(cancel_at, where=(n_layers - 1, 2 * chunk))
        with pytest.raises(EvalCancelled) as info:
            engine.eval(prompt, progress=rec)
        assert rec.cancelled_at == len(rec.calls) and info.value.done == 2 * chunk
        assert engine.stats()["experts"]["misses"] > misses  # the cache is cold enough to read
        assert np.array_equal(engine.eval(prompt[2 * chunk:]), want), f"cancelled at poll {cancel_at}"
    engine.close()


def _fresh(ckpt: Path, *calls: list[int], window: int) -> np.ndarray:
    """The logits of the last call on a fresh engine fed the calls before it first (the same
    calls: a sub-chunk starts where its call does, so other cuts would batch other rows)."""
    engine = Engine(str(ckpt), max_ctx=MAX_CTX, prefill_window=window)
    try:
        for ids in calls[:-1]:
            if ids:
                engine.eval(ids)
        return engine.eval(calls[-1])
    finally:
        engine.close()


def test_slot_prefill_reports_windows_and_stops_between_layers(build_checkpoint) -> None:
    ckpt = build_checkpoint("qwen3_moe", "bf16")
    chunk = chunk_of(ckpt)
    engine = Engine(str(ckpt), max_ctx=MAX_CTX, prefill_window=chunk)
    slot = Slot(engine, Tokenizer.from_dir(ckpt), max_ctx=MAX_CTX)
    prompt = prompt_for(engine, 2 * chunk + 40, seed=5)
    reports: list[ProgressEvent] = []
    slot.progress_seconds = 3600.0  # window ends only
    logits, cached = slot.prefill(prompt, threading.Event(), reports.append)
    assert cached == 0 and [(r.done, r.total, r.layer) for r in reports] == [
        (chunk, len(prompt), None), (2 * chunk, len(prompt), None), (len(prompt), len(prompt), None)]
    assert engine.stats()["prefill_calls"] == 1  # the whole prompt in one engine call

    # Layer progress inside each window, as often as progress_seconds allows (0: every layer).
    slot.engine.reset()
    slot.tokens = []
    slot.progress_seconds = 0.0
    reports.clear()
    slot.prefill(prompt, threading.Event(), reports.append)
    n_layers = engine.info["n_layers"]
    windows = [(0, chunk), (chunk, chunk), (2 * chunk, 40)]
    want = [(d, len(prompt), layer, n_layers, w) for d, w in windows for layer in range(1, n_layers)]
    assert [(r.done, r.total, r.layer, r.n_layers, r.window) for r in reports if r.layer is not None] == want
    assert [r.done for r in reports if r.layer is None] == [chunk, 2 * chunk, len(prompt)]

    slot.engine.reset()
    slot.tokens = []
    slot.progress_seconds = 3600.0
    cancel = threading.Event()
    with pytest.raises(Cancelled):
        slot.prefill(prompt, cancel, lambda event: cancel.set())  # set as the first window finishes
    assert slot.tokens == prompt[:chunk] and engine.n_past == chunk
    again, cached = slot.prefill(prompt, threading.Event())
    assert cached == chunk and np.array_equal(again, logits)
