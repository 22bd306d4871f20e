"""Server-sent events on aiohttp's StreamResponse."""
from __future__ import annotations

import json

from aiohttp import web


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    return resp


async def send_data(resp: web.StreamResponse, payload: dict | str, event: str | None = None) -> None:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    await resp.write(f"{head}data: {data}\n\n".encode("utf-8"))


async def send_comment(resp: web.StreamResponse, text: str) -> None:
    await resp.write(f": {text}\n\n".encode("utf-8"))
