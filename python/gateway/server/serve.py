"""Startup: load the model, print the summary, run the aiohttp server."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from ..families import ChatSetup, gguf_chat_setup, load_chat_setup
from ..generate import Slot
from ..gguf_vocab import build_tokenizer, read_vocab, stop_token_ids
from ..model_path import is_gguf, model_name, resolve_model_path, split_parts
from ..prefix_cache import MIN_SNAPSHOT_TOKENS, PrefixCache
from ..prefix_disk import DiskSnapshots, model_folder
from ..scheduler import Scheduler
from ..tokenizer import Tokenizer
from . import constrained
from .app import create_app
from .state import Metrics, ServerState

log = logging.getLogger("moegate")

# At SIGTERM, how long the handlers get to write their final events once the running
# generation was told to stop (it stops at its next token or prefill layer) before they are
# cancelled.  The whole shutdown stays well inside the 10 s a container runtime waits.
SHUTDOWN_GRACE_SECONDS = 3.0


@dataclass
class ServeOptions:
    model: str | None = None
    ram_gb: float | None = None
    read_ahead: bool = True  # --read-ahead / --no-read-ahead: Engine(expert_prefetch=...)
    threads: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    ctx: int | None = None
    kv_dtype: str = "bf16"  # the server's default; Engine's own default stays f32 (the oracle tests)
    activations: str = "f32"  # "int8": the block formats' int8-activation decode (Engine(activations=...))
    api_key: str | None = None
    model_id: str | None = None
    max_queue: int = 16
    default_max_tokens: int = 4096
    cors: tuple[str, ...] = ()
    reasoning_mirror: bool = False
    kernels: str | None = None
    keepalive_seconds: float = 10.0
    retry_after_seconds: int = 5
    prefix_cache_gb: float | None = None  # None: auto (prefix_cache_budget)
    prefix_cache_dir: str | None = None   # snapshots on disk too (they outlive the process)
    prefix_cache_disk_gb: float = 20.0


def prefix_cache_budget(opts: ServeOptions) -> float:
    """GB of conversation snapshots (gateway.prefix_cache).  Auto: a tenth of --ram up to 2 GB,
    1 GB without --ram.  Under --ram it comes out of the budget, so the process stays within it."""
    if opts.prefix_cache_gb is not None:
        return max(0.0, opts.prefix_cache_gb)
    if opts.ram_gb is None:
        return 1.0
    return min(2.0, 0.1 * opts.ram_gb)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def build_state(opts: ServeOptions, *, demo: bool = False) -> ServerState:
    from ..engine import Engine, EngineError

    given = Path(opts.model).expanduser()
    path = resolve_model_path(given)
    if path != given:
        log.info("model: %s (the one GGUF model in %s)", path, given)
    if is_gguf(path):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such GGUF file")
    elif not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not a checkpoint folder (no config.json), a .gguf file, nor a folder "
                                "holding one")
    # Tokenizer and chat format before the weights: a checkpoint we cannot talk to fails in
    # a second, not after the engine has mapped its weights.
    tokenizer, chat, checkpoint_stops = load_tokenizer_and_chat(path)
    snapshots_gb = prefix_cache_budget(opts)
    engine_ram = opts.ram_gb
    if opts.ram_gb is not None:
        if snapshots_gb >= opts.ram_gb:
            raise ValueError(f"--prefix-cache {snapshots_gb:g} GB leaves nothing of --ram {opts.ram_gb:g} GB")
        engine_ram = opts.ram_gb - snapshots_gb
    try:
        engine = Engine(str(path), ram_gb=engine_ram, threads=opts.threads, max_ctx=opts.ctx, kernels=opts.kernels,
                        kv_dtype=opts.kv_dtype, expert_prefetch=opts.read_ahead, activations=opts.activations)
    except EngineError as exc:
        if opts.ram_gb is not None and snapshots_gb > 0 and "too small" in str(exc):
            raise EngineError(f"{exc} (of --ram {opts.ram_gb:g} GB, {snapshots_gb:g} GB went to the prefix "
                              "cache: lower it with --prefix-cache)") from None
        raise
    max_ctx = int(engine.info.get("max_ctx") or opts.ctx or 4096)
    if chat.note:
        log.warning("chat format: %s", chat.note)
    # The end of a turn: the family's stop strings held as one token, the tokenizer's EOS and
    # generation_config's; the family's stop strings that are no single token are matched as text.
    stop_ids, stop_texts = set(), []
    for text in chat.stop_strings + ((tokenizer.eos_token,) if tokenizer.eos_token else ()):
        tid = tokenizer.token_id(text)
        if tid is not None:
            stop_ids.add(tid)
        elif text in chat.stop_strings:
            stop_texts.append(text)
    stop_ids.update(checkpoint_stops)
    disk = None
    if opts.prefix_cache_dir:
        folder = model_folder(Path(opts.prefix_cache_dir).expanduser(), path, opts.kv_dtype)
        disk = DiskSnapshots(folder, int(opts.prefix_cache_disk_gb * 1e9), MIN_SNAPSHOT_TOKENS)
    if disk is not None and opts.ram_gb is not None and snapshots_gb <= 0:
        log.warning("--prefix-cache-dir is off: under --ram, snapshots pass through RAM, so it needs "
                    "--prefix-cache > 0")
    slot = Slot(engine, tokenizer, max_ctx, PrefixCache(int(snapshots_gb * 1e9)), disk,
                budgeted=opts.ram_gb is not None, hidden_token_ids=tokenizer.hidden_ids(chat.family.output_markup))
    metrics = Metrics()
    scheduler = Scheduler(slot, opts.max_queue, on_result=metrics.record_job, on_dropped=metrics.record_dropped)
    state = ServerState(
        engine=engine, tokenizer=tokenizer, slot=slot, scheduler=scheduler,
        chat=chat, model_id=opts.model_id or default_model_id(path), model_path=str(path), max_ctx=max_ctx,
        stop_token_ids=frozenset(stop_ids), stop_texts=tuple(stop_texts), default_max_tokens=opts.default_max_tokens,
        api_key=opts.api_key,
        cors_origins=opts.cors, reasoning_field_mirror=opts.reasoning_mirror,
        keepalive_seconds=opts.keepalive_seconds,
        retry_after_seconds=opts.retry_after_seconds, demo=demo, ram_gb=opts.ram_gb, metrics=metrics)
    # Forced calls and JSON replies sample under a grammar whose token trie takes seconds to
    # build on a large vocabulary: build it now rather than in the first such request.
    seconds = constrained.warm_up(state)
    log.info("structured output ready (token trie built in %.1f s)", seconds)
    return state


def load_tokenizer_and_chat(path: Path) -> tuple[Tokenizer, ChatSetup, list[int]]:
    """The tokenizer, the chat setup and the checkpoint's own end-of-turn ids of a folder
    (tokenizer.json, generation_config.json's eos_token_id list) or of a GGUF file (its
    tokenizer.ggml.* metadata, read once for all three; its eos/eot/eom ids)."""
    if is_gguf(path):
        vocab = read_vocab(path)
        return build_tokenizer(vocab), gguf_chat_setup(vocab), stop_token_ids(vocab)
    return Tokenizer.from_dir(path), load_chat_setup(path), _generation_eos(path)


def default_model_id(path: Path) -> str:
    """/v1/models id without --model-id: the folder's name, or the file's without .gguf (and
    without a split set's -00001-of-0000N)."""
    return model_name(path) if is_gguf(path) else path.name


def _generation_eos(path: Path) -> list[int]:
    eos = _read_json(path / "generation_config.json").get("eos_token_id")
    if isinstance(eos, int):
        return [eos]
    return [e for e in eos if isinstance(e, int)] if isinstance(eos, list) else []


def _auth_summary(state: ServerState, url: str) -> str:
    if state.api_key:
        return "API key required (Bearer or x-api-key; /health is public)"
    host = url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")
    if host in ("127.0.0.1", "localhost", "::1"):
        return "none (this machine only)"
    return "NONE: anyone who can reach this address can use the model (set --api-key)"


def kv_bytes(info: dict, max_ctx: int) -> int:
    """The slot's state at max_ctx: per position, plus what it holds whatever the context
    (DeepSeek-V4's ring of recent window rows)."""
    return int(info.get("kv_bytes_per_token") or 0) * max_ctx + int(info.get("kv_fixed_bytes") or 0)


def _kv_summary(info: dict, max_ctx: int) -> str:
    per_token = int(info.get("kv_bytes_per_token") or 0)
    fixed = int(info.get("kv_fixed_bytes") or 0)
    ring = f" + {fixed / 2**20:.0f} MiB ring" if fixed else ""
    return (f"{info.get('kv_dtype', 'f32')}, {per_token / 1024:.1f} KiB/token{ring} "
            f"({kv_bytes(info, max_ctx) / 1e9:.2f} GB at {max_ctx} tokens)")


def memory_plan(state: ServerState, experts: dict | None = None) -> dict[str, float]:
    """Where the RAM goes, in GB: resident weights (everything but the routed experts under a
    budget), the expert cache, the KV at the context the slot reserves, the prefill window's
    scratch, and the prefix cache.  Under --ram these are the terms the engine plans with."""
    info = state.engine.info
    weights = sum(int(b) for b in (info.get("weight_bytes") or {}).values())
    if experts is None:
        experts = state.engine.stats().get("experts") or {}
    cache = int(experts.get("slots") or 0) * int(experts.get("slot_bytes") or 0)
    resident = weights - int(info.get("expert_bytes") or 0) if cache else weights
    prefix = state.slot.prefix_cache.capacity_bytes if state.slot.prefix_cache is not None else 0
    return {
        "resident weights": resident / 1e9,
        "expert cache": cache / 1e9,
        f"KV at {state.max_ctx} tokens": kv_bytes(info, state.max_ctx) / 1e9,
        f"prefill scratch ({int(info.get('prefill_window') or 0)}-token window)":
            int(info.get("prefill_bytes_per_token") or 0) * int(info.get("prefill_window") or 0) / 1e9,
        "prefix cache": prefix / 1e9,
    }


def _memory_summary(state: ServerState) -> str:
    """The RAM plan: the split of memory_plan, and what the expert cache does, under which budget."""
    experts = state.engine.stats().get("experts") or {}
    split = ", ".join(f"{name} {gb:.2f} GB" for name, gb in memory_plan(state, experts).items())
    if state.ram_gb is None:
        return f"no --ram budget: weights memory-mapped; {split}"
    slots, slot_bytes = int(experts.get("slots") or 0), int(experts.get("slot_bytes") or 0)
    if not slots:
        return f"--ram {state.ram_gb:g} GB: everything resident; {split}"
    ahead = (", the next layer's predicted experts read ahead" if state.engine.read_ahead
             else ", no read-ahead")
    return (f"--ram {state.ram_gb:g} GB: {split}; routed experts cached ({slots} slots x {slot_bytes / 1e6:.1f} MB, "
            f"misses read from disk{ahead})")


def _snapshot_summary(state: ServerState) -> str:
    cache, disk = state.slot.prefix_cache, state.slot.prefix_disk
    parts = []
    if cache is not None:
        parts.append(f"{cache.capacity_bytes / 1e9:.2f} GB RAM for conversations the slot leaves")
    if disk is not None:
        parts.append(f"{len(disk)} on disk in {disk.folder} (up to {disk.capacity_bytes / 1e9:.0f} GB, kept across "
                     "restarts)")
    if not parts:
        return "off (a conversation the slot leaves is prefilled again when it returns)"
    return "; ".join(parts)


def _gguf_summary(path: str) -> str:
    """A GGUF's version, size and tensor types by count ("Q4_K x96, F32 x97"), over every part
    of a split set: what a quantised file holds, whatever the engine turns it into."""
    from .. import _core

    parts = [_core.gguf_inspect(str(p), arrays=False) for p in split_parts(path) if p.is_file()]
    counts = Counter(t["type"] for info in parts for t in info["tensors"])
    types = ", ".join(f"{name} x{n}" for name, n in counts.most_common())
    size = sum(info["file_size"] for info in parts)
    shown = f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"
    split = f" in {len(parts)} parts" if len(parts) > 1 else ""
    return f"GGUF v{parts[0]['version']}, {shown}{split}, tensors {types}"


# Weight formats that --activations int8 leaves in fp32: every other one (the GGUF block formats,
# and fp4_e2m1, which checkpoints store with ue8m0 scales per 32: DeepSeek-V4's experts) has an
# int8 path (mg_matrix_has_q8_path).
_F32_ONLY_FORMATS = {"f32", "bf16", "f16", "fp8_e4m3"}


def _activations_hint(info: dict) -> str:
    """Where the exact default leaves speed on the table: GGUF block formats or FP4 experts run
    with fp32 activations (int8 activations decode them faster, as llama.cpp does), or, on a CPU
    with AVX512_BF16, bf16 / fp8 weights prefill with fp32 activations (the fast path rounds x to
    bf16 there; docs/KERNELS.md)."""
    weights = info.get("weights") or {}
    if not isinstance(weights, dict):
        return ""
    blocks = any(name not in _F32_ONLY_FORMATS for name in weights)
    bf16x = info.get("simd") == "avx512bf16" and any(name in ("bf16", "fp8_e4m3") for name in weights)
    if info.get("activations", "f32") != "f32":
        return "" if not blocks or info.get("int8_prefill", True) else "   (prefill stays f32: this CPU has no int8 GEMM)"
    if blocks:
        return "   (--activations int8: faster block formats, not bit-exact)"
    return "   (--activations int8: faster prefill, not bit-exact)" if bf16x else ""


def startup_summary(state: ServerState, url: str) -> str:
    info = state.engine.info
    formats = info.get("weights") or info.get("formats") or {}
    if isinstance(formats, dict):
        formats = ", ".join(f"{k} x{v}" for k, v in formats.items())
    lines = [
        "moegate " + ("DEMO (tiny random weights: output is noise; pass --model DIR for a real checkpoint)"
                      if state.demo else "ready"),
        f"  model      {state.model_id}  ({state.model_path})",
        f"  arch       {info.get('arch')}  layers={info.get('n_layers')}  vocab={info.get('vocab_size')}",
        f"  weights    {formats}",
        *([f"  file       {_gguf_summary(state.model_path)}"] if is_gguf(state.model_path) else []),
        f"  memory     {_memory_summary(state)}",
        f"  SIMD       {info.get('simd')}   activations {info.get('activations', 'f32')}   threads {info.get('threads')}"
        + _activations_hint(info),
        f"  context    {state.max_ctx} tokens   chat format {state.chat.format}",
        f"  KV cache   {_kv_summary(info, state.max_ctx)}",
        f"  snapshots  {_snapshot_summary(state)}",
        f"  auth       {_auth_summary(state, url)}",
        f"  listening  {url}/v1   (OpenAI: /v1/chat/completions, Anthropic: /v1/messages)",
    ]
    return "\n".join(lines)


def serve(opts: ServeOptions) -> None:
    demo = False
    if not opts.model:
        from ..demo import ensure_demo_checkpoint
        opts.model = str(ensure_demo_checkpoint())
        opts.model_id = opts.model_id or "moegate-demo"
        demo = True
    state = build_state(opts, demo=demo)
    try:
        asyncio.run(_serve_until_signal(create_app(state), state, opts.host, opts.port))
    finally:
        state.slot.persist()  # with --prefix-cache-dir: the next process starts from this state
        state.engine.close()  # writes a budgeted run's routing history before the process exits


async def _serve_until_signal(app: web.Application, state: ServerState, host: str, port: int) -> None:
    """Binds (port 0 picks a free port; the summary shows the real one), serves until SIGINT or
    SIGTERM, then shuts down: the listening socket closes, the running generation ends with its
    final event, queued requests get 503 with Retry-After (app.py's on_shutdown), handlers get
    SHUTDOWN_GRACE_SECONDS to finish; `serve` then persists the slot."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=SHUTDOWN_GRACE_SECONDS,
                           access_log=log if os.environ.get("MOEGATE_ACCESS_LOG") else None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        shown = f"[{host}]" if ":" in host else host
        print(startup_summary(state, f"http://{shown}:{bound}"), file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # not on the main thread / platform
                pass
        await stop.wait()
        log.info("shutting down: no new connections; ending the running generation, refusing queued requests")
    finally:
        await runner.cleanup()
