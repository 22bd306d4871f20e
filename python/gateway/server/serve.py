"""Startup: load the model, print the summary, run the aiohttp server."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from ..generate import Slot
from ..scheduler import Scheduler
from ..tokenizer import Tokenizer
from .app import create_app
from .state import ServerState

log = logging.getLogger("moegate")


@dataclass
class ServeOptions:
    model: str | None = None
    ram_gb: float | None = None
    threads: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    ctx: int | None = None
    api_key: str | None = None
    model_id: str | None = None
    max_queue: int = 16
    default_max_tokens: int = 4096
    cors: tuple[str, ...] = ()
    reasoning_mirror: bool = False
    kernels: str | None = None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def build_state(opts: ServeOptions, *, demo: bool = False) -> ServerState:
    from ..chat import load_chat_setup
    from ..engine import Engine

    path = Path(opts.model).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not a checkpoint folder (no config.json)")
    tokenizer = Tokenizer.from_dir(path)
    engine = Engine(str(path), ram_gb=opts.ram_gb, threads=opts.threads, max_ctx=opts.ctx, kernels=opts.kernels)
    max_ctx = int(engine.info.get("max_ctx") or opts.ctx or 4096)
    chat = load_chat_setup(path)
    if chat.note:
        log.warning("chat format: %s", chat.note)
    stop_ids = set()
    for text in chat.stop_strings + ((tokenizer.eos_token,) if tokenizer.eos_token else ()):
        tid = tokenizer.token_id(text)
        if tid is not None:
            stop_ids.add(tid)
    for tid in _generation_eos(path):
        stop_ids.add(tid)
    slot = Slot(engine, tokenizer, max_ctx)
    return ServerState(
        engine=engine, tokenizer=tokenizer, slot=slot, scheduler=Scheduler(slot, opts.max_queue),
        chat=chat, model_id=opts.model_id or path.name, model_path=str(path), max_ctx=max_ctx,
        stop_token_ids=frozenset(stop_ids), default_max_tokens=opts.default_max_tokens, api_key=opts.api_key,
        cors_origins=opts.cors, reasoning_field_mirror=opts.reasoning_mirror, demo=demo)


def _generation_eos(path: Path) -> list[int]:
    eos = _read_json(path / "generation_config.json").get("eos_token_id")
    if isinstance(eos, int):
        return [eos]
    return [e for e in eos if isinstance(e, int)] if isinstance(eos, list) else []


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
        f"  memory     {info.get('ram_plan', 'all weights memory-mapped (no --ram budget)')}",
        f"  SIMD       {info.get('simd')}   threads {info.get('threads')}",
        f"  context    {state.max_ctx} tokens   chat format {state.chat.format}",
        f"  auth       {'API key required' if state.api_key else 'none (local only)' if url.startswith('http://127.') else 'NONE'}",
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
    app = create_app(state)
    host = opts.host
    url = f"http://{'[' + host + ']' if ':' in host else host}:{opts.port}"
    print(startup_summary(state, url), file=sys.stderr, flush=True)
    web.run_app(app, host=host, port=opts.port, print=None, handler_cancellation=True,
                access_log=None if not os.environ.get("MOEGATE_ACCESS_LOG") else log)
