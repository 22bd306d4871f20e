"""Operational endpoints: /health, /metrics (Prometheus text), /props, /tokenize, /detokenize."""
from __future__ import annotations

import time

from aiohttp import web

from .errors import bad_request
from .openai_protocol import parse_openai_chat
from .pipeline import prepare_chat
from .spec import check_token_ids, parse_json_body
from .state import STATE_KEY


async def health(request: web.Request) -> web.Response:
    """Never touches the engine: answers while a long prefill runs."""
    state = request.app[STATE_KEY]
    if not state.ready:
        return web.json_response({"status": "loading"}, status=503)
    return web.json_response({"status": "ok", "model": state.model_id,
                              "busy": state.scheduler.running is not None,
                              "queue_depth": state.scheduler.queue_depth})


def _engine_stats(state) -> dict:
    try:
        stats = state.engine.stats()
    except Exception:  # metrics must never fail because of the engine
        return {}
    return stats if isinstance(stats, dict) else {}


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    m = state.metrics
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP moegate_{name} {help_text}")
        lines.append(f"# TYPE moegate_{name} {kind}")
        for labels, value in samples:
            lines.append(f"moegate_{name}{labels} {value}")

    metric("requests_total", "counter", "HTTP requests by endpoint and status",
           [(f'{{endpoint="{ep}",status="{st}"}}', n) for (ep, st), n in sorted(m.requests.items())] or [("", 0)])
    metric("prompt_tokens_total", "counter", "Prompt tokens received", [("", m.prompt_tokens)])
    metric("prompt_tokens_cached_total", "counter", "Prompt tokens served from the prefix cache",
           [("", m.cached_tokens)])
    metric("completion_tokens_total", "counter", "Tokens generated", [("", m.completion_tokens)])
    metric("prefix_cache_hits_total", "counter", "Requests that reused a cached prefix",
           [("", state.slot.prefix_hits)])
    snapshots = state.slot.prefix_cache.stats() if state.slot.prefix_cache is not None else {}
    on_disk = state.slot.prefix_disk.stats() if state.slot.prefix_disk is not None else {}
    metric("prefix_snapshots", "gauge", "Conversation snapshots held (the slot left them)",
           [('{tier="ram"}', snapshots.get("snapshots", 0)), ('{tier="disk"}', on_disk.get("files", 0))])
    metric("prefix_snapshot_bytes", "gauge", "Bytes held by conversation snapshots",
           [('{tier="ram"}', snapshots.get("bytes", 0)), ('{tier="disk"}', on_disk.get("bytes", 0))])
    metric("prefix_snapshot_restores_total", "counter", "Requests that resumed a conversation from a snapshot",
           [("", state.slot.snapshot_restores)])
    metric("prefix_snapshot_restored_tokens_total", "counter", "Prompt tokens a snapshot restore saved from prefill",
           [("", state.slot.snapshot_restored_tokens)])
    metric("decode_tokens_per_second", "gauge", "Decode speed of the last request", [("", m.last_decode_tps)])
    metric("prefill_tokens_per_second", "gauge", "Prefill speed of the last request", [("", m.last_prefill_tps)])
    metric("queue_depth", "gauge", "Requests waiting for the slot", [("", state.scheduler.queue_depth)])
    metric("busy", "gauge", "1 while a request holds the slot", [("", int(state.scheduler.running is not None))])
    metric("requests_rejected_total", "counter", "Requests refused because the queue was full", [("", m.rejected)])
    metric("requests_cancelled_total", "counter", "Requests cancelled by a client disconnect", [("", m.cancelled)])
    metric("reasoning_calls_delivered_total", "counter", "Tool calls delivered from inside the reasoning",
           [("", m.reasoning_calls_delivered)])
    metric("reasoning_calls_kept_as_text_total", "counter",
           "Complete calls to a declared tool inside the reasoning that stayed text",
           [("", m.reasoning_calls_kept_as_text)])
    metric("constrained_requests_total", "counter", "Requests decoded under a grammar (forced calls, JSON)",
           [("", m.constrained_requests)])
    metric("constraint_masks_total", "counter", "Grammar token masks computed", [("", m.constraint_masks)])
    metric("constraint_mask_seconds_total", "counter", "Time spent computing masks and closing plans",
           [("", round(m.constraint_mask_seconds, 6))])
    metric("constraint_steered_tokens_total", "counter", "Tokens steered to close a structure within max_tokens",
           [("", m.constraint_steered)])
    stats = _engine_stats(state)
    experts = stats.get("experts") if isinstance(stats.get("experts"), dict) else {}
    for key, value in sorted(experts.items()):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metric(f"expert_cache_{key}", "gauge" if "rate" in key else "counter", f"Expert store: {key}",
                   [("", value)])
    metric("uptime_seconds", "gauge", "Seconds since start", [("", round(time.time() - m.started, 3))])
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})


async def props(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    info = getattr(state.engine, "info", {}) or {}
    return web.json_response({"model": state.model_id, "model_path": state.model_path, "chat_format": state.chat.format,
                              "n_ctx": state.max_ctx, "default_max_tokens": state.default_max_tokens,
                              "demo": state.demo, "engine": info, "chat_template": state.chat.chat_template,
                              "prefix_snapshots": {
                                  "ram": state.slot.prefix_cache.stats() if state.slot.prefix_cache else None,
                                  "disk": state.slot.prefix_disk.stats() if state.slot.prefix_disk else None,
                                  "restores": state.slot.snapshot_restores}})


async def tokenize(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    body = parse_json_body(await request.read())
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    if "messages" in body:
        ids = prepare_chat(state, parse_openai_chat(body)).prompt_ids
    else:
        content = body.get("content", body.get("prompt"))
        if not isinstance(content, str):
            raise bad_request("'content' must be a string (or send 'messages')", "content")
        ids = state.tokenizer.encode(content)
    out: dict = {"tokens": ids, "count": len(ids)}
    if body.get("with_pieces"):
        out["pieces"] = [state.tokenizer.decode([i]) for i in ids]
    return web.json_response(out)


async def detokenize(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    body = parse_json_body(await request.read())
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad_request("'tokens' must be a list of token ids", "tokens")
    check_token_ids(tokens, state.tokenizer.vocab_size, "tokens")
    return web.json_response({"content": state.tokenizer.decode(tokens)})
