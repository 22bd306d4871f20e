"""Model decode benchmarks: decode tok/s of whole forward passes on bench checkpoints, turned into
GB/s of weights read and set next to the memory read bandwidth measured in the same run.

    python tools/bench_models.py                     # DeepSeek-V4 bench + GLM-4.5 bench
    python tools/bench_models.py --models glm4_moe   # one of them
    python tools/bench_models.py --quick             # tiny checkpoints: checks the bench runs

tools/bench.py imports this module and calls `run_model_benches(opts)` (every option it reads
has a default, see `model_options`).  Bench checkpoints are written once by
tools/make_checkpoint.py into --bench-dir (default $MOEGATE_BENCH_DIR or /tmp/moegate-bench) and
reused by later runs.

Bytes of weights read per decoded token (the numerator of the ratio) come from the model's own
accounting: Engine.info["weight_bytes"] is the census of every matrix the forward pass binds and
reads once per token, except that the embedding is one row and the routed experts are only the
ones selected.  The experts actually fetched are counted by the expert store (expert_stats()
"hits" is incremented by the number of experts of every fetch), so a token's routed bytes are
that count times one expert's bytes (from the checkpoint's safetensors headers).  KV-cache and
activation traffic is not counted: at the short contexts used here it is well below 1 %.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# numpy's BLAS threads would spin next to the engine's pool (only effective when run standalone).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
from gateway import _core  # noqa: E402
from gateway.engine import Engine  # noqa: E402

GB = 1e9
MiB = 1 << 20

# (arch, format, size on disk in GB at --size bench: for the free-space check)
MODELS: dict[str, tuple[str, str, float]] = {
    "deepseek_v4": ("deepseek_v4", "native", 4.5),
    "glm4_moe": ("glm4_moe", "bf16", 4.6),
    "qwen3_moe": ("qwen3_moe", "bf16", 4.6),
}
DEFAULT_MODELS = "deepseek_v4,glm4_moe"

DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
               "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
EXPERT_TENSOR = re.compile(r"(^|\.)experts\.(\d+)\.")
EMBED_NAMES = ("embed.weight", "model.embed_tokens.weight")


# ---- options --------------------------------------------------------------------------------

def add_model_options(p: argparse.ArgumentParser) -> None:
    """The options this module reads; tools/bench.py may add them to its own parser."""
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--bench-dir", default="", help="where bench checkpoints are kept (default $MOEGATE_BENCH_DIR "
                   "or /tmp/moegate-bench)")
    p.add_argument("--decode-tokens", type=int, default=24, help="timed single-token decode steps per model")
    p.add_argument("--prompt-tokens", type=int, default=64, help="prefill before decoding (also warms the weights)")
    p.add_argument("--activations", choices=["f32", "int8"], default="f32",
                   help="our engine's activations of the GGUF block-format linears (Engine(activations=...))")


def model_options(opts: argparse.Namespace) -> argparse.Namespace:
    """opts with every option this module reads filled in (bench.py's namespace may lack some)."""
    defaults = argparse.ArgumentParser(add_help=False)
    add_model_options(defaults)
    defaults.add_argument("--quick", action="store_true")
    defaults.add_argument("--threads", type=int, default=0)
    defaults.add_argument("--reps", type=int, default=5)
    defaults.add_argument("--table", default="")
    filled = defaults.parse_args([])
    for key, value in vars(opts).items():
        setattr(filled, key, value)
    return filled


# ---- checkpoints ----------------------------------------------------------------------------

def bench_dir(opts: argparse.Namespace) -> Path:
    return Path(opts.bench_dir or os.environ.get("MOEGATE_BENCH_DIR") or "/tmp/moegate-bench")


# Raised when the generator of a model's bench checkpoint changes (tools/ckpt), so that a cached
# folder written by an older one is rewritten: 2 = DeepSeek-V4's fp8 codes of rounded normal
# values, subnormal codes included (they had exponent fields 5..8 only).
BENCH_VERSIONS = {"deepseek_v4": 2}
VERSION_FILE = "moegate-bench-version"


def ensure_checkpoint(name: str, opts: argparse.Namespace) -> Path:
    """The bench checkpoint of `name`, written once (tiny with --quick), and again when its
    generator's BENCH_VERSIONS entry is newer than the cached folder's."""
    arch, fmt, gb = MODELS[name]
    size = "tiny" if opts.quick else "bench"
    out = bench_dir(opts) / f"{arch}-{size}-{fmt}"
    version = str(BENCH_VERSIONS.get(name, 1))
    if (out / "config.json").is_file():
        stamp = out / VERSION_FILE
        if size == "tiny" or out.is_symlink() or (stamp.read_text().strip() if stamp.is_file() else "1") == version:
            return out
        print(f"  {out} was written by an older generator (bench version {version} now): rewriting it", flush=True)
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out.parent).free / GB
    need = 0.1 if opts.quick else gb * 1.1
    if free < need:
        raise RuntimeError(f"{out.parent}: {free:.1f} GB free, the {name} {size} checkpoint needs {need:.1f} GB")
    print(f"  writing the {name} {size} checkpoint to {out} (once) ...", flush=True)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, str(ROOT / "tools" / "make_checkpoint.py"), "--arch", arch, "--size", size,
                    "--format", fmt, "--out", str(tmp)], check=True, stdout=subprocess.DEVNULL)
    (tmp / VERSION_FILE).write_text(version + "\n")
    tmp.rename(out)
    return out


def tensor_bytes(path: Path) -> dict[str, int]:
    """Stored bytes of every tensor: of a folder's safetensors shards (headers only), or of a
    GGUF file, whose stacked expert tensors are listed per expert as `blk.N.experts.E.<proj>`
    (the slices the expert store reads), so both group the same way below."""
    if path.suffix == ".gguf":
        return gguf_tensor_bytes(path)
    sizes: dict[str, int] = {}
    for shard in sorted(path.glob("*.safetensors")):
        with shard.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for key, meta in header.items():
            if key == "__metadata__":
                continue
            begin, end = meta["data_offsets"]
            sizes[key] = end - begin
    return sizes


def gguf_tensor_bytes(path: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for t in _core.gguf_inspect(str(path), arrays=False)["tensors"]:
        layer, _, proj = t["name"].removesuffix(".weight").rpartition(".")
        if proj.endswith("_exps") and len(t["shape"]) == 3:
            n_experts = t["shape"][2]
            for e in range(n_experts):
                sizes[f"{layer}.experts.{e}.{proj}"] = t["nbytes"] // n_experts
        else:
            sizes[{"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight"}
                  .get(t["name"], t["name"])] = t["nbytes"]
    return sizes


@dataclass
class WeightAccount:
    """What one decoded token reads, split the way the ratio needs it."""
    fixed_bytes: int        # every bound matrix read once per token (attention, dense, shared, router, head ...)
    expert_bytes: float     # one routed expert (values + scales of its three matrices)
    embed_row_bytes: int

    def per_token(self, experts_per_token: float) -> float:
        return self.fixed_bytes + self.embed_row_bytes + experts_per_token * self.expert_bytes


def weight_account(engine: Engine) -> WeightAccount:
    sizes = tensor_bytes(engine.path)
    census = sum(int(v) for v in engine.info["weight_bytes"].values())
    experts: dict[tuple[str, str], int] = {}
    for key, nbytes in sizes.items():
        m = EXPERT_TENSOR.search(key)
        if m:  # group by (layer prefix, expert id): scales ride along with their weight
            experts[(key[: m.start()], m.group(2))] = experts.get((key[: m.start()], m.group(2)), 0) + nbytes
    all_experts = sum(experts.values())
    embed_name = next((n for n in EMBED_NAMES if n in sizes), None)
    embed = sizes.get(embed_name, 0) if embed_name else 0
    vocab = int(engine.info["vocab_size"])
    tied = embed_name is not None and not any(n in sizes for n in ("head.weight", "lm_head.weight"))
    fixed = census - all_experts - (0 if tied else embed)  # a tied head is read whole
    return WeightAccount(fixed, all_experts / max(1, len(experts)), embed // vocab if vocab else 0)


# ---- measurements ---------------------------------------------------------------------------

def yardstick_buffer(opts: argparse.Namespace) -> np.ndarray:
    """A buffer well above the LLC (256 MiB: ~20-40 ms to read, short enough to pair with each step)."""
    want = (64 if opts.quick else 256) * MiB
    avail = 4 << 30
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    return np.ones(max(64 * MiB, min(want, avail // 8)) // 4, dtype=np.float32)


@dataclass
class DecodeResult:
    name: str
    threads: int
    step_seconds: list[float]   # decode steps
    read_gbs: list[float]       # read_sum GB/s measured right after each step
    bytes_per_token: float
    experts_per_token: float

    @property
    def ratios(self) -> list[float]:
        return [self.bytes_per_token / t / bw for t, bw in zip(self.step_seconds, self.read_gbs)]

    def row(self) -> list[str]:
        med_t = statistics.median(self.step_seconds)
        med_bw = statistics.median(self.read_gbs)
        return [self.name, str(self.threads), f"{1 / med_t:.2f}", f"{1 / min(self.step_seconds):.2f}",
                f"{self.bytes_per_token / GB:.3f}", f"{self.experts_per_token:.0f}",
                f"{self.bytes_per_token / med_t / GB:.2f}", f"{med_bw / GB:.2f}",
                f"{statistics.median(self.ratios):.2f}", f"{max(self.ratios):.2f}"]


HEADER = ["model", "T", "tok/s med", "tok/s best", "GB/token", "experts/tok", "weights GB/s", "read GB/s",
          "ratio med", "ratio best"]


def bench_decode_model(name: str, opts: argparse.Namespace, yardstick: np.ndarray,
                       path: Path | None = None) -> DecodeResult:
    """Decode steps of `name`'s bench checkpoint (or of `path`, a file or folder of that model)."""
    path = path or ensure_checkpoint(name, opts)
    table = opts.table or _core.best_kernel_table()
    threads = opts.threads or len(os.sched_getaffinity(0))
    engine = Engine(path, threads=threads, kernels=table, max_ctx=4096, activations=opts.activations)
    account = weight_account(engine)
    vocab = engine.vocab_size
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, min(vocab, 32000), opts.prompt_tokens)]
    # The prefill maps (nearly) every expert's pages; a few untimed steps settle the rest.
    logits = engine.eval(prompt, last_only=True)
    for _ in range(3):
        logits = engine.eval([int(np.argmax(logits[-1]))], last_only=True)
    _core.read_sum(table, yardstick, threads)
    hits0 = int(engine.stats()["experts"]["hits"])
    steps, bws = [], []
    n = 4 if opts.quick else opts.decode_tokens
    for _ in range(n):
        # Each step is paired with a bandwidth reading taken right after it: the host's share of
        # the memory bus drifts by 2x within seconds, so only side-by-side ratios are stable.
        token = int(np.argmax(logits[-1]))
        t0 = time.perf_counter()
        logits = engine.eval([token], last_only=True)
        t1 = time.perf_counter()
        _core.read_sum(table, yardstick, threads)
        bws.append(yardstick.nbytes / (time.perf_counter() - t1))
        steps.append(t1 - t0)
    experts_per_token = (int(engine.stats()["experts"]["hits"]) - hits0) / n
    del engine
    return DecodeResult(name, threads, steps, bws, account.per_token(experts_per_token), experts_per_token)


def bench_prefill(path: Path, opts: argparse.Namespace, tokens: int) -> float:
    """Prompt tok/s of one `tokens`-token prefill (logits of the last position only, as
    llama-bench's pp), after an untimed one that maps the weights."""
    table = opts.table or _core.best_kernel_table()
    threads = opts.threads or len(os.sched_getaffinity(0))
    engine = Engine(path, threads=threads, kernels=table, max_ctx=max(4096, tokens), activations=opts.activations)
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, min(engine.vocab_size, 32000), tokens)]
    engine.eval(prompt, last_only=True)
    engine.truncate(0)
    t0 = time.perf_counter()
    engine.eval(prompt, last_only=True)
    seconds = time.perf_counter() - t0
    del engine
    return tokens / seconds


def print_table(header: list[str], rows: list[list[str]], rule: bool = False) -> None:
    """Right-aligned columns (the bench tools' one table format); `rule`: a dashed line under
    the header."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "  ".join(h.rjust(w) for h, w in zip(header, widths))
    print(line)
    if rule:
        print("-" * len(line))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def run_model_benches(opts: argparse.Namespace) -> list[DecodeResult]:
    """Decode benches of every model in opts.models; prints one table and returns the rows."""
    opts = model_options(opts)
    names = [m for m in opts.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    yardstick = yardstick_buffer(opts)
    print(f"== model decode: {', '.join(names)}, {opts.prompt_tokens}-token prompt then "
          f"{4 if opts.quick else opts.decode_tokens} single-token steps (eval last_only)")
    results = []
    for name in names:
        results.append(bench_decode_model(name, opts, yardstick))
        print("  " + "  ".join(f"{h}={v}" for h, v in zip(HEADER, results[-1].row())), flush=True)
    print_table(HEADER, [r.row() for r in results], rule=True)
    print("\nGB/token = weight bytes read per decoded token (bound matrices + the routed experts fetched); "
          "ratio = weight GB/s of a step over read_sum GB/s measured right after it (same threads), "
          "median and best over the steps. Target: >= 0.75 on a resident model.\n")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(p)
    p.add_argument("--quick", action="store_true", help="tiny checkpoints: checks the bench runs, numbers meaningless")
    p.add_argument("--threads", type=int, default=0, help="engine and read_sum threads (default: all cores)")
    p.add_argument("--reps", type=int, default=5, help="read_sum repetitions (best of)")
    p.add_argument("--table", default="", help="kernel table (default: the best this CPU runs)")
    run_model_benches(p.parse_args(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
