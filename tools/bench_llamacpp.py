"""Decode speed as a ratio to llama.cpp's on the same checkpoint, measured side by side in one run.

    python tools/bench_llamacpp.py                       # qwen3_moe, glm4_moe, deepseek_v4 bench checkpoints
    python tools/bench_llamacpp.py --models qwen3_moe    # one of them
    python tools/bench_llamacpp.py --quick               # tiny checkpoints, never downloads or builds
    python tools/bench_llamacpp.py --models deepseek_v4 --threads 1 --activations int8

Each model's bench checkpoint (tools/bench_models.py writes and caches it) is converted once to
GGUF by llama.cpp's own convert_hf_to_gguf.py at the same precision (bf16 stays bf16; DeepSeek-V4's
native FP8/FP4 become the converter's Q8_0/MXFP4) and cached next to the checkpoint.  Then, per
repetition, our decode (tools/bench_models.py: single-token Engine.eval(last_only=True) steps
after a short prompt, each paired with a memory-read-bandwidth reading) and llama.cpp's decode
(`llama-bench -p 0 -n N -d PROMPT`: N generated tokens after a PROMPT-token context) run back to
back with the same threads; both rates are tokens over the summed time of the decode steps, and
the table shows medians over the repetitions.

Which files: for qwen3_moe and glm4_moe, one row per --quants type (default Q8_0, Q4_K_M; any of
llama-quantize's own type names, e.g. Q2_K, Q3_K_M, Q5_K_M, IQ2_XXS, IQ3_XXS) where both engines
read the one file llama-quantize made.  The IQ types (and Q2_K_S) are made with an importance
matrix, as users' IQ files are: llama-imatrix runs the converted checkpoint over a few hundred
tokens of built-in text once (tools/llamacpp.py; cached beside the GGUF), and glm4_moe's
multi-token-prediction layer, which llama.cpp never runs, stays Q8_0 in those files.  For
deepseek_v4 the file users run is the converter's own (FP8 -> Q8_0, FP4 experts -> MXFP4, BF16
kept: no llama-quantize step), so its "Q8_0+MXFP4" row has both engines read that file
(CONVERTED; --no-converted leaves it out).  The row named by the checkpoint's format (bf16,
native) reads our checkpoint in our engine and its conversion in llama.cpp.

llama-bench (llama-quantize, llama-imatrix) is looked up in $MOEGATE_LLAMA_BENCH
($MOEGATE_LLAMA_QUANTIZE, $MOEGATE_LLAMA_IMATRIX), then on PATH, then in the cache folder
($MOEGATE_LLAMA_DIR or ~/.cache/moegate/llama.cpp).  Missing, it is built there (CPU only, no
BLAS/GPU, at low priority) from the llama.cpp sources vendored in the llama-cpp-python sdist of the
pinned version, fetched with pip.  When that is impossible (offline, no cmake or compiler, a load
failure) the row says n/a and why; the bench never fails because llama.cpp is missing.

Our bench checkpoints carry a synthetic tokenizer whose vocabulary the converter cannot
fingerprint, so the conversion names the pre-tokenizer of the real model family instead; both
engines are fed token ids, so that name only labels the GGUF.
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_models  # noqa: E402  (sets OPENBLAS_NUM_THREADS before numpy loads)
import llamacpp  # noqa: E402
from llamacpp import LLAMA_CPP_PYTHON, Unavailable, all_threads  # noqa: E402,F401  (LLAMA_CPP_PYTHON: tests)

DEFAULT_MODELS = "qwen3_moe,glm4_moe,deepseek_v4"
# GGUF --outtype for our checkpoint formats (native DeepSeek-V4: the converter picks Q8_0/MXFP4
# for the FP8/FP4 tensors itself and keeps the bf16 ones).
OUTTYPE = {"bf16": "bf16", "native": "bf16"}
# The files desktop users run: llama-quantize makes them from the converted bench checkpoint, and
# both engines read the same .gguf (issue 17's targets: decode >= 1.3x on Q4_K_M, >= 1.15x on
# Q8_0, prefill >= 1.0x).
QUANT_MODELS = ("qwen3_moe", "glm4_moe")
DEFAULT_QUANTS = "Q8_0,Q4_K_M"
# Models whose GGUF users run is the converter's output itself, and the row name of that file:
# DeepSeek-V4's FP8 weights become Q8_0 and its FP4 experts MXFP4 (llama-quantize would only
# lose precision), so both engines read the converted file (issue 17's V4 target: >= 1.2x).
CONVERTED = {"deepseek_v4": "Q8_0+MXFP4"}


# ---- options --------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_models.add_model_options(p)
    p.set_defaults(models=DEFAULT_MODELS)
    p.add_argument("--quick", action="store_true",
                   help="tiny checkpoints, few steps, one repetition; never downloads or builds llama.cpp")
    p.add_argument("--repeats", type=int, default=3, help="side-by-side repetitions (medians reported)")
    p.add_argument("--threads", type=int, default=0, help="threads of both engines (default: all cores)")
    p.add_argument("--table", default="", help="our kernel table (default: the best this CPU runs)")
    p.add_argument("--llama-dir", default="", help="cache folder for llama.cpp's sources, build and GGUFs' "
                   "tools (default $MOEGATE_LLAMA_DIR or ~/.cache/moegate/llama.cpp)")
    p.add_argument("--no-fetch", action="store_true", help="never download or build llama.cpp (use what exists)")
    p.add_argument("--build-jobs", type=int, default=0, help="parallel compile jobs (default: all cores)")
    p.add_argument("--quants", default=DEFAULT_QUANTS,
                   help=f"GGUF types made by llama-quantize and served by both engines from the same file, for "
                        f"{', '.join(QUANT_MODELS)} (comma-separated, llama-quantize's names: Q8_0, Q4_K_M, Q2_K, "
                        f"Q3_K_M, Q5_K_M, IQ2_XXS, IQ3_XXS, IQ1_M ...; the IQ ones with an importance matrix "
                        f"from llama-imatrix; empty: none)")
    p.add_argument("--converted", action=argparse.BooleanOptionalAction, default=True,
                   help=f"the rows where both engines read the converter's own GGUF "
                        f"({', '.join(f'{m}: {t}' for m, t in CONVERTED.items())})")
    p.add_argument("--same-file-only", action="store_true",
                   help="only the rows where both engines read one GGUF file (not our checkpoint against its conversion)")
    p.add_argument("--prefill-tokens", type=int, default=256, help="prompt of the prefill comparison (0: skip it)")
    opts = p.parse_args(argv)
    # Checked here, not by llama-quantize after the bench checkpoint's conversion (minutes).
    quants = [q.strip().upper() for q in opts.quants.split(",") if q.strip()]
    unknown = [q for q in quants if q not in llamacpp.QUANTIZE_TYPES]
    if unknown:
        p.error(f"--quants: {', '.join(unknown)} not llama-quantize type(s) (known: {', '.join(llamacpp.QUANTIZE_TYPES)})")
    opts.quants = ",".join(quants)
    if opts.quick:
        opts.repeats, opts.no_fetch, opts.quants, opts.converted, opts.prefill_tokens = 1, True, "", False, 0
    return opts


def llama_dir(opts: argparse.Namespace) -> Path:
    return llamacpp.cache_dir(opts.llama_dir)


def find_llama_bench(opts: argparse.Namespace) -> Path:
    """$MOEGATE_LLAMA_BENCH, then PATH, then the cache's build, else (without --no-fetch) a fresh
    build there."""
    return llamacpp.find_tool("llama-bench", cache=llama_dir(opts), build_missing=not opts.no_fetch,
                              jobs=opts.build_jobs)


# ---- GGUF conversion ------------------------------------------------------------------------

def gguf_path(ckpt: Path) -> Path:
    """Next to the checkpoint, named after it (its name carries the format)."""
    return ckpt.parent / f"{ckpt.name}.gguf"


def ensure_gguf(name: str, ckpt: Path, fmt: str, opts: argparse.Namespace) -> Path:
    """The checkpoint converted by llama.cpp's converter, cached next to it (redone if older)."""
    out = gguf_path(ckpt)
    if out.is_file() and out.stat().st_mtime >= (ckpt / "config.json").stat().st_mtime:
        return out
    src = llamacpp.fetch_source(llama_dir(opts), no_fetch=opts.no_fetch)
    need = sum(f.stat().st_size for f in ckpt.glob("*.safetensors")) * 1.1  # a GGUF is about as large
    free = shutil.disk_usage(ckpt.parent).free
    if free < need:
        raise Unavailable(f"{ckpt.parent}: {free / 1e9:.1f} GB free, its GGUF needs {need / 1e9:.1f} GB")
    print(f"  converting {ckpt.name} to GGUF ({OUTTYPE[fmt]}) with llama.cpp's convert_hf_to_gguf.py "
          f"(once; log {out}.log) ...", flush=True)
    t0 = time.perf_counter()
    llamacpp.convert(src, ckpt, name, OUTTYPE[fmt], out)
    print(f"  converted in {time.perf_counter() - t0:.0f} s: {out} ({out.stat().st_size / 1e9:.2f} GB)", flush=True)
    return out


def ensure_quantized(name: str, ckpt: Path, fmt: str, quant: str, opts: argparse.Namespace) -> Path:
    """The converted checkpoint quantised by llama-quantize to `quant`, cached next to it.  The IQ
    types are made with an importance matrix of the converted file (llama-imatrix over a built-in
    text, cached beside it), as the IQ files users download are."""
    base = ensure_gguf(name, ckpt, fmt, opts)
    out = ckpt.parent / f"{ckpt.name}.{quant}.gguf"
    imatrix = None
    if llamacpp.needs_imatrix(quant):
        fresh = llamacpp.newer_than(llamacpp.imatrix_path(base), base)
        if not fresh:
            print(f"  computing an importance matrix of {base.name} with llama-imatrix (once) ...", flush=True)
        t0 = time.perf_counter()
        imatrix = llamacpp.ensure_imatrix(base, cache=llama_dir(opts), build_missing=not opts.no_fetch,
                                          threads=opts.threads, jobs=opts.build_jobs)
        if not fresh:
            print(f"  importance matrix in {time.perf_counter() - t0:.0f} s: {imatrix}", flush=True)
    if llamacpp.newer_than(out, base, *([imatrix] if imatrix else [])):
        return out
    quantizer = llamacpp.find_tool("llama-quantize", cache=llama_dir(opts), build_missing=not opts.no_fetch,
                                   jobs=opts.build_jobs)
    print(f"  quantising {base.name} to {quant} with llama-quantize (once) ...", flush=True)
    t0 = time.perf_counter()
    # glm4_moe's multi-token-prediction layer (never run, so not in the matrix) stays Q8_0 in IQ files
    rules = llamacpp.with_unrun_layers(quant, {}, llamacpp.unrun_layers(ckpt))
    llamacpp.quantize(quantizer, base, out, quant, tensor_types=rules, imatrix=imatrix)
    print(f"  quantised in {time.perf_counter() - t0:.0f} s: {out} ({out.stat().st_size / 1e9:.2f} GB)", flush=True)
    return out


# ---- measurements ---------------------------------------------------------------------------

@dataclass
class LlamaRun:
    tok_s: float
    commit: str
    flags: list[str] = field(default_factory=list)  # llama-bench options this run needed beyond its defaults
    why_flags: str = ""                             # why: how the defaults failed


# The pinned llama-bench crashed with its defaults (SIGSEGV, or GGML_ASSERT(*cur_backend_id !=
# -1)) on Q8_0 / Q4_K / MXFP4 files as soon as it ran a batch (a prompt, or the context of -d),
# on an Intel CPU with AMX: its repacked / AMX weight buffers.  What a crashed run tries next, in
# order: a decode without the context (-d 0: no batch, repacking still on, its fastest decode),
# then repacking off (NO_REPACK).
NO_REPACK = ["--repack", "0"]


def crashed(done: subprocess.CompletedProcess) -> bool:
    """Whether llama-bench died of a signal or one of its own asserts (not a refused option or file)."""
    return done.returncode < 0 or done.returncode >= 128 or "GGML_ASSERT" in done.stderr


def llama_bench(binary: Path, model: Path, threads: int, *, gen: int = 0, prompt: int = 0, depth: int = 0,
                flags: list[str] | None = None) -> LlamaRun:
    """One llama-bench run (after its own warm-up): a tg run of `gen` tokens after `depth` of
    context, or a pp run of a `prompt`-token prompt.  `flags`: the options an earlier run of the
    same kind needed (then only those are tried).  A run that crashes with llama-bench's defaults
    is repeated with the fallbacks above, and the result says which and why (the table's notes
    print it)."""
    base = [str(binary), "-m", str(model), "-p", str(prompt), "-n", str(gen), "-t", str(threads), "-r", "1",
            "-o", "json"]
    attempts = [list(flags)] if flags is not None else [[], *([["-d", "0"]] if depth else []), list(NO_REPACK)]
    why_flags = ""
    for attempt in attempts:
        # -d (context depth) is missing in older llama-bench: then the run goes without it
        for extra in (["-d", str(depth)] if depth and "-d" not in attempt else [], []):
            cmd = base + attempt + extra
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=3600)
            except subprocess.TimeoutExpired:
                raise Unavailable(f"llama-bench on {model.name} did not finish within an hour") from None
            if done.returncode == 0 or "-d" not in extra or "invalid parameter for argument: -d" not in done.stderr:
                break
        if done.returncode == 0 or not crashed(done):
            break
        why_flags = why_flags or failure_reason(done, cmd)
    if done.returncode != 0:
        raise Unavailable(f"llama-bench could not run {model.name}: {failure_reason(done, cmd)}")
    key = "n_gen" if gen else "n_prompt"
    try:
        rows = [r for r in json.loads(done.stdout) if int(r.get(key, 0)) > 0]
    except (ValueError, TypeError, AttributeError):
        raise Unavailable(f"llama-bench's output is not its JSON report: {done.stdout[:120]!r}") from None
    if not rows:
        raise Unavailable(f"llama-bench printed no {'tg' if gen else 'pp'} result")
    return LlamaRun(float(rows[0]["avg_ts"]), str(rows[0].get("build_commit", "?")), attempt,
                    why_flags if attempt else "")


def failure_reason(done: subprocess.CompletedProcess, cmd: list[str]) -> str:
    """The line saying why llama-bench failed; without -v it hides the loader's reason, so a
    failed run is repeated once with -v (it fails at load, in seconds) to read it."""
    lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
    if done.returncode < 0 or done.returncode >= 128:  # a crash: its signal, and an assert's line if any
        number = -done.returncode if done.returncode < 0 else done.returncode - 128
        try:
            signal_name = f"killed by {signal.Signals(number).name}"
        except ValueError:
            signal_name = f"killed by signal {number}"
        asserts = [ln for ln in lines if "GGML_ASSERT" in ln]
        return f"{signal_name}: {asserts[-1][:200]}" if asserts else signal_name
    try:
        verbose = subprocess.run(cmd + ["-v"], capture_output=True, text=True, errors="replace", timeout=600)
        lines += [ln.strip() for ln in verbose.stderr.splitlines() if ln.strip()]
    except (OSError, subprocess.TimeoutExpired):
        pass
    for marker in ("error loading model", "error", "fail"):
        found = [ln for ln in lines if marker in ln.lower()]
        if found:
            return found[0 if marker == "error loading model" else -1][:240]
    return lines[-1][:240] if lines else f"exit {done.returncode}"


@dataclass
class Row:
    name: str
    fmt: str
    threads: int
    ours: list[float] = field(default_factory=list)       # tok/s per repetition
    llama: list[float] = field(default_factory=list)
    read_gbs: list[float] = field(default_factory=list)   # memory read bandwidth next to our steps
    of_bandwidth: list[float] = field(default_factory=list)  # our weight GB/s / that bandwidth
    prefill_ours: list[float] = field(default_factory=list)  # prompt tok/s
    prefill_llama: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)       # other runnable tasks seen around each repetition
    note: str = ""
    commit: str = ""
    # options llama-bench's decode and prefill runs needed (LlamaRun.flags; None: not yet run), and why
    llama_flags: list[str] | None = None
    prefill_flags: list[str] | None = None
    llama_flags_why: str = ""

    def cells(self) -> list[str]:
        def med(xs: list[float], fmt: str = "{:.2f}") -> str:
            return fmt.format(statistics.median(xs)) if xs else "n/a"
        ratios = [o / ll for o, ll in zip(self.ours, self.llama)]
        prefill = [o / ll for o, ll in zip(self.prefill_ours, self.prefill_llama)]
        return [self.name, self.fmt, str(self.threads), med(self.ours), med(self.llama), med(ratios),
                med(self.prefill_ours, "{:.1f}"), med(self.prefill_llama, "{:.1f}"), med(prefill),
                med(self.read_gbs), med(self.of_bandwidth), str(len(self.ours)),
                f"{max(self.busy):g}" if self.busy else "?"]


HEADER = ["model", "format", "T", "ours tok/s", "llama.cpp tok/s", "ratio", "pp ours", "pp llama.cpp", "pp ratio",
          "read GB/s", "of bw", "reps", "busy"]


def other_runnable() -> float:
    """Tasks of other processes wanting a CPU right now (median of a few /proc/stat samples,
    minus the sampler itself): on a shared machine another busy process makes llama.cpp's
    spinning OpenMP barriers collapse (20x slower seen on 2 cores), far more than our pool, so
    a ratio measured then says little.  -1 where /proc/stat is unavailable."""
    samples = []
    for _ in range(9):
        try:
            with open("/proc/stat") as f:
                running = next((int(ln.split()[1]) for ln in f if ln.startswith("procs_running")), None)
        except OSError:
            return -1
        if running is None:
            return -1
        samples.append(running - 1)
        time.sleep(0.02)
    return statistics.median(samples)


def warm_page_cache(files: list[Path]) -> None:
    """Reads the files once so both engines start from the page cache: llama.cpp prefaults its
    mapping before timing (MAP_POPULATE) while our engine maps lazily, so a checkpoint evicted by
    the previous model's files would otherwise be read from disk inside our timed steps only."""
    t0 = time.perf_counter()
    total = 0
    buf = bytearray(16 << 20)
    for path in files:
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    print(f"  page cache: read {total / 1e9:.1f} GB of weights in {time.perf_counter() - t0:.1f} s", flush=True)


def row_variants(name: str, opts: argparse.Namespace) -> list[str]:
    """The rows of one model: "" (our checkpoint against its conversion, unless --same-file-only),
    then the same-file ones."""
    quants = [q for q in opts.quants.split(",") if q] if name in QUANT_MODELS else []
    converted = [CONVERTED[name]] if opts.converted and name in CONVERTED else []
    return ([] if opts.same_file_only else [""]) + quants + converted


def bench_model(name: str, opts: argparse.Namespace, yardstick, quant: str = "") -> Row:
    """One row: our engine and llama-bench side by side.  Without `quant`, ours reads the bench
    checkpoint and llama.cpp its conversion at the same precision; with it, both read the one
    GGUF file: the one llama-quantize made, or (quant == CONVERTED[name]) the conversion itself."""
    arch, fmt, _ = bench_models.MODELS[name]
    threads = opts.threads or all_threads()
    row = Row(name, quant or fmt, threads)
    ckpt = bench_models.ensure_checkpoint(name, opts)
    binary = model = None
    try:
        binary = find_llama_bench(opts)
        if quant and quant != CONVERTED.get(name):
            model = ensure_quantized(arch, ckpt, fmt, quant, opts)
        else:
            model = ensure_gguf(arch, ckpt, fmt, opts)
        print(f"  {name}: llama-bench {binary}, GGUF {model}", flush=True)
    except Unavailable as why:
        row.note = str(why)
        if quant:  # no file to read: nothing to measure on either side
            return row
    ours_path = model if quant else ckpt
    steps = 4 if opts.quick else opts.decode_tokens
    warm_page_cache([*([] if quant else sorted(ckpt.glob("*.safetensors"))), *([model] if model else [])])
    for rep in range(opts.repeats):
        # Alternate which engine goes first: the host's share of the memory bus drifts in seconds.
        order = ("ours", "llama") if rep % 2 == 0 else ("llama", "ours")
        row.busy.append(other_runnable())
        for who in order:
            if who == "ours":
                result = bench_models.bench_decode_model(name, opts, yardstick, path=ours_path)
                # tokens over their summed time, as llama-bench's avg_ts (a median would drop slow steps)
                row.ours.append(len(result.step_seconds) / sum(result.step_seconds))
                row.read_gbs.append(statistics.median(result.read_gbs) / bench_models.GB)
                row.of_bandwidth.append(statistics.median(result.ratios))
                if opts.prefill_tokens:
                    row.prefill_ours.append(bench_models.bench_prefill(ours_path, opts, opts.prefill_tokens))
            elif binary and model and not row.note:
                try:
                    run = llama_bench(binary, model, threads, gen=steps, depth=opts.prompt_tokens,
                                      flags=row.llama_flags)
                    row.llama.append(run.tok_s)
                    row.commit = run.commit
                    row.llama_flags = run.flags  # every later decode run of the row the same way
                    row.llama_flags_why = row.llama_flags_why or run.why_flags
                    if opts.prefill_tokens:
                        pp = llama_bench(binary, model, threads, prompt=opts.prefill_tokens, flags=row.prefill_flags)
                        row.prefill_llama.append(pp.tok_s)
                        row.prefill_flags = pp.flags
                        row.llama_flags_why = row.llama_flags_why or pp.why_flags
                except Unavailable as why:
                    row.note = str(why)
        ours = f"{row.ours[-1]:.2f}"
        theirs = f"{row.llama[-1]:.2f}" if len(row.llama) == len(row.ours) else "n/a"
        row.busy[-1] = max(row.busy[-1], other_runnable())
        print(f"  {name} {row.fmt} rep {rep + 1}/{opts.repeats}: decode ours {ours} tok/s, llama.cpp {theirs} tok/s"
              + (f"; prefill ours {row.prefill_ours[-1]:.1f} tok/s" if row.prefill_ours else "")
              + (f", llama.cpp {row.prefill_llama[-1]:.1f} tok/s" if len(row.prefill_llama) == len(row.ours) else "")
              + f" (other runnable tasks: {row.busy[-1]:g})", flush=True)
    if row.note:
        row.llama.clear()  # a load that failed midway leaves no partial ratio
        row.prefill_llama.clear()
    return row


def print_table(rows: list[Row]) -> None:
    bench_models.print_table(HEADER, [r.cells() for r in rows], rule=True)
    for r in rows:
        if r.note:
            print(f"  {r.name} {r.fmt}: llama.cpp n/a: {r.note}")
        elif r.llama_flags or r.prefill_flags:
            runs = "; ".join(f"its {what} with {' '.join(flags)}" for what, flags in
                             (("decode", r.llama_flags), ("prefill", r.prefill_flags)) if flags)
            context = " (-d 0: without the context)" if "-d" in (r.llama_flags or []) else ""
            print(f"  {r.name} {r.fmt}: llama.cpp ran {runs}{context}: with its defaults it crashed "
                  f"on this CPU ({r.llama_flags_why})")
    commits = sorted({r.commit for r in rows if r.commit})
    print(f"\nratio = our decode tok/s / llama.cpp's on the same checkpoint, same threads, medians over the "
          f"repetitions{'; llama.cpp build ' + ', '.join(commits) if commits else ''}.  Rows named by a GGUF type "
          "(Q8_0, Q4_K_M ...) read one file made by llama-quantize in both engines, Q8_0+MXFP4 the converter's "
          "own deepseek4 file in both; the others read our checkpoint "
          "and its conversion by llama.cpp's converter at the same precision.  pp = prompt tok/s of a "
          "--prefill-tokens prompt (pp ratio: ours / llama.cpp).  read GB/s = memory read bandwidth measured "
          "between our steps; of bw = the weight bytes our decode streams per second / that bandwidth.")
    print("busy = most runnable tasks of other processes seen around a repetition: above 0 the machine "
          "was shared and llama.cpp's spinning barriers suffer far more than our pool, so the ratio is unreliable.")
    if any(busy > 0 for r in rows for busy in r.busy):
        print("WARNING: the machine was busy during this run; rerun when it is idle for a meaningful ratio.")
    if any(r.name == "deepseek_v4" for r in rows):
        print("deepseek_v4 in GGUF (llama.cpp's side of the native row, both sides of Q8_0+MXFP4): BF16 kept, "
              "FP4 experts as MXFP4 (same bytes), FP8 as Q8_0 (~6 % more).")
    print()


def run_llamacpp_benches(opts: argparse.Namespace) -> list[Row]:
    names = [m for m in opts.models.split(",") if m]
    unknown = [m for m in names if m not in bench_models.MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(bench_models.MODELS)}")
    opts = bench_models.model_options(opts)
    yardstick = bench_models.yardstick_buffer(opts)
    print(f"== decode and prefill vs llama.cpp: {', '.join(names)}, {opts.prompt_tokens}-token context then "
          f"{4 if opts.quick else opts.decode_tokens} decoded tokens; a {opts.prefill_tokens}-token prompt; "
          f"{opts.repeats} side-by-side repetition(s); our activations {opts.activations}")
    rows = []
    for name in names:
        for quant in row_variants(name, opts):
            try:
                rows.append(bench_model(name, opts, yardstick, quant))
            except Exception as error:  # one model failing (disk space, a load error) keeps the others
                print(f"  {name} {quant}: failed: {error}", flush=True)
                rows.append(Row(name, quant or bench_models.MODELS[name][1], opts.threads or all_threads(),
                                note=f"failed: {error}"))
    print_table(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    run_llamacpp_benches(parse_args(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
