"""The built-in demo checkpoint: what `python -m gateway` serves when no --model is given.

A tiny random-weight DeepSeek-V4 checkpoint in the release's exact on-disk form (FP8 + ue8m0
projections, packed FP4 experts, all three attention types, hash- and score-routed MoE layers)
with the real V4 tokenizer, so the whole serving path (tokenizer, chat format, engine, APIs) can
be tried without downloading a model. Its output is noise.

It is written once into a cache folder and reused:

    $MOEGATE_CACHE, else $XDG_CACHE_HOME/moegate, else ~/.cache/moegate
        demo-deepseek-v4-v1/           <- DEMO_FORMAT: bump it when the demo changes
            config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
            model-0000N-of-0000M.safetensors, model.safetensors.index.json,
            demo.json                  <- marker: what this is, when and how it was made

Publishing is atomic: the folder is written under a temporary name in the same parent and
renamed into place only when complete (demo.json included), so another process never sees a
half-written demo and a crash leaves no broken one (its leftover temporary folder is removed by
the next run). A lock file makes a concurrent second process wait instead of writing it twice.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .checkpoints import deepseek_v4 as dsv4

log = logging.getLogger(__name__)

DEMO_FORMAT = "demo-deepseek-v4-v1"
DEMO_SEED = 20250424
MARKER = "demo.json"
LOCK_FILE = ".demo.lock"
STALE_AFTER_SECONDS = 24 * 3600  # a temp folder this old is abandoned whoever made it

DEMO_DIMS = dsv4.Dims(
    vocab_size=129280,  # the real V4 tokenizer's vocabulary
    hidden_size=128,
    # Flash's schedule in miniature: two sliding-window-only layers, then CSA (ratio 4, with the
    # lightning indexer) and HCA (ratio 16 here, 128 in Flash) alternating.
    compress_ratios=(0, 0, 4, 16, 4, 16),
    num_hash_layers=3,  # layers 0-2 route by token id (tid2eid), 3-5 by scores (as Flash)
    num_attention_heads=4,
    head_dim=64,
    qk_rope_head_dim=16,
    q_lora_rank=128,
    o_groups=2,
    o_lora_rank=128,
    sliding_window=32,
    n_routed_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=64,
    index_n_heads=16,
    index_head_dim=32,
    index_topk=8,
)

# <tag>.tmp.<host>.<pid>.<random>: who is writing it, so a dead writer's leftovers can be removed
_TEMP_NAME = re.compile(r"^\.(?P<tag>[\w.-]+?)\.tmp\.(?P<host>[^.]+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+$")


def cache_root() -> Path:
    """$MOEGATE_CACHE, else $XDG_CACHE_HOME/moegate, else ~/.cache/moegate (empty or relative
    XDG_CACHE_HOME is ignored, as the XDG spec asks)."""
    explicit = os.environ.get("MOEGATE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "moegate"
    return Path.home() / ".cache" / "moegate"


def demo_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the demo checkpoint lives (whether or not it has been made yet)."""
    return (Path(cache_dir) if cache_dir is not None else cache_root()) / DEMO_FORMAT


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The folder's demo.json if it is a complete demo of the current format, else None."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != DEMO_FORMAT:
        return None
    return marker


def ensure_demo_checkpoint(cache_dir: str | os.PathLike[str] | None = None, *, progress: bool = True) -> Path:
    """The demo checkpoint folder, made first if it is missing (a few seconds, ~70 MB).

    `cache_dir` overrides the cache folder (tests); `progress` shows a progress bar on stderr
    while writing.
    """
    final = demo_path(cache_dir)
    root = final.parent
    remove_abandoned_temps(root)  # a crashed writer's leftovers, whether or not the demo exists
    if read_marker(final) is not None:
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / LOCK_FILE):
        if read_marker(final) is not None:  # another process made it while we waited
            return final
        log.info("making the demo checkpoint (tiny random-weight DeepSeek-V4, real V4 tokenizer) in %s", final)
        temp = Path(tempfile.mkdtemp(prefix=f".{DEMO_FORMAT}.tmp.{_host()}.{os.getpid()}.", dir=root))
        try:
            write_demo(temp, progress=progress)
            _sync_folder(temp)
            _publish(temp, final)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
    return final


def write_demo(out_dir: Path, *, seed: int = DEMO_SEED, progress: bool = False) -> Path:
    """Writes the complete demo checkpoint (marker last) into `out_dir`; deterministic for a seed."""
    out_dir = Path(out_dir)
    started = time.perf_counter()
    total = dsv4.weight_bytes(DEMO_DIMS)
    with _progress_bar(total, progress) as on_bytes:
        dsv4.write_folder(out_dir, DEMO_DIMS, seed, on_bytes=on_bytes)
    marker = {
        "what": "moegate built-in demo: a tiny random-weight DeepSeek-V4 checkpoint with the real "
                "DeepSeek-V4 tokenizer. Its output is noise; serve a real model with --model DIR.",
        "format": DEMO_FORMAT,
        "arch": "deepseek_v4",
        "seed": seed,
        "weight_bytes": total,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds_to_make": round(time.perf_counter() - started, 2),
        "made_by": f"moegate {_version()}",
    }
    (out_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return out_dir


def remove_abandoned_temps(root: Path) -> list[Path]:
    """Deletes temporary demo folders whose writer is gone (same host, dead pid) or that are
    older than STALE_AFTER_SECONDS; returns what was removed."""
    removed = []
    now = time.time()
    for entry in root.iterdir() if root.is_dir() else ():
        match = _TEMP_NAME.match(entry.name)
        if not match or not entry.is_dir():
            continue
        same_host_dead = match["host"] == _host() and not _pid_alive(int(match["pid"]))
        try:
            too_old = now - entry.stat().st_mtime > STALE_AFTER_SECONDS
        except OSError:
            continue
        if same_host_dead or too_old:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


# ----------------------------------------------------------------------------------------------
# helpers


def _publish(temp: Path, final: Path) -> None:
    """Renames the finished `temp` to `final`. A folder already at `final` that is not a valid
    demo (an older format, a foreign leftover) is moved aside and deleted first."""
    for _ in range(3):
        try:
            os.rename(temp, final)  # replaces an empty folder; fails on a non-empty one
            _fsync_dir(final.parent)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
        if read_marker(final) is not None:  # made meanwhile by a writer that took no lock
            shutil.rmtree(temp, ignore_errors=True)
            return
        aside = Path(tempfile.mkdtemp(prefix=f".{DEMO_FORMAT}.tmp.{_host()}.{os.getpid()}.", dir=final.parent))
        os.rename(final, aside / "old")  # works for a folder or a stray file alike
        shutil.rmtree(aside, ignore_errors=True)
    raise OSError(f"{final}: could not put the demo checkpoint in place")


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock (flock) held for the block; a no-op where flock is missing."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic rename alone keeps readers safe
        yield
        return
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def _progress_bar(total: int, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="demo checkpoint",
               file=sys.stderr, leave=True)
    try:
        yield bar.update
    finally:
        bar.close()


def _sync_folder(folder: Path) -> None:
    """fsync every file and the folder, so the rename publishes data that is on disk."""
    for path in folder.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def _host() -> str:
    # dots separate the fields of a temp folder name; keep the host to one field
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("moegate")
    except Exception:  # noqa: BLE001 - running from a checkout without metadata
        return "(checkout)"
