"""Snapshots of conversations the single slot had to leave, so coming back costs no prefill.

The engine holds one sequence.  Agents interleave conversations: Claude Code sends short side
requests (titles, command checks, sub-agents) between the turns of a long main conversation,
and each one would otherwise truncate the slot and make the next main turn prefill tens of
thousands of tokens again.  Before the slot drops a long tail, `Slot` saves its state here
(`Engine.save_prefix`); a later prompt that shares more with a snapshot than with the slot
restores it (`Engine.restore_prefix`, bitwise the state the slot had) and prefills only the
rest.  Snapshots live in RAM, least recently used first out, under a byte budget that the
server subtracts from --ram.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# A snapshot is worth keeping only if restoring it saves at least this much prefill.
MIN_SNAPSHOT_TOKENS = 256


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Snapshot:
    tokens: tuple[int, ...]
    state: np.ndarray  # Engine.save_prefix(len(tokens))

    @property
    def nbytes(self) -> int:
        return int(self.state.nbytes)


class PrefixCache:
    """Least-recently-used snapshots under `capacity_bytes` (0 disables the cache).  The slot's
    worker thread changes it; the lock lets /metrics read it at any time."""

    def __init__(self, capacity_bytes: int, min_tokens: int = MIN_SNAPSHOT_TOKENS) -> None:
        self.capacity_bytes = max(0, int(capacity_bytes))
        self.min_tokens = min_tokens
        self._entries: OrderedDict[int, Snapshot] = OrderedDict()
        self._next_key = 0
        self.saves = 0
        self.restores = 0
        self.evictions = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    @property
    def bytes_held(self) -> int:
        with self._lock:
            return self._bytes()

    def _bytes(self) -> int:
        return sum(s.nbytes for s in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def best_match(self, prompt: Sequence[int]) -> tuple[int | None, int]:
        """(key, shared tokens) of the snapshot sharing the longest prefix with `prompt`."""
        best_key, best = None, 0
        with self._lock:
            entries = list(self._entries.items())
        for key, snap in entries:
            shared = common_prefix(snap.tokens, prompt)
            if shared > best:
                best_key, best = key, shared
        return best_key, best

    def take(self, key: int) -> Snapshot:
        """The snapshot, marked as just used."""
        with self._lock:
            self._entries.move_to_end(key)
            self.restores += 1
            return self._entries[key]

    def worth_saving(self, tokens: Sequence[int]) -> bool:
        """A state long enough to keep, and not already inside a held snapshot."""
        if not self.enabled or len(tokens) < self.min_tokens:
            return False
        with self._lock:
            held = list(self._entries.values())
        return not any(len(s.tokens) >= len(tokens) and common_prefix(s.tokens, tokens) == len(tokens)
                       for s in held)

    def make_room(self, nbytes: int) -> bool:
        """Evicts least recently used snapshots until `nbytes` more fit, before the new one is
        even allocated (so the process never holds more than the budget); False when it cannot
        fit at all."""
        if nbytes > self.capacity_bytes:
            return False
        with self._lock:
            while self._entries and self._bytes() + nbytes > self.capacity_bytes:
                self._entries.popitem(last=False)
                self.evictions += 1
        return True

    def add(self, tokens: Sequence[int], state: np.ndarray) -> bool:
        """Keeps a snapshot (dropping held ones it extends, then the least recently used until it
        fits); False when it alone is over the budget."""
        snap = Snapshot(tuple(tokens), state)
        if snap.nbytes > self.capacity_bytes:
            return False
        with self._lock:
            for key in [k for k, s in self._entries.items()
                        if len(s.tokens) <= len(snap.tokens) and common_prefix(s.tokens, snap.tokens) == len(s.tokens)]:
                del self._entries[key]  # a prefix of the new one: the new one serves it too
            while self._entries and self._bytes() + snap.nbytes > self.capacity_bytes:
                self._entries.popitem(last=False)
                self.evictions += 1
            self._entries[self._next_key] = snap
            self._next_key += 1
            self.saves += 1
        return True

    def stats(self) -> dict[str, int]:
        with self._lock:
            count, held = len(self._entries), self._bytes()
        return {"snapshots": count, "bytes": held, "capacity_bytes": self.capacity_bytes,
                "saves": self.saves, "restores": self.restores, "evictions": self.evictions}
