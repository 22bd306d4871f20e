"""The safetensors loader against corrupted checkpoints (issue 16, "keep them found"): random
byte flips in a JSON header, bad and huge header lengths, data offsets out of range or
overlapping, wrong dtype names, truncated shards, and a broken or incomplete index.

Every case is a copy of a tiny checkpoint with one corruption.  `Engine(path)` must either load
it (a flip in padding, say; the model then evaluates) or raise a Python exception whose message
names the file (and, where one is to blame, the tensor): never crash, never hang.  The cases are
loaded in one child process with a time limit, so a crash or a hang is reported as such, with the
case that caused it, instead of taking the test run down; under `make sanitize` the child
inherits the sanitizer runtime (LD_PRELOAD), so an out-of-bounds read fails the case too.
Seeded: the same cases every run.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SEED = 16
FLIP_CASES = 24  # random byte flips per checkpoint
CASES_PER_CHILD = 12  # cases copied to disk and loaded by one child process at a time
CHILD_SECONDS = 240.0  # one child's cases (about a second each under the sanitizers)

# ---------------------------------------------------------------- safetensors surgery


def read_shard(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + hlen]), raw[8 + hlen:]


def write_shard(path: Path, header: dict, data: bytes) -> None:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def tensors_of(header: dict) -> list[str]:
    return sorted(k for k in header if k != "__metadata__")


def shards_of(ckpt: Path) -> list[Path]:
    return sorted(ckpt.glob("*.safetensors"))


Corruption = Callable[[Path, random.Random], str]  # edits the copy in place; returns a description


def flip_header_bytes(ckpt: Path, rng: random.Random) -> str:
    shard = rng.choice(shards_of(ckpt))
    raw = bytearray(shard.read_bytes())
    (hlen,) = struct.unpack("<Q", raw[:8])
    spots = [8 + rng.randrange(hlen) for _ in range(rng.choice((1, 1, 2, 4, 16)))]
    for at in spots:
        raw[at] ^= 1 << rng.randrange(8)
    shard.write_bytes(bytes(raw))
    return f"{shard.name}: header bits flipped at {spots}"


def set_header_length(value: int) -> Corruption:
    def corrupt(ckpt: Path, rng: random.Random) -> str:
        shard = rng.choice(shards_of(ckpt))
        raw = bytearray(shard.read_bytes())
        raw[:8] = struct.pack("<Q", value % 2**64)
        shard.write_bytes(bytes(raw))
        return f"{shard.name}: header length {value}"
    return corrupt


def relative_header_length(delta: int) -> Corruption:
    def corrupt(ckpt: Path, rng: random.Random) -> str:
        shard = rng.choice(shards_of(ckpt))
        raw = bytearray(shard.read_bytes())
        (hlen,) = struct.unpack("<Q", raw[:8])
        raw[:8] = struct.pack("<Q", (hlen + delta) % 2**64)
        shard.write_bytes(bytes(raw))
        return f"{shard.name}: header length {hlen} + {delta}"
    return corrupt


def edit_entry(edit: Callable[[dict, dict, str, int, random.Random], None], what: str) -> Corruption:
    """Rewrites one tensor's header entry (the JSON stays valid)."""
    def corrupt(ckpt: Path, rng: random.Random) -> str:
        shard = rng.choice(shards_of(ckpt))
        header, data = read_shard(shard)
        name = rng.choice(tensors_of(header))
        edit(header, header[name], name, len(data), rng)
        write_shard(shard, header, data)
        return f"{shard.name}: tensor {name}: {what}"
    return corrupt


def _offsets(value: object) -> Callable[[dict, dict, str, int, random.Random], None]:
    def edit(header: dict, entry: dict, name: str, size: int, rng: random.Random) -> None:
        begin, end = entry["data_offsets"]
        entry["data_offsets"] = value(begin, end, size) if callable(value) else value
    return edit


def _overlap(header: dict, entry: dict, name: str, size: int, rng: random.Random) -> None:
    other = rng.choice([t for t in tensors_of(header) if t != name])
    entry["data_offsets"] = list(header[other]["data_offsets"])
    entry["shape"], entry["dtype"] = list(header[other]["shape"]), header[other]["dtype"]


def _field(key: str, value: object) -> Callable[[dict, dict, str, int, random.Random], None]:
    def edit(header: dict, entry: dict, name: str, size: int, rng: random.Random) -> None:
        if value is KeyError:
            del entry[key]
        else:
            entry[key] = value
    return edit


def _whole_header(value: object) -> Callable[[dict, dict, str, int, random.Random], None]:
    def edit(header: dict, entry: dict, name: str, size: int, rng: random.Random) -> None:
        header.clear()
        if value is not None:
            header.update(value)
    return edit


def truncate_shard(where: Callable[[int, int], int], what: str) -> Corruption:
    def corrupt(ckpt: Path, rng: random.Random) -> str:
        shard = rng.choice(shards_of(ckpt))
        raw = shard.read_bytes()
        (hlen,) = struct.unpack("<Q", raw[:8])
        cut = max(0, min(len(raw) - 1, where(hlen, len(raw))))
        shard.write_bytes(raw[:cut])
        return f"{shard.name}: truncated to {cut} of {len(raw)} bytes ({what})"
    return corrupt


def edit_index(edit: Callable[[dict, Path, random.Random], str]) -> Corruption:
    def corrupt(ckpt: Path, rng: random.Random) -> str:
        path = ckpt / "model.safetensors.index.json"
        index = json.loads(path.read_text())
        what = edit(index, ckpt, rng)
        path.write_text(json.dumps(index))
        return f"index: {what}"
    return corrupt


def _delete_shard(index: dict, ckpt: Path, rng: random.Random) -> str:
    shard = rng.choice(shards_of(ckpt))
    shard.unlink()
    return f"{shard.name} deleted"


def _remap(target: str) -> Callable[[dict, Path, random.Random], str]:
    def edit(index: dict, ckpt: Path, rng: random.Random) -> str:
        name = rng.choice(sorted(index["weight_map"]))
        index["weight_map"][name] = target
        return f"{name} -> {target!r}"
    return edit


def _drop_from_index(index: dict, ckpt: Path, rng: random.Random) -> str:
    name = rng.choice(sorted(index["weight_map"]))
    del index["weight_map"][name]
    return f"{name} missing from weight_map"


def _move_to_other_shard(index: dict, ckpt: Path, rng: random.Random) -> str:
    name = rng.choice(sorted(index["weight_map"]))
    others = sorted({s for s in index["weight_map"].values() if s != index["weight_map"][name]})
    index["weight_map"][name] = others[0]
    return f"{name} listed in {others[0]}"


def garbage_index(ckpt: Path, rng: random.Random) -> str:
    path = ckpt / "model.safetensors.index.json"
    raw = path.read_bytes()
    path.write_bytes(raw[: rng.randrange(1, len(raw) - 1)])
    return "index truncated"


FIXED: list[tuple[str, Corruption]] = [
    ("header length 0", set_header_length(0)),
    ("header length 1", set_header_length(1)),
    ("header length 2^63", set_header_length(2**63)),
    ("header length 2^64-1", set_header_length(2**64 - 1)),
    ("header length 100 MB", set_header_length(100_000_000)),
    ("header length -1", relative_header_length(-1)),
    ("header length +1", relative_header_length(1)),
    ("header length +8", relative_header_length(8)),
    ("header length -8", relative_header_length(-8)),
    ("offsets past the end", edit_entry(_offsets(lambda b, e, n: [b, n + 8]), "end past the data")),
    ("offsets far past the end", edit_entry(_offsets(lambda b, e, n: [2**63, 2**63 + (e - b)]), "begin 2^63")),
    ("offsets 2^64", edit_entry(_offsets(lambda b, e, n: [b, 2**64 + 5]), "end 2^64+5")),
    ("offsets reversed", edit_entry(_offsets(lambda b, e, n: [e, b]), "end before begin")),
    ("offsets negative", edit_entry(_offsets(lambda b, e, n: [-8, e]), "negative begin")),
    ("offsets floats", edit_entry(_offsets(lambda b, e, n: [float(b), e + 0.5]), "floats")),
    ("offsets strings", edit_entry(_offsets(lambda b, e, n: [str(b), str(e)]), "strings")),
    ("offsets triple", edit_entry(_offsets(lambda b, e, n: [b, e, e]), "three numbers")),
    ("offsets short", edit_entry(_offsets(lambda b, e, n: [b, e - 1]), "one byte short of the shape")),
    ("offsets overlap", edit_entry(_overlap, "overlaps another tensor")),
    ("dtype unknown", edit_entry(_field("dtype", "F33"), "dtype F33")),
    ("dtype empty", edit_entry(_field("dtype", ""), "dtype ''")),
    ("dtype lower case", edit_entry(_field("dtype", "bf16"), "dtype bf16")),
    ("dtype number", edit_entry(_field("dtype", 5), "dtype 5")),
    ("dtype null", edit_entry(_field("dtype", None), "dtype null")),
    ("dtype long", edit_entry(_field("dtype", "F" * 5000), "dtype of 5000 characters")),
    ("dtype missing", edit_entry(_field("dtype", KeyError), "no dtype")),
    ("shape huge", edit_entry(_field("shape", [2**62, 2**62]), "shape 2^62 x 2^62")),
    ("shape negative", edit_entry(_field("shape", [-1, 4]), "negative shape")),
    ("shape deep", edit_entry(_field("shape", [1] * 64), "64 dimensions")),
    ("shape not a list", edit_entry(_field("shape", "64"), "shape '64'")),
    ("entry not an object", edit_entry(lambda h, e, n, s, r: h.__setitem__(n, [1, 2]), "entry is a list")),
    ("header empty object", edit_entry(_whole_header(None), "header {}")),
    ("metadata not an object", edit_entry(lambda h, e, n, s, r: h.__setitem__("__metadata__", 7), "metadata 7")),
    ("truncated: 0 bytes", truncate_shard(lambda h, n: 0, "empty")),
    ("truncated: 4 bytes", truncate_shard(lambda h, n: 4, "inside the length")),
    ("truncated: mid header", truncate_shard(lambda h, n: 8 + h // 2, "inside the header")),
    ("truncated: header only", truncate_shard(lambda h, n: 8 + h, "no data")),
    ("truncated: mid data", truncate_shard(lambda h, n: (8 + h + n) // 2, "inside the data")),
    ("truncated: one byte", truncate_shard(lambda h, n: n - 1, "one byte short")),
    ("index: shard deleted", edit_index(_delete_shard)),
    ("index: unknown shard", edit_index(_remap("model-00009-of-00009.safetensors"))),
    ("index: path escape", edit_index(_remap("../../etc/passwd"))),
    ("index: absolute path", edit_index(_remap("/etc/passwd"))),
    ("index: not a string", edit_index(_remap(17))),  # type: ignore[arg-type]
    ("index: tensor missing", edit_index(_drop_from_index)),
    ("index: wrong shard", edit_index(_move_to_other_shard)),
    ("index: no weight_map", edit_index(lambda i, c, r: (i.pop("weight_map"), "no weight_map")[1])),
    ("index: truncated", garbage_index),
]


def cases() -> list[tuple[str, Corruption]]:
    return FIXED + [(f"header flips #{i}", flip_header_bytes) for i in range(FLIP_CASES)]


# ---------------------------------------------------------------- the child that loads them

CHILD = r"""
import json, sys
from gateway.engine import Engine
for line in sys.stdin:
    folder = line.strip()
    print(json.dumps({"start": folder}), flush=True)
    try:
        engine = Engine(folder, threads=1)
    except Exception as exc:
        print(json.dumps({"folder": folder, "error": type(exc).__name__, "message": str(exc)}), flush=True)
        continue
    try:
        logits = engine.eval([1, 2, 3], last_only=True)
        print(json.dumps({"folder": folder, "loaded": True, "shape": list(logits.shape)}), flush=True)
    except Exception as exc:
        print(json.dumps({"folder": folder, "error": type(exc).__name__, "message": str(exc),
                          "at": "eval"}), flush=True)
    finally:
        engine.close()
"""


def load_all(folders: list[Path]) -> dict[str, dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT / "python"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.run([sys.executable, "-c", CHILD], input="".join(f"{f}\n" for f in folders),
                          capture_output=True, text=True, timeout=CHILD_SECONDS, env=env, cwd=REPO_ROOT)
    results: dict[str, dict] = {}
    last = None
    for line in proc.stdout.splitlines():
        if not line.startswith("{"):
            continue
        item = json.loads(line)
        if "start" in item:
            last = item["start"]
        else:
            results[item["folder"]] = item
    assert proc.returncode == 0, (f"the loader crashed (exit {proc.returncode}) on {last}:\n"
                                  f"{proc.stderr[-6000:]}")
    # Under the sanitizers UBSan reports and carries on (the extension's flags do not make it
    # abort): its reports must fail the test too.
    for sign in ("runtime error:", "AddressSanitizer", "LeakSanitizer"):
        assert sign not in proc.stderr, proc.stderr[-6000:]
    return results


@pytest.mark.parametrize("arch, fmt", [("qwen3_moe", "fp8"), ("deepseek_v4", "native")])
def test_corrupted_checkpoints_give_clear_errors(arch, fmt, build_checkpoint, tmp_path):
    source = build_checkpoint(arch, fmt)
    rng = random.Random(f"{SEED}-{arch}-{fmt}")
    described: dict[str, tuple[str, str]] = {}
    results: dict[str, dict] = {}
    all_cases = list(enumerate(cases()))
    # A few cases on disk at a time: each is a whole copy of the checkpoint (85 MB for the V4
    # one), and all 70-odd at once took 6 GB of a disk that CI shares.
    for start in range(0, len(all_cases), CASES_PER_CHILD):
        folders = []
        for i, (label, corrupt) in all_cases[start:start + CASES_PER_CHILD]:
            folder = tmp_path / f"case{i:03d}"
            shutil.copytree(source, folder)
            described[str(folder)] = (label, corrupt(folder, rng))
            folders.append(folder)
        results.update(load_all(folders))
        for folder in folders:
            shutil.rmtree(folder)

    files = {p.name for p in source.iterdir()}
    loaded, problems = 0, []
    for folder, (label, what) in described.items():
        result = results.get(folder)
        if result is None:
            problems.append(f"{label} ({what}): no result")
        elif result.get("loaded"):
            # Corruptions the loader may accept, the model then evaluating: a flipped bit that
            # keeps the header consistent (in a metadata string, say), and an index that forgets
            # a tensor its shard holds (the shard headers describe every tensor anyway).
            loaded += label.startswith("header flips")
            if not label.startswith(("header flips", "index: tensor missing")):
                problems.append(f"{label} ({what}) was accepted")
        elif result["error"] not in ("EngineError", "ConfigError", "ValueError") or result.get("at") == "eval":
            problems.append(f"{label} ({what}): {result}")
        elif not any(name in result["message"] for name in files):
            problems.append(f"{label} ({what}): the message names no file: {result['message']}")
        elif label.startswith(("offsets", "dtype", "shape", "entry")):
            tensor = what.split("tensor ", 1)[1].split(":", 1)[0]
            if tensor not in result["message"]:
                problems.append(f"{label} ({what}): the message names no tensor: {result['message']}")
    assert not problems, "\n".join(problems)
    assert loaded < FLIP_CASES, "no flip was ever caught"
