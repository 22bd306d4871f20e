"""Conversation snapshots on disk (`--prefix-cache-dir`): they outlive the process.

An agent's sessions start with the same long prefix (Claude Code's system prompt and tool
definitions are tens of thousands of tokens), which a CPU prefills in minutes.  With a folder
set, every snapshot the slot keeps (gateway.prefix_cache) is also written here, and so is the
slot's own state when the server stops; a later process finds the snapshot sharing the longest
prefix with a prompt, reads it (seconds) and prefills only the rest.

Files hold conversation tokens, so this is off unless a folder is given.  One subfolder per
model (checkpoint path, config, KV dtype); the engine refuses a snapshot of anything else too.
File names are hashes of the tokens: request data never forms a path.  Least recently used
files go first when the folder is over its byte budget.  A damaged file is skipped and removed.
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .prefix_cache import common_prefix

log = logging.getLogger("moegate.prefix")

MAGIC = b"MGSNAPF2"
HEADER = struct.Struct("<8sQQI")  # magic, token count, state bytes, crc32 of the state
SUFFIX = ".snap"


def model_folder(root: Path, model_dir: Path, kv_dtype: str) -> Path:
    """The subfolder for one model: a hash of its path, its config.json and the KV dtype.  A
    GGUF file has no config.json: its size and modification time stand in, so another file
    saved under the same name (a different quantisation, say) never meets the old snapshots."""
    if model_dir.is_file():
        st = model_dir.stat()
        config = f"gguf:{st.st_size}:{st.st_mtime_ns}".encode()
    else:
        config = (model_dir / "config.json").read_bytes() if (model_dir / "config.json").is_file() else b""
    key = hashlib.sha256(str(model_dir.resolve()).encode() + b"\0" + config + b"\0" + kv_dtype.encode())
    return root / key.hexdigest()[:16]


@dataclass
class DiskSnapshot:
    path: Path
    tokens: tuple[int, ...]
    state_offset: int
    state_bytes: int
    crc: int

    @property
    def file_bytes(self) -> int:
        return self.state_offset + self.state_bytes


def _read_header(path: Path) -> DiskSnapshot:
    with path.open("rb") as f:
        head = f.read(HEADER.size)
        if len(head) != HEADER.size:
            raise ValueError("short header")
        magic, n_tokens, state_bytes, crc = HEADER.unpack(head)
        if magic != MAGIC:
            raise ValueError("not a snapshot file")
        raw = f.read(4 * n_tokens)
        if len(raw) != 4 * n_tokens:
            raise ValueError("short token list")
    entry = DiskSnapshot(path, tuple(np.frombuffer(raw, dtype="<i4").tolist()), HEADER.size + 4 * n_tokens,
                         state_bytes, crc)
    if path.stat().st_size != entry.file_bytes:
        raise ValueError("size does not match its header")
    return entry


class DiskSnapshots:
    """The snapshot files of one model folder, indexed by their tokens (read at start)."""

    def __init__(self, folder: Path, capacity_bytes: int, min_tokens: int) -> None:
        self.folder = folder
        self.capacity_bytes = max(0, int(capacity_bytes))
        self.min_tokens = min_tokens
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        self._entries: dict[Path, DiskSnapshot] = {}
        self.writes = 0
        self.reads = 0
        for path in sorted(self.folder.glob("*" + SUFFIX)):
            self._index(path)
        for stale in self.folder.glob("*.tmp*"):
            stale.unlink(missing_ok=True)  # a write that never finished

    def _index(self, path: Path) -> None:
        try:
            self._entries[path] = _read_header(path)
        except (OSError, ValueError) as exc:
            log.warning("prefix snapshot %s skipped and removed: %s", path.name, exc)
            path.unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes_held(self) -> int:
        with self._lock:
            return sum(e.file_bytes for e in self._entries.values())

    def best_match(self, prompt: Sequence[int]) -> tuple[DiskSnapshot | None, int]:
        best, shared = None, 0
        with self._lock:
            entries = list(self._entries.values())
        for entry in entries:
            n = common_prefix(entry.tokens, prompt)
            if n > shared:
                best, shared = entry, n
        return best, shared

    def worth_saving(self, tokens: Sequence[int]) -> bool:
        if self.capacity_bytes <= 0 or len(tokens) < self.min_tokens:
            return False
        with self._lock:
            entries = list(self._entries.values())
        return not any(len(e.tokens) >= len(tokens) and common_prefix(e.tokens, tokens) == len(tokens)
                       for e in entries)

    def read(self, entry: DiskSnapshot) -> np.ndarray:
        """The engine snapshot of a file (OSError / ValueError when it went bad: then dropped)."""
        try:
            state = np.fromfile(entry.path, dtype=np.uint8, count=entry.state_bytes, offset=entry.state_offset)
            if state.size != entry.state_bytes:
                raise ValueError("file shorter than its header says")
            if zlib.crc32(state) != entry.crc:  # a flipped bit would be a silently wrong conversation
                raise ValueError("checksum mismatch")
            os.utime(entry.path)  # most recently used
        except (OSError, ValueError):
            self._drop(entry.path)
            raise
        self.reads += 1
        return state

    def save(self, tokens: Sequence[int], state: np.ndarray) -> bool:
        """Writes a snapshot (atomically: a temporary file renamed into place), dropping held
        ones it extends, then the least recently used until the folder fits its budget."""
        ids = np.asarray(tokens, dtype="<i4")
        size = HEADER.size + ids.nbytes + state.nbytes
        if size > self.capacity_bytes:
            return False
        name = hashlib.sha256(ids.tobytes()).hexdigest()[:32] + SUFFIX
        path = self.folder / name
        tmp = self.folder / f"{name}.tmp{os.getpid()}"
        state = np.ascontiguousarray(state)
        crc = zlib.crc32(state)
        try:
            with tmp.open("wb") as f:
                f.write(HEADER.pack(MAGIC, ids.size, state.nbytes, crc))
                f.write(ids.tobytes())
                f.write(memoryview(state).cast("B"))
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            log.warning("prefix snapshot not written to %s: %s", self.folder, exc)
            return False
        entry = DiskSnapshot(path, tuple(int(t) for t in ids), HEADER.size + ids.nbytes, int(state.nbytes), crc)
        with self._lock:
            for other in [e for e in self._entries.values() if e.path != path and len(e.tokens) <= len(entry.tokens)
                          and common_prefix(e.tokens, entry.tokens) == len(e.tokens)]:
                self._drop_locked(other.path)
            self._entries[path] = entry
            by_age = sorted(self._entries.values(), key=lambda e: _mtime(e.path))
            while sum(e.file_bytes for e in self._entries.values()) > self.capacity_bytes and by_age:
                oldest = by_age.pop(0)
                if oldest.path != path:
                    self._drop_locked(oldest.path)
        self.writes += 1
        return True

    def _drop(self, path: Path) -> None:
        with self._lock:
            self._drop_locked(path)

    def _drop_locked(self, path: Path) -> None:
        self._entries.pop(path, None)
        path.unlink(missing_ok=True)

    def stats(self) -> dict[str, int]:
        with self._lock:
            count, held = len(self._entries), sum(e.file_bytes for e in self._entries.values())
        return {"files": count, "bytes": held, "capacity_bytes": self.capacity_bytes,
                "writes": self.writes, "reads": self.reads}


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
