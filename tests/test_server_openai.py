"""OpenAI-compatible API against a live server (real engine, tiny random-weight Qwen3-MoE).

Random weights write noise, so these tests assert protocol, never prose: stream shapes, the
official SDK's own helpers, usage accounting, prefix reuse, seeds, stop strings, logprobs,
tool_choice handling and error shapes.
"""
from __future__ import annotations

import json

import openai
import pytest

pytest.register_assert_rewrite("server_fixtures")
from server_fixtures import TIME_TOOL, WEATHER_TOOL, check_openai_chunks, open_stream, openai_text  # noqa: E402

pytest_plugins = ["server_fixtures"]  # live_server, qwen_server, ... shared by the whole session

HI = [{"role": "user", "content": "Say hi."}]


def final_completion(stream):
    """The helper's final completion; with finish_reason "length" the SDK raises instead of
    returning it (it refuses to parse a cut response), and the completion rides on the error."""
    try:
        return stream.get_final_completion()
    except openai.LengthFinishReasonError as err:
        return err.completion


@pytest.fixture(scope="module")
def client(qwen_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen_server.url("/v1"), api_key="unused", max_retries=0, timeout=60)


# ------------------------------------------------------------------------------------ models

def test_models_list_and_get(client, qwen_server):
    models = client.models.list()
    assert len(models.data) == 1 and models.data[0].object == "model"
    model_id = models.data[0].id
    assert client.models.retrieve(model_id).id == model_id
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.body["type"] == "not_found_error"
    assert err.value.body["code"] == "model_not_found"


# ------------------------------------------------------------------------------- chat, plain

def test_chat_non_streaming(client):
    r = client.chat.completions.create(model="anything", messages=HI, max_tokens=6, seed=1)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "anything"  # any model name is accepted and echoed
    choice = r.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 6
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert isinstance(r.usage.prompt_tokens_details.cached_tokens, int)


def test_chat_streaming_raw_shape(qwen_server):
    stream = open_stream(qwen_server.base_url, "/v1/chat/completions", {
        "model": "m", "messages": HI, "max_tokens": 6, "stream": True, "seed": 2,
        "stream_options": {"include_usage": True}})
    assert stream.status == 200
    assert stream.resp.getheader("Content-Type").startswith("text/event-stream")
    chunks = check_openai_chunks(stream.read_all(), include_usage=True)
    assert chunks[-1]["usage"]["completion_tokens"] <= 6


def test_chat_streaming_without_usage(qwen_server):
    stream = open_stream(qwen_server.base_url, "/v1/chat/completions",
                         {"model": "m", "messages": HI, "max_tokens": 3, "stream": True})
    check_openai_chunks(stream.read_all(), include_usage=False)


def test_stream_helper_final_completion_with_tools(client):
    with client.chat.completions.stream(model="m", messages=HI, max_tokens=8, seed=3,
                                        tools=[WEATHER_TOOL, TIME_TOOL],
                                        stream_options={"include_usage": True}) as stream:
        kinds = {type(event).__name__ for event in stream}
        final = final_completion(stream)
    assert "ChunkEvent" in kinds
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert final.usage is not None and final.usage.completion_tokens <= 8
    for call in final.choices[0].message.tool_calls or []:
        assert call.type == "function" and call.id and call.function.name in ("get_weather", "get_time")
        json.loads(call.function.arguments)


def test_raw_stream_iterator_rebuilds_like_non_streaming(client):
    """Same seed, streamed and not: the same text, token for token."""
    kwargs = dict(model="m", messages=[{"role": "user", "content": "Count."}], max_tokens=10, seed=11,
                  temperature=0.9)
    whole = client.chat.completions.create(**kwargs)
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
             if c.choices]
    assert "".join(parts) == (whole.choices[0].message.content or "")


# ------------------------------------------------------------------------------ sampling

def test_seed_is_reproducible(client):
    kwargs = dict(model="m", messages=[{"role": "user", "content": "Tell a story."}], max_tokens=12,
                  temperature=1.0, top_p=0.95, presence_penalty=0.5, frequency_penalty=0.3,
                  extra_body={"top_k": 50, "min_p": 0.01})
    a = client.chat.completions.create(seed=1234, **kwargs).choices[0].message.content
    b = client.chat.completions.create(seed=1234, **kwargs).choices[0].message.content
    c = client.chat.completions.create(seed=4321, **kwargs).choices[0].message.content
    assert a == b
    assert a != c  # 12 tokens from a 1024-token vocabulary: a collision would be a bug


def test_n_choices_run_one_after_another(client):
    kwargs = dict(model="m", messages=[{"role": "user", "content": "Three takes."}], max_tokens=8,
                  temperature=1.0, n=3)
    r = client.chat.completions.create(seed=77, **kwargs)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) == 3, texts  # choice i samples with seed + i
    single = client.chat.completions.create(seed=77, **dict(kwargs, n=1))
    assert single.choices[0].message.content == texts[0]
    assert r.choices[1].message.content == client.chat.completions.create(
        seed=78, **dict(kwargs, n=1)).choices[0].message.content
    # The prompt counts once; completion tokens add up over the choices.
    assert r.usage.prompt_tokens == single.usage.prompt_tokens
    assert r.usage.completion_tokens >= 3 and r.usage.completion_tokens <= 24
    # Streamed: every choice comes with its index, role first, its own finish; usage at the end.
    stream = client.chat.completions.create(seed=77, stream=True, stream_options={"include_usage": True}, **kwargs)
    parts: dict[int, list[str]] = {0: [], 1: [], 2: []}
    finishes, roles, usage = {}, [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.index)
            parts[c.index].append(c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert roles == [0, 1, 2] and set(finishes) == {0, 1, 2}
    assert ["".join(parts[i]) for i in range(3)] == texts
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens


def test_legacy_completions_n_choices(client):
    kwargs = dict(model="m", prompt="Once upon", max_tokens=5, temperature=1.0, n=2, seed=5)
    r = client.completions.create(**kwargs)
    assert [c.index for c in r.choices] == [0, 1] and r.choices[0].text != r.choices[1].text
    assert r.choices[0].text == client.completions.create(**dict(kwargs, n=1)).choices[0].text
    parts: dict[int, str] = {0: "", 1: ""}
    for chunk in client.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            parts[c.index] += c.text
    assert [parts[0], parts[1]] == [c.text for c in r.choices]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(**dict(kwargs, n=9))


def test_greedy_is_reproducible(client):
    kwargs = dict(model="m", messages=[{"role": "user", "content": "Greedy."}], max_tokens=8, temperature=0)
    assert (client.chat.completions.create(**kwargs).choices[0].message.content
            == client.chat.completions.create(**kwargs).choices[0].message.content)


def _stop_candidate(text: str) -> str | None:
    """A 3-character piece from the middle of `text` with no whitespace or replacement chars."""
    for start in range(len(text) // 3, len(text) - 3):
        piece = text[start:start + 3]
        if piece.strip() == piece and " " not in piece and "\ufffd" not in piece and text.find(piece) > 0:
            return piece
    return None


def test_stop_strings_are_never_leaked(client, qwen_server):
    # Noise could contain a think tag, which would move text into reasoning: take the first seed
    # whose output is plain content with a usable stop string in it.
    for seed in range(77, 87):
        base = dict(model="m", messages=[{"role": "user", "content": "Write."}], max_tokens=24, seed=seed,
                    temperature=1.0, extra_body={"ignore_eos": True})
        message = client.chat.completions.create(**base).choices[0].message
        full = message.content or ""
        stop = _stop_candidate(full)
        if stop and not (message.model_extra or {}).get("reasoning_content"):
            break
    else:
        raise AssertionError("no seed gave plain content with a usable stop string")
    expected = full[:full.find(stop)].strip()
    cut = client.chat.completions.create(stop=[stop, "never-appears-xyz"], **base)
    assert cut.choices[0].finish_reason == "stop"
    assert (cut.choices[0].message.content or "") == expected
    # Streamed: no chunk may carry any part of the stop string's match.
    stream = open_stream(qwen_server.base_url, "/v1/chat/completions", {
        "model": "m", "messages": base["messages"], "max_tokens": 24, "seed": seed, "temperature": 1.0,
        "ignore_eos": True, "stop": [stop], "stream": True})
    chunks = check_openai_chunks(stream.read_all())
    assert openai_text(chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_stop_strings_on_completions_are_exact(client):
    base = dict(model="m", prompt="Once upon a time", max_tokens=24, seed=5, extra_body={"ignore_eos": True})
    full = client.completions.create(**base).choices[0].text
    stop = _stop_candidate(full)
    assert stop
    cut = client.completions.create(stop=stop, **base)
    assert cut.choices[0].text == full[:full.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_logprobs_shape(client, qwen_server):
    r = client.chat.completions.create(model="m", messages=HI, max_tokens=5, logprobs=True, top_logprobs=3,
                                       seed=9, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 5
    for item in content:
        assert item.logprob <= 0.0
        assert len(item.top_logprobs) == 3
        values = [t.logprob for t in item.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert item.logprob <= values[0] + 1e-9
        assert bytes(item.bytes).decode("utf-8", errors="replace") == item.token
    stream = open_stream(qwen_server.base_url, "/v1/chat/completions", {
        "model": "m", "messages": HI, "max_tokens": 5, "logprobs": True, "top_logprobs": 2, "seed": 9,
        "ignore_eos": True, "stream": True})
    chunks = check_openai_chunks(stream.read_all())
    streamed = [item for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for item in c["choices"][0]["logprobs"]["content"]]
    assert len(streamed) == 5 and all(len(i["top_logprobs"]) == 2 for i in streamed)
    assert [i["token"] for i in streamed] == [i.token for i in content]


def test_logit_bias_forces_a_token(client, qwen_server):
    status, tok, _ = qwen_server.post_json("/tokenize", {"content": " hello"})
    forced = tok["tokens"][0]
    r = client.chat.completions.create(model="m", messages=HI, max_tokens=4, temperature=0, logprobs=True,
                                       logit_bias={str(forced): 100}, extra_body={"ignore_eos": True})
    status, piece, _ = qwen_server.post_json("/detokenize", {"tokens": [forced]})
    assert [item.token for item in r.choices[0].logprobs.content] == [piece["content"]] * 4
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=HI, logit_bias={"x": 1})
    assert err.value.param == "logit_bias"


def test_completions_endpoint(client):
    r = client.completions.create(model="m", prompt="Hello", max_tokens=4, seed=1, logprobs=2)
    assert r.object == "text_completion" and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 4
    assert len(r.choices[0].logprobs.tokens) == len(r.choices[0].logprobs.token_logprobs)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="m", prompt="Hello", max_tokens=4, seed=1, stream=True) if c.choices)
    assert streamed == r.choices[0].text


# ---------------------------------------------------------------------------- prefix reuse

def test_second_turn_reuses_the_prefix(client, qwen_server):
    before = qwen_server.metrics()
    turn1 = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "First question?"}]
    r1 = client.chat.completions.create(model="m", messages=turn1, max_tokens=6, seed=1)
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content or ""},
                     {"role": "user", "content": "And a second one?"}]
    r2 = client.chat.completions.create(model="m", messages=turn2, max_tokens=4, seed=1)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    # The second turn shares at least the system + first user message with the first prompt.
    assert cached >= r1.usage.prompt_tokens - 3, (cached, r1.usage.prompt_tokens)
    assert cached < r2.usage.prompt_tokens
    after = qwen_server.metrics()
    assert after["moegate_prefix_cache_hits_total"] > before["moegate_prefix_cache_hits_total"]
    assert after["moegate_prompt_tokens_cached_total"] - before["moegate_prompt_tokens_cached_total"] >= cached


def test_interleaved_conversations_resume_from_snapshots(client, qwen_server):
    """A side request between two turns of a long conversation (what Claude Code does) does not
    make the next turn prefill the conversation again: the slot kept a snapshot of it."""
    long_system = "You are a careful assistant. " + " ".join(f"Rule {i}: be precise." for i in range(60))
    main = [{"role": "system", "content": long_system}, {"role": "user", "content": "Main question?"}]
    r1 = client.chat.completions.create(model="m", messages=main, max_tokens=4, seed=1)
    assert r1.usage.prompt_tokens > 300
    side = [{"role": "system", "content": "Write a title. " * 40}, {"role": "user", "content": "Title?"}]
    client.chat.completions.create(model="m", messages=side, max_tokens=2, seed=1)
    before = qwen_server.metrics()
    turn2 = main + [{"role": "assistant", "content": r1.choices[0].message.content or ""},
                    {"role": "user", "content": "Follow-up?"}]
    r2 = client.chat.completions.create(model="m", messages=turn2, max_tokens=2, seed=1)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 3
    after = qwen_server.metrics()
    assert after["moegate_prefix_snapshot_restores_total"] == before["moegate_prefix_snapshot_restores_total"] + 1
    assert after["moegate_prefix_snapshots"] >= 1 and after["moegate_prefix_snapshot_bytes"] > 0
    props = qwen_server.get_json("/props")["prefix_snapshots"]
    assert props["restores"] >= 1 and props["ram"]["capacity_bytes"] > 0 and props["disk"] is None


# ------------------------------------------------------------------------------ tool_choice

def _prompt_tokens(server, body: dict) -> tuple[list[int], str]:
    status, out, _ = server.post_json("/tokenize", dict(body, with_pieces=True))
    assert status == 200, out
    return out["tokens"], "".join(out["pieces"])


def test_tool_choice_none_withholds_tools(client, qwen_server):
    plain, _ = _prompt_tokens(qwen_server, {"messages": HI})
    withheld, _ = _prompt_tokens(qwen_server, {"messages": HI, "tools": [WEATHER_TOOL], "tool_choice": "none"})
    offered, text = _prompt_tokens(qwen_server, {"messages": HI, "tools": [WEATHER_TOOL]})
    assert withheld == plain
    assert len(offered) > len(plain) and "get_weather" in text
    r = client.chat.completions.create(model="m", messages=HI, tools=[WEATHER_TOOL], tool_choice="none",
                                       max_tokens=3)
    assert r.usage.prompt_tokens == len(plain)
    assert not r.choices[0].message.tool_calls


@pytest.mark.parametrize("choice, opener", [
    ("required", '<tool_call>\n{"name": "'),
    ({"type": "function", "function": {"name": "get_time"}}, '<tool_call>\n{"name": "get_time", "arguments": '),
])
def test_forced_tool_choice_prefills_the_opener(client, qwen_server, choice, opener):
    body = {"messages": HI, "tools": [WEATHER_TOOL, TIME_TOOL], "tool_choice": choice}
    auto, _ = _prompt_tokens(qwen_server, {"messages": HI, "tools": [WEATHER_TOOL, TIME_TOOL]})
    forced, text = _prompt_tokens(qwen_server, body)
    assert text.endswith(opener), text[-80:]
    assert len(forced) > len(auto)
    # The real generation runs on exactly that prompt, with the parser started inside the call.
    r = client.chat.completions.create(model="m", messages=HI, tools=[WEATHER_TOOL, TIME_TOOL],
                                       tool_choice=choice, max_tokens=12, seed=4)
    assert r.usage.prompt_tokens == len(forced)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason in ("tool_calls", "stop", "length")
    assert not (msg.content or "").startswith("<tool_call>"), "the prefilled opener is never shown"
    for call in msg.tool_calls or []:
        assert call.function.name in ("get_weather", "get_time")
        json.loads(call.function.arguments)
    # The SDK's stream helper copes with whatever the parser made of it.
    with client.chat.completions.stream(model="m", messages=HI, tools=[WEATHER_TOOL, TIME_TOOL],
                                        tool_choice=choice, max_tokens=12, seed=4) as stream:
        final = final_completion(stream)
    assert final.choices[0].message.content == msg.content
    assert final.choices[0].finish_reason == r.choices[0].finish_reason


def test_parallel_tool_calls_false_is_accepted(client):
    r = client.chat.completions.create(model="m", messages=HI, tools=[WEATHER_TOOL, TIME_TOOL],
                                       tool_choice="required", parallel_tool_calls=False, max_tokens=10, seed=6)
    assert len(r.choices[0].message.tool_calls or []) <= 1


def test_tool_history_round_trip_is_accepted(client):
    """A second turn carrying the assistant's call (content null) and the tool's result."""
    messages = HI + [
        {"role": "assistant", "content": None, "reasoning_content": "need weather",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    r = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL], max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # `reasoning` is accepted on input too.
    messages[1] = dict(messages[1], reasoning="need weather")
    del messages[1]["reasoning_content"]
    client.chat.completions.create(model="m", messages=messages, tools=[WEATHER_TOOL], max_tokens=2)


# ---------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"messages": HI, "temperature": 7}, "temperature"),
    ({"messages": HI, "n": 9}, "n"),
    ({"messages": HI, "n": 0}, "n"),
    ({"messages": HI, "max_tokens": 0}, "max_tokens"),
    ({"messages": HI, "max_tokens": "ten"}, "max_tokens"),
    ({"messages": HI, "tool_choice": "required"}, "tool_choice"),
    ({"messages": HI, "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"messages": HI, "tools": [{"type": "retrieval"}]}, "tools"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
])
def test_invalid_requests_are_400_in_openai_shape(qwen_server, body, param):
    status, out, headers = qwen_server.post_json("/v1/chat/completions", dict(body, model="m"))
    assert status == 400, out
    assert set(out) == {"error"}
    assert out["error"]["type"] == "invalid_request_error"
    assert out["error"]["param"] == param
    assert isinstance(out["error"]["message"], str) and out["error"]["message"]
    assert headers.get("x-should-retry") == "false"


def test_sdk_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=HI, tools=[WEATHER_TOOL],
                                       tool_choice={"type": "function", "function": {"name": "missing"}})
    assert err.value.status_code == 400
    assert "missing" in err.value.message


def test_context_overflow(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 6000}],
                                       max_tokens=2)
    assert err.value.code == "context_length_exceeded"


def test_malformed_json_and_unknown_routes(qwen_server):
    import urllib.error
    import urllib.request
    req = urllib.request.Request(qwen_server.url("/v1/chat/completions"), data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400 and json.loads(err.value.read())["error"]["type"] == "invalid_request_error"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(qwen_server.url("/v1/nothing-here"), timeout=10)
    assert err.value.code == 404 and "error" in json.loads(err.value.read())
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(qwen_server.url("/v1/chat/completions"), timeout=10)  # GET
    assert err.value.code == 405 and "error" in json.loads(err.value.read())




# ------------------------------------------------------------------ issue 16: no 5xx from bad input

def raw_post(server, path: str, raw: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """POSTs raw bytes (the JSON escapes a client library would never write)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def assert_openai_400(status: int, out: dict, param: str | None = None) -> None:
    assert status == 400, out
    assert set(out) == {"error"} and out["error"]["type"] == "invalid_request_error", out
    assert isinstance(out["error"]["message"], str) and out["error"]["message"]
    if param is not None:
        assert out["error"]["param"] == param, out


LONE = b"a\\ud800b"


@pytest.mark.parametrize("path, raw", [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "' + LONE + b'"}], "max_tokens": 2}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "system", "content": "' + LONE + b'"}, '
                             b'{"role": "user", "content": "x"}], "max_tokens": 2}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "tools": '
                             b'[{"type": "function", "function": {"name": "' + LONE + b'"}}]}'),
    ("/v1/completions", b'{"prompt": "' + LONE + b'", "max_tokens": 2}'),
    ("/tokenize", b'{"content": "' + LONE + b'"}'),
    ("/tokenize", b'{"messages": [{"role": "user", "content": "' + LONE + b'"}]}'),
    ("/v1/responses", b'{"input": "' + LONE + b'", "max_output_tokens": 2}'),
    ("/v1/responses", b'{"input": "x", "instructions": "' + LONE + b'", "max_output_tokens": 2}'),
    ("/v1/chat/completions", b"[" * 1000 + b"]" * 1000),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}'),
])
def test_lone_surrogates_and_deep_bodies_are_400(qwen_server, path, raw):
    assert_openai_400(*raw_post(qwen_server, path, raw))


def test_deep_tool_schema_with_required_is_400(qwen_server):
    schema: dict = {"type": "string"}
    for _ in range(300):
        schema = {"type": "array", "items": schema}
    tool = {"type": "function", "function": {"name": "deep", "parameters": {
        "type": "object", "properties": {"x": schema}}}}
    for stream in (False, True):
        status, out, _ = qwen_server.post_json("/v1/chat/completions", {
            "model": "m", "messages": HI, "tools": [tool], "tool_choice": "required", "max_tokens": 4,
            "stream": stream})
        assert_openai_400(status, out)


@pytest.mark.parametrize("body, param", [
    ({"seed": -1}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"stream": "false"}, "stream"),
    ({"logprobs": "false"}, "logprobs"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"ignore_eos": "true"}, "ignore_eos"),
    ({"repetition_penalty": "high"}, "repetition_penalty"),
    ({"model": 7}, "model"),
    ({"user": {"id": 1}}, "user"),
    ({"metadata": "x"}, "metadata"),
    ({"max_tokens": 10**12}, "max_tokens"),
    ({"max_tokens": 2**64}, "max_tokens"),
    ({"max_tokens": 10**400}, "max_tokens"),
    ({"max_completion_tokens": 4096}, "max_tokens"),
])
def test_bad_fields_are_400_before_any_stream(qwen_server, body, param):
    """Checked before the stream opens: a 400 status even with stream true."""
    for stream in (False, True):
        full = {"model": "m", "messages": HI, "max_tokens": 4, **body}
        if "stream" not in body:
            full["stream"] = stream
        status, out, _ = qwen_server.post_json("/v1/chat/completions", full)
        assert_openai_400(status, out, param)


def test_max_tokens_that_fits_is_honoured(client, qwen_server):
    prompt = qwen_server.post_json("/tokenize", {"messages": HI})[1]["count"]
    room = qwen_server.get_json("/props")["n_ctx"] - prompt
    status, out, _ = qwen_server.post_json("/v1/chat/completions", {"model": "m", "messages": HI,
                                                                     "max_tokens": room + 1})
    assert_openai_400(status, out, "max_tokens")
    assert out["error"]["code"] == "context_length_exceeded" and str(room) in out["error"]["message"]
    r = client.chat.completions.create(model="m", messages=HI, max_tokens=room, seed=1)
    assert r.usage.completion_tokens <= room
    for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}),
                       ("/v1/responses", {"input": "hi", "max_output_tokens": 10**6})):
        status, out, _ = qwen_server.post_json(path, dict(body, model="m"))
        assert_openai_400(status, out, "max_output_tokens" if "input" in body else "max_tokens")


def test_completions_list_of_prompts(client, qwen_server):
    r = client.completions.create(model="m", prompt=["Once upon", "A long time"], max_tokens=3, n=2, seed=5,
                                  echo=True)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text.startswith("Once upon") and r.choices[1].text.startswith("Once upon")
    assert r.choices[2].text.startswith("A long time") and r.choices[3].text.startswith("A long time")
    single = [client.completions.create(model="m", prompt=p, max_tokens=3, seed=5) for p in ("Once upon", "A long time")]
    assert r.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in single)
    ids = qwen_server.post_json("/tokenize", {"content": "A long time"})[1]["tokens"]
    by_ids = client.completions.create(model="m", prompt=[ids, ids], max_tokens=2, seed=5)
    assert [c.index for c in by_ids.choices] == [0, 1]
    stream = open_stream(qwen_server.base_url, "/v1/completions", {
        "model": "m", "prompt": ["Once upon", "A long time"], "max_tokens": 2, "stream": True, "seed": 5,
        "stream_options": {"include_usage": True}})
    chunks = [e.json() for e in stream.read_all() if e.comment is None and e.data != "[DONE]"]
    finished = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finished == [0, 1]
    assert chunks[-1]["usage"]["prompt_tokens"] == sum(s.usage.prompt_tokens for s in single)


def test_tokenize_counts_a_prompt_longer_than_the_context(qwen_server):
    status, out, _ = qwen_server.post_json("/tokenize", {"messages": [{"role": "user", "content": "word " * 6000}]})
    assert status == 200 and out["count"] > qwen_server.get_json("/props")["n_ctx"]


def test_options_on_an_unknown_path_is_404(qwen_server):
    import http.client

    for path, expected in (("/v1/nothing-here", 404), ("/v1/chat/completions", 204)):
        conn = http.client.HTTPConnection("127.0.0.1", qwen_server.port, timeout=10)
        conn.request("OPTIONS", path, headers={"Origin": "http://localhost:3000",
                                               "Access-Control-Request-Method": "POST"})
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        assert resp.status == expected, (path, resp.status)
        if expected == 404:
            assert json.loads(body)["error"]["type"] == "not_found_error"


def test_non_utf8_api_key_is_401(busy_server):
    import http.client

    for header in ("x-api-key", "Authorization"):
        conn = http.client.HTTPConnection("127.0.0.1", busy_server.port, timeout=10)
        conn.putrequest("GET", "/v1/models")
        conn.putheader(header, b"Bearer \xff\xfe\x80" if header == "Authorization" else b"\xff\xfe\x80")
        conn.endheaders()
        resp = conn.getresponse()
        out = json.loads(resp.read())
        conn.close()
        assert resp.status == 401, (header, out)
        assert out["error"]["type"] == "authentication_error"
    assert busy_server.get_json("/v1/models")["data"]
