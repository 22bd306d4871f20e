"""moegate benchmarks (`make bench`): every number is printed next to the yardstick it is
judged against, measured in the same run, because this class of machine is noisy.

Sections are plain functions registered with @bench; add model benches (decode tok/s, expert
store, ...) the same way.  Each takes the parsed options and prints its own table.

    python tools/bench.py                 # everything
    python tools/bench.py --only decode   # one or more sections, comma-separated
    python tools/bench.py --list
    python tools/bench.py --quick         # small sizes: a smoke run, numbers not meaningful
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from gateway import _core  # noqa: E402

MiB = 1 << 20
GB = 1e9

BenchFn = Callable[[argparse.Namespace], None]
BENCHES: dict[str, tuple[BenchFn, str]] = {}


def bench(name: str, help_text: str) -> Callable[[BenchFn], BenchFn]:
    def register(fn: BenchFn) -> BenchFn:
        BENCHES[name] = (fn, help_text)
        return fn
    return register


# ---- helpers --------------------------------------------------------------------------------

def all_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (or a conservative 4 GiB where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    """Wall times of `reps` runs after one warm-up run."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = "  ".join(h.rjust(w) for h, w in zip(header, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    print()


# ---- weights in their stored formats, filled from a small valid random block ----------------

@dataclass
class BenchMatrix:
    label: str
    fmt: str
    scale_kind: str
    rows: int
    cols: int
    data: np.ndarray
    scale: np.ndarray | None

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (self.scale.nbytes if self.scale is not None else 0)

    def linear(self, table: str, x: np.ndarray, threads: int) -> np.ndarray:
        return _core.linear(table, self.fmt, self.scale_kind, self.data, self.scale, self.rows, self.cols, x, threads)


# (label, format, scale kind, bytes per weight): the layouts real checkpoints use.
LAYOUTS = [
    ("f32", "f32", "none", 4.0),
    ("bf16", "bf16", "none", 2.0),
    ("f16", "f16", "none", 2.0),
    ("fp8 e4m3 + f32/128²", "fp8_e4m3", "f32_block128", 1.0),
    ("fp8 e4m3 + e8m0/128²", "fp8_e4m3", "e8m0_block128", 1.0),
    ("mxfp4 (e2m1 + e8m0/32)", "fp4_e2m1", "e8m0_g32", 0.5),
    # ggml block formats (GGUF), self-scaled blocks
    ("gguf q8_0", "q8_0", "none", 34 / 32),
    ("gguf q4_0", "q4_0", "none", 18 / 32),
    ("gguf q4_k", "q4_k", "none", 144 / 256),
    ("gguf q5_k", "q5_k", "none", 176 / 256),
    ("gguf q6_k", "q6_k", "none", 210 / 256),
    ("gguf mxfp4", "mxfp4", "none", 17 / 32),
    ("gguf iq4_xs", "iq4_xs", "none", 136 / 256),
]

# ggml block formats: (elements, bytes) per block and the byte offsets of their f16 scales.
GGML_BLOCKS = {"q8_0": (32, 34, (0,)), "q4_0": (32, 18, (0,)), "q5_0": (32, 22, (0,)), "q4_k": (256, 144, (0, 2)),
               "q5_k": (256, 176, (0, 2)), "q6_k": (256, 210, (208,)), "mxfp4": (32, 17, ()),
               "iq4_nl": (32, 18, (0,)), "iq4_xs": (256, 136, (0,))}


def random_codes(fmt: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Valid codes (no NaN/inf, no fp32 denormals that would slow some CPUs)."""
    rows, cols = shape
    if fmt == "f32":
        return rng.standard_normal(shape, dtype=np.float32)
    if fmt == "bf16":
        return (rng.standard_normal(shape, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if fmt == "f16":
        return rng.standard_normal(shape, dtype=np.float32).astype(np.float16)
    if fmt in GGML_BLOCKS:  # random codes, f16 scales 1e-3..1e-2, e8m0 exponents near 2^-7
        elems, nbytes, f16_at = GGML_BLOCKS[fmt]
        nblk = rows * cols // elems
        blocks = rng.integers(0, 256, (nblk, nbytes), dtype=np.uint8)
        for off in f16_at:
            blocks[:, off:off + 2] = rng.uniform(1e-3, 1e-2, nblk).astype(np.float16).view(np.uint8).reshape(nblk, 2)
        if fmt == "mxfp4":
            blocks[:, 0] = rng.integers(118, 126, nblk)
        return blocks.reshape(rows, -1)
    if fmt == "fp8_e4m3":
        codes = rng.integers(0, 256, shape, dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] ^= 1
        return codes
    return rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)


def make_matrix(label: str, fmt: str, scale_kind: str, rows: int, cols: int, rng: np.random.Generator) -> BenchMatrix:
    block_rows = min(rows, max(1, (4 * MiB) // max(1, cols)))
    block = random_codes(fmt, (block_rows, cols), rng)
    data = np.resize(block, (rows, block.shape[1]))  # tiles the block: fast to build, still streamed
    scale = None
    if scale_kind == "f32_block128":
        scale = rng.uniform(1e-4, 1e-2, (-(-rows // 128), -(-cols // 128))).astype(np.float32)
    elif scale_kind == "e8m0_block128":
        scale = rng.integers(110, 125, (-(-rows // 128), -(-cols // 128)), dtype=np.uint8)
    elif scale_kind == "e8m0_g32":
        scale = rng.integers(110, 125, (rows, cols // 32), dtype=np.uint8)
    return BenchMatrix(label, fmt, scale_kind, rows, cols, data, scale)


def weight_budget(opts: argparse.Namespace, copies: float) -> int:
    """Bytes per weight matrix: the requested size, shrunk to leave room on a busy machine."""
    want = (16 if opts.quick else opts.size_mib) * MiB
    room = int(available_bytes() * 0.5 / copies)
    if room < want:
        print(f"  (only {available_bytes() / MiB:.0f} MiB available: using {room / MiB:.0f} MiB matrices)")
    return max(4 * MiB, min(want, room))


# ---- sections -------------------------------------------------------------------------------

@dataclass
class PairTimes:
    """One repetition: the read yardstick and the kernel, run back to back over the same bytes."""
    read_wall: float
    read_cpu: float
    kernel_wall: float
    kernel_cpu: float


def timed_pair(read: Callable[[], object], kernel: Callable[[], object]) -> PairTimes:
    """Wall and process-CPU seconds of read() then kernel().  CPU time counts only while this
    process's threads run, so it is not inflated when other jobs take the cores (memory traffic
    of other jobs still slows both)."""
    t0, c0 = time.perf_counter(), time.process_time()
    read()
    t1, c1 = time.perf_counter(), time.process_time()
    kernel()
    t2, c2 = time.perf_counter(), time.process_time()
    return PairTimes(t1 - t0, c1 - c0, t2 - t1, c2 - c1)


@bench("decode", "linear kernel, n_tok=1, weights larger than the LLC: GB/s vs measured read bandwidth")
def bench_decode(opts: argparse.Namespace) -> None:
    tables = [t for t in (opts.table.split(",") if opts.table else [_core.best_kernel_table()]) if t]
    size = weight_budget(opts, copies=2.2)  # one matrix + the read-bandwidth buffer
    cols = opts.cols
    thread_counts = sorted({1, opts.threads or all_threads()})
    reps = 2 if opts.quick else opts.reps
    rng = np.random.default_rng(0)
    yardstick = np.ones(size // 4, dtype=np.float32)

    print(f"== decode: tables {','.join(tables)}, {size / MiB:.0f} MiB of weights per format, cols {cols}, "
          f"median of {reps} read/kernel pairs")
    header = ["format", "table", "MiB"]
    for t in thread_counts:
        header += [f"{t}T GB/s", f"{t}T read GB/s", f"{t}T ratio", f"{t}T cpu ratio"]
    rows = []
    for label, fmt, scale_kind, bytes_per_w in LAYOUTS:
        n_rows = max(1, int(size / (bytes_per_w * cols)))
        m = make_matrix(label, fmt, scale_kind, n_rows, cols, rng)
        x = rng.standard_normal((1, cols), dtype=np.float32)
        for table in tables:
            row = [label, table, f"{m.nbytes / MiB:.0f}"]
            for t in thread_counts:
                # The yardstick is read with the same table's read_sum, right before each kernel
                # run: the host's share of bandwidth drifts from second to second.
                def read() -> object:
                    return _core.read_sum(table, yardstick, t)

                def kernel(matrix=m) -> object:  # bound now: `del m` below frees it before the next size
                    return matrix.linear(table, x, t)

                read(), kernel()  # warm-up: pool threads, page tables, x in cache
                pairs = [timed_pair(read, kernel) for _ in range(reps)]
                gbs = statistics.median(m.nbytes / p.kernel_wall for p in pairs)
                bw = statistics.median(yardstick.nbytes / p.read_wall for p in pairs)
                ratio = statistics.median((m.nbytes / p.kernel_wall) / (yardstick.nbytes / p.read_wall) for p in pairs)
                cpu_ratio = statistics.median(
                    (m.nbytes / max(p.kernel_cpu, 1e-9)) / (yardstick.nbytes / max(p.read_cpu, 1e-9)) for p in pairs)
                row += [f"{gbs / GB:.2f}", f"{bw / GB:.2f}", f"{ratio:.2f}", f"{cpu_ratio:.2f}"]
            rows.append(row)
        del m
    print_table(header, rows)
    print("ratio = median over pairs of kernel weight bytes/s over read_sum bytes/s (wall clock, same thread count);\n"
          "cpu ratio = the same with process CPU seconds (robust to other jobs taking the cores).\n"
          "Targets: >= 0.80 fp8/fp4, >= 0.85 bf16 at all threads.\n")


@bench("prefill", "linear kernel, n_tok=32 (register-blocked tiles): GFLOP/s per format")
def bench_prefill(opts: argparse.Namespace) -> None:
    tables = [opts.table.split(",")[0] if opts.table else _core.best_kernel_table()]
    if opts.with_scalar and "scalar" not in tables:
        tables.append("scalar")
    rows_n, cols, n_tok = (256, 1024, 32) if opts.quick else (opts.prefill_rows, opts.cols, 32)
    thread_counts = sorted({1, opts.threads or all_threads()})
    reps = 2 if opts.quick else max(3, opts.reps // 2)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n_tok, cols), dtype=np.float32)
    flops = 2.0 * rows_n * cols * n_tok
    print(f"== prefill: {rows_n}x{cols} weights, n_tok {n_tok}, best of {reps}")
    header = ["format", "table"] + [f"{t}T GFLOP/s" for t in thread_counts] + ["decode-equiv GB/s (1T)"]
    out = []
    for label, fmt, scale_kind, _ in LAYOUTS:
        m = make_matrix(label, fmt, scale_kind, rows_n, cols, rng)
        for table in tables:
            row = [label, table]
            first = 0.0
            for t in thread_counts:
                secs = min(timed(lambda: m.linear(table, x, t), reps))
                row.append(f"{flops / secs / 1e9:.1f}")
                first = first or secs
            # Weight bytes the same work would stream at decode, one token at a time.
            row.append(f"{m.nbytes * n_tok / first / GB:.1f}")
            out.append(row)
    print_table(header, out)


# ---- driver ---------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated sections (see --list)")
    p.add_argument("--list", action="store_true", help="list sections and exit")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the bench runs, numbers meaningless")
    p.add_argument("--table", default="", help="kernel table(s), comma-separated (default: the best this CPU runs)")
    p.add_argument("--threads", type=int, default=0, help="thread count for the 'all threads' column (default: all cores)")
    p.add_argument("--size-mib", type=int, default=1024, help="weight bytes per decode matrix (default 1024: above the LLC)")
    p.add_argument("--cols", type=int, default=4096, help="matrix columns (multiple of 32)")
    p.add_argument("--prefill-rows", type=int, default=4096)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--with-scalar", action="store_true", help="prefill: also time the scalar twin")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if opts.list:
        for name, (_, help_text) in BENCHES.items():
            print(f"{name:12s} {help_text}")
        return 0
    wanted = [s for s in opts.only.split(",") if s] or list(BENCHES)
    unknown = [s for s in wanted if s not in BENCHES]
    if unknown:
        print(f"unknown section(s): {', '.join(unknown)}; known: {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    feats = ", ".join(k for k, v in _core.cpu_features().items() if v)
    print(f"moegate bench: tables {_core.kernel_tables()}, cpu [{feats}], {all_threads()} threads\n")
    for name in wanted:
        BENCHES[name][0](opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
