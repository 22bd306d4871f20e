"""Operational endpoints: /health, /metrics (Prometheus text, by prometheus_client), /props, /tokenize,
/detokenize."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .body import read_json
from .errors import bad_request
from .offload import off_loop
from .openai_protocol import parse_openai_chat
from .pipeline import prepare_chat
from .spec import check_token_ids, field_of
from .state import STATE_KEY, ServerState


async def health(request: web.Request) -> web.Response:
    """Never touches the engine: answers while a long prefill runs."""
    state = request.app[STATE_KEY]
    if not state.ready:
        return web.json_response({"status": "loading"}, status=503)
    if state.scheduler.draining:  # load balancers take the instance out
        return web.json_response({"status": "shutting_down"}, status=503,
                                 headers={"Retry-After": str(state.retry_after_seconds)})
    return web.json_response({"status": "ok", "model": state.model_id,
                              "busy": state.scheduler.running is not None,
                              "queue_depth": state.scheduler.queue_depth})


def _engine_stats(state) -> dict:
    try:
        stats = state.engine.stats()
    except Exception:  # metrics must never fail because of the engine
        return {}
    return stats if isinstance(stats, dict) else {}


class StateMetrics:
    """The server's figures as Prometheus metric families (prometheus_client renders the text);
    read at each scrape, so nothing is counted twice."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        state, m = self.state, self.state.metrics

        def counter(name: str, help_text: str, value: float) -> Metric:
            return CounterMetricFamily(f"moegate_{name}", help_text, value=value)

        def gauge(name: str, help_text: str, value: float) -> Metric:
            return GaugeMetricFamily(f"moegate_{name}", help_text, value=value)

        def tiers(name: str, help_text: str, ram: float, disk: float) -> Metric:
            family = GaugeMetricFamily(f"moegate_{name}", help_text, labels=["tier"])
            family.add_metric(["ram"], ram)
            family.add_metric(["disk"], disk)
            return family

        if m.requests:
            requests = CounterMetricFamily("moegate_requests_total", "HTTP requests by endpoint and status",
                                           labels=["endpoint", "status"])
            for (endpoint, status), n in sorted(m.requests.items()):
                requests.add_metric([endpoint, status], n)
            yield requests
        else:
            yield counter("requests_total", "HTTP requests by endpoint and status", 0)
        yield counter("prompt_tokens_total", "Prompt tokens received", m.prompt_tokens)
        yield counter("prompt_tokens_cached_total", "Prompt tokens served from the prefix cache", m.cached_tokens)
        yield counter("completion_tokens_total", "Tokens generated", m.completion_tokens)
        yield counter("prefix_cache_hits_total", "Requests that reused a cached prefix", state.slot.prefix_hits)
        snapshots = state.slot.prefix_cache.stats() if state.slot.prefix_cache is not None else {}
        on_disk = state.slot.prefix_disk.stats() if state.slot.prefix_disk is not None else {}
        yield tiers("prefix_snapshots", "Conversation snapshots held (the slot left them)",
                    snapshots.get("snapshots", 0), on_disk.get("files", 0))
        yield tiers("prefix_snapshot_bytes", "Bytes held by conversation snapshots",
                    snapshots.get("bytes", 0), on_disk.get("bytes", 0))
        yield counter("prefix_snapshot_restores_total", "Requests that resumed a conversation from a snapshot",
                      state.slot.snapshot_restores)
        yield counter("prefix_snapshot_restored_tokens_total", "Prompt tokens a snapshot restore saved from prefill",
                      state.slot.snapshot_restored_tokens)
        yield gauge("decode_tokens_per_second", "Decode speed of the last request", m.last_decode_tps)
        yield gauge("prefill_tokens_per_second", "Prefill speed of the last request", m.last_prefill_tps)
        yield gauge("queue_depth", "Requests waiting for the slot", state.scheduler.queue_depth)
        yield gauge("busy", "1 while a request holds the slot", int(state.scheduler.running is not None))
        yield counter("requests_rejected_total", "Requests refused because the queue was full", m.rejected)
        yield counter("requests_cancelled_total", "Requests cancelled by a client disconnect", m.cancelled)
        yield counter("reasoning_calls_delivered_total", "Tool calls delivered from inside the reasoning",
                      m.reasoning_calls_delivered)
        yield counter("reasoning_calls_kept_as_text_total",
                      "Complete calls to a declared tool inside the reasoning that stayed text",
                      m.reasoning_calls_kept_as_text)
        yield counter("constrained_requests_total", "Requests decoded under a grammar (forced calls, JSON)",
                      m.constrained_requests)
        yield counter("constraint_masks_total", "Grammar token masks computed", m.constraint_masks)
        yield counter("constraint_mask_seconds_total", "Time spent computing masks and closing plans",
                      round(m.constraint_mask_seconds, 6))
        yield counter("constraint_steered_tokens_total", "Tokens steered to close a structure within max_tokens",
                      m.constraint_steered)
        stats = _engine_stats(state)
        experts = stats.get("experts") if isinstance(stats.get("experts"), dict) else {}
        for key, value in sorted(experts.items()):
            # A snapshot of Engine.stats(): gauges, since a Prometheus counter's name ends in _total.
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                yield gauge(f"expert_cache_{key}", f"Expert store: {key}", value)
        yield gauge("uptime_seconds", "Seconds since start", round(time.time() - m.started, 3))


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.Response(body=generate_latest(StateMetrics(state)),
                        headers={"Content-Type": CONTENT_TYPE_LATEST, "X-Content-Type-Options": "nosniff"})


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
    body = await read_json(request)
    # The reply grows with the body too (an id per token): serialised off the loop as well.
    text = await off_loop(lambda: json.dumps(_tokenize(state, body)))
    return web.Response(text=text, content_type="application/json")


def _tokenize(state: ServerState, body: object) -> dict:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    # Typed whichever is used: a junk `prompt` next to `messages` is refused, not ignored.
    field_of(body, "content", str)
    field_of(body, "prompt", str)
    if "messages" in body:
        ids = prepare_chat(state, parse_openai_chat(body), limit=False).prompt_ids  # counts any length
    else:
        content = body.get("content", body.get("prompt"))
        if not isinstance(content, str):
            raise bad_request("'content' must be a string (or send 'messages')", "content")
        ids = state.tokenizer.encode(content)
    out: dict = {"tokens": ids, "count": len(ids)}
    if field_of(body, "with_pieces", bool, False):
        out["pieces"] = [state.tokenizer.decode([i]) for i in ids]
    return out


async def detokenize(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.json_response({"content": await off_loop(_detokenize, state, await read_json(request))})


def _detokenize(state: ServerState, body: object) -> str:
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad_request("'tokens' must be a list of token ids", "tokens")
    check_token_ids(tokens, state.tokenizer.vocab_size, "tokens")
    return state.tokenizer.decode(tokens)
