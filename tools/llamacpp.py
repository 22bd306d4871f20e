"""llama.cpp's own tools, from the llama-cpp-python sdist of one pinned version: its sources, a
CPU-only build of llama-bench, llama-quantize and llama-imatrix, its converter
(convert_hf_to_gguf.py), its quantizer and the importance matrices the IQ1 / IQ2 / IQ3_XXS types
need.  tools/bench_llamacpp.py compares decode speed with them; tools/llamacpp_ggufs.py and
the GGUF tests turn our tiny checkpoints into GGUF files made by llama.cpp itself.

Everything lives in one cache folder ($MOEGATE_LLAMA_DIR or ~/.cache/moegate/llama.cpp):
download/ (the sdist, fetched with pip), the extracted tree, build/ (cmake).  Whatever cannot be
had (offline, no cmake or compiler, a failed build) raises Unavailable with the reason; callers
print it or skip, and never fake a result.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"       # the pinned sdist: its vendor/llama.cpp is the llama.cpp we compare with
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DGGML_BLAS=OFF",
               "-DGGML_CUDA=OFF", "-DGGML_VULKAN=OFF", "-DGGML_METAL=OFF", "-DGGML_HIP=OFF", "-DGGML_SYCL=OFF",
               "-DGGML_OPENCL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_TOOLS=ON",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF"]
# llama-quantize's type names at the pinned version (tools/quantize/quantize.cpp, QUANT_OPTIONS;
# it takes them in any case): the K-quant mixes (Q2_K, Q3_K_M, Q4_K_M, Q5_K_M ...), the legacy
# 32-blocks, the IQ types, and the unquantised ones.
QUANTIZE_TYPES = ("Q1_0", "Q2_0", "Q4_0", "Q4_1", "MXFP4_MOE", "Q5_0", "Q5_1", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M",
                  "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "Q2_K", "Q2_K_S", "IQ3_XXS", "IQ3_S", "IQ3_M", "Q3_K", "IQ3_XS",
                  "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS", "Q4_K", "Q4_K_S", "Q4_K_M", "Q5_K", "Q5_K_S",
                  "Q5_K_M", "Q6_K", "Q8_0", "F16", "BF16", "F32")
# The binaries this project uses, with the variable that may point at one built elsewhere.
TOOLS = {"llama-bench": "MOEGATE_LLAMA_BENCH", "llama-quantize": "MOEGATE_LLAMA_QUANTIZE",
         "llama-imatrix": "MOEGATE_LLAMA_IMATRIX"}

# ggml types whose quantisers weigh every column by an importance matrix and which llama-quantize
# refuses to make without one (src/llama-quant.cpp, tensor_requires_imatrix; Q2_K only in a
# Q2_K_S file), in the lower case of --tensor-type.
IMATRIX_TENSOR_TYPES = frozenset({"iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq1_s", "iq1_m"})

# The text llama-imatrix runs the model on: a few hundred tokens of prose, code, numbers and other
# languages, so that every column of every matrix sees some activation (the weights it yields only
# steer the IQ quantisers' search; a tiny synthetic model has no "right" ones).  Chunks of
# IMATRIX_CONTEXT tokens; llama-imatrix wants at least two.
IMATRIX_CONTEXT = 64
CALIBRATION_TEXT = """\
The river rose after three days of rain, and by Thursday the lower road to the mill was under a foot
of brown water. Mara kept the ledger open on the kitchen table: 14 sacks of flour, 9 of barley, 2
barrels of salt herring, and a note that the bridge toll had gone up to 35 cents.
def moving_average(values, window=4):
    total, out = 0.0, []
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
SELECT name, COUNT(*) AS n FROM orders WHERE shipped_at >= '2024-03-01' GROUP BY name ORDER BY n DESC;
Der Zug nach Hamburg hatte zwanzig Minuten Verspaetung, also tranken wir noch einen Kaffee am Bahnsteig.
Le marche ouvre a sept heures; les pommes viennent de Normandie et le fromage des Alpes.
Q: What is 17 times 23? A: 17 x 23 = 391, since 17 x 20 = 340 and 17 x 3 = 51.
{"id": 7, "tags": ["alpha", "beta"], "ratio": 0.625, "ok": true}
In a mixture-of-experts layer a router scores every expert for each token, keeps the top few, and
adds their outputs weighted by the softmax of those scores; the rest of the experts are not read.
She wrote back the next morning: "The parcel arrived, the blue one was broken, please send another."
"""

# The converter recognises a tokenizer by hashing how it splits a test string; ours are synthetic,
# so the pre-tokenizer name of the real model family is given instead (it only labels the GGUF
# unless the file's tokenizer is used).
PRE_TOKENIZER = {"qwen3_moe": "qwen2", "glm4_moe": "glm4", "deepseek_v4": "deepseek-v3"}

# Runs convert_hf_to_gguf.py with a fallback pre-tokenizer name (argv: src, pre-tokenizer, args...).
CONVERT_LAUNCHER = r"""
import runpy, sys
from pathlib import Path
src, pre = Path(sys.argv[1]), sys.argv[2]
sys.path[0:0] = [str(src), str(src / "gguf-py")]
import conversion.base as base
known = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        print(f"llamacpp: synthetic tokenizer, pre-tokenizer set to {pre!r}", flush=True)
        return pre
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = [str(src / "convert_hf_to_gguf.py")] + sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class Unavailable(Exception):
    """A llama.cpp tool cannot be had or run here; the message says why."""


def all_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cache_dir(explicit: str | os.PathLike[str] = "") -> Path:
    return Path(explicit or os.environ.get("MOEGATE_LLAMA_DIR") or Path.home() / ".cache" / "moegate" / "llama.cpp")


# ---- sources and build ----------------------------------------------------------------------

def vendored_source(cache: Path) -> Path | None:
    """The extracted llama.cpp tree of the pinned sdist in the cache, if there is one."""
    src = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    return src if (src / "convert_hf_to_gguf.py").is_file() and (src / "CMakeLists.txt").is_file() else None


def fetch_source(cache: Path, *, no_fetch: bool = False) -> Path:
    """llama.cpp's source tree, extracted from the pinned llama-cpp-python sdist (downloaded once)."""
    src = vendored_source(cache)
    if src:
        return src
    if no_fetch:
        raise Unavailable(f"no llama.cpp sources in {cache} (not downloading)")
    download = cache / "download"
    download.mkdir(parents=True, exist_ok=True)
    sdist = next(iter(sorted(download.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))), None)
    if sdist is None:
        print(f"  fetching the llama-cpp-python {LLAMA_CPP_PYTHON} sdist (its vendor/llama.cpp, ~80 MB) with pip ...",
              flush=True)
        # --no-binary names the package only: with :all: pip would also compile the sdist's build
        # dependencies (cmake, ninja ...) from source just to read its metadata.
        cmd = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "--no-deps",
               "--no-binary", "llama-cpp-python", "--disable-pip-version-check", "--progress-bar", "on",
               "--timeout", "30", "--retries", "2", "-d", str(download)]
        try:
            done = subprocess.run(cmd, timeout=1800)
        except subprocess.TimeoutExpired:
            raise Unavailable("pip download of the llama-cpp-python sdist timed out") from None
        sdist = next(iter(sorted(download.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"))), None)
        if done.returncode != 0 or sdist is None:
            raise Unavailable(f"pip could not download llama-cpp-python=={LLAMA_CPP_PYTHON} (offline?)")
    print(f"  extracting {sdist.name} ...", flush=True)
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(cache, filter="data")
        else:  # Python < 3.11.4
            tar.extractall(cache)  # noqa: S202 (a pinned sdist fetched by pip)
    src = vendored_source(cache)
    if not src:
        raise Unavailable(f"{sdist.name} holds no vendor/llama.cpp with convert_hf_to_gguf.py")
    return src


def build(cache: Path, targets: list[str], *, jobs: int = 0, no_fetch: bool = False) -> None:
    """Builds these llama.cpp targets (CPU only) in cache/build from the vendored sources."""
    src = fetch_source(cache, no_fetch=no_fetch)
    cmake = shutil.which("cmake")
    if not cmake:
        raise Unavailable("cmake not found: cannot build llama.cpp (install cmake, or point "
                          f"{' / '.join(TOOLS.values())} at built binaries)")
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        raise Unavailable("no C++ compiler found: cannot build llama.cpp")
    out = cache / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") and not (out / "Makefile").exists() else []
    jobs = jobs or all_threads()
    print(f"  building {', '.join(targets)} in {out} (CPU only, {jobs} jobs, low priority; minutes) ...", flush=True)
    # Low priority: a build on a shared machine should not skew the timings of whoever else runs.
    low = (lambda: os.nice(19)) if hasattr(os, "nice") else None
    for cmd in ([cmake, "-S", str(src), "-B", str(out), *generator, *CMAKE_FLAGS],
                [cmake, "--build", str(out), "--target", *targets, "-j", str(jobs)]):
        if subprocess.run(cmd, preexec_fn=low).returncode != 0:
            raise Unavailable(f"building llama.cpp failed ({' '.join(cmd[:3])} ...), see the output above")


def find_tool(name: str, *, cache: Path | None = None, build_missing: bool = True, jobs: int = 0) -> Path:
    """A llama.cpp binary (llama-bench, llama-quantize, llama-imatrix): its variable in TOOLS, then PATH, then the
    cache's build, else (build_missing) a fresh build there."""
    env = os.environ.get(TOOLS[name])
    if env:
        if not os.access(env, os.X_OK):
            raise Unavailable(f"{TOOLS[name]}={env} is not an executable")
        return Path(env)
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    cache = cache or cache_dir()
    built = cache / "build" / "bin" / name
    if built.is_file():
        return built
    if not build_missing:
        raise Unavailable(f"{name} not found (${TOOLS[name]}, PATH, {built}); not building it "
                          "(`make llamacpp` builds it)")
    build(cache, [name], jobs=jobs)
    if not built.is_file():
        raise Unavailable(f"the build produced no {built}")
    return built


# ---- the converter and the quantizer --------------------------------------------------------

def convert(src: Path, ckpt: Path, arch: str, outtype: str, out: Path) -> Path:
    """llama.cpp's convert_hf_to_gguf.py on checkpoint folder `ckpt` -> `out` (written atomically,
    its log beside it).  arch: our model_type, for the fallback pre-tokenizer name."""
    log = out.with_name(out.name + ".log")
    tmp = out.with_name(out.name + ".partial")
    cmd = [sys.executable, "-c", CONVERT_LAUNCHER, str(src), PRE_TOKENIZER.get(arch, "default"), str(ckpt),
           "--outtype", outtype, "--outfile", str(tmp)]
    with log.open("w") as f:
        # PYTHONPATH emptied: the converter imports the gguf-py of its own tree, not an installed one
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": ""})
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise Unavailable(f"llama.cpp's converter rejected {ckpt.name}: {tail[0][:200]}")
    tmp.rename(out)
    return out


def needs_imatrix(ftype: str, tensor_types: dict[str, str] | None = None) -> bool:
    """Whether a file of llama-quantize type `ftype` with these overrides is made with an
    importance matrix: always for the IQ mixes (as the IQ files users download are; IQ4_NL / IQ4_XS
    and the IQ3_S of IQ3_M do without one, but llama.cpp's mixes pick other types then) and
    Q2_K_S, and whenever an override names a type that requires one."""
    name = ftype.upper()
    return (name.startswith("IQ") or name == "Q2_K_S"
            or any(kind.lower() in IMATRIX_TENSOR_TYPES for kind in (tensor_types or {}).values()))


# The type given to the layers llama.cpp never runs (glm4_moe's multi-token-prediction layers):
# llama-imatrix sees no activations there, and llama-quantize refuses an IQ1 / IQ2 / IQ3_XXS
# tensor without them ("Missing importance matrix ... in a very low-bit quantization"), so files
# made with a matrix keep such layers in a type that needs none (the engine skips them too).
UNRUN_LAYER_TYPE = "q8_0"


def unrun_layers(ckpt: Path) -> list[int]:
    """The blocks of checkpoint folder `ckpt` that the converter writes but llama.cpp's graph
    skips: the multi-token-prediction layers (num_nextn_predict_layers, after the others)."""
    config = json.loads((ckpt / "config.json").read_text())
    first = int(config.get("num_hidden_layers") or 0)
    return list(range(first, first + int(config.get("num_nextn_predict_layers") or 0)))


def with_unrun_layers(ftype: str, tensor_types: dict[str, str], layers: list[int]) -> dict[str, str]:
    """`tensor_types` with a first rule keeping `layers` (unrun_layers()) UNRUN_LAYER_TYPE, where
    the file is made with an importance matrix (needs_imatrix); the first matching rule wins."""
    if not layers or not needs_imatrix(ftype, tensor_types):
        return tensor_types
    return {rf"^blk\.({'|'.join(map(str, layers))})\.": UNRUN_LAYER_TYPE, **tensor_types}


def imatrix_path(model: Path) -> Path:
    """Where the importance matrix of GGUF `model` is cached: beside it."""
    return model.with_name(model.name.removesuffix(".gguf") + ".imatrix.gguf")


def make_imatrix(binary: Path, model: Path, out: Path, *, threads: int = 0) -> Path:
    """llama-imatrix on `model` (an unquantised GGUF, or the converter's own) over
    CALIBRATION_TEXT -> `out` (GGUF format, written atomically, the text and a log beside it).
    A second to a minute: the text is a few chunks of IMATRIX_CONTEXT tokens."""
    text = out.with_name(out.name + ".txt")
    text.write_text(CALIBRATION_TEXT)
    tmp = partial_path(out)
    ctx = str(IMATRIX_CONTEXT)
    # Run in the folder with names relative to it: the text's name is recorded in the matrix as its
    # dataset, and from there in every file quantised with it.
    cmd = [str(binary.resolve()), "-m", str(model.resolve()), "-f", text.name, "-o", tmp.name, "--output-format",
           "gguf", "-c", ctx, "-b", ctx, "-t", str(threads or all_threads()), "--no-ppl"]
    return run_to_file("llama-imatrix", cmd, out, cwd=out.parent)


def partial_path(out: Path) -> Path:
    """Where a llama.cpp tool writes `out` before it is complete (run_to_file renames it)."""
    return out.with_name(out.name + ".partial")


def run_to_file(tool: str, cmd: list[str], out: Path, *, cwd: Path | None = None) -> Path:
    """Runs a llama.cpp tool that writes partial_path(out), its output logged beside `out`; on
    success renames the file to `out` (so `out` is never half written), else raises Unavailable
    with the log's last error line."""
    log = out.with_name(out.name + ".log")
    tmp = partial_path(out)
    with log.open("w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd)
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if "error" in ln.lower() or "fail" in ln.lower()),
                   lines[-1] if lines else "(no output)")
        raise Unavailable(f"{tool} could not make {out.name}: {why.strip()[:200]}")
    tmp.rename(out)
    return out


def ensure_imatrix(model: Path, *, cache: Path | None = None, build_missing: bool = False, threads: int = 0,
                   jobs: int = 0) -> Path:
    """The importance matrix of `model`, cached beside it (remade when older than it)."""
    out = imatrix_path(model)
    if not newer_than(out, model):
        binary = find_tool("llama-imatrix", cache=cache, build_missing=build_missing, jobs=jobs)
        make_imatrix(binary, model, out, threads=threads)
    return out


def quantize(binary: Path, source: Path, out: Path, ftype: str, *, tensor_types: dict[str, str] | None = None,
             threads: int = 0, allow_requantize: bool = False, imatrix: Path | None = None) -> Path:
    """llama-quantize `source` -> `out` as `ftype` (Q8_0, Q4_K_M, ...), with per-tensor overrides
    (`--tensor-type NAME=TYPE`, as mixed files like unsloth's are made); written atomically.
    allow_requantize: `source` holds quantised tensors (deepseek4's converter writes Q8_0 and
    MXFP4), which llama-quantize refuses to requantise unless told to.  imatrix: an importance
    matrix of `source` (ensure_imatrix; needs_imatrix says when one is required)."""
    cmd = [str(binary)] + (["--allow-requantize"] if allow_requantize else [])
    cmd += ["--imatrix", str(imatrix)] if imatrix else []
    for name, kind in (tensor_types or {}).items():
        cmd += ["--tensor-type", f"{name}={kind}"]
    cmd += [str(source), str(partial_path(out)), ftype, str(threads or all_threads())]
    return run_to_file("llama-quantize", cmd, out)


def newer_than(out: Path, *sources: Path) -> bool:
    """`out` exists and is at least as new as every source (a cached product is reused only then)."""
    return out.is_file() and all(out.stat().st_mtime >= s.stat().st_mtime for s in sources)
