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

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:
    from .prefix_disk import DiskSnapshots

log = logging.getLogger("moegate.prefix")

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


Loader = Callable[[], "tuple[Sequence[int], np.ndarray]"]


class ConversationSnapshots:
    """The slot's snapshot tiers: RAM (PrefixCache) and, with --prefix-cache-dir, disk
    (gateway.prefix_disk.DiskSnapshots).  `keep` writes to every tier that wants the state;
    `best` finds the snapshot sharing the most with a prompt, RAM first on a tie."""

    def __init__(self, ram: PrefixCache | None = None, disk: "DiskSnapshots | None" = None,
                 budgeted: bool = False) -> None:
        """budgeted (--ram): every snapshot buffer, also one only passing to or from disk, must
        fit in the RAM tier's share of the budget (room is made by evicting RAM snapshots), so
        the disk tier needs a RAM tier."""
        self.ram = ram if ram is not None and ram.enabled else None
        self.disk = disk if disk is not None and (self.ram is not None or not budgeted) else None
        self.budgeted = budgeted
        self.restores = 0          # from either tier (counted by the slot when a restore succeeds)
        self.restored_tokens = 0   # prompt tokens those restores saved from prefill

    def _room_for(self, nbytes: int) -> bool:
        """Whether a buffer of nbytes may be allocated now (RAM snapshots evicted for it)."""
        if self.ram is None:
            return not self.budgeted
        return self.ram.make_room(nbytes) or not self.budgeted

    @property
    def enabled(self) -> bool:
        return self.ram is not None or self.disk is not None

    def keep(self, engine: Any, tokens: Sequence[int], *, to_ram: bool = True) -> None:
        """Saves the engine's state for `tokens` (all it holds) where it is worth keeping.  Best
        effort: a snapshot that cannot be taken only costs a later prefill."""
        ram = self.ram if to_ram and self.ram is not None and self.ram.worth_saving(tokens) else None
        disk = self.disk if self.disk is not None and self.disk.worth_saving(tokens) else None
        if ram is None and disk is None:
            return
        try:
            nbytes = engine.prefix_bytes(len(tokens))
            if not self._room_for(nbytes):
                return
            if ram is not None and nbytes > ram.capacity_bytes:
                ram = None
            if ram is None and disk is None:
                return
            state = engine.save_prefix(len(tokens))
            if ram is not None:
                ram.add(tokens, state)
            if disk is not None:
                disk.save(tokens, state)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory for the copy
            log.warning("prefix snapshot of %d tokens not kept: %s", len(tokens), exc)

    def best(self, prompt: Sequence[int]) -> tuple[Loader | None, int]:
        """(loader of the snapshot sharing the most with the prompt, tokens shared)."""
        best: Loader | None = None
        shared = 0
        if self.ram is not None:
            ram = self.ram
            key, n = ram.best_match(prompt)
            if key is not None:
                def from_ram() -> tuple[Sequence[int], np.ndarray]:
                    snap = ram.take(key)
                    return snap.tokens, snap.state
                best, shared = from_ram, n
        if self.disk is not None:
            disk = self.disk
            entry, n = disk.best_match(prompt)
            if entry is not None and n > shared:
                def from_disk() -> tuple[Sequence[int], np.ndarray]:
                    if not self._room_for(entry.state_bytes):
                        raise ValueError(f"no room under --ram for a {entry.state_bytes / 1e9:.2f} GB snapshot")
                    return entry.tokens, disk.read(entry)
                best, shared = from_disk, n
        return best, shared
