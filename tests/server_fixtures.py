"""Live gateway servers for the server tests, and helpers to read their streams.

A server is the real thing: `python -m gateway --model DIR --port 0 --host 127.0.0.1` in a
subprocess, on a tiny random-weight checkpoint, running the real engine.  `--port 0` lets the OS
pick a free port; the startup summary's "listening" line tells us which.  Servers are started
once per session for each distinct (checkpoint, arguments) and stopped at the end.

Test modules load this file as a plugin, so every module shares the same servers:

    pytest_plugins = ["server_fixtures"]
"""
from __future__ import annotations

import atexit
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
STARTUP_SECONDS = 90.0
BUSY_CTX = 65536
BUSY_API_KEY = "test-key-123"


@dataclass
class LiveServer:
    base_url: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen
    log_path: Path
    model_dir: Path
    api_key: str | None = None
    args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def url(self, path: str) -> str:
        return self.base_url + path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def get_json(self, path: str, timeout: float = 10.0) -> dict:
        req = urllib.request.Request(self.url(path), headers=self.headers())
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def post_raw(self, path: str, raw: bytes, timeout: float = 120.0) -> tuple[int, dict]:
        """(status, JSON body) of raw bytes POSTed as JSON -- error statuses are returned."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, body=raw, headers={"Content-Type": "application/json", **self.headers()})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read() or b"null")
        finally:
            conn.close()

    def post_json(self, path: str, body: dict, timeout: float = 60.0,
                  headers: dict[str, str] | None = None) -> tuple[int, dict, dict[str, str]]:
        """(status, JSON body, headers) -- error statuses are returned, not raised."""
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.url(path), data=data, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **(self.headers() if headers is None else headers)})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read()), dict(resp.headers)
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null"), dict(err.headers)

    def metrics(self) -> dict[str, float]:
        """Unlabelled Prometheus samples by name (labelled ones summed)."""
        req = urllib.request.Request(self.url("/metrics"), headers=self.headers())
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, value = line.rsplit(" ", 1)
            name = name.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
        return out


def start_server(model_dir: Path, *args: str, api_key: str | None = None) -> LiveServer:
    """Starts a gateway and waits until /health answers 200."""
    log = Path(tempfile.mkstemp(prefix="moegate-test-server-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "gateway", "--model", str(model_dir), "--host", "127.0.0.1", "--port", "0",
           "--threads", "1", *args]
    if api_key:
        cmd += ["--api-key", api_key]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT / "python"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    deadline = time.monotonic() + STARTUP_SECONDS
    base_url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        found = re.search(r"listening\s+(http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
        if found:
            base_url = found.group(1)
            try:
                with urllib.request.urlopen(base_url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        server = LiveServer(base_url, proc, log, Path(model_dir), api_key, tuple(args))
                        atexit.register(stop_server, server)  # even if pytest is interrupted
                        return server
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the server did not become healthy in {STARTUP_SECONDS} s:\n{log.read_text(errors='replace')}")


def stop_server(server: LiveServer) -> None:
    """SIGTERM (the server shuts down cleanly), SIGKILL if it does not within 15 s."""
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(timeout=5)
    server.log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def live_server(build_checkpoint: Callable[..., Path]) -> Iterator[Callable[..., LiveServer]]:
    """live_server(arch, *args, api_key=None) -> LiveServer, one per distinct configuration."""
    started: dict[tuple, LiveServer] = {}

    def get(arch: str, *args: str, api_key: str | None = None, fmt: str = "bf16") -> LiveServer:
        key = (arch, fmt, args, api_key)
        if key not in started:
            started[key] = start_server(build_checkpoint(arch, fmt), *args, api_key=api_key)
        server = started[key]
        assert server.proc.poll() is None, f"server died:\n{server.log()}"
        return server

    yield get
    for server in started.values():
        stop_server(server)


@pytest.fixture(scope="session")
def qwen_server(live_server) -> LiveServer:
    """Qwen3-MoE tiny checkpoint (qwen3 chat format, hermes tool calls)."""
    return live_server("qwen3_moe")


@pytest.fixture(scope="session")
def glm_server(live_server) -> LiveServer:
    """GLM-4.5-MoE tiny checkpoint (glm45 chat format, glm tool calls)."""
    return live_server("glm4_moe")


@pytest.fixture(scope="session")
def busy_server(live_server) -> LiveServer:
    """For queueing, auth and CORS: one waiting request at most, an API key, fast keepalives, and
    a slot of BUSY_CTX tokens: the tiny model decodes thousands of tokens a second, so a job that
    must hold the slot while a test queues and cancels around it needs far more than 4096."""
    return live_server("qwen3_moe", "--max-queue", "1", "--keepalive", "0.3", "--ctx", str(BUSY_CTX),
                       "--cors", "http://localhost:3000", "--retry-after", "7", api_key=BUSY_API_KEY)


# ---------------------------------------------------------------- raw SSE and stream invariants

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}


@dataclass
class SSEEvent:
    event: str | None
    data: str
    comment: str | None = None

    def json(self) -> dict:
        return json.loads(self.data)


@dataclass
class RawStream:
    """One streaming POST read event by event; `close()` drops the connection mid-stream."""

    conn: http.client.HTTPConnection
    resp: http.client.HTTPResponse
    events: list[SSEEvent] = field(default_factory=list)

    @property
    def status(self) -> int:
        return self.resp.status

    def next_event(self) -> SSEEvent | None:
        """The next event or comment block; None at the end of the stream."""
        event, data, comment = None, [], None
        while True:
            line = self.resp.readline()
            if not line:
                return None
            text = line.decode("utf-8").rstrip("\r\n")
            if text == "":
                if event is None and not data and comment is None:
                    continue
                ev = SSEEvent(event, "\n".join(data), comment)
                self.events.append(ev)
                return ev
            if text.startswith(":"):
                comment = text[1:].strip()
            elif text.startswith("event:"):
                event = text[6:].strip()
            elif text.startswith("data:"):
                data.append(text[5:].strip())

    def read_all(self) -> list[SSEEvent]:
        while self.next_event() is not None:
            pass
        return self.events

    def close(self) -> None:
        self.conn.close()


def open_stream(base_url: str, path: str, body: dict, headers: dict[str, str] | None = None,
                timeout: float = 60.0) -> RawStream:
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request("POST", path, body=json.dumps(body),
                 headers={"Content-Type": "application/json", **(headers or {})})
    return RawStream(conn, conn.getresponse())


def data_events(events: list[SSEEvent]) -> list[SSEEvent]:
    return [e for e in events if e.comment is None]


def check_openai_chunks(events: list[SSEEvent], include_usage: bool = False) -> list[dict]:
    """Asserts the §2.1 rules on a finished chat stream; returns the JSON chunks (without [DONE])."""
    data = data_events(events)
    assert data and data[-1].data == "[DONE]", "a chat stream ends with data: [DONE]"
    chunks = [e.json() for e in data[:-1]]
    assert all(e.event is None for e in data), "OpenAI streams carry no event: lines"
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        assert isinstance(c["created"], int) and c["model"]
    body = [c for c in chunks if c["choices"]]
    assert body[0]["choices"][0]["delta"].get("role") == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in body[1:]), "role is sent once"
    finishes = [c["choices"][0]["finish_reason"] for c in body if c["choices"][0]["finish_reason"]]
    assert len(finishes) == 1, f"exactly one finish_reason, got {finishes}"
    assert body[-1]["choices"][0]["finish_reason"] == finishes[0]
    for c in body:
        choice = c["choices"][0]
        assert choice["index"] == 0
        delta = choice["delta"]
        for key in ("content", "reasoning_content"):
            if key in delta and delta[key] is not None and c is not body[0]:
                assert delta[key] != "", f"empty {key} delta"
        seen: set[int] = set()
        for call in delta.get("tool_calls") or []:
            assert isinstance(call["index"], int)
            assert call.get("type", "function") == "function", "never type: null"
            assert isinstance(call["function"].get("arguments", ""), str)
            seen.add(call["index"])
    usage_chunks = [c for c in chunks if not c["choices"]]
    if include_usage:
        assert len(usage_chunks) == 1 and chunks[-1] is usage_chunks[0], "the usage chunk comes last"
        usage = usage_chunks[0]["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)
    else:
        assert not usage_chunks, "usage only when stream_options.include_usage is set"
    return chunks


def openai_text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def check_anthropic_events(events: list[SSEEvent]) -> list[tuple[str, dict]]:
    """Asserts the §2.2 rules on a finished Messages stream; returns (event, data) pairs."""
    pairs = [(e.event, e.json()) for e in data_events(events)]
    assert all(name for name, _ in pairs), "every Anthropic event has an event: name"
    assert all(name == data["type"] for name, data in pairs)
    names = [name for name, _ in pairs]
    assert names[0] == "message_start" and names.count("message_start") == 1
    assert names[-2:] == ["message_delta", "message_stop"]
    start = pairs[0][1]["message"]
    assert start["content"] == [] and isinstance(start["usage"]["input_tokens"], int)
    open_index, next_index = None, 0
    for name, data in pairs:
        if name == "content_block_start":
            assert open_index is None, "blocks never interleave"
            assert data["index"] == next_index, "block indices run 0, 1, 2..."
            open_index, next_index = data["index"], next_index + 1
        elif name == "content_block_delta":
            assert data["index"] == open_index
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
    assert open_index is None
    delta = pairs[-2][1]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence", "tool_use")
    assert isinstance(delta["usage"]["output_tokens"], int)
    return pairs


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
