"""Anthropic Messages API against a live server (real engine, tiny random-weight GLM-4.5-MoE).

Random weights write noise: these tests assert protocol (event order, block indices, usage,
stop reasons, error envelopes, SDK helpers), never prose.
"""
from __future__ import annotations

import json

import anthropic
import pytest

pytest.register_assert_rewrite("server_fixtures")
from server_fixtures import check_anthropic_events, open_stream  # noqa: E402

pytest_plugins = ["server_fixtures"]

HI = [{"role": "user", "content": "Say hi."}]
WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CLOCK = {"name": "get_time", "description": "Current time",
         "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}}


@pytest.fixture(scope="module")
def client(glm_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=glm_server.base_url, api_key="unused", max_retries=0, timeout=60)


def test_non_streaming_message(client):
    m = client.messages.create(model="claude-any", max_tokens=6, messages=HI)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == "claude-any"
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert all(b.type in ("text", "thinking", "tool_use") for b in m.content)
    assert isinstance(m.usage.input_tokens, int) and m.usage.input_tokens >= 0
    assert isinstance(m.usage.cache_read_input_tokens, int)
    assert 0 < m.usage.output_tokens <= 6


def test_raw_stream_event_order(glm_server):
    stream = open_stream(glm_server.base_url, "/v1/messages", {
        "model": "m", "max_tokens": 6, "messages": HI, "stream": True},
        headers={"anthropic-version": "2023-06-01"})
    assert stream.status == 200
    pairs = check_anthropic_events(stream.read_all())
    usage = pairs[-2][1]["usage"]
    start_usage = pairs[0][1]["message"]["usage"]
    # message_start reports the whole prompt; the final usage splits it into new + cache reads.
    assert start_usage["input_tokens"] == usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert 0 < usage["output_tokens"] <= 6


def test_stream_helper_final_message(client):
    with client.messages.stream(model="m", max_tokens=8, messages=HI, tools=[WEATHER, CLOCK]) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    text_blocks = [b.text for b in final.content if b.type == "text"]
    assert "".join(texts) == "".join(text_blocks)
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
    for block in final.content:
        if block.type == "tool_use":
            assert block.name in ("get_weather", "get_time") and isinstance(block.input, dict)


def test_stream_and_create_agree(client):
    # This SDK version has no `temperature` argument any more; the wire field still exists.
    kwargs = dict(model="m", max_tokens=10, messages=[{"role": "user", "content": "Count."}],
                  extra_body={"temperature": 0})
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
    assert streamed.stop_reason == whole.stop_reason


def test_count_tokens_matches_the_prompt(client):
    counted = client.messages.count_tokens(model="m", messages=HI, tools=[WEATHER], system="Be brief.")
    m = client.messages.create(model="m", max_tokens=2, messages=HI, tools=[WEATHER], system="Be brief.")
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens
    bare = client.messages.count_tokens(model="m", messages=HI)
    assert bare.input_tokens < counted.input_tokens


def test_second_turn_reads_the_cache(client):
    first = client.messages.create(model="m", max_tokens=5, system="You are terse.",
                                   messages=[{"role": "user", "content": "First?"}])
    reply = "".join(b.text for b in first.content if b.type == "text") or "ok"
    second = client.messages.create(model="m", max_tokens=3, system="You are terse.", messages=[
        {"role": "user", "content": "First?"}, {"role": "assistant", "content": reply},
        {"role": "user", "content": "Second?"}])
    assert second.usage.cache_read_input_tokens >= first.usage.input_tokens + first.usage.cache_read_input_tokens - 3


def test_tool_use_history_with_thinking_and_tool_result(client):
    """Claude-Code-shaped turn: signed thinking, tool_use, then tool_result (+ is_error) and text."""
    messages = HI + [
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Need the weather.", "signature": "sig-from-elsewhere"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "clock offline"}]},
            {"type": "text", "text": "Thanks."}]}]
    # budget_tokens must be below max_tokens (issue 16 item 13; max_tokens was 4 here, which Anthropic refuses).
    m = client.messages.create(model="m", max_tokens=1025, messages=messages, tools=[WEATHER, CLOCK],
                               thinking={"type": "enabled", "budget_tokens": 1024},
                               metadata={"user_id": "u1"})
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_agent_shaped_extras_do_not_fail_the_turn(client, glm_server):
    """What agents send besides plain text: a tool result holding a screenshot (a text-only model
    gets a note instead of a 400 that would end the loop), cache_control marks, and server tools
    (left out: nothing here runs them)."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    messages = HI + [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_9",
             "content": [{"type": "text", "text": "radar:"}, image], "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Go on.", "cache_control": {"type": "ephemeral"}}]}]
    tools = [WEATHER, {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]
    m = client.messages.create(model="m", max_tokens=3, messages=messages, tools=tools,
                               system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}])
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
    status, out, _ = glm_server.post_json("/v1/messages/count_tokens", {"model": "m", "messages": messages,
                                                                        "tools": tools})
    assert status == 200 and out["input_tokens"] > 0
    # The model saw the note where the picture was.
    noted = json.loads(json.dumps(messages))
    noted[2]["content"][0]["content"][1] = {"type": "text", "text": "[image omitted: this model reads text only]"}
    status, same, _ = glm_server.post_json("/v1/messages/count_tokens", {"model": "m", "messages": noted,
                                                                         "tools": tools})
    assert same["input_tokens"] == out["input_tokens"]
    # A picture the user sends is still refused: the user can act on that.
    status, err, _ = glm_server.post_json("/v1/messages", {"model": "m", "max_tokens": 2, "messages": [
        {"role": "user", "content": [image]}]})
    assert status == 400 and "image" in err["error"]["message"]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_time"}])
def test_forced_tool_choice(client, glm_server, choice):
    auto = client.messages.count_tokens(model="m", messages=HI, tools=[WEATHER, CLOCK])
    forced = client.messages.count_tokens(model="m", messages=HI, tools=[WEATHER, CLOCK], tool_choice=choice)
    assert forced.input_tokens > auto.input_tokens  # the call opener is prefilled
    m = client.messages.create(model="m", max_tokens=10, messages=HI, tools=[WEATHER, CLOCK],
                               tool_choice=dict(choice, disable_parallel_tool_use=True))
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == forced.input_tokens
    assert sum(b.type == "tool_use" for b in m.content) <= 1
    assert all(not b.text.lstrip().startswith("<tool_call>") for b in m.content if b.type == "text")
    with client.messages.stream(model="m", max_tokens=10, messages=HI, tools=[WEATHER, CLOCK],
                                tool_choice=choice) as stream:
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")


def _stop_piece(full: str) -> str | None:
    return next((full[i:i + 3] for i in range(len(full) // 3, len(full) - 3)
                 if full[i:i + 3].strip() == full[i:i + 3] and " " not in full[i:i + 3]
                 and "\ufffd" not in full[i:i + 3] and full.find(full[i:i + 3]) > 0), None)


def test_stop_sequences(client, glm_server):
    # Noise could contain a think tag (text would move into a thinking block): take the first
    # prompt whose greedy output is plain text with a usable stop sequence in it.
    for n in range(10):
        base = dict(model="m", max_tokens=24, messages=[{"role": "user", "content": f"Write {n}."}],
                    extra_body={"ignore_eos": True, "temperature": 0})
        blocks = client.messages.create(**base).content
        full = "".join(b.text for b in blocks if b.type == "text")
        stop = _stop_piece(full)
        if stop and [b.type for b in blocks] == ["text"]:
            break
    else:
        raise AssertionError("no prompt gave plain text with a usable stop sequence")
    m = client.messages.create(stop_sequences=[stop], **base)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    text = "".join(b.text for b in m.content if b.type == "text")
    assert text == full[:full.find(stop)].strip()
    stream = open_stream(glm_server.base_url, "/v1/messages", dict(
        model="m", max_tokens=24, messages=base["messages"], temperature=0, ignore_eos=True,
        stop_sequences=[stop], stream=True))
    pairs = check_anthropic_events(stream.read_all())
    streamed = "".join(d["delta"]["text"] for n, d in pairs
                       if n == "content_block_delta" and d["delta"]["type"] == "text_delta")
    assert streamed == text
    assert pairs[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}


# ---------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("body", [
    {"model": "m", "messages": HI},  # max_tokens missing
    {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
    {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"model": "m", "max_tokens": 5, "messages": HI, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "x"}},
    {"model": "m", "max_tokens": 5, "messages": HI, "tool_choice": {"type": "any"}},
    {"model": "m", "max_tokens": 5, "messages": HI, "temperature": "hot"},
])
def test_invalid_requests_are_400_in_anthropic_shape(glm_server, body):
    status, out, _ = glm_server.post_json("/v1/messages", body)
    assert status == 400, out
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error"
    assert out["error"]["message"] and out["request_id"].startswith("req_")


def test_sdk_exception_classes(client):
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="m", max_tokens=5, messages=HI, tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "not_a_tool"})
    assert err.value.status_code == 400
    assert err.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "w " * 6000}])




# ------------------------------------------------------------------ issue 16: bad input and minor items

def raw_post(server, path: str, raw: bytes) -> tuple[int, dict]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def assert_anthropic_400(status: int, out: dict) -> None:
    assert status == 400, out
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error", out
    assert out["error"]["message"] and out["request_id"].startswith("req_")


LONE = b"a\\ud800b"


@pytest.mark.parametrize("path, raw", [
    ("/v1/messages", b'{"max_tokens": 2, "messages": [{"role": "user", "content": "' + LONE + b'"}]}'),
    ("/v1/messages", b'{"max_tokens": 2, "system": "' + LONE + b'", "messages": [{"role": "user", "content": "x"}]}'),
    ("/v1/messages", b'{"max_tokens": 2, "messages": [{"role": "user", "content": "x"}], '
                     b'"tools": [{"name": "' + LONE + b'", "input_schema": {"type": "object"}}]}'),
    ("/v1/messages/count_tokens", b'{"messages": [{"role": "user", "content": "' + LONE + b'"}]}'),
    ("/v1/messages", b"[" * 1000 + b"]" * 1000),
    ("/v1/messages", b'{"max_tokens": 2, "seed": 1, "temperature": Infinity, "messages": []}'),
])
def test_bad_bodies_are_400_in_anthropic_shape(glm_server, path, raw):
    assert_anthropic_400(*raw_post(glm_server, path, raw))


@pytest.mark.parametrize("extra", [
    {"stop_sequences": "x"}, {"stream": "false"}, {"ignore_eos": 1}, {"model": 3}, {"metadata": "u"},
    {"metadata": {"user_id": 5}}, {"max_tokens": 10**12}, {"max_tokens": 2**64}, {"max_tokens": 10**400},
    {"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}},
])
def test_loose_types_and_unbounded_max_tokens_are_400(glm_server, extra):
    for stream in (False, True):
        body = {"model": "m", "max_tokens": 4, "messages": HI, "stream": stream, **extra}
        assert_anthropic_400(*glm_server.post_json("/v1/messages", body)[:2])


def test_count_tokens_counts_a_prompt_longer_than_the_context(client, glm_server):
    long = [{"role": "user", "content": "word " * 6000}]
    counted = client.messages.count_tokens(model="m", messages=long)
    assert counted.input_tokens > glm_server.get_json("/props")["n_ctx"]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="m", max_tokens=2, messages=long)
    budgeted = client.messages.count_tokens(model="m", messages=HI, thinking={"type": "enabled", "budget_tokens": 2048})
    assert budgeted.input_tokens > 0


def test_tool_use_ids_start_with_toolu(client, glm_server):
    kwargs = dict(model="m", max_tokens=40, messages=HI, tools=[CLOCK], tool_choice={"type": "tool", "name": "get_time"})
    m = client.messages.create(**kwargs)
    calls = [b for b in m.content if b.type == "tool_use"]
    assert calls and all(b.id.startswith("toolu_") for b in calls), m.content
    raw = open_stream(glm_server.base_url, "/v1/messages", dict(kwargs, stream=True))
    starts = [d["content_block"] for n, d in check_anthropic_events(raw.read_all()) if n == "content_block_start"]
    ids = [b["id"] for b in starts if b["type"] == "tool_use"]
    assert ids and all(i.startswith("toolu_") for i in ids)


def test_hang_ups_log_nothing(qwen_server):
    """Clients that reset the connection mid-stream, or as soon as they have message_stop: the
    server's next write (or its write_eof) meets a closed transport, which is the client leaving,
    not an error to log."""
    import socket
    import struct
    import time

    server = qwen_server  # the fastest tiny model: its writes most often beat the disconnect watcher
    before = server.log().count("Error handling request")
    # Whether the server's write or its disconnect watcher comes first is a race: many tries.
    for max_tokens, last in [(300, b"message_start")] * 30 + [(300, b"content_block_delta")] * 10 \
            + [(2, b"message_stop")] * 10:
        body = json.dumps({"model": "m", "max_tokens": max_tokens, "stream": True, "messages": HI,
                           "ignore_eos": True}).encode()
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        seen = b""
        while last not in seen:
            chunk = sock.recv(65536)
            if not chunk:
                break
            seen += chunk
        sock.close()
    time.sleep(0.5)
    assert server.get_json("/health")["status"] == "ok"
    log = server.log()
    assert log.count("Error handling request") == before, log[-3000:]
    assert "ClientConnectionResetError" not in log
