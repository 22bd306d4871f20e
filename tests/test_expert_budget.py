"""The expert store under a RAM budget (issue 4), checked from the outside.

- Logits with any budget (tiny ones that evict every token, mid, large) are bitwise identical to
  the fully resident run: prefill, decode steps, truncate and replay.
- A checkpoint at least 3x the budget runs, and the child process's peak RSS (its VmHWM, read by
  the parent from /proc while the child waits) stays under the budget.
- A budget too small for the resident part fails at start with a message naming the minimum,
  and that minimum loads.
- An expert region that became unreadable after load (its shard truncated) gives a clear
  EngineError naming the file and the tensor, not a crash; once the bytes are back, the same
  engine computes the resident logits again.

Checkpoints are written with the streaming `bench` writer (numpy only, seconds) and small
config overrides, so experts dominate the bytes while every file stays small.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tools.ckpt import write_checkpoint

from engine_budget import stated_minimum_gb  # noqa: E402
from gateway.engine import Engine, EngineError  # noqa: E402  (conftest puts python/ on sys.path)

REPO_ROOT = Path(__file__).resolve().parent.parent

# Small but real MoE shapes: 32 experts of width 256 over hidden 128 -> ~200 KB per bf16 expert.
QWEN_SMALL: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 256, "num_experts": 32,
    "num_experts_per_tok": 4, "num_hidden_layers": 3, "vocab_size": 1024, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512,
}
GLM_SMALL: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 256, "n_routed_experts": 32,
    "num_experts_per_tok": 4, "num_hidden_layers": 4, "vocab_size": 1024, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512, "use_qk_norm": True,
}
SMALL = {"qwen3_moe": QWEN_SMALL, "glm4_moe": GLM_SMALL}

PROMPT = [5, 17, 42, 99, 3, 250, 7, 600, 31, 8, 77, 512]
DECODE_STEPS = 20
KEEP_AFTER_TRUNCATE = 8


# ---- checkpoints ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("expert_budget")


_built: dict[str, Path] = {}


def small_checkpoint(root: Path, arch: str, fmt: str) -> Path:
    key = f"{arch}-{fmt}"
    if key not in _built or not _built[key].exists():
        _built[key] = write_checkpoint(arch, "bench", fmt, root / key, seed=1, overrides=SMALL[arch])
    return _built[key]


# The tiny DeepSeek-V4 has 16 small experts per layer: its whole pool fits in the slack of the
# smallest budget (which the engine rounds up to 0.01 GB).  64 experts of width 256 per layer
# make the pool (~6 layers x 64 x ~60 KB) a few times that slack, so small budgets evict.
DSV4_MORE_EXPERTS: dict[str, Any] = {"n_routed_experts": 64, "moe_intermediate_size": 256}


def dsv4_small_checkpoint(root: Path) -> Path:
    """DeepSeek-V4 with the tiny dims but more and wider experts, written by the streaming
    writer (no torch model)."""
    from tools.ckpt.deepseek_v4 import TINY

    key = "deepseek_v4-native"
    if key not in _built or not _built[key].exists():
        dims = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(TINY).items()}
        dims.update(DSV4_MORE_EXPERTS)
        _built[key] = write_checkpoint("deepseek_v4", "bench", "native", root / key, seed=1, overrides=dims)
    return _built[key]


def checkpoint_bytes(ckpt: Path) -> int:
    return sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))


def read_header(shard: Path) -> tuple[int, dict[str, Any]]:
    """(data start offset, tensor entries) of a safetensors file."""
    with open(shard, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


# ---- budgets --------------------------------------------------------------------------------


def open_with_slots(ckpt: Path, want: int, **options: Any) -> Engine:
    """An engine whose cache has about `want` expert slots (capped at every expert).

    The fixed part of a budget (weights, KV, this process's RSS) drifts between loads by more
    than a slot (0.1-0.2 MB here) in a process holding torch, and a budget above "every expert"
    reports the cap, so the budget is searched: a linear step from the slot count, kept inside
    the bracket of budgets already seen to give too few and too many slots."""
    # Usage history (on by default under a budget) would pin and preload experts from earlier
    # engines on the same folder, changing which misses happen; these tests want a cold cache.
    options.setdefault("expert_history", False)
    # Read-ahead (on by default) would add reads and evictions that depend on the disk's timing.
    options.setdefault("expert_prefetch", False)
    slack = 2 + want // 8
    lo, hi = 0.0, float("inf")  # budgets (GB) known to give too few / too many slots
    gb, last = stated_minimum_gb(ckpt), None
    for _ in range(16):
        try:
            engine = Engine(str(ckpt), ram_gb=gb, **options)
        except EngineError as exc:
            if "too small" not in str(exc):
                raise
            lo = gb
            gb = (lo + hi) / 2 if hi < float("inf") else gb * 1.5
            continue
        st = engine.stats()["experts"]
        slot, slots = int(st["slot_bytes"]), int(st["slots"])
        assert slots > 0 and slot > 0, f"budget not honoured: {st}"
        if abs(slots - want) <= slack or (slots < want and last is not None and slots == last and gb > lo):
            return engine  # close enough, or more budget gave no more slots: every expert fits
        engine.close()
        if slots > want:
            hi = gb
        else:
            lo = gb
        last = slots
        guess = gb + (want + 0.5 - slots) * slot / 1e9
        gb = guess if lo < guess < hi else (lo + hi) / 2
    raise AssertionError(f"could not open {ckpt} with about {want} slots")


# ---- the logits sequence ----------------------------------------------------------------------


def run_sequence(engine: Engine) -> list[np.ndarray]:
    """Prefill, greedy decode steps, truncate and replay, reset and prefill again: every logits
    array the engine returned, in order."""
    engine.reset()
    out = [engine.eval(PROMPT)]
    tokens = list(PROMPT)
    for _ in range(DECODE_STEPS):
        nxt = int(np.argmax(out[-1][-1]))
        tokens.append(nxt)
        out.append(engine.eval([nxt]))
    engine.truncate(KEEP_AFTER_TRUNCATE)
    out.append(engine.eval(tokens[KEEP_AFTER_TRUNCATE:]))
    engine.reset()
    out.append(engine.eval(tokens[:5], last_only=True))
    return out


def assert_bitwise_equal(got: list[np.ndarray], want: list[np.ndarray], label: str) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{label}: call {i}: shape {g.shape} != {w.shape}"
        if not np.array_equal(g, w):
            diff = float(np.max(np.abs(g - w)))
            pytest.fail(f"{label}: call {i}: logits differ from the resident run (max |diff| {diff:g})")


def check_budgets_match_resident(ckpt: Path) -> None:
    resident = Engine(str(ckpt))
    assert resident.stats()["experts"]["slots"] == 0
    want = run_sequence(resident)
    info = resident.info
    del resident
    n_experts = int(info.get("n_experts") or 0)
    assert n_experts > 0, f"engine info lacks n_experts: {info}"
    total = None
    for label, slots in (("tiny", n_experts + 4), ("mid", 3 * n_experts // 2 + 8), ("large", 10**6)):
        engine = open_with_slots(ckpt, slots)
        got = run_sequence(engine)
        st = engine.stats()["experts"]
        del engine
        assert st["slots"] >= n_experts, st
        assert_bitwise_equal(got, want, f"{ckpt.name} budget {label} ({st['slots']} slots)")
        assert st["misses"] > 0 and st["bytes_read"] > 0, st
        assert st["direct_reads"] + st["buffered_reads"] > 0, st
        if label == "large":
            total = st["slots"]
            assert st["evictions"] == 0, f"a cache holding every expert evicted: {st}"
            assert st["hits"] > 0, st
        else:
            # Slots are calibrated against this process's RSS, which drifts, so a "mid" cache may
            # hold every expert the short sequence touches.  Without prefetch or history every
            # miss beyond the slot count must evict exactly one expert.
            assert st["evictions"] == max(0, st["misses"] - st["slots"]), f"budget {label}: {st}"
            if label == "tiny":
                assert st["evictions"] > 0, f"budget tiny: no evictions with {st['slots']} slots: {st}"
    assert total is not None and total > 3 * n_experts // 2 + 8


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
@pytest.mark.parametrize("arch", ["qwen3_moe", "glm4_moe"])
def test_logits_bitwise_identical_at_any_budget(ckpt_root: Path, arch: str, fmt: str) -> None:
    check_budgets_match_resident(small_checkpoint(ckpt_root, arch, fmt))


@pytest.mark.rss  # budgets sized for an uninstrumented process (make sanitize skips these)
def test_logits_bitwise_identical_at_any_budget_deepseek_v4(ckpt_root: Path) -> None:
    check_budgets_match_resident(dsv4_small_checkpoint(ckpt_root))


# ---- too-small budget ---------------------------------------------------------------------------


def test_too_small_budget_names_the_minimum(ckpt_root: Path) -> None:
    ckpt = small_checkpoint(ckpt_root, "qwen3_moe", "bf16")
    with pytest.raises(EngineError) as info:
        Engine(str(ckpt), ram_gb=0.001)
    message = str(info.value)
    assert "too small" in message and "minimum" in message, message
    minimum = stated_minimum_gb(ckpt)
    assert minimum > 0.001
    # The stated minimum is enough, and it is a real cache (not resident mode).
    engine = Engine(str(ckpt), ram_gb=minimum)
    st = engine.stats()["experts"]
    assert st["slots"] >= int(engine.info["n_experts"]), st
    engine.eval(PROMPT[:3])


# ---- peak RSS of a child process, measured from the parent ---------------------------------------

RSS_BUDGET_GB = 0.1
# 32 experts of 3 x 256 x 512 bf16 (768 KiB) per layer, 13 layers: ~330 MB of experts.
RSS_OVERRIDES: dict[str, Any] = {
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 512, "num_experts": 32,
    "num_experts_per_tok": 4, "num_hidden_layers": 13, "vocab_size": 1024, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 256,
}

CHILD_DECODE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from gateway.engine import Engine
    path, ram = sys.argv[1], float(sys.argv[2])
    engine = Engine(path, ram_gb=ram if ram > 0 else None)
    logits = engine.eval([5, 17, 42, 99, 3, 250, 7, 600], last_only=True)
    for _ in range(int(sys.argv[3])):
        logits = engine.eval([int(np.argmax(logits[-1]))], last_only=True)
    print(json.dumps(engine.stats()["experts"]), flush=True)
    sys.stdin.readline()  # the parent reads this process's peak RSS now
    """
)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "python"), str(REPO_ROOT)])
    return env


def run_child_peak_rss(code: str, *args: str) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak RSS bytes) of `python -c code args`.

    The peak is the kernel's high-water mark of the child's memory (VmHWM in /proc/PID/status),
    read by this process while the child waits on stdin after its last output line.  Not
    ru_maxrss from os.wait4: at exec Linux folds the spawning process's own high-water mark
    into the child's maxrss (the child starts on the parent's memory map), so under pytest it
    reports the parent's peak, not the child's."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=child_env(), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    first = proc.stdout.readline()  # the child prints one line, then blocks on stdin
    peak = 0
    try:
        with open(f"/proc/{proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass  # the child already died: its exit code tells why
    out, err = proc.communicate("\n", timeout=120)
    return proc.returncode, first + out, err, peak


def run_child(code: str, *args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-c", code, *args], env=child_env(), text=True,
                          capture_output=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.rss  # budgets sized for an uninstrumented process (make sanitize skips these)
def test_checkpoint_three_times_the_budget_stays_under_it(ckpt_root: Path) -> None:
    ckpt = write_checkpoint("qwen3_moe", "bench", "bf16", ckpt_root / "rss", seed=2, overrides=RSS_OVERRIDES)
    size = checkpoint_bytes(ckpt)
    budget = RSS_BUDGET_GB * 1e9
    assert size >= 3 * budget, f"checkpoint {size / 1e9:.2f} GB is not 3x the budget"
    code, out, err, peak = run_child_peak_rss(CHILD_DECODE, str(ckpt), str(RSS_BUDGET_GB), "12")
    assert code == 0, f"child failed ({code}): {err[-2000:]}"
    st = json.loads(out.strip().splitlines()[-1])
    assert st["slots"] > 0 and st["misses"] > 0 and st["evictions"] > 0, st
    assert peak < budget, f"peak RSS {peak / 1e6:.1f} MB exceeds the {budget / 1e6:.0f} MB budget ({st})"
    # Control: the same decode fully resident does exceed the budget (the measurement can fail).
    code, _, err, resident_peak = run_child_peak_rss(CHILD_DECODE, str(ckpt), "0", "2")
    assert code == 0, f"resident child failed ({code}): {err[-2000:]}"
    assert resident_peak > budget, f"resident run peaked at {resident_peak / 1e6:.1f} MB only"


# ---- unreadable expert region ---------------------------------------------------------------------


def split_layer_experts(src: Path, dst: Path, layer: int) -> Path:
    """Copies a checkpoint, moving the routed experts of `layer` into a shard of their own
    (a valid two-shard layout with index.json); returns that shard's path."""
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if not p.name.endswith(".safetensors") and p.name != "model.safetensors.index.json":
            shutil.copy(p, dst / p.name)
    tensors: dict[str, tuple[Path, int, dict[str, Any]]] = {}
    for shard in sorted(src.glob("*.safetensors")):
        start, header = read_header(shard)
        for name, entry in header.items():
            tensors[name] = (shard, start, entry)
    prefix = f"model.layers.{layer}.mlp.experts."
    names = sorted(tensors, key=lambda n: (tensors[n][0].name, tensors[n][2]["data_offsets"][0]))
    groups = {"model-00001-of-00002.safetensors": [n for n in names if not n.startswith(prefix)],
              "model-00002-of-00002.safetensors": [n for n in names if n.startswith(prefix)]}
    assert groups["model-00002-of-00002.safetensors"], f"no tensor starts with {prefix}"
    weight_map = {}
    for file_name, members in groups.items():
        header, offset = {}, 0
        for n in members:
            _, _, entry = tensors[n]
            length = entry["data_offsets"][1] - entry["data_offsets"][0]
            header[n] = {"dtype": entry["dtype"], "shape": entry["shape"], "data_offsets": [offset, offset + length]}
            offset += length
            weight_map[n] = file_name
        blob = json.dumps(header).encode()
        blob += b" " * (-len(blob) % 8)
        with open(dst / file_name, "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob)
            for n in members:
                shard, start, entry = tensors[n]
                with open(shard, "rb") as s:
                    s.seek(start + entry["data_offsets"][0])
                    f.write(s.read(entry["data_offsets"][1] - entry["data_offsets"][0]))
    index = {"metadata": {"total_size": sum(e[2]["data_offsets"][1] - e[2]["data_offsets"][0]
                                            for e in tensors.values())}, "weight_map": weight_map}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst / "model-00002-of-00002.safetensors"


CHILD_UNREADABLE = textwrap.dedent(
    """
    import json, os, re, sys
    import numpy as np
    from gateway.engine import Engine, EngineError
    path, shard, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
    prompt = [5, 17, 42, 99, 3, 250, 7, 600, 31, 8, 77, 512]
    want = Engine(path).eval(prompt)
    try:
        Engine(path, ram_gb=0.001)
    except EngineError as exc:
        minimum = float(re.search(r"minimum is ([0-9.]+) GB", str(exc)).group(1))
    engine = Engine(path, ram_gb=minimum, expert_history=False)  # nothing cached before the damage
    with open(shard, "rb") as f:
        original = f.read()
    os.truncate(shard, keep)  # the experts of one layer are gone after load, none cached yet
    result = {"slots": engine.stats()["experts"]["slots"]}
    errors = []
    for attempt in range(2):
        engine.reset()
        try:
            engine.eval(prompt)
            errors.append(None)
        except EngineError as exc:
            errors.append(str(exc))
    result["errors"] = errors
    with open(shard, "r+b") as f:  # bytes back: the same engine must recover exactly
        f.seek(keep)
        f.write(original[keep:])
    engine.reset()
    try:
        result["recovered_equal"] = bool(np.array_equal(engine.eval(prompt), want))
    except EngineError as exc:
        result["recovered_equal"] = False
        result["recovery_error"] = str(exc)
    print(json.dumps(result))
    """
)


@pytest.fixture(scope="module")
def unreadable_run(ckpt_root: Path) -> tuple[Path, int, dict[str, Any]]:
    """One child run over a checkpoint whose layer-1 expert shard is truncated after load."""
    src = small_checkpoint(ckpt_root, "qwen3_moe", "bf16")
    layer = 1
    shard = split_layer_experts(src, ckpt_root / "unreadable", layer)
    data_start, _ = read_header(shard)
    code, out, err = run_child(CHILD_UNREADABLE, str(shard.parent), str(shard), str(data_start))
    assert code == 0, f"child crashed or failed (exit {code}): {err[-3000:]}"
    return shard, layer, json.loads(out.strip().splitlines()[-1])


@pytest.mark.rss  # budgets sized for an uninstrumented process (make sanitize skips these)
def test_unreadable_expert_region_is_a_clear_error(unreadable_run: tuple[Path, int, dict[str, Any]]) -> None:
    shard, layer, result = unreadable_run
    assert result["slots"] > 0, result
    for message in result["errors"]:
        assert message is not None, f"eval over a truncated expert shard succeeded: {result}"
        assert shard.name in message, f"error does not name the file: {message}"
        assert f"model.layers.{layer}.mlp.experts." in message, f"error does not name the tensor: {message}"


@pytest.mark.rss  # budgets sized for an uninstrumented process (make sanitize skips these)
def test_engine_recovers_once_the_expert_bytes_are_back(
    unreadable_run: tuple[Path, int, dict[str, Any]],
) -> None:
    _, _, result = unreadable_run
    assert result["recovered_equal"], f"after the bytes came back: {result}"


# ---- routing history across restarts -------------------------------------------------------------


def fresh_copy(src: Path, dst: Path) -> Path:
    """The checkpoint without the routing history earlier budgeted tests left beside it."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".moegate-expert-usage*"))
    return dst


def test_budgeted_runs_keep_their_history_beside_the_model(ckpt_root: Path) -> None:
    """A --ram run writes its routing history beside the model; the next start reads it, pins
    the most requested experts and loads them before the first token, and the logits stay
    bitwise those of the resident run."""
    ckpt = fresh_copy(small_checkpoint(ckpt_root, "qwen3_moe", "bf16"), ckpt_root / "history")
    history = ckpt / ".moegate-expert-usage"
    resident = Engine(str(ckpt))
    want = run_sequence(resident)
    del resident
    assert not history.exists(), "a resident run wrote a routing history"
    first = open_with_slots(ckpt, 48, expert_history=True)
    assert first.info["expert_history"] == str(history.resolve())
    assert first.stats()["experts"]["hot_set"] == 0  # nothing learned yet
    assert_bitwise_equal(run_sequence(first), want, "first budgeted run")
    first_stats = first.stats()["experts"]
    del first
    assert history.exists() and history.stat().st_size > 16
    for restart in range(2):
        engine = open_with_slots(ckpt, 48, expert_history=True)
        st = engine.stats()["experts"]
        assert st["hot_set"] > 0 and st["preloaded"] == st["hot_set"], st
        assert st["fetches"] == 0 and st["bytes_read"] > 0, st  # read at start, before any token
        got = run_sequence(engine)
        st = engine.stats()["experts"]
        del engine
        assert_bitwise_equal(got, want, f"restart {restart}")
        # the hot set was requested: the restart misses less than the cold first run
        assert st["misses"] < first_stats["misses"], (restart, st, first_stats)


def test_history_goes_to_a_cache_folder_when_the_model_folder_is_read_only(
    ckpt_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gateway import engine as engine_module

    ckpt = fresh_copy(small_checkpoint(ckpt_root, "qwen3_moe", "bf16"), ckpt_root / "read-only")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    real_access = os.access
    # root may write anywhere, so a read-only folder is simulated for the model folder only
    monkeypatch.setattr(engine_module.os, "access",
                        lambda p, mode: False if Path(p).resolve() == ckpt.resolve() else real_access(p, mode))
    path = engine_module.default_expert_history(ckpt)
    assert path.parent == tmp_path / "cache" / "moegate" / "expert-usage"
    assert path.name.startswith(ckpt.name + "-")
    other = engine_module.default_expert_history(ckpt_root / "history")
    assert other != path  # keyed by the model's path
    engine = open_with_slots(ckpt, 40, expert_history=True)
    assert engine.info["expert_history"] == str(path)
    engine.eval(PROMPT)
    del engine
    assert path.exists() and not (ckpt / ".moegate-expert-usage").exists()


@pytest.mark.rss  # budgets sized for an uninstrumented process (make sanitize skips these)
def test_expert_stats_report_hit_rate_and_read_bandwidth(ckpt_root: Path) -> None:
    ckpt = small_checkpoint(ckpt_root, "glm4_moe", "bf16")
    engine = open_with_slots(ckpt, 40, expert_history=True)
    engine.eval(PROMPT)
    st = engine.stats()["experts"]
    lookups = st["hits"] + st["misses"]
    assert st["hit_rate"] == pytest.approx(st["hits"] / lookups)
    assert st["read_seconds"] > 0 and st["read_gb_s"] == pytest.approx(st["bytes_read"] / st["read_seconds"] / 1e9)
    resident = Engine(str(ckpt)).stats()["experts"]
    assert resident["hit_rate"] == 1.0 or resident["fetches"] == 0
    assert resident["read_gb_s"] == 0.0


def check_read_ahead_keeps_logits(ckpt: Path, name: str) -> None:
    resident = Engine(str(ckpt))
    want = run_sequence(resident)
    slots = int(resident.info["n_experts"]) + 4  # a layer's experts and a few: reads evict
    del resident
    for run in range(2):  # the second start also has a history (hot set, preloaded)
        engine = open_with_slots(ckpt, slots, expert_prefetch=True)
        assert engine.read_ahead
        got = run_sequence(engine)
        st = engine.stats()["experts"]
        del engine
        assert_bitwise_equal(got, want, f"{name} read-ahead run {run}")
        # decode steps gave look-ahead hints, and the store read hinted experts ahead
        assert st["auto_prefetches"] > 0 and st["evictions"] > 0, st
        assert st["prefetch_hits"] + st["prefetches_withdrawn"] <= st["prefetches"], st
        assert st["prefetch_hits"] <= st["hits"], st


@pytest.mark.parametrize("arch", ["glm4_moe", "qwen3_moe"])
def test_idle_disk_read_ahead_keeps_logits_bitwise(ckpt_root: Path, arch: str) -> None:
    """With the store's read-ahead on (the next layer's router applied one layer early hints
    its experts, read while the experts just fetched are computed), the logits stay those of
    the resident run."""
    ckpt = fresh_copy(small_checkpoint(ckpt_root, arch, "bf16"), ckpt_root / f"prefetch-{arch}")
    check_read_ahead_keeps_logits(ckpt, arch)


@pytest.mark.rss  # budgets sized for an uninstrumented process (make sanitize skips these)
def test_idle_disk_read_ahead_keeps_logits_bitwise_deepseek_v4(ckpt_root: Path) -> None:
    """DeepSeek-V4: hash-routed layers are hinted from the token, the others by their gate."""
    ckpt = fresh_copy(dsv4_small_checkpoint(ckpt_root), ckpt_root / "prefetch-deepseek_v4")
    check_read_ahead_keeps_logits(ckpt, "deepseek_v4")


def test_emulated_disk_paces_reads_and_keeps_logits_bitwise(ckpt_root: Path) -> None:
    """Rehearsals' disk model (Engine(emulate_disk_gbps=)): every expert read goes through one
    queue at the stated rate, so the reads of a run take at least bytes / rate of its wall time
    (the tiny checkpoint's bytes come from the page cache far faster), read-ahead included; the
    bytes themselves, and so the logits, are those of the resident run."""
    ckpt = fresh_copy(small_checkpoint(ckpt_root, "qwen3_moe", "bf16"), ckpt_root / "emulated-disk")
    resident = Engine(str(ckpt))
    want = run_sequence(resident)
    slots = int(resident.info["n_experts"]) + 4
    assert resident.stats()["experts"]["emulated_disk_bps"] == 0.0
    del resident
    gbps = 0.1  # ~200 KB experts: 2 ms each, some tenths of a second for the run
    engine = open_with_slots(ckpt, slots, expert_prefetch=True, emulate_disk_gbps=gbps)
    before = engine.stats()["experts"]
    started = time.perf_counter()
    got = run_sequence(engine)
    wall = time.perf_counter() - started
    st = engine.stats()["experts"]
    engine.close()
    assert_bitwise_equal(got, want, "emulated disk")
    assert st["emulated_disk_bps"] == pytest.approx(gbps * 1e9)
    disk_s = (st["bytes_read"] - before["bytes_read"]) / (gbps * 1e9)
    assert disk_s > 0.05, st  # enough bytes for the pacing to show
    assert st["read_seconds"] - before["read_seconds"] >= disk_s * (1 - 1e-9), st
    assert wall >= disk_s, (wall, disk_s)
    with pytest.raises(ValueError, match="ram_gb"):
        Engine(str(ckpt), emulate_disk_gbps=gbps)
    with pytest.raises(ValueError, match="positive"):
        Engine(str(ckpt), ram_gb=1.0, emulate_disk_gbps=0)


def test_close_releases_the_model_now(ckpt_root: Path) -> None:
    """close() (or leaving a with-block) writes a budgeted run's history at once, not whenever
    the garbage collector gets to the engine; later calls fail with a clear error."""
    ckpt = fresh_copy(small_checkpoint(ckpt_root, "qwen3_moe", "bf16"), ckpt_root / "close")
    history = ckpt / ".moegate-expert-usage"
    with open_with_slots(ckpt, 40, expert_history=True) as engine:
        engine.eval(PROMPT)
        assert not engine.closed and not history.exists()
    assert engine.closed and history.exists()
    with pytest.raises(EngineError, match="closed"):
        engine.eval(PROMPT)
    with pytest.raises(EngineError, match="closed"):
        engine.stats()
    engine.close()  # twice is harmless
    assert "closed" in repr(engine)


def test_server_read_ahead_flag(ckpt_root: Path) -> None:
    """Under `python -m gateway --ram X` the store reads ahead by default (as Engine does with
    ram_gb) and the startup summary says so; `--no-read-ahead` turns it off and the summary says
    that too."""
    from gateway.__main__ import build_parser
    from gateway.server.serve import ServeOptions, build_state, startup_summary

    assert build_parser().parse_args(["--model", "m"]).read_ahead
    assert build_parser().parse_args(["--model", "m", "--read-ahead"]).read_ahead
    assert not build_parser().parse_args(["--model", "m", "--no-read-ahead"]).read_ahead
    assert ServeOptions(model="m").read_ahead
    ckpt = small_checkpoint(ckpt_root, "qwen3_moe", "bf16")
    budget = stated_minimum_gb(ckpt)
    for flag in (True, False):
        state = build_state(ServeOptions(model=str(ckpt), ram_gb=budget, prefix_cache_gb=0.0, threads=1,
                                         read_ahead=flag))
        summary = startup_summary(state, "http://127.0.0.1:8000")
        assert state.engine.read_ahead is flag
        assert state.engine.stats()["experts"]["emulated_disk_bps"] == 0.0  # never in the server
        assert ("predicted experts read ahead" in summary) is flag, summary
        assert ("no read-ahead" in summary) is not flag, summary
        state.engine.close()


@pytest.mark.rss
@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v4"])
def test_startup_summary_splits_the_budget(ckpt_root: Path, arch: str) -> None:
    """The startup summary prints where --ram goes: resident weights, the expert cache, the KV
    at --ctx, the prefill window's scratch and the prefix cache, and those terms fit the budget
    (the engine plans them, with the process's own resident set, under it)."""
    from gateway.server.serve import ServeOptions, build_state, memory_plan, startup_summary

    ckpt = small_checkpoint(ckpt_root, arch, "bf16") if arch == "qwen3_moe" else dsv4_small_checkpoint(ckpt_root)
    budget = stated_minimum_gb(ckpt) + 0.05
    state = build_state(ServeOptions(model=str(ckpt), ram_gb=budget, prefix_cache_gb=0.02, threads=1, ctx=512))
    try:
        plan = memory_plan(state)
        summary = startup_summary(state, "http://127.0.0.1:8000")
        info = state.engine.info
        assert [name.split(" (")[0] for name in plan] == [
            "resident weights", "expert cache", "KV at 512 tokens", "prefill scratch", "prefix cache"]
        for name, gb in plan.items():
            assert f"{name} {gb:.2f} GB" in summary, summary
        assert 0 < info["expert_bytes"] < sum(info["weight_bytes"].values())
        assert plan["resident weights"] > 0 and plan["expert cache"] > 0 and plan["prefix cache"] == pytest.approx(0.02)
        assert info["prefill_bytes_per_token"] > 0 and info["prefill_window"] > 0
        assert sum(plan.values()) <= budget + 0.02, plan  # + the prefix cache, taken from --ram first
    finally:
        state.engine.close()
