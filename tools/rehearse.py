#!/usr/bin/env python3
"""Rehearsals of the full-size releases on this machine, on sparse checkpoints.

    python tools/rehearse.py [deepseek_v4 glm4_moe qwen3_moe] [--layers N] [--prompt 1024,4096]
                             [--decode 16] [--ram 20] [--disk-gbps 3.5] [--keep DIR] [--json]
    python tools/rehearse.py serve deepseek_v4 [--layers N] [--ram 20] [--keep DIR]

For each family a checkpoint is written at the release's published geometry, tensor names,
dtypes and sharding, as a *sparse* file set: every large matrix is a hole (the writer seeks past
it, so it reads back as zeros and costs no disk), while the embedding, the routers and their
biases, DeepSeek's hash tables, norms, hyper-connection parameters and every scale tensor hold
real random values -- routing then varies from token to token and numerics stay finite.  The
engine loads it under a RAM budget, runs each prompt (random ids) and a few decoded tokens, and
a table reports what a real disk would have to deliver:

* bytes the expert store read per prompt token and per decoded token, its hit rate;
* compute seconds = wall seconds - the store's read seconds (holes come from the page cache or
  are zero-filled by the kernel, so the wall time of a rehearsal is not a disk time);
* projected seconds on a disk of --disk-gbps = compute + bytes read / disk speed.  The model
  assumes reads do not overlap compute (demand misses block their layer; read-ahead, which
  could hide some, is counted as if it did not), so it is an upper bound at that disk speed;
* with --emulate-disk (the default) the store's reads go through a model of that disk: one
  queue at --disk-gbps, each read held until the disk would have delivered it (holes come back
  at memory speed).  The wall time then is what that disk would give, and the time split
  reports the measured ratio = wall / max(compute, bytes / disk) beside the projection;
* peak RSS (VmHWM, reset after writing so only the engine counts) against the budget.

`serve` writes the DeepSeek-V4 rehearsal, starts `python -m gateway --model DIR --ram GB` on a
free 127.0.0.1 port, waits for /health and runs tools/try_tool_calling.py against it with the
tool call forced (tool_choice required / any): the grammar makes the random model write one.

The sparse files need a file system with holes (ext4, xfs, btrfs; not every tmpfs or network
file system); the default temp folder is deleted at exit, --keep DIR keeps the checkpoint.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from ckpt import common, hf_moe  # noqa: E402  (ckpt.common puts the checkout's python/ on sys.path)
from ckpt import deepseek_v4 as ckpt_dsv4  # noqa: E402

from gateway.checkpoints import deepseek_v4 as dsv4  # noqa: E402
from gateway.checkpoints.shards import Entry, Hole, tensor_rng, write_shards  # noqa: E402

GB = 1e9  # the engine's ram_gb unit

# ----------------------------------------------------------------------------------------------
# The releases' geometry

# DeepSeek-V4-Flash: the project's own definition of the release (tools/ckpt/deepseek_v4.py,
# from the published config.json).
FLASH = ckpt_dsv4.FLASH

# GLM-4.6 (zai-org/GLM-4.6 config.json; model_type glm4_moe, 355B-A32B).  Values: the project's
# reference notes (GGUF metadata of GLM-4.5 in ik_llama.cpp issue #809, the Megatron launch
# script scripts/models/glm4.5-355B-A32B.sh of zyzshishui/slime), and the 202752-token context
# of GLM-4.6 from xorbitsai/inference's model page (doc/source/models/builtin/llm/glm-4.6.rst).
# GLM-4.7 (big) ships the same glm4_moe geometry.
GLM46: dict[str, Any] = {
    "hidden_size": 5120, "intermediate_size": 12288, "num_hidden_layers": 92,
    "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
    "partial_rotary_factor": 0.5, "rope_theta": 1000000.0, "attention_bias": True, "use_qk_norm": True,
    "first_k_dense_replace": 3, "moe_intermediate_size": 1536, "n_routed_experts": 160,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "num_nextn_predict_layers": 1,
    "rms_norm_eps": 1e-05, "max_position_embeddings": 202752, "vocab_size": 151552,
}

# Qwen3-235B-A22B-FP8 (Qwen/Qwen3-235B-A22B-FP8 config.json; model_type qwen3_moe).  Values:
# the project's reference notes (zyzshishui/slime scripts/models/qwen3-235B-A22B.sh: 94 layers,
# d 4096, 64 / 4 heads of 128, expert width 1536, 128 experts top-8, vocab 151936, theta 1e6,
# eps 1e-6) and the FP8 model card (akash-network/awesome-akash Qwen3-235B-A22B-FP8/README.md:
# 94 layers, 64 Q / 4 KV heads, 128 experts, 8 active, 32768 native context); 40960 positions
# as every original Qwen3 release's config.json.
QWEN3_235B: dict[str, Any] = {
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 94,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "rope_theta": 1000000.0,
    "attention_bias": False, "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-06,
    "max_position_embeddings": 40960, "vocab_size": 151936,
}

# Hugging Face releases are cut by save_pretrained's default max_shard_size (5 GB); the exact
# shard count of the FP8 repos was not found, so this reproduces the convention, not the count.
HF_SHARD_BYTES = 5 * 10**9


# ----------------------------------------------------------------------------------------------
# Random bytes for the tensors that hold values (everything that is not a large matrix)

_CHUNK = 1 << 24  # elements per generated block: bounded memory for the 0.5-1 G-entry embeddings


def random_bf16(rng: np.random.Generator, count: int, exponent: int) -> Iterator[bytes]:
    """bf16 bit patterns with random sign and mantissa and magnitude in [2^(e-128), 2^(e-126)):
    the same spread as a normal draw, without generating float32 first (an embedding is 1 GB)."""
    for start in range(0, count, _CHUNK):
        bits = np.frombuffer(bytearray(rng.bytes(2 * min(_CHUNK, count - start))), dtype="<u2")
        # Keep sign, mantissa and bit 7; adding (e-1) << 7 makes the exponent field e-1 + bit 7.
        np.bitwise_and(bits, 0x80FF, out=bits)
        np.add(bits, (exponent - 1) << 7, out=bits)
        yield bits.tobytes()


def random_ue8m0(rng: np.random.Generator, entry: Entry, fan_in: int, headroom: int) -> bytes:
    """Power-of-two block scales near what quantising ~N(0, 1/fan_in) weights gives (amax over
    the format's range), +-1 octave; never 255 (NaN)."""
    centre = 127 - round(math.log2(math.sqrt(fan_in))) - headroom
    codes = np.frombuffer(bytearray(rng.bytes(math.prod(entry.shape))), dtype=np.uint8)
    np.remainder(codes, 3, out=codes)
    np.add(codes, centre - 1, out=codes)
    return codes.tobytes()


def random_f32_scales(rng: np.random.Generator, entry: Entry, fan_in: int) -> bytes:
    """float32 `weight_scale_inv` blocks: amax / 448 of a 1.6/sqrt(fan_in) weight, x [0.5, 2)."""
    typical = 4 * 1.6 / math.sqrt(fan_in) / common.FP8_E4M3_MAX
    return (typical * rng.uniform(0.5, 2.0, entry.shape)).astype("<f4").tobytes()


# ----------------------------------------------------------------------------------------------
# Sparse checkpoint folders


@dataclass
class Written:
    """What a sparse writer produced."""

    path: Path
    apparent_bytes: int  # safetensors data as planned (what a real download would weigh)
    value_bytes: int  # the part written with values; the rest is holes
    shards: int
    seconds: float
    allocated_bytes: int = 0  # st_blocks of the shards after writing (filled in by `measure_disk`)


class _Counter:
    """on_bytes callback: drives the progress bar and counts the bytes that got values."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.value_bytes = 0

    def __call__(self, n: int) -> None:
        self.bar.update(n)


def _progress(total: int, desc: str, quiet: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, disable=quiet,
                mininterval=1.0)


def _counted(pieces: Iterator[tuple[str, bytes | Hole]], counter: _Counter) -> Iterator[tuple[str, bytes | Hole]]:
    for name, data in pieces:
        if not isinstance(data, Hole):
            counter.value_bytes += len(data)
        yield name, data


def settle(path: Path) -> None:
    """fsync every shard: O_DIRECT reads of ranges whose pages are still dirty wait for their
    writeback, which would bill the writer's disk time to the rehearsal's reads."""
    for shard in Path(path).glob("*.safetensors"):
        fd = os.open(shard, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def measure_disk(path: Path) -> tuple[int, int]:
    """(apparent, allocated) bytes of the folder's safetensors shards."""
    apparent = allocated = 0
    for shard in Path(path).glob("*.safetensors"):
        st = shard.stat()
        apparent += st.st_size
        allocated += st.st_blocks * 512
    return apparent, allocated


# -- DeepSeek-V4 ---------------------------------------------------------------------------------


def flash_dims(layers: int | None) -> dsv4.Dims:
    """Flash at full width; `layers` keeps the first N layers (and at most N hash layers)."""
    if layers is None:
        return FLASH
    if not 1 <= layers <= FLASH.n_layers:
        raise ValueError(f"--layers must be 1..{FLASH.n_layers} for deepseek_v4, got {layers}")
    return dsv4.dims_with(FLASH, compress_ratios=FLASH.compress_ratios[:layers],
                          num_hash_layers=min(FLASH.num_hash_layers, layers))


def dsv4_is_hole(t: dsv4.Tensor) -> bool:
    """Every projection (init "linear": attention, compressors, indexer, shared and routed
    experts, the head) is a hole; embedding, router, its bias, tid2eid, norms, mHC, sinks and
    ape keep values."""
    return t.init == "linear"


def dsv4_pieces(t: dsv4.Tensor, d: dsv4.Dims, seed: int) -> Iterator[tuple[str, bytes | Hole]]:
    """(entry, bytes or Hole) of one tensor in the release's storage format."""
    rng = tensor_rng(seed, t.name)
    entries = dsv4.stored_entries(t)
    if dsv4_is_hole(t):
        main, *scales = entries
        yield main.name, Hole(main.nbytes)
        for scale in scales:  # FP8: 2^-7 below the weight's amax; FP4 (max 6): 2^-1
            yield scale.name, random_ue8m0(rng, scale, t.shape[-1], 7 if t.kind == "fp8" else 1)
    elif t.init == "embed":  # the project's draw is N(0, 1): magnitudes [0.5, 2)
        (main,) = entries
        for block in random_bf16(rng, math.prod(main.shape), 127):
            yield main.name, block
    else:
        encoded, _ = dsv4.encode(t, dsv4.draw_tensor(t, d, seed))
        yield from encoded.items()


def dsv4_shard_groups(plan: Sequence[dsv4.Tensor]) -> list[list[dsv4.Tensor]]:
    """The release's cut: the embedding, then one shard per layer, then the final norm,
    hc_head and head (public headers put layer N in model-(N+2)-of-00046; the 46th holds the
    MTP block, which the project's plan does not have)."""
    def shard_of(name: str) -> int:
        if name == "embed.weight":
            return 0
        if name.startswith("layers."):
            return 1 + int(name.split(".")[1])
        return sys.maxsize  # the globals after the last layer

    groups: dict[int, list[dsv4.Tensor]] = {}
    for t in plan:
        groups.setdefault(shard_of(t.name), []).append(t)
    return [groups[k] for k in sorted(groups)]


def write_dsv4(out: Path, layers: int | None, seed: int = 0, quiet: bool = False) -> Written:
    d = flash_dims(layers)
    plan = dsv4.tensor_plan(d)
    total = dsv4.weight_bytes(d)
    groups = dsv4_shard_groups(plan)
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with _progress(total, f"deepseek_v4 {d.n_layers}L sparse", quiet) as bar:
        counter = _Counter(bar)
        write_shards(out, plan, dsv4.stored_entries, lambda t: _counted(dsv4_pieces(t, d, seed), counter), 0,
                     counter, shards=groups)
    dsv4.write_metadata(out, d)
    return Written(out, total, counter.value_bytes, len(groups), time.perf_counter() - started)


# -- glm4_moe / qwen3_moe --------------------------------------------------------------------------

HF_RELEASES: dict[str, dict[str, Any]] = {"glm4_moe": GLM46, "qwen3_moe": QWEN3_235B}
HF_HOLE_ROLES = (common.Role.LINEAR, common.Role.LINEAR_KEEP, common.Role.HEAD)
HF_FORMAT = "fp8"  # 128x128 blocks, F32 `weight_scale_inv`; router, norms, embed, head bf16


def hf_overrides(family: str, layers: int | None) -> dict[str, Any]:
    release = dict(HF_RELEASES[family])
    if layers is not None:
        if not 1 <= layers <= release["num_hidden_layers"]:
            raise ValueError(f"--layers must be 1..{release['num_hidden_layers']} for {family}, got {layers}")
        release["num_hidden_layers"] = layers
        if family == "glm4_moe":  # keep at least one MoE layer in a truncated GLM
            release["first_k_dense_replace"] = min(release["first_k_dense_replace"], layers - 1)
    return release


def hf_pieces(spec: common.TensorSpec, seed: int) -> Iterator[tuple[str, bytes | Hole]]:
    rng = tensor_rng(seed, spec.name)
    entries = common.stored_entries(spec, HF_FORMAT)
    if spec.role in HF_HOLE_ROLES:
        main, *scales = entries
        yield main.name, Hole(main.nbytes)
        for scale in scales:
            yield scale.name, random_f32_scales(rng, scale, spec.shape[-1])
    elif spec.role is common.Role.EMBED:  # the project's draw is N(0, 0.5): magnitudes [0.25, 1)
        (main,) = entries
        for block in random_bf16(rng, math.prod(main.shape), 126):
            yield main.name, block
    else:
        (main,) = entries
        for block in common.draw_tensor_rows(spec, seed):
            yield main.name, common.encode_plain(block, main.dtype)


def write_hf(family: str, out: Path, layers: int | None, seed: int = 0, quiet: bool = False) -> Written:
    started = time.perf_counter()
    config, tokenizer = hf_moe.start_checkpoint(family, "bench", out, hf_overrides(family, layers))
    specs = hf_moe.tensor_specs(config)
    def entries_of(spec: common.TensorSpec) -> list[Entry]:
        return common.stored_entries(spec, HF_FORMAT)
    total = common.planned_bytes(specs, HF_FORMAT)
    with _progress(total, f"{family} {config['num_hidden_layers']}L sparse", quiet) as bar:
        counter = _Counter(bar)
        weight_map = write_shards(out, specs, entries_of, lambda s: _counted(hf_pieces(s, seed), counter),
                                  HF_SHARD_BYTES, counter)
    hf_moe.finish_checkpoint(config, tokenizer, HF_FORMAT, out)
    return Written(out, total, counter.value_bytes, len(set(weight_map.values())), time.perf_counter() - started)


@dataclass(frozen=True)
class Release:
    family: str  # model_type, the command-line name
    title: str
    write: Callable[[Path, int | None, int, bool], Written]


RELEASES: dict[str, Release] = {
    "deepseek_v4": Release("deepseek_v4", "DeepSeek-V4-Flash 284B (FP8 + FP4 experts)", write_dsv4),
    "glm4_moe": Release("glm4_moe", "GLM-4.6 355B-A32B FP8 (128x128 blocks)",
                        lambda out, n, seed, quiet: write_hf("glm4_moe", out, n, seed, quiet)),
    "qwen3_moe": Release("qwen3_moe", "Qwen3-235B-A22B-FP8 (128x128 blocks)",
                         lambda out, n, seed, quiet: write_hf("qwen3_moe", out, n, seed, quiet)),
}


# ----------------------------------------------------------------------------------------------
# Measuring a run

EXPERT_COUNTERS = ("bytes_read", "read_seconds", "hits", "misses", "fetches", "prefetches", "prefetch_hits",
                   "direct_reads", "buffered_reads", "compute_seconds", "wait_seconds")
SECONDS = ("read_seconds", "compute_seconds", "wait_seconds")


def reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0), so the writer's memory is not counted."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """VmHWM of this process (resource.getrusage's maxrss where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class Phase:
    """One measured stretch of evaluation: a prompt's prefill, or its decoded tokens."""

    kind: str  # "prefill" | "decode"
    tokens: int
    wall_s: float
    bytes_read: int
    read_s: float
    hits: int
    misses: int
    fetches: int
    prefetches: int = 0
    prefetch_hits: int = 0
    direct_reads: int = 0
    buffered_reads: int = 0
    expert_s: float = 0.0  # the MoE computing routed and shared experts (the store's compute_seconds)
    wait_s: float = 0.0  # the MoE waiting for the store: issuing reads, then each miss
    slot_bytes: int = 0  # one expert's read (the cache's slot): for reads per lookup
    emulated: bool = False  # the reads went through the disk model at the stated speed

    @property
    def compute_s(self) -> float:
        """Wall time the engine did not wait for reads: its own work (dense + experts)."""
        return max(self.wall_s - self.wait_s, 0.0)

    @property
    def dense_s(self) -> float:
        """Attention, routers, norms, head: what is not expert compute nor waiting."""
        return max(self.wall_s - self.expert_s - self.wait_s, 0.0)

    def overlapped_s(self, disk_bps: float) -> float:
        """The floor when every read overlapped compute: max(compute, bytes / disk)."""
        return max(self.compute_s, self.bytes_read / disk_bps)

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def projected_s(self, disk_bps: float) -> float:
        """compute + bytes / disk: reads assumed not to overlap compute (an upper bound; demand
        misses wait for their layer's routing, so only read-ahead and the hits of the same
        fetch can hide them)."""
        return self.compute_s + self.bytes_read / disk_bps

    def measured_ratio(self, disk_bps: float) -> float:
        """wall / max(compute, bytes / disk): how far the run is from full overlap.  Only a
        disk time when the reads went through the disk model (else the reads ran at the
        machine's speed, and this is not what that disk would give)."""
        floor = self.overlapped_s(disk_bps)
        return self.wall_s / floor if floor else 0.0

    @property
    def reads_per_lookup(self) -> float:
        """bytes read / ((hits + misses) x one expert's bytes): 1.0 when every expert asked
        for was read exactly once (a prefill window covering the prompt: once per layer), below
        with hits, above when read-ahead read more than was asked for."""
        lookups = (self.hits + self.misses) * self.slot_bytes
        return self.bytes_read / lookups if lookups else 0.0

    def summary(self, disk_bps: float) -> dict[str, float]:
        return {**asdict(self), "compute_s": self.compute_s, "hit_rate": self.hit_rate,
                "measured_ratio": self.measured_ratio(disk_bps), "reads_per_lookup": self.reads_per_lookup,
                "bytes_per_token": self.bytes_read / self.tokens, "wall_tok_s": self.tokens / self.wall_s,
                "dense_s": self.dense_s, "overlapped_s": self.overlapped_s(disk_bps),
                "disk_floor_s": self.bytes_read / disk_bps, "projected_s": self.projected_s(disk_bps),
                "projected_tok_s": self.tokens / self.projected_s(disk_bps)}


def _expert_counters(engine: Any) -> dict[str, float]:
    experts = engine.stats()["experts"]
    return {k: experts.get(k, 0) for k in EXPERT_COUNTERS}


def measured(engine: Any, kind: str, tokens: int, run: Callable[[], np.ndarray]) -> tuple[Phase, np.ndarray]:
    experts = engine.stats()["experts"]
    before = _expert_counters(engine)
    started = time.perf_counter()
    logits = run()
    wall = time.perf_counter() - started
    after = _expert_counters(engine)
    delta = {k: after[k] - before[k] for k in EXPERT_COUNTERS}
    counts = {k: int(v) for k, v in delta.items() if k not in ("bytes_read", *SECONDS)}
    phase = Phase(kind, tokens, wall, int(delta["bytes_read"]), float(delta["read_seconds"]), **counts,
                  expert_s=float(delta["compute_seconds"]), wait_s=float(delta["wait_seconds"]),
                  slot_bytes=int(experts.get("slot_bytes", 0)), emulated=bool(experts.get("emulated_disk_bps", 0)))
    return phase, logits


def prefill_prompt(engine: Any, ids: list[int], log: Callable[[str], None]) -> np.ndarray:
    """engine.eval(ids, last_only=True) in one call, as the server's generation loop makes it:
    the engine runs the prompt layer by layer over windows of info["prefill_window"] tokens, so
    each routed expert is read once per layer per window.  The progress hook logs each tenth of
    the layers (it must not call the engine: the eval holds the slot)."""
    started = time.perf_counter()
    step = max(1, engine.info["n_layers"] // 10)

    def hook(layer: int, n_layers: int, done: int, window: int) -> None:
        if (layer + 1) % step == 0 and layer + 1 < n_layers:
            log(f"    window of {window} at {done}/{len(ids)}: layer {layer + 1}/{n_layers}, "
                f"{time.perf_counter() - started:.0f} s")

    return engine.eval(ids, last_only=True, progress=hook)


@dataclass
class Result:
    family: str
    title: str
    layers: int
    checkpoint: dict[str, Any]
    ram_gb: float
    load_s: float = 0.0
    peak_rss: int = 0
    cache_slots: int = 0
    runs: list[dict[str, Any]] = field(default_factory=list)  # per prompt: prefill + decode phases
    finite: bool = True
    error: str | None = None  # the engine refused to load (e.g. the budget is below its minimum)


def rehearse(release: Release, written: Written, *, prompts: Sequence[int], decode: int, ram_gb: float,
             kv_dtype: str, disk_bps: float, seed: int = 0, log: Callable[[str], None] = print,
             emulate_disk: bool = False, read_ahead: bool = True) -> Result:
    """Loads the checkpoint under the budget and measures each prompt + `decode` tokens.
    emulate_disk: the store's reads go through the disk model at disk_bps (Engine's
    emulate_disk_gbps), so wall times are those of that disk.  read_ahead: the store's
    read-ahead from next-layer hints (Engine's expert_prefetch, on in the server)."""
    from gateway.engine import Engine, EngineError

    config = json.loads((written.path / "config.json").read_text())
    result = Result(release.family, release.title, int(config["num_hidden_layers"]), asdict(written) | {
        "path": str(written.path)}, ram_gb)
    reset_peak_rss()
    ctx = max(prompts) + decode
    # max_ctx = the longest run: the budget reserves the KV slot at max_ctx (a 32k-token f32 slot
    # of GLM-4.6 alone would exceed 20 GB); bf16 KV as the server's default; no routing history
    # (.moegate-expert-usage), so every rehearsal starts cold and runs compare.
    try:
        engine = Engine(written.path, ram_gb=ram_gb, max_ctx=ctx, kv_dtype=kv_dtype, expert_history=False,
                        emulate_disk_gbps=disk_bps / GB if emulate_disk else None, expert_prefetch=read_ahead)
    except EngineError as exc:  # a finding, not a crash: e.g. GLM-4.6 FP8 does not fit 20 GB
        result.error = str(exc)
        log(f"  not loaded: {exc}")
        return result
    with engine:
        result.load_s = engine.load_seconds  # shards are mapped, not read: weights page in on first use
        result.cache_slots = int(engine.stats()["experts"].get("slots", 0))
        log(f"  loaded in {result.load_s:.1f} s; {result.cache_slots} expert slots under {ram_gb:g} GB")
        rng = np.random.default_rng(seed)
        vocab = engine.vocab_size
        for n in prompts:
            engine.reset()
            ids = rng.integers(0, vocab, n).tolist()
            log(f"  prompt {n} tokens ...")
            prefill, logits = measured(engine, "prefill", n, lambda: prefill_prompt(engine, ids, log))
            finite = bool(np.isfinite(logits).all())
            log(f"    prefill {prefill.wall_s:.1f} s, {prefill.bytes_read / GB:.1f} GB read")
            # Random decode ids, not the argmax: on hole weights the logits are all zero, and one
            # repeated id would pin the hash-routed layers to a single row of tid2eid.
            steps = rng.integers(0, vocab, decode).tolist()

            def decode_all() -> np.ndarray:
                last = logits
                for tok in steps:
                    last = engine.eval([tok], last_only=True)
                return last

            dec, last = measured(engine, "decode", decode, decode_all) if decode else (None, logits)
            finite = finite and bool(np.isfinite(last).all())
            result.finite = result.finite and finite
            result.runs.append({"prompt": n, "prefill": prefill.summary(disk_bps),
                                "decode": dec.summary(disk_bps) if dec else None, "finite": finite})
            if dec:
                log(f"    decode {dec.wall_s:.1f} s for {decode} tokens, {dec.bytes_read / GB:.2f} GB read")
    result.peak_rss = peak_rss_bytes()
    return result


# ----------------------------------------------------------------------------------------------
# Output


def _gb(n: float) -> str:
    return f"{n / GB:.2f}"


def _aligned(rows: list[tuple[str, ...]]) -> str:
    """rows[0] is the head: columns padded to their widest cell (the first two left-aligned),
    a rule under the head."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) if i > 1 else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def table(results: Sequence[Result], disk_gbps: float) -> str:
    """One row per (family, prompt, phase), the columns the issue asks for."""
    head = ("family", "L", "load s", "peak RSS GB", "phase", "tokens", "wall s", "tok/s", "hit rate",
            "MB/token", "read s", "compute s", f"disk floor s @{disk_gbps:g}", "projected s", "projected tok/s")
    rows = [head]
    for r in results:
        if r.error:
            rows.append((r.family, str(r.layers), "-", f"-/{r.ram_gb:g}", "not loaded", *["-"] * (len(head) - 5)))
        for run in r.runs:
            for kind in ("prefill", "decode"):
                p = run[kind]
                if p is None:
                    continue
                rows.append((r.family, str(r.layers), f"{r.load_s:.1f}",
                             f"{r.peak_rss / GB:.1f}/{r.ram_gb:g}", kind, str(p["tokens"]), f"{p['wall_s']:.1f}",
                             f"{p['wall_tok_s']:.2f}", f"{p['hit_rate']:.3f}", f"{p['bytes_per_token'] / 1e6:.1f}",
                             f"{p['read_s']:.1f}", f"{p['compute_s']:.1f}", f"{p['disk_floor_s']:.1f}",
                             f"{p['projected_s']:.1f}", f"{p['projected_tok_s']:.3f}"))
    return _aligned(rows)


def time_split(results: Sequence[Result], disk_gbps: float) -> str:
    """Where one token's time goes, per phase: dense compute, expert compute, waiting for the
    store, the store's read time; the no-overlap projection and the full-overlap floor on a disk
    of disk_gbps, their ratio (projected), and wall / floor (measured: a disk time only when the
    reads went through the disk model, else "-"); for prefill, bytes read per expert looked up."""
    head = ("family", "phase", "tokens", "dense s/tok", "expert s/tok", "wait s/tok", "read s/tok",
            f"no overlap s/tok @{disk_gbps:g}", "full overlap s/tok", "projected ratio", "wall s/tok",
            "measured ratio", "read / lookup")
    rows = [head]
    for r in results:
        for run in r.runs:
            for kind in ("prefill", "decode"):
                p = run[kind]
                if p is None:
                    continue
                n = p["tokens"]
                rows.append((r.family, kind, str(n), *(f"{p[k] / n:.3f}" for k in ("dense_s", "expert_s", "wait_s",
                             "read_s", "projected_s", "overlapped_s")),
                             f"{p['projected_s'] / p['overlapped_s']:.2f}" if p["overlapped_s"] else "-",
                             f"{p['wall_s'] / n:.3f}",
                             f"{p['measured_ratio']:.2f}" if p["emulated"] and p["overlapped_s"] else "-",
                             f"{p['reads_per_lookup']:.3f}" if kind == "prefill" else "-"))
    return _aligned(rows)


def checkpoint_line(r: Result) -> str:
    c = r.checkpoint
    made = f"written in {c['seconds']:.0f} s" if c["seconds"] else "reused"
    return (f"{r.family}: {r.title}, {r.layers} layers: {c['shards']} shards, {_gb(c['apparent_bytes'])} GB apparent, "
            f"{_gb(c['allocated_bytes'])} GB on disk ({_gb(c['value_bytes'])} GB of values), {made}; "
            f"{r.cache_slots} expert cache slots; logits finite: {r.finite}")


# ----------------------------------------------------------------------------------------------
# serve: the gateway on the V4 rehearsal, try_tool_calling against it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_health(base: str, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.returncode} before /health answered")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:  # refused while starting, 503 while loading
            pass
        time.sleep(1.0)
    raise TimeoutError(f"{base}/health did not answer within {timeout_s:.0f} s")


def serve_and_probe(path: Path, ram_gb: float, max_tokens: int, timeout_s: float) -> int:
    """Starts the gateway on `path`, runs try_tool_calling --force against it, stops it."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "python"), str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "gateway", "--model", str(path), "--ram", f"{ram_gb:g}", "--host", "127.0.0.1",
               "--port", str(port), "--ctx", "4096"]
    print("$ " + " ".join(command), flush=True)
    server = subprocess.Popen(command, env=env)
    try:
        wait_for_health(base, server, timeout_s)
        probe = [sys.executable, str(TOOLS / "try_tool_calling.py"), "--base-url", base, "--force", "--protocol-only",
                 "--max-tokens", str(max_tokens), "--timeout", f"{timeout_s:g}"]
        print("$ " + " ".join(probe), flush=True)
        return subprocess.run(probe, env=env).returncode
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# ----------------------------------------------------------------------------------------------
# main


def _prompts(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt wants comma-separated token counts, got {text!r}") from None
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError("--prompt lengths must be >= 2 tokens (one token is a decode step)")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("families", nargs="*", metavar="family",
                   help=f"{', '.join(RELEASES)} (default: all), or `serve deepseek_v4`")
    p.add_argument("--layers", type=int, default=None, help="keep the first N layers (full width); default: all")
    p.add_argument("--prompt", type=_prompts, default=[1024, 4096], help="prompt lengths, comma-separated")
    p.add_argument("--decode", type=int, default=16, help="decoded tokens after each prompt")
    p.add_argument("--ram", type=float, default=20.0, metavar="GB", help="the engine's budget (ram_gb)")
    p.add_argument("--kv-dtype", choices=["bf16", "f32"], default="bf16", help="KV storage (server default bf16)")
    p.add_argument("--disk-gbps", type=float, default=3.5, help="disk speed for the projection, GB/s")
    p.add_argument("--emulate-disk", action=argparse.BooleanOptionalAction, default=True,
                   help="read experts through a model of that disk (one queue at --disk-gbps; reads that come "
                        "back faster are held), so wall time is that disk's (default: on)")
    p.add_argument("--read-ahead", action=argparse.BooleanOptionalAction, default=True,
                   help="the store's read-ahead from next-layer hints, as the server runs (default: on)")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="write the checkpoints into DIR/<family> and keep them (default: a temp dir, deleted)")
    p.add_argument("--reuse", action="store_true", help="with --keep: use a checkpoint already in DIR/<family>")
    p.add_argument("--write-only", action="store_true", help="with --keep: write the checkpoints, run nothing")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=48, help="serve: max_tokens of each probe request")
    p.add_argument("--timeout", type=float, default=1800.0, help="serve: seconds to wait for /health and per request")
    args = p.parse_args(argv)
    args.serve = bool(args.families) and args.families[0] == "serve"
    if args.serve:
        args.families = args.families[1:] or ["deepseek_v4"]
        if args.families != ["deepseek_v4"]:
            p.error("serve runs the DeepSeek-V4 rehearsal only (its real tokenizer renders the tool prompt)")
    args.families = args.families or list(RELEASES)
    unknown = [f for f in args.families if f not in RELEASES]
    if unknown:
        p.error(f"unknown family {unknown[0]!r}; known: {', '.join(RELEASES)}")
    if args.write_only and not args.keep:
        p.error("--write-only needs --keep DIR (a temp folder would be deleted at once)")
    if args.decode < 0 or args.ram <= 0 or args.disk_gbps <= 0:
        p.error("--decode must be >= 0, --ram and --disk-gbps > 0")
    return args


def prepare(release: Release, root: Path, args: argparse.Namespace) -> Written:
    """The family's sparse checkpoint in root/<family>: written, or reused with --reuse."""
    out = root / release.family
    if args.reuse and (out / "config.json").exists():
        apparent, allocated = measure_disk(out)
        return Written(out, apparent, allocated, len(list(out.glob("*.safetensors"))), 0.0, allocated)
    if out.exists():
        shutil.rmtree(out)
    written = release.write(out, args.layers, args.seed, args.json)
    settle(out)
    written.allocated_bytes = measure_disk(out)[1]
    return written


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.json else (lambda msg: print(msg, flush=True))
    root = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="moegate-rehearse-"))
    root.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    try:
        for family in args.families:
            release = RELEASES[family]
            log(f"{family}: {release.title}")
            written = prepare(release, root, args)
            if args.write_only:
                log(f"  {written.path}: {written.shards} shards, {_gb(written.apparent_bytes)} GB apparent, "
                    f"{_gb(written.allocated_bytes)} GB on disk, {written.seconds:.0f} s")
                continue
            if args.serve:
                return serve_and_probe(written.path, args.ram, args.max_tokens, args.timeout)
            results.append(rehearse(release, written, prompts=args.prompt, decode=args.decode, ram_gb=args.ram,
                                    kv_dtype=args.kv_dtype, disk_bps=args.disk_gbps * GB, seed=args.seed, log=log,
                                    emulate_disk=args.emulate_disk, read_ahead=args.read_ahead))
            if not args.keep:  # one full-size folder at a time in the temp dir
                shutil.rmtree(written.path, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if not results:  # --write-only
        return 0
    report = sys.stderr if args.json else sys.stdout  # --json: the table still goes to the terminal
    print(file=report)
    for r in results:
        print(checkpoint_line(r), file=report)
        if r.error:
            print(f"  not loaded: {r.error}", file=report)
    print(file=report)
    print(table(results, args.disk_gbps), file=report)
    print(f"\nprojected = compute + bytes read / {args.disk_gbps:g} GB/s (compute = wall - the time the MoE "
          "waited for the store; reads assumed not to overlap compute)\n", file=report)
    print(time_split(results, args.disk_gbps), file=report)
    emulated = f"reads went through a {args.disk_gbps:g} GB/s disk model" if args.emulate_disk else \
        "no disk model (--no-emulate-disk): reads ran at this machine's speed"
    print("\nprojected ratio = no overlap / full overlap (max(compute, bytes / disk)); measured ratio = wall / "
          f"full overlap ({emulated}); read / lookup = bytes read / ((hits + misses) x one expert's bytes)",
          file=report)
    if args.json:
        print(json.dumps({"disk_gbps": args.disk_gbps, "emulate_disk": args.emulate_disk, "argv": sys.argv[1:],
                          "results": [asdict(r) for r in results]}, indent=2))
    return 0 if all(r.finite and not r.error for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
