"""The slot's two snapshot tiers as one: RAM (prefix_cache.PrefixCache) and, with
--prefix-cache-dir, disk (prefix_disk.DiskSnapshots).  `generate.Slot` asks this module which
snapshot to restore and where to keep the conversation it leaves."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Sequence

import numpy as np

from .prefix_cache import PrefixCache
from .prefix_disk import DiskSnapshots

log = logging.getLogger("moegate.prefix")

Loader = Callable[[], "tuple[Sequence[int], np.ndarray]"]


class ConversationSnapshots:
    """The slot's snapshot tiers: RAM (PrefixCache) and, with --prefix-cache-dir, disk
    (DiskSnapshots).  `keep` writes to every tier that wants the state;
    `best` finds the snapshot sharing the most with a prompt, RAM first on a tie."""

    def __init__(self, ram: PrefixCache | None = None, disk: DiskSnapshots | None = None,
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
