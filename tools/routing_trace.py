"""Record expert routing and replay it through cache policies.

A routing trace is what the expert store saw: one record per fetch (a layer and the experts
requested together).  The C store writes it (mg_expert_store_trace); this tool reads it, can
synthesise one, and replays it through the replacement policies at several cache sizes:

  lru     least recently requested expert is evicted
  ours    predicted next use (the store's policy, expert_policy.h; demand reads only, as
          Engine(expert_prefetch=False)): evicts the expert whose next request is furthest
          away by the layer cycle of decode and a sticky-frequency estimate; optionally
          seeded and warmed from routing history (--history)
  belady  offline optimum of a demand cache: evict the expert whose next request is furthest away
  ahead   ours plus read-ahead from the trace's look-ahead hints (version 3 traces; the
          store's default under a budget), as if the disk always had the idle time

The replay follows the store's rules: all experts of a fetch are looked up first (a fetch's own
experts are never evicted to make room for each other), and the cache needs at least one
layer's experts.

  python tools/routing_trace.py record --model DIR --out run.trace [--tokens 64] [--prompt-ids ...]
  python tools/routing_trace.py record --model DIR --out run.trace --text FILE [--prompt-tokens 256] --tokens N [--ids-only]
  python tools/routing_trace.py replay run.trace [--budgets 0.05,0.1,0.25,0.5] [--history old.trace|usage-file]
  python tools/routing_trace.py scores run.trace    (the router's ranks vs the policy's prediction)
  python tools/routing_trace.py synth --out synth.trace --layers 8 --experts 64 --k 8 --tokens 500 \
      [--skew 1.0 --reuse 0.3 --drift 0.15 --drift-tokens 50]
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAGIC = b"MGRTRACE"
VERSION = 3  # 3: records carry the look-ahead hint; 2: the router's scores; 1: ids only (all read)
HEADER = struct.Struct("<8sIIII")  # magic, version, n_layers, n_experts, reserved


@dataclass
class Trace:
    n_layers: int
    n_experts: int
    layers: list[int] = field(default_factory=list)
    batches: list[np.ndarray] = field(default_factory=list)  # expert ids per fetch
    # per fetch: the values the router's top-k ranked for the batch's last token (float32 of
    # n_experts), or None (a version 1 trace, a hash-routed layer, a synthetic trace)
    scores: list[np.ndarray | None] = field(default_factory=list)
    # per fetch: the look-ahead hint given just before it (the layer it is for, its expert ids
    # best first; experts.h mg_expert_store_hint), or None
    hints: list[tuple[int, np.ndarray] | None] = field(default_factory=list)

    def score(self, i: int) -> np.ndarray | None:
        return self.scores[i] if i < len(self.scores) else None

    def hint(self, i: int) -> tuple[int, np.ndarray] | None:
        return self.hints[i] if i < len(self.hints) else None

    def keys(self, i: int) -> np.ndarray:
        """Unique cache keys (layer * n_experts + expert) of fetch i, in request order."""
        ids = self.batches[i].astype(np.int64) + self.layers[i] * self.n_experts
        _, first = np.unique(ids, return_index=True)
        return ids[np.sort(first)]

    @property
    def n_keys(self) -> int:
        return self.n_layers * self.n_experts

    def __len__(self) -> int:
        return len(self.batches)


def read_trace(path: str | os.PathLike[str]) -> Trace:
    data = Path(path).read_bytes()
    if len(data) < HEADER.size:
        raise ValueError(f"{path}: not a routing trace (file too short)")
    magic, version, n_layers, n_experts, _ = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"{path}: not a routing trace (bad magic {magic!r})")
    if version not in (1, 2, 3):
        raise ValueError(f"{path}: routing trace version {version}, expected 1 to {VERSION}")
    if version == 1 and (len(data) - HEADER.size) % 2:
        raise ValueError(f"{path}: truncated routing trace")
    trace = Trace(n_layers, n_experts)
    pos, end = HEADER.size, len(data)

    def u16s(at: int, n: int) -> np.ndarray:
        if at + 2 * n > end:
            raise ValueError(f"{path}: truncated record at byte {pos}")
        return np.frombuffer(data, dtype="<u2", count=n, offset=at)

    while pos < end:
        layer, n = (int(x) for x in u16s(pos, 2))
        ids = u16s(pos + 4, n)
        at = pos + 4 + 2 * n
        scores = None
        if version >= 2:
            (ns,) = u16s(at, 1)
            ns = int(ns)
            if ns not in (0, n_experts) or at + 2 + 4 * ns > end:
                raise ValueError(f"{path}: damaged or truncated record at byte {pos}")
            if ns:
                scores = np.frombuffer(data, dtype="<f4", count=ns, offset=at + 2).copy()
            at += 2 + 4 * ns
        hint = None
        if version >= 3:
            (nh,) = u16s(at, 1)
            nh = int(nh)
            at += 2
            if nh:
                hint_layer = int(u16s(at, 1)[0])
                hint_ids = u16s(at + 2, nh).astype(np.int32)
                if hint_layer >= n_layers or int(hint_ids.max()) >= n_experts:
                    raise ValueError(f"{path}: record at byte {pos} is out of range")
                hint = (hint_layer, hint_ids)
                at += 2 + 2 * nh
        if layer >= n_layers or (n and int(ids.max()) >= n_experts):
            raise ValueError(f"{path}: record at byte {pos} is out of range")
        trace.layers.append(layer)
        trace.batches.append(ids.astype(np.int32))
        trace.scores.append(scores)
        trace.hints.append(hint)
        pos = at
    return trace


def write_trace(path: str | os.PathLike[str], trace: Trace) -> None:
    with open(path, "wb") as f:
        f.write(HEADER.pack(MAGIC, VERSION, trace.n_layers, trace.n_experts, 0))
        for i, (layer, ids) in enumerate(zip(trace.layers, trace.batches)):
            f.write(struct.pack("<HH", layer, len(ids)))
            f.write(np.asarray(ids, dtype="<u2").tobytes())
            sc = trace.score(i)
            f.write(struct.pack("<H", 0 if sc is None else trace.n_experts))
            if sc is not None:
                f.write(np.asarray(sc, dtype="<f4").tobytes())
            h = trace.hint(i)
            f.write(struct.pack("<H", 0 if h is None else len(h[1])))
            if h is not None:
                f.write(struct.pack("<H", h[0]))
                f.write(np.asarray(h[1], dtype="<u2").tobytes())


def synthesize(n_layers: int, n_experts: int, k: int, n_tokens: int, seed: int = 0,
               skew: float = 1.0, reuse: float = 0.3, drift: float = 0.0, drift_tokens: float = 50.0) -> Trace:
    """Decode-like routing.  Per layer a Zipf popularity (weight of the r-th most popular expert
    ~ 1 / r**skew) over a random permutation of the experts; each of a token's k choices
    repeats one of the previous token's experts of that layer with probability `reuse`, else
    draws from the popularity.  drift > 0 lets popularity wander: before each token every
    expert's log-weight takes a step of an Ornstein-Uhlenbeck walk, offset += -offset /
    drift_tokens + drift * N(0, 1), so the hot set changes over ~drift_tokens tokens while the
    skew stays (stationary spread of the offsets: drift * sqrt(drift_tokens / 2)).  With
    drift = 0 the random stream is the same as before drift existed."""
    rng = np.random.default_rng(seed)
    weights = []
    for _ in range(n_layers):
        w = 1.0 / np.arange(1, n_experts + 1) ** skew
        weights.append(rng.permutation(w / w.sum()))
    offsets = [np.zeros(n_experts) for _ in range(n_layers)]
    trace = Trace(n_layers, n_experts)
    prev: list[np.ndarray] = [np.empty(0, dtype=np.int32) for _ in range(n_layers)]
    for _ in range(n_tokens):
        for layer in range(n_layers):
            p = weights[layer]
            if drift > 0:
                off = offsets[layer]
                off += -off / drift_tokens + drift * rng.standard_normal(n_experts)
                p = p * np.exp(off - off.max())
                p = p / p.sum()
            chosen: list[int] = []
            while len(chosen) < k:
                if len(prev[layer]) and rng.random() < reuse:
                    e = int(rng.choice(prev[layer]))
                else:
                    e = int(rng.choice(n_experts, p=p))
                if e not in chosen:
                    chosen.append(e)
            ids = np.array(sorted(chosen), dtype=np.int32)
            prev[layer] = ids
            trace.layers.append(layer)
            trace.batches.append(ids)
    return trace


# ---- policies ------------------------------------------------------------------------------


def usage_counts(trace: Trace) -> np.ndarray:
    counts = np.zeros(trace.n_keys)
    for i in range(len(trace)):
        counts[trace.keys(i)] += 1
    return counts


USAGE_MAGIC = b"MGUSAGE2"  # the store's routing history (expert_cache.c)


def read_history(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The store's routing-history file: (counts per key, visits per layer, n_layers,
    n_experts), as float32 values widened like the store does."""
    data = Path(path).read_bytes()
    if len(data) < 16 or data[:8] != USAGE_MAGIC:
        raise ValueError(f"{path}: not a routing history")
    n_layers, n_experts = struct.unpack_from("<II", data, 8)
    n_keys = n_layers * n_experts
    n = n_keys + n_layers
    values = np.frombuffer(data, dtype="<f4", offset=16)
    if len(values) != n:
        raise ValueError(f"{path}: routing history of {len(values)} values, expected {n}")
    values = np.where(np.isfinite(values) & (values >= 0), values, 0).astype(np.float64)
    return values[:n_keys], values[n_keys:], n_layers, n_experts


def usage_visits(trace: Trace) -> np.ndarray:
    """Fetches of each layer: what the store's routing history keeps beside the counts."""
    return np.bincount(np.asarray(trace.layers, dtype=np.int64), minlength=trace.n_layers).astype(np.float64)


@dataclass
class Result:
    hits: int = 0
    misses: int = 0
    read_ahead: int = 0  # experts read before their fetch asked (policy "ahead")

    @property
    def reads_per_request(self) -> float:
        """Experts read from disk per expert requested: 1 - hit rate without read-ahead."""
        total = self.hits + self.misses
        return (self.misses + self.read_ahead) / total if total else 0.0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


STICKY_DECAY = 0.99  # per fetch, for the stickiness sums (expert_policy.c)
BANK_TOKENS = (16.0, 8.0, 32.0, 64.0, 128.0)  # the default bank of half-lives (expert_policy.c)
ERR_HALF_LIFE_TOKENS = 8.0  # memory of the bank's prediction errors
HINT_RANKS, HINT_DECAY, HINT_PRIOR = 16, 0.98, 0.5  # look-ahead hint accuracy (expert_policy.c)
HINT_MIN_ACCURACY = 0.7  # read ahead only ranks of hint at least this accurate (expert_cache.c)


class _NextUse:
    """The NEXT_USE policy of expert_policy.c, operation for operation (same order of floating
    point additions), so that a replay reproduces the store's hits and misses exactly.
    half_life (fetches) runs one model; None the bank of BANK_TOKENS, where the model whose
    visit predictions had the lowest decayed squared error ranks."""

    def __init__(self, n_layers: int, n_experts: int, half_life: float | None) -> None:
        self.n_layers, self.n_experts = n_layers, n_experts
        n_keys = n_layers * n_experts
        lives = [half_life] if half_life else [t * n_layers for t in BANK_TOKENS]
        self.alpha = [1.0 - math.exp2(-n_layers / h) for h in lives]
        self.f = [np.zeros(n_keys) for _ in lives]
        self.reused = [0.0] * len(lives)
        self.expected = [0.0] * len(lives)
        self.trials = [0.0] * len(lives)
        self.w = [0.0] * len(lives)
        self.err = [0.0] * len(lives)
        self.err_decay = math.exp2(-1.0 / (ERR_HALF_LIFE_TOKENS * n_layers))
        self.used = np.zeros(n_keys, dtype=bool)
        # look-ahead hints (mg_policy_hint): 1 + rank per hinted key, and per (layer, rank) the
        # decayed hints that came true and hints given
        self.hinted = np.zeros(n_keys, dtype=np.int64)
        self.hint_hit = np.zeros((n_layers, HINT_RANKS))
        self.hint_n = np.zeros((n_layers, HINT_RANKS))
        self.best = 0
        self.chosen: list[int] = []  # the ranking model after each fetch (for tests and plots)

    def seed(self, history: np.ndarray, visits: np.ndarray | None = None) -> None:
        """f = each key's count over its layer's visits (over the layer's top count when the
        visits are unknown or fewer than it), as mg_policy_seed."""
        hist = np.asarray(history, dtype=np.float64).reshape(self.n_layers, self.n_experts)
        top = hist.max(axis=1, keepdims=True)
        v = np.zeros((self.n_layers, 1)) if visits is None else np.asarray(visits, np.float64).reshape(-1, 1)
        per = np.where(np.isfinite(v) & (v >= top) & (v > 0), v, top)
        seeded = (hist > 0) & (per > 0)
        f = np.where(seeded, hist / np.where(per > 0, per, 1.0), 0.0).reshape(-1)
        self.f = [f.copy() for _ in self.f]

    def hint(self, layer: int, keys: list[int]) -> None:
        """keys of `layer`, best first, predicted for its next visit (replaces its hint)."""
        base = layer * self.n_experts
        self.hinted[base : base + self.n_experts] = 0
        for i in range(len(keys) - 1, -1, -1):
            self.hinted[keys[i]] = 1 + min(i, HINT_RANKS - 1)

    def hint_accuracies(self, k: np.ndarray) -> np.ndarray:
        """mg_policy_hint_accuracy of each key: its layer and rank's (hits + 1/2) / (hints + 1),
        0 when not hinted."""
        r = self.hinted[k]
        lay, ri = k // self.n_experts, np.maximum(r - 1, 0)
        return np.where(r > 0, (self.hint_hit[lay, ri] + HINT_PRIOR) / (self.hint_n[lay, ri] + 1.0), 0.0)

    def hint_accuracy(self, key: int) -> float:
        return float(self.hint_accuracies(np.array([key]))[0])

    def request(self, layer: int, keys: np.ndarray) -> None:
        E = self.n_experts
        base = layer * E
        req = np.zeros(E, dtype=bool)
        req[keys - base] = True
        hinted = self.hinted[base : base + E]
        if hinted.any():  # score the layer's hint by rank, then spend it
            given = np.bincount(hinted[hinted > 0] - 1, minlength=HINT_RANKS).astype(np.float64)
            true = np.bincount(hinted[(hinted > 0) & req] - 1, minlength=HINT_RANKS).astype(np.float64)
            seen = given > 0
            self.hint_hit[layer, seen] = self.hint_hit[layer, seen] * HINT_DECAY + true[seen]
            self.hint_n[layer, seen] = self.hint_n[layer, seen] * HINT_DECAY + given[seen]
            self.hinted[base : base + E] = 0
        used = self.used[base : base + E]
        prev = np.flatnonzero(used)
        target = req.astype(np.float64)
        for i in range(len(self.f)):
            seg = self.f[i][base : base + E]
            w = self.w[i]
            prob = np.where(used, seg + w * (1.0 - seg), (1.0 - w) * seg)
            d = prob - target
            # sums in expert order, one addition at a time (accumulate), as the C loops add
            sq = float(np.add.accumulate(d * d)[-1])
            e = float(np.add.accumulate(seg[prev])[-1]) if len(prev) else 0.0
            r = float(np.count_nonzero(req[prev]))
            self.err[i] = self.err[i] * self.err_decay + sq
            self.reused[i] = self.reused[i] * STICKY_DECAY + r
            self.expected[i] = self.expected[i] * STICKY_DECAY + e
            self.trials[i] = self.trials[i] * STICKY_DECAY + float(len(prev))
            keep = 1.0 - self.alpha[i]
            self.f[i][base : base + E] = np.where(req, seg * keep + self.alpha[i], seg * keep)
            room = self.trials[i] - self.expected[i]
            self.w[i] = min(1.0, max(0.0, (self.reused[i] - self.expected[i]) / room)) if room > 0 else 0.0
        self.used[base : base + E] = req
        best = 0
        for i in range(1, len(self.err)):
            if self.err[i] < self.err[best]:
                best = i
        self.best = best
        self.chosen.append(best)

    def rates(self, k: np.ndarray) -> np.ndarray:
        """Each key's estimated share of its layer's visits requesting it (f of the ranking model)."""
        return self.f[self.best][k]

    def score(self, k: np.ndarray, layer: int) -> np.ndarray:
        """Minus the predicted fetches until each key's next request (-inf: nothing known)."""
        L = self.n_layers
        f, w = self.rates(k), self.w[self.best]
        prob = np.where(self.used[k], f + w * (1.0 - f), (1.0 - w) * f)
        if self.hinted[k].any():  # a hinted key: at least its hint's accuracy
            acc = self.hint_accuracies(k)
            prob = np.where(acc > prob, acc, prob)
        delta = (k // self.n_experts - layer) % L
        delta = np.where(delta == 0, L, delta)
        safe = np.where(prob > 0, prob, 1.0)
        return np.where(prob > 0, -(delta + L * (1.0 / safe - 1.0)), -math.inf)


def simulate(trace: Trace, policy: str, n_slots: int, *, half_life: float | None = None,
             history: np.ndarray | None = None, history_visits: np.ndarray | None = None,
             pin_fraction: float = 0.5, warm: int = 0, model: _NextUse | None = None,
             depth: int | None = None) -> Result:
    """Replays the trace through one policy with n_slots expert slots.  Fetches before `warm`
    fill the cache without being counted.  history: per-key request counts of earlier runs
    (ours only): seeds f (count over its layer's visits, history_visits; without them, over
    the layer's largest count), and the top pin_fraction * n_slots keys start in the cache (the
    store reads them before the first token; they are not pinned).
    ours = predicted next use (expert_policy.h, replayed to the bit): evict the expert whose
    next request is predicted furthest away, delta + L * (1/p - 1), where delta is the
    distance in fetches to the next visit of its layer and p mixes f (moving share of the
    layer's visits that requested it) with whether the layer's latest visit requested it,
    weighted by the measured stickiness w.  half_life (fetches) fixes f's half-life; None (the
    store's default) runs the bank of half-lives and ranks by the one predicting best.
    ahead = ours plus the store's read-ahead (Engine expert_prefetch; experts.h): the trace's
    look-ahead hints raise the hinted experts' p to their rank's measured accuracy, and once a
    fetch has its slots the next layer's hinted experts that are missing (ranks at least
    HINT_MIN_ACCURACY accurate, best first, up to `depth`) are read into the slots the policy
    values least, never the fetch's own, and only a slot valued below the hinted expert.  The
    replay has no clock: it reads ahead as if the disk always had the idle time, while the
    store reads ahead only as much as its disk sat idle (expert_cache.c), so this is the most
    read-ahead can give.
    model: a fresh _NextUse to use (and inspect afterwards), else one is made."""
    if policy not in ("lru", "ours", "belady", "ahead"):
        raise ValueError(f"unknown policy {policy!r}")
    if n_slots < 1:
        raise ValueError("n_slots must be >= 1")
    n_layers, n_experts = trace.n_layers, trace.n_experts
    last = np.full(trace.n_keys, -math.inf)  # tick of the last request
    hot = np.zeros(trace.n_keys, dtype=bool)  # the history's hot set, read in before the first fetch
    nu = None
    look_ahead = policy == "ahead"
    if look_ahead:
        policy = "ours"
    pending: tuple[int, list[int]] | None = None  # the hint the cache holds (ahead)
    if policy == "ours":
        nu = model if model is not None else _NextUse(n_layers, n_experts, half_life)
        if history is not None:
            nu.seed(history, history_visits)
            seen = history > 0
            n_pin = min(int(pin_fraction * n_slots), int(seen.sum()))
            if n_pin > 0:
                hot[np.lexsort((np.arange(trace.n_keys), -history))[:n_pin]] = True
    next_use = _next_uses(trace) if policy == "belady" else None
    nxt = np.full(trace.n_keys, math.inf)  # belady: next request of each key
    slot_key = np.full(n_slots, -1, dtype=np.int64)
    key_slot = np.full(trace.n_keys, -1, dtype=np.int64)
    preload = np.flatnonzero(hot)  # in key order into the first slots, as usage_preload
    slot_key[: len(preload)] = preload
    key_slot[preload] = np.arange(len(preload))
    result = Result()
    for t in range(len(trace)):
        keys = trace.keys(t)
        layer = trace.layers[t]
        now = float(t + 1)
        if look_ahead and trace.hint(t) is not None:
            hint_layer, hint_ids = trace.hint(t)
            hk = list(dict.fromkeys(int(e) + hint_layer * n_experts for e in hint_ids))
            pending = (hint_layer, hk)
            nu.hint(hint_layer, hk)
        if nu is not None:
            nu.request(layer, keys)
        elif policy == "belady":
            nxt[keys] = next_use[t]
        last[keys] = now
        missing = keys[key_slot[keys] < 0]
        if t >= warm:
            result.hits += len(keys) - len(missing)
            result.misses += len(missing)
        if len(missing):
            _place(slot_key, key_slot, keys, missing, policy, last, nxt, nu, layer, t)
        if look_ahead:
            target = (layer + 1) % n_layers
            if pending is not None and pending[0] == target:
                cand = [k for k in pending[1] if key_slot[k] < 0 and nu.hint_accuracy(k) >= HINT_MIN_ACCURACY]
                n_read = _read_ahead(slot_key, key_slot, keys, cand[: depth if depth is not None else len(cand)],
                                     nu, layer)
                if t >= warm:
                    result.read_ahead += n_read
            pending = None
    return result


def _place(slot_key: np.ndarray, key_slot: np.ndarray, keys: np.ndarray, missing: np.ndarray, policy: str,
           last: np.ndarray, nxt: np.ndarray, nu: _NextUse | None, layer: int, t: int) -> None:
    """The fetch's missing keys into the slots ranked lowest (the fetch's own never)."""
    n_slots = len(slot_key)
    occupied = slot_key >= 0
    k = np.where(occupied, slot_key, 0)
    # eviction order: empty slots, then by policy (lower first); the batch's own slots never
    if policy == "lru":
        score = last[k]
    elif policy == "belady":
        score = -nxt[k]
    else:
        score = nu.score(k, layer)
    primary = np.where(occupied, 0.0, -math.inf)
    secondary = np.where(occupied, score, 0.0)
    excluded = occupied & np.isin(k, keys)
    order = np.lexsort((np.arange(n_slots), secondary, primary, excluded))
    victims = order[: len(missing)]
    if len(victims) < len(missing) or excluded[victims].any():
        raise ValueError(f"fetch {t}: {len(keys)} experts do not fit {n_slots} slots")
    old = slot_key[victims]
    key_slot[old[old >= 0]] = -1
    slot_key[victims] = missing
    key_slot[missing] = victims


def _read_ahead(slot_key: np.ndarray, key_slot: np.ndarray, keys: np.ndarray, cand: list[int], nu: _NextUse,
                layer: int) -> int:
    """prefetch_ids of expert_cache.c: each candidate into the slot ranked lowest, the fetch's
    slots and those just started excluded; skipped when that slot's expert was requested at its
    layer's latest visit (unless the candidate is hinted, which it is here) or is valued as
    much.  Returns how many were read."""
    n_slots = len(slot_key)
    if not cand:
        return 0
    taken = np.zeros(n_slots, dtype=bool)
    taken[key_slot[keys]] = True
    occupied = slot_key >= 0
    score = nu.score(np.where(occupied, slot_key, 0), layer)
    # the policy does not change while reads start: one order serves every candidate, and a
    # candidate turned away leaves the same victim for the next
    order = np.lexsort((np.arange(n_slots), np.where(occupied, score, 0.0), np.where(occupied, 0.0, -math.inf),
                        taken))
    key_scores = nu.score(np.asarray(cand, dtype=np.int64), layer)
    at, started = 0, 0
    for key, key_score in zip(cand, key_scores):
        if key_slot[key] >= 0:
            continue
        if at >= n_slots or taken[order[at]]:
            break
        victim = int(order[at])
        old = int(slot_key[victim])
        if old >= 0 and ((nu.used[old] and not nu.hint_accuracy(key) > 0) or not (score[victim] < key_score)):
            continue
        if old >= 0:
            key_slot[old] = -1
        slot_key[victim] = key
        key_slot[key] = victim
        at += 1
        started += 1
    return started


def _next_uses(trace: Trace) -> list[list[float]]:
    """For each fetch, for each of its keys: the index of the next fetch requesting it."""
    last: dict[int, float] = {}
    out: list[list[float]] = [[] for _ in range(len(trace))]
    for t in range(len(trace) - 1, -1, -1):
        keys = [int(x) for x in trace.keys(t)]
        out[t] = [last.get(key, math.inf) for key in keys]
        for key in keys:
            last[key] = float(t)
    return out


def score_signal(trace: Trace, half_life: float | None = None) -> list[dict[str, float]]:
    """Whether the router's scores tell the cache something the requested ids do not.  At each
    visit of a layer that carries scores (after the layer's first visit, the prompt), every
    expert gets its rank by score; at the layer's next visit it was requested or not.  Per
    rank group (n = the experts the visit requested): the pairs seen, the mean probability
    the store's policy gave that next request (visit_prob of the ranking model, expert_policy.h)
    and the observed rate.  Observed above predicted for the near misses (rank n..2n-1) is
    reuse the policy does not see; equal rates everywhere: the scores add nothing to it."""
    n_layers, n_experts = trace.n_layers, trace.n_experts
    model = _NextUse(n_layers, n_experts, half_life)
    groups = ("selected", "next n", "next 2n", "rest")
    pending: list[tuple[np.ndarray, np.ndarray] | None] = [None] * n_layers  # (group, p) per expert
    seen = np.zeros(n_layers, dtype=bool)
    n, p_sum, y_sum = np.zeros(4), np.zeros(4), np.zeros(4)
    for t in range(len(trace)):
        layer, keys = trace.layers[t], trace.keys(t)
        base = layer * n_experts
        if pending[layer] is not None:
            group, p = pending[layer]
            y = np.zeros(n_experts)
            y[keys - base] = 1.0
            n += np.bincount(group, minlength=4)
            p_sum += np.bincount(group, weights=p, minlength=4)
            y_sum += np.bincount(group, weights=y, minlength=4)
        model.request(layer, keys)
        sc = trace.score(t)
        pending[layer] = None
        if sc is not None and seen[layer]:
            rank = np.empty(n_experts, dtype=np.int64)
            rank[np.argsort(-sc, kind="stable")] = np.arange(n_experts)
            k = max(1, len(keys))
            group = np.searchsorted([k, 2 * k, 4 * k], rank, side="right")
            m = model.best
            f, w, used = model.f[m][base : base + n_experts], model.w[m], model.used[base : base + n_experts]
            pending[layer] = (group, np.where(used, f + w * (1.0 - f), (1.0 - w) * f))
        seen[layer] = True
    return [{"group": g, "pairs": float(n[i]), "predicted": p_sum[i] / n[i] if n[i] else math.nan,
             "observed": y_sum[i] / n[i] if n[i] else math.nan} for i, g in enumerate(groups)]


def replay_table(trace: Trace, budgets: list[float], *, history: np.ndarray | None = None,
                 history_visits: np.ndarray | None = None, warm: int = 0,
                 half_life: float | None = None) -> list[dict[str, float]]:
    """Hit rates of the policies at each budget (a fraction of the expert pool); with the
    trace's look-ahead hints also ours reading ahead ("ahead") and its disk reads per request
    ("ahead_reads"; the others read 1 - their hit rate)."""
    has_hints = any(h is not None for h in trace.hints)
    rows = []
    for b in budgets:
        slots = max(trace.n_experts, int(round(b * trace.n_keys)))
        row: dict[str, float] = {"budget": b, "slots": float(slots)}
        for policy in ("lru", "ours", "belady") + (("ahead",) if has_hints else ()):
            res = simulate(trace, policy, slots, history=history if policy in ("ours", "ahead") else None,
                           history_visits=history_visits, warm=warm, half_life=half_life)
            row[policy] = res.hit_rate
            if policy == "ahead":
                row["ahead_reads"] = res.reads_per_request
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, float]]) -> str:
    ahead = bool(rows) and "ahead" in rows[0]
    head = f"{'budget':>8} {'slots':>7} {'lru':>7} {'ours':>7} {'belady':>7} {'gap':>6}"
    if ahead:  # ours reading ahead from the hints: hit rate, and reads per request vs ours and Belady
        head += f" {'ahead':>7} {'gap':>6} {'reads':>6} {'/ours':>6} {'/belady':>7}"
    lines = [head]
    for r in rows:  # gap: how far ours is below the optimum, in points of hit rate
        line = (f"{r['budget']:>8.3f} {int(r['slots']):>7d} {r['lru']:>7.3f} {r['ours']:>7.3f} "
                f"{r['belady']:>7.3f} {100 * (r['belady'] - r['ours']):>6.1f}")
        if ahead:
            reads = r["ahead_reads"]
            line += (f" {r['ahead']:>7.3f} {100 * (r['belady'] - r['ahead']):>6.1f} {reads:>6.3f} "
                     f"{reads / max(1e-12, 1 - r['ours']):>6.2f} {reads / max(1e-12, 1 - r['belady']):>7.2f}")
        lines.append(line)
    return "\n".join(lines)


# ---- recording ---------------------------------------------------------------------------


def record(model: str, out: str, tokens: int, prompt_ids: list[int], ram_gb: float | None,
           follow: list[int] | None = None, **engine_options: object) -> tuple[Trace, dict[str, object]]:
    """Runs the prompt, then `tokens` decode steps with the engine (Engine(..., routing_trace=out))
    while it records its fetches: (the trace, the engine's expert statistics at the end).

    Each decode step feeds the greedy choice, or with `follow` the next token of that text
    (teacher forcing: the routing of decoding natural text, which a small model's own greedy
    output, soon repeating itself, is not)."""
    from gateway.engine import Engine  # late: only `record` needs the compiled engine

    eng = Engine(model, ram_gb=ram_gb, routing_trace=out, **engine_options)  # type: ignore[arg-type]
    logits = eng.eval(prompt_ids, last_only=True)
    for step in range(tokens):
        nxt = follow[step] if follow is not None else int(np.argmax(logits[-1]))
        logits = eng.eval([nxt], last_only=True)
    eng.set_routing_trace(None)  # flushes and closes the file
    stats = eng.stats()["experts"]
    del eng
    return read_trace(out), stats


def text_ids(model: str, path: str, n: int) -> list[int]:
    """The first `n` token ids of a text file, by the model's own tokenizer.json."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(Path(model) / "tokenizer.json")).encode(Path(path).read_text(encoding="utf-8")).ids
    if len(ids) < n:
        raise SystemExit(f"{path}: {len(ids)} tokens, {n} needed")
    return ids[:n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run the engine and record its routing")
    rec.add_argument("--model", required=True)
    rec.add_argument("--out", required=True)
    rec.add_argument("--tokens", type=int, default=64)
    rec.add_argument("--prompt-ids", default="1,2,3,4,5,6,7,8", help="comma-separated token ids")
    rec.add_argument("--text", help="a text file: its first --prompt-tokens tokens are the prompt, the next "
                     "--tokens are fed one per decode step (instead of the greedy choice)")
    rec.add_argument("--prompt-tokens", type=int, default=256)
    rec.add_argument("--ids-only", action="store_true", help="drop the router scores from the file (a tenth of the size)")
    rec.add_argument("--ram", type=float, default=None)
    rep = sub.add_parser("replay", help="hit rates of lru / ours / belady at several budgets")
    rep.add_argument("trace")
    rep.add_argument("--budgets", default="0.05,0.1,0.25,0.5")
    rep.add_argument("--history", help="an earlier trace or the store's routing-history file: seeds and warms 'ours'")
    rep.add_argument("--warm", type=int, default=0, help="fetches replayed before counting")
    rep.add_argument("--half-life", type=float, default=None, help="in fetches (default 16 tokens)")
    sig = sub.add_parser("scores", help="does the router's ranking predict the next visit beyond the policy?")
    sig.add_argument("trace")
    syn = sub.add_parser("synth", help="write a synthetic decode-like trace")
    syn.add_argument("--out", required=True)
    syn.add_argument("--layers", type=int, default=8)
    syn.add_argument("--experts", type=int, default=64)
    syn.add_argument("--k", type=int, default=8)
    syn.add_argument("--tokens", type=int, default=300)
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of each layer's popularity")
    syn.add_argument("--reuse", type=float, default=0.3, help="chance a choice repeats the previous token's")
    syn.add_argument("--drift", type=float, default=0.0, help="per-token step of the log-popularity walk")
    syn.add_argument("--drift-tokens", type=float, default=50.0, help="mean-reversion time of the walk")
    args = ap.parse_args(argv)
    if args.cmd == "record":
        follow = None
        if args.text:
            text = text_ids(args.model, args.text, args.prompt_tokens + args.tokens)
            ids, follow = text[: args.prompt_tokens], text[args.prompt_tokens:]
        else:
            ids = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        tr, st = record(args.model, args.out, args.tokens, ids, args.ram, follow)
        if args.ids_only:
            tr.scores = []
            write_trace(args.out, tr)
        print(f"{args.out}: {len(tr)} fetches, {tr.n_layers} layers x {tr.n_experts} experts")
        if st.get("slots"):
            print(f"engine cache: {st['slots']} slots, hit rate {st['hit_rate']:.3f}")
    elif args.cmd == "replay":
        tr = read_trace(args.trace)
        hist = visits = None
        if args.history and Path(args.history).read_bytes()[:8] == USAGE_MAGIC:
            hist, visits, _, _ = read_history(args.history)
        elif args.history:
            old = read_trace(args.history)
            hist, visits = usage_counts(old), usage_visits(old)
        budgets = [float(x) for x in args.budgets.split(",") if x.strip()]
        print(f"{args.trace}: {len(tr)} fetches, {tr.n_layers} layers x {tr.n_experts} experts "
              "(budget = share of the expert pool)")
        print(format_table(replay_table(tr, budgets, history=hist, history_visits=visits, warm=args.warm,
                                        half_life=args.half_life)))
    elif args.cmd == "scores":
        tr = read_trace(args.trace)
        rows = score_signal(tr)
        if not any(r["pairs"] for r in rows):
            print(f"{args.trace}: no router scores (a version 1 trace, or hash-routed layers only)")
            return 0
        print(f"{args.trace}: request at the layer's next visit, by router rank at this one "
              "(n = the experts requested)")
        print(f"{'rank':>10} {'pairs':>9} {'policy p':>9} {'observed':>9} {'excess':>7}")
        for r in rows:
            print(f"{r['group']:>10} {int(r['pairs']):>9d} {r['predicted']:>9.3f} {r['observed']:>9.3f} "
                  f"{100 * (r['observed'] - r['predicted']):>+7.1f}")
    else:
        write_trace(args.out, synthesize(args.layers, args.experts, args.k, args.tokens, args.seed, args.skew,
                                         args.reuse, args.drift, args.drift_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
