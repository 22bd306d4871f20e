"""Over-budget decode benchmark for the expert store (issue 4), printed side by side:

  decode tok/s    measured at a RAM budget of a third of the checkpoint, next to the floor
                  (missed-expert bytes / measured O_DIRECT read GB/s + bytes read from memory /
                  measured memory read GB/s, per token) as a ratio; the disk's GB/s is the
                  faster of a probe and the store's own reads during the run;
  hit rate        measured by the engine, next to Belady's (offline optimum) and our policy's
                  replay on the same routing trace (tools/routing_trace.py), same slot count;
                  then the routing traces recorded from trained models (tools/traces/) replayed
                  through LRU, ours and Belady at several budgets.

    python tools/bench_experts.py [--model DIR] [--size-gb 1.2] [--tokens 32] [--budget-fraction 0.333]

Without --model a qwen3_moe bf16 checkpoint of about --size-gb is written (streaming writer,
seconds per GB) into --work-dir and kept for the next run.  `run(args)` is the entry point
`make bench` calls.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
for _p in (REPO_ROOT, REPO_ROOT / "python"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from tools.bench_models import print_table  # noqa: E402
from tools.routing_trace import format_table, read_history, read_trace, replay_table, simulate  # noqa: E402

EXPERT_MARK = ".mlp.experts."
TRACE_DIR = REPO_ROOT / "tools" / "traces"  # routing recorded from trained models
TRACE_BUDGETS = (0.1, 0.125, 0.25, 0.375, 0.5)
PROMPT = [5, 17, 42, 99, 3, 250, 7, 600, 31, 8, 77, 512, 64, 128, 9, 2]


# ---- checkpoint ------------------------------------------------------------------------------


def bench_overrides(size_gb: float) -> dict[str, Any]:
    """qwen3_moe shapes where routed experts are ~95% of the bytes: 8 layers of 64 experts over
    hidden 1024, the expert width chosen to reach size_gb (384 at 1.2 GB: 2.4 MB per bf16
    expert), so one layer's experts (the cache's minimum) stay an eighth of the checkpoint."""
    layers, experts, hidden = 8, 64, 1024
    width = max(64, int(size_gb * 1e9 / (layers * experts * 3 * hidden * 2)) // 32 * 32)
    return {
        "hidden_size": hidden, "intermediate_size": 2048, "moe_intermediate_size": width, "num_experts": experts,
        "num_experts_per_tok": 8, "num_hidden_layers": layers, "vocab_size": 2048,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "max_position_embeddings": 512,
    }


def ensure_checkpoint(args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model)
    from tools.ckpt import write_checkpoint

    out = Path(args.work_dir) / f"qwen3_moe-bf16-{args.size_gb:g}gb"
    if not (out / "config.json").exists():
        write_checkpoint("qwen3_moe", "bench", "bf16", out, seed=3, overrides=bench_overrides(args.size_gb))
        # flush the just-written GB now: the kernel's delayed writeback (~30 s later) would
        # otherwise compete with the disk probe and the decode's expert reads
        os.sync()
    return out


@dataclass
class Layout:
    shards: list[Path]
    expert_bytes: int  # all routed experts
    n_experts: int  # (layer, expert) pairs
    other_bytes: int  # everything else, minus the embedding (decode reads one row of it)
    total_bytes: int


def read_layout(ckpt: Path) -> Layout:
    shards = sorted(ckpt.glob("*.safetensors"))
    expert = other = 0
    experts: set[str] = set()
    for shard in shards:
        with open(shard, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        for name, entry in header.items():
            size = entry["data_offsets"][1] - entry["data_offsets"][0]
            if EXPERT_MARK in name:
                expert += size
                head, _, rest = name.partition(EXPERT_MARK)
                experts.add(head + "." + rest.split(".", 1)[0])
            elif "embed_tokens" not in name:
                other += size
    return Layout(shards, expert, len(experts), other, sum(p.stat().st_size for p in shards))


# ---- bandwidths ----------------------------------------------------------------------------


def memory_read_gbps(threads: int, size: int = 256 << 20, reps: int = 3) -> float:
    from gateway import _core

    table = _core.best_kernel_table()
    buf = np.ones(size // 4, dtype=np.float32)
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        _core.read_sum(table, buf, threads)
        best = min(best, time.perf_counter() - started)
    return buf.nbytes / best / 1e9


def disk_read_gbps(shards: list[Path], block: int, budget_bytes: int, queue_depth: int = 4,
                   seed: int = 0) -> tuple[float, str]:
    """Random expert-sized reads across the shards, `queue_depth` in flight (the store's default
    I/O threads): (GB/s, mode).  O_DIRECT into page-aligned buffers, as the store reads; buffered
    pread when the filesystem refuses O_DIRECT (the mode says so: then the page cache counts)."""
    from concurrent.futures import ThreadPoolExecutor

    block = max(4096, block + (-block % 4096))
    sizes = [p.stat().st_size for p in shards]
    usable = [i for i, size in enumerate(sizes) if size >= block]
    rng = np.random.default_rng(seed)
    n_reads = max(queue_depth, budget_bytes // block)
    picks = rng.choice(usable, n_reads)
    offsets = [int(rng.integers(0, (sizes[i] - block) // 4096 + 1)) * 4096 for i in picks]
    mode = "O_DIRECT"
    try:
        fds = [os.open(p, os.O_RDONLY | os.O_DIRECT) for p in shards]
        probe = mmap.mmap(-1, block)
        os.preadv(fds[usable[0]], [probe], 0)
        probe.close()
    except OSError as exc:
        mode = f"buffered (O_DIRECT refused: {exc.strerror})"
        fds = [os.open(p, os.O_RDONLY) for p in shards]

    def worker(lane: int) -> int:
        buf = mmap.mmap(-1, block)  # anonymous maps are page-aligned, as O_DIRECT needs
        done = 0
        for j in range(lane, n_reads, queue_depth):
            done += os.preadv(fds[picks[j]], [buf], offsets[j])
        buf.close()
        return done

    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(queue_depth) as pool:
            total = sum(pool.map(worker, range(queue_depth)))
        elapsed = time.perf_counter() - started
    finally:
        for fd in fds:
            os.close(fd)
    return total / elapsed / 1e9, f"{mode}, {queue_depth} reads in flight"


# ---- decode at a budget ---------------------------------------------------------------------


@dataclass
class DecodeResult:
    tok_per_s: float
    stats_prefill: dict[str, Any]
    stats_end: dict[str, Any]
    trace_path: Path | None
    n_prefill_fetches: int
    n_moe_layers: int
    # the routing history the engine started from (its file is rewritten when the engine
    # closes): the replay must start from the same one to be the engine's policy
    history: Any = None
    history_visits: Any = None


def decode_at_budget(ckpt: Path, ram_gb: float, tokens: int, threads: int | None, trace_path: Path,
                     prefetch: bool = False) -> DecodeResult:
    if trace_path.exists():
        trace_path.unlink()
    from gateway.engine import Engine, default_expert_history

    # the routing history beside the checkpoint (kept from earlier runs) seeds the cache
    history = visits = None
    history_file = default_expert_history(ckpt)
    if history_file.exists():
        history, visits, _, _ = read_history(history_file)
    engine = Engine(str(ckpt), ram_gb=ram_gb, threads=threads, routing_trace=trace_path,
                    expert_prefetch=prefetch)
    logits = engine.eval(PROMPT, last_only=True)
    after_prefill = dict(engine.stats()["experts"])
    started = time.perf_counter()
    for _ in range(tokens):
        logits = engine.eval([int(np.argmax(logits[-1]))], last_only=True)
    seconds = time.perf_counter() - started
    end = dict(engine.stats()["experts"])
    n_moe = int(engine.info.get("n_layers", 0))
    engine.set_routing_trace(None)  # flush and close the trace
    engine.close()
    return DecodeResult(tokens / seconds, after_prefill, end, trace_path if trace_path.exists() else None,
                        int(after_prefill["fetches"]), n_moe, history, visits)


# ---- report ----------------------------------------------------------------------------------


def decode_deltas(dec: DecodeResult) -> dict[str, float]:
    """The store's counters over the timed decode steps (end minus after the prefill)."""
    keys = ("hits", "misses", "bytes_read", "read_seconds", "evictions", "fetches", "prefetches", "auto_prefetches",
            "prefetch_hits")
    return {k: dec.stats_end[k] - dec.stats_prefill[k] for k in keys}


def run(args: argparse.Namespace) -> dict[str, Any]:
    ckpt = ensure_checkpoint(args)
    layout = read_layout(ckpt)
    budget_gb = args.budget_fraction * layout.total_bytes / 1e9
    per_expert = layout.expert_bytes / max(1, layout.n_experts)
    threads = args.threads or os.cpu_count() or 1
    mem_gbps = memory_read_gbps(threads)
    disk_gbps, disk_mode = disk_read_gbps(layout.shards, int(per_expert), int(args.disk_probe_mb * 1e6))
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    dec = decode_at_budget(ckpt, budget_gb, args.tokens, args.threads, work / "bench_experts.trace",
                           prefetch=args.prefetch)

    d = decode_deltas(dec)
    n_tok = args.tokens
    missed_bytes = d["bytes_read"] / n_tok
    memory_bytes = layout.other_bytes + d["hits"] / n_tok * per_expert
    store_gbps = d["bytes_read"] / d["read_seconds"] / 1e9 if d["read_seconds"] else 0.0
    # The floor takes the faster of the probe and what the store's own reads achieved: a disk
    # that gave the store more than the probe saw must not make the floor easy to beat.
    floor_disk_gbps = max(disk_gbps, store_gbps)
    floor_s = missed_bytes / (floor_disk_gbps * 1e9) + memory_bytes / (mem_gbps * 1e9)
    floor_tps = 1.0 / floor_s if floor_s else float("inf")
    lookups = d["hits"] + d["misses"]
    hit_rate = d["hits"] / lookups if lookups else 0.0
    slots = int(dec.stats_end["slots"])

    print(f"== expert store over budget: {ckpt}")
    print(f"checkpoint {layout.total_bytes / 1e9:.2f} GB (experts {layout.expert_bytes / 1e9:.2f} GB, "
          f"{per_expert / 1e6:.2f} MB each); budget {budget_gb:.2f} GB = {args.budget_fraction:.3f} x checkpoint; "
          f"{slots} slots of {int(dec.stats_end['slot_bytes']) / 1e6:.2f} MB")
    print(f"memory read {mem_gbps:.2f} GB/s ({threads} threads); disk read {disk_gbps:.2f} GB/s, {disk_mode}; "
          f"the store's own reads during decode: {store_gbps:.2f} GB/s; the floor uses {floor_disk_gbps:.2f} GB/s")
    print_table(
        ["metric", "measured", "floor/optimum", "ratio"],
        [
            ["decode tok/s", f"{dec.tok_per_s:.2f}", f"{floor_tps:.2f}", f"{dec.tok_per_s / floor_tps:.3f}"],
            ["per token: MB read from disk", f"{missed_bytes / 1e6:.1f}", "", ""],
            ["per token: MB read from memory", f"{memory_bytes / 1e6:.1f}", "", ""],
        ],
    )
    result: dict[str, Any] = {
        "decode_tok_per_s": dec.tok_per_s, "floor_tok_per_s": floor_tps, "hit_rate": hit_rate,
        "memory_gbps": mem_gbps, "disk_gbps": disk_gbps, "floor_disk_gbps": floor_disk_gbps, "disk_mode": disk_mode,
        "slots": slots,
        "budget_gb": budget_gb, "checkpoint_gb": layout.total_bytes / 1e9,
    }
    print(f"cache: {int(dec.stats_end['hot_set'])} in the routing history's hot set, "
          f"{int(dec.stats_end['preloaded'])} read at start, {int(d['prefetches'])} prefetched during decode "
          f"({int(d['auto_prefetches'])} read ahead from look-ahead hints)")
    if dec.trace_path is None:
        print(f"hit rate (decode) {hit_rate:.3f}; Belady: n/a, the engine wrote no routing trace")
        return result
    trace = read_trace(dec.trace_path)
    warm = dec.n_prefill_fetches  # the prefill fills the cache; decode fetches are counted
    belady = simulate(trace, "belady", slots, warm=warm).hit_rate
    ours = simulate(trace, "ours", slots, warm=warm, history=dec.history, history_visits=dec.history_visits).hit_rate
    lru = simulate(trace, "lru", slots, warm=warm).hit_rate
    print_table(
        ["hit rate (decode)", "engine", "ours replay", "lru replay", "belady", "engine - belady"],
        [["same trace, same slots", f"{hit_rate:.3f}", f"{ours:.3f}", f"{lru:.3f}", f"{belady:.3f}",
          f"{100 * (hit_rate - belady):+.1f} points"]],
    )
    result.update({"belady_hit_rate": belady, "ours_replay_hit_rate": ours, "lru_replay_hit_rate": lru})
    if not args.prefetch:
        result["read_ahead"] = read_ahead_side_by_side(args, ckpt, budget_gb, dec, belady, work)
    result["recorded_traces"] = recorded_trace_tables()
    return result


def read_ahead_side_by_side(args: argparse.Namespace, ckpt: Path, budget_gb: float, off: DecodeResult,
                            belady: float, work: Path) -> dict[str, float]:
    """The same decode with the store's read-ahead on (the engine's default) next to the run
    above (read-ahead off: demand reads only, which the replay reproduces exactly), in
    args.pairs interleaved pairs (off-on, on-off, ...): single runs on a shared disk differ by
    more than read-ahead changes, so the ratio is the geometric mean of each pair's."""
    runs: dict[bool, list[DecodeResult]] = {False: [off], True: []}
    for i in range(args.pairs):
        for ahead in ((False, True) if i % 2 == 0 else (True, False)):
            if i == 0 and not ahead:
                continue  # the run above
            runs[ahead].append(decode_at_budget(ckpt, budget_gb, args.tokens, args.threads,
                                                work / f"bench_experts_{int(ahead)}.trace", prefetch=ahead))
    rows, out = [], {}
    for ahead in (False, True):
        deltas = [decode_deltas(dec) for dec in runs[ahead]]
        hit = float(np.mean([d["hits"] / max(1, d["hits"] + d["misses"]) for d in deltas]))
        tps = float(np.mean([dec.tok_per_s for dec in runs[ahead]]))
        mb = float(np.mean([d["bytes_read"] for d in deltas])) / args.tokens / 1e6
        read_ahead = float(np.mean([d["auto_prefetches"] for d in deltas]))
        right = float(np.mean([d["prefetch_hits"] for d in deltas]))
        rows.append(["read-ahead on (default)" if ahead else "read-ahead off", f"{tps:.2f}", f"{mb:.1f}",
                     f"{hit:.3f}", f"{100 * (hit - belady):+.1f} points", f"{read_ahead:.0f}", f"{right:.0f}"])
        name = "on" if ahead else "off"
        out[f"{name}_tok_per_s"], out[f"{name}_hit_rate"], out[f"{name}_mb_per_token"] = tps, hit, mb
    print_table([f"decode (mean of {args.pairs})", "tok/s", "MB read/token", "hit rate", "vs belady",
                 "read ahead", "of them hit"], rows)
    ratios = np.array([a.tok_per_s / b.tok_per_s for a, b in zip(runs[True], runs[False])])
    out["on_over_off"] = float(np.exp(np.log(ratios).mean()))
    print(f"read-ahead on / off: {out['on_over_off']:.2f}x decode tok/s (geometric mean of {len(ratios)} interleaved "
          f"pairs, {ratios.min():.2f}-{ratios.max():.2f}; this bench's random weights: next-layer hints are right "
          "about half the time, trained routers' about nine times in ten, tools/traces/README.md)")
    return out


def recorded_trace_tables(budgets: tuple[float, ...] = TRACE_BUDGETS) -> dict[str, list[dict[str, float]]]:
    """Replays the routing traces recorded from trained models (tools/traces/, see its README)
    through lru / ours / Belady.  The bench checkpoint above has random weights, whose routing is
    close to independent from token to token; these traces have a trained router's structure."""
    tables: dict[str, list[dict[str, float]]] = {}
    for path in sorted(TRACE_DIR.glob("*.trace")):
        trace = read_trace(path)
        rows = replay_table(trace, list(budgets))
        print(f"== recorded routing, trained model: {path.name} ({len(trace)} fetches, "
              f"{trace.n_layers} layers x {trace.n_experts} experts; budget = share of the expert pool, "
              "gap = belady - ours in points)")
        print(format_table(rows))
        tables[path.name] = rows
    return tables


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="an existing checkpoint (default: write a qwen3_moe bench one)")
    ap.add_argument("--size-gb", type=float, default=1.2, help="size of the written checkpoint")
    ap.add_argument("--work-dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "moegate-bench-experts"))
    ap.add_argument("--tokens", type=int, default=32, help="decode steps timed")
    ap.add_argument("--budget-fraction", type=float, default=1 / 3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prefetch", action="store_true",
                    help="read ahead in the first run too (the engine's default; its hits then depend on the "
                         "disk's timing, so the replay no longer reproduces them, and no side-by-side run)")
    ap.add_argument("--pairs", type=int, default=3, help="interleaved read-ahead off/on pairs timed")
    ap.add_argument("--disk-probe-mb", type=float, default=256.0, help="bytes read to measure disk GB/s")
    return ap


def main(argv: list[str] | None = None) -> int:
    run(parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
