"""OpenAI Responses API (POST /v1/responses, stateless) against live servers, through the official
openai SDK: `responses.create`, streaming, the `responses.stream()` accumulator (strict about
event order and item identities), function tools round trips, forced calls, instructions,
max_output_tokens, reasoning items, errors and cancellation.

Random weights write noise, so these tests assert protocol, never prose; a forced call's
arguments and a json_schema reply validate *because of* the grammar.
"""
from __future__ import annotations

import json

import jsonschema
import openai
import pydantic
import pytest

pytest.register_assert_rewrite("server_fixtures")
from server_fixtures import data_events, open_stream, wait_until  # noqa: E402

pytest_plugins = ["server_fixtures"]

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather of a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"], "additionalProperties": False}}
TIME = {"type": "function", "name": "get_time", "description": "Current time in a timezone", "strict": False,
        "parameters": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
                       "required": ["tz"]}}
TERMINALS = ("response.completed", "response.incomplete", "response.failed")


@pytest.fixture(scope="module")
def client(qwen_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen_server.url("/v1"), api_key="unused", max_retries=0, timeout=120)


def check_usage(usage) -> None:
    u = usage if isinstance(usage, dict) else usage.model_dump()
    assert u["input_tokens"] > 0
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    assert isinstance(u["input_tokens_details"]["cached_tokens"], int)
    assert 0 <= u["output_tokens_details"]["reasoning_tokens"] <= u["output_tokens"]


def check_events(events) -> tuple[list[dict], dict]:
    """Asserts the Responses stream rules on raw SSE events; returns (event data, final response)."""
    data = data_events(events)
    assert data, "no events"
    assert all(e.data != "[DONE]" for e in data), "Responses streams have no [DONE] sentinel"
    out = [e.json() for e in data]
    assert all(e.event == d["type"] for e, d in zip(data, out)), "event: line equals data.type"
    assert [d["sequence_number"] for d in out] == list(range(len(out))), "sequence numbers run 0, 1, 2..."
    types = [d["type"] for d in out]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in TERMINALS and sum(t in TERMINALS for t in types) == 1
    ident = out[0]["response"]["id"]
    assert ident.startswith("resp_") and out[0]["response"]["status"] == "in_progress"
    assert all(d["response"]["id"] == ident for d in out if "response" in d)
    open_item, done_items = None, []
    for d in out[2:-1]:
        kind = d["type"]
        if kind == "response.output_item.added":
            assert open_item is None, "items never interleave"
            assert d["output_index"] == len(done_items)
            open_item = d["item"]
            assert open_item["status"] == "in_progress"
        elif kind == "response.output_item.done":
            assert open_item is not None and d["output_index"] == len(done_items)
            item = d["item"]
            assert (item["type"], item["id"], item.get("call_id")) == \
                   (open_item["type"], open_item["id"], open_item.get("call_id"))
            done_items.append(item)
            open_item = None
        elif kind != "error":
            assert open_item is not None, f"{kind} outside an item"
            assert d["item_id"] == open_item["id"] and d["output_index"] == len(done_items)
    assert open_item is None
    final = out[-1]["response"]
    assert final["output"] == done_items, "the final output is the items the stream closed"
    # The text of each item is the sum of its deltas.
    for index, item in enumerate(done_items):
        deltas = "".join(d["delta"] for d in out if d.get("output_index") == index and d["type"].endswith(".delta"))
        if item["type"] == "message":
            assert [p["type"] for p in item["content"]] == ["output_text"]
            assert item["content"][0]["text"] == deltas and item["id"].startswith("msg_")
        elif item["type"] == "function_call":
            assert item["arguments"] == deltas and item["call_id"] and item["id"].startswith("fc_")
        elif item["type"] == "reasoning":
            assert item["content"][0]["text"] == deltas and item["id"].startswith("rs_")
    if final["status"] != "failed":
        check_usage(final["usage"])
    return out, final


def to_input(items) -> list[dict]:
    """SDK output items as input items for the next turn (what agents replay)."""
    return [i.model_dump(exclude_none=True) for i in items]


# ---------------------------------------------------------------------------------- basics

def test_create_non_streaming(client):
    r = client.responses.create(model="anything", input="Say hi.", max_output_tokens=8, temperature=0.7,
                                extra_body={"seed": 1})
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.model == "anything" and r.status in ("completed", "incomplete")
    assert r.temperature == pytest.approx(0.7) and r.parallel_tool_calls is True and r.tools == []
    assert r.usage.output_tokens <= 8
    check_usage(r.usage)
    for item in r.output:
        assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
        assert [p.type for p in item.content] == ["output_text"]
    assert isinstance(r.output_text, str)
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_streaming_raw_events_and_sdk_iterator(client, qwen_server):
    body = {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}],
            "max_output_tokens": 6, "stream": True, "seed": 4}
    stream = open_stream(qwen_server.base_url, "/v1/responses", body)
    assert stream.status == 200 and stream.resp.getheader("Content-Type").startswith("text/event-stream")
    out, final = check_events(stream.read_all())
    assert final["usage"]["output_tokens"] <= 6
    # The SDK's raw iterator types every event; same seed, same text.
    events = list(client.responses.create(**{k: v for k, v in body.items() if k != "seed"},
                                          extra_body={"seed": 4}))
    assert [e.type for e in events] == [d["type"] for d in out]
    assert events[-1].response.output_text == "".join(
        p["text"] for i in final["output"] if i["type"] == "message" for p in i["content"])


def test_max_output_tokens_gives_incomplete(client, qwen_server):
    # ignore_eos keeps the noise going, so the budget is what ends the reply.
    kwargs = dict(model="m", input="Count.", max_output_tokens=3, extra_body={"ignore_eos": True})
    r = client.responses.create(**kwargs)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3
    assert r.output and r.output[-1].status == "incomplete"

    stream = open_stream(qwen_server.base_url, "/v1/responses",
                         {"model": "m", "input": "Count.", "max_output_tokens": 3, "stream": True,
                          "ignore_eos": True})
    out, final = check_events(stream.read_all())
    assert out[-1]["type"] == "response.incomplete"
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    # The SDK helper delivers the incomplete event; only response.completed gives a final response.
    with client.responses.stream(**kwargs) as helper:
        kinds = [e.type for e in helper]
    assert kinds[-1] == "response.incomplete"


def test_instructions_become_the_system_turn(client):
    plain = client.responses.create(model="m", input="Hi.", max_output_tokens=1)
    told = client.responses.create(model="m", input="Hi.", max_output_tokens=1,
                                   instructions="You are a terse assistant. Answer in one word.")
    assert told.instructions == "You are a terse assistant. Answer in one word."
    assert told.usage.input_tokens > plain.usage.input_tokens + 5
    # A developer message in the input is the same kind of turn.
    dev = client.responses.create(model="m", max_output_tokens=1, input=[
        {"role": "developer", "content": "You are a terse assistant. Answer in one word."},
        {"role": "user", "content": "Hi."}])
    assert dev.usage.input_tokens == told.usage.input_tokens


# ---------------------------------------------------------------------- structured output

class Verdict(pydantic.BaseModel):
    ok: bool
    score: int


def test_stream_helper_parses_a_json_schema_reply(client):
    with client.responses.stream(model="m", input="Judge.", text_format=Verdict, max_output_tokens=60) as helper:
        final = helper.get_final_response()
    assert final.status == "completed"
    assert isinstance(final.output_parsed, Verdict)
    parsed = client.responses.parse(model="m", input="Judge.", text_format=Verdict, max_output_tokens=60)
    assert isinstance(parsed.output_parsed, Verdict)
    assert parsed.text.format.type == "json_schema"


def test_json_object_format(client):
    r = client.responses.create(model="m", input="JSON please.", max_output_tokens=40,
                                text={"format": {"type": "json_object"}})
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)


# --------------------------------------------------------------------------- function tools

@pytest.mark.parametrize("stream", [False, True])
def test_forced_call_validates_and_round_trips(client, stream):
    kwargs = dict(model="m", input=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER, TIME],
                  tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=80)
    if stream:
        with client.responses.stream(**kwargs) as helper:
            first = helper.get_final_response()
    else:
        first = client.responses.create(**kwargs)
    assert first.status == "completed"
    calls = [i for i in first.output if i.type == "function_call"]
    assert len(calls) >= 1 and all(c.name == "get_weather" for c in calls)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
        assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.status == "completed"
    if stream:  # strict tools come back parsed by the SDK helper
        assert calls[0].parsed_arguments == json.loads(calls[0].arguments)

    # Next turn: the client replays the call and answers it with function_call_output.
    second_input = kwargs["input"] + to_input(first.output) + [
        {"type": "function_call_output", "call_id": c.call_id, "output": json.dumps({"temp_c": 21})} for c in calls]
    second = client.responses.create(model="m", input=second_input, tools=[WEATHER, TIME], max_output_tokens=4)
    assert second.status in ("completed", "incomplete")
    # The replayed call and its output are in the prompt.
    assert second.usage.input_tokens > first.usage.input_tokens + 10


def test_required_picks_any_tool_and_parallel_false_keeps_one(client):
    r = client.responses.create(model="m", input="Use a tool.", tools=[WEATHER, TIME], tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=80)
    calls = [i for i in r.output if i.type == "function_call"]
    assert len(calls) == 1 and r.parallel_tool_calls is False
    schema = {"get_weather": WEATHER, "get_time": TIME}[calls[0].name]["parameters"]
    jsonschema.validate(json.loads(calls[0].arguments), schema)


def test_allowed_tools_restricts_the_choice(client):
    r = client.responses.create(model="m", input="Use a tool.", tools=[WEATHER, TIME], max_output_tokens=80,
                                tool_choice={"type": "allowed_tools", "mode": "required",
                                             "tools": [{"type": "function", "name": "get_time"}]})
    names = [i.name for i in r.output if i.type == "function_call"]
    assert names and set(names) == {"get_time"}


def test_codex_style_request_is_accepted(qwen_server):
    """What Codex CLI sends: hosted and custom tools next to function tools, a developer turn,
    a reasoning item with only encrypted content, earlier custom / shell calls, store false,
    include, prompt_cache_key; streamed."""
    body = {"model": "gpt-5-codex", "instructions": "You are a coding agent.", "stream": True, "store": False,
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "abc", "parallel_tool_calls": False,
            "reasoning": {"effort": "medium", "summary": "auto"}, "tool_choice": "auto", "max_output_tokens": 4,
            "tools": [{"type": "function", "name": "shell", "description": "Run a command", "strict": False,
                       "parameters": {"type": "object", "properties": {
                           "command": {"type": "array", "items": {"type": "string"}}}, "required": ["command"]}},
                      {"type": "web_search"}, {"type": "local_shell"},
                      {"type": "custom", "name": "apply_patch", "description": "Patch files",
                       "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
                      {"type": "namespace", "name": "mcp__fs", "description": "Files", "tools": [
                          {"type": "function", "name": "read_file", "parameters": {"type": "object"}}]}],
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox."}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List files."}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
                {"type": "function_call", "call_id": "call_a", "name": "shell",
                 "arguments": json.dumps({"command": ["ls"]})},
                {"type": "function_call_output", "call_id": "call_a", "output": "a.txt\nb.txt"},
                {"type": "custom_tool_call", "call_id": "call_b", "name": "apply_patch", "input": "*** Begin"},
                {"type": "custom_tool_call_output", "call_id": "call_b", "output": "Done"},
                {"type": "web_search_call", "id": "ws_1", "status": "completed"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks."}]}]}
    stream = open_stream(qwen_server.base_url, "/v1/responses", body)
    assert stream.status == 200
    _, final = check_events(stream.read_all())
    assert final["status"] in ("completed", "incomplete") and final["store"] is False


# ------------------------------------------------------------------------------- reasoning

def test_reasoning_items_stream_and_replay(live_server):
    """DeepSeek-V4 with reasoning on: the prompt opens the reasoning block, so the noise is
    reasoning, sent as a reasoning item with reasoning_text deltas."""
    server = live_server("deepseek_v4", "--reasoning-field", "both", fmt="native")
    oa = openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0, timeout=120)
    kwargs = dict(model="m", input="Think first.", max_output_tokens=8, reasoning={"effort": "high"},
                  extra_body={"seed": 3})
    r = oa.responses.create(**kwargs)
    assert r.output[0].type == "reasoning" and r.output[0].id.startswith("rs_")
    text = r.output[0].content[0].text
    assert text and r.output[0].content[0].type == "reasoning_text"
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens

    stream = open_stream(server.base_url, "/v1/responses",
                         {"model": "m", "input": "Think first.", "max_output_tokens": 8, "stream": True,
                          "reasoning": {"effort": "high"}, "seed": 3})
    out, final = check_events(stream.read_all())
    assert "response.reasoning_text.delta" in [d["type"] for d in out]
    assert final["output"][0]["content"][0]["text"] == text
    # Reasoning items are accepted back as input.
    again = oa.responses.create(model="m", max_output_tokens=2,
                                input=[{"role": "user", "content": "Think first."}, *to_input(r.output),
                                       {"role": "user", "content": "Go on."}])
    assert again.usage.input_tokens > r.usage.input_tokens


# ---------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("body, param", [
    ({"model": "m", "input": "hi", "previous_response_id": "resp_123"}, "previous_response_id"),
    ({"model": "m", "input": "hi", "conversation": "conv_1"}, "conversation"),
    ({"model": "m", "input": 42}, "input"),
    ({"model": "m"}, "input"),
    ({"model": "m", "input": []}, "input"),
    ({"model": "m", "input": [{"type": "bogus_item"}]}, "input"),
    ({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, "input"),
    ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "hi", "temperature": "hot"}, "temperature"),
    ({"model": "m", "input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    # found by make fuzz: a schema on a text format was ignored (OpenAI's text format has none)
    ({"model": "m", "input": "hi", "text": {"format": {"type": "text", "schema": "junk"}}}, "text.format"),
    ({"model": "m", "input": "hi", "text": {"format": {"type": "json_object", "schema": {}}}}, "text.format"),
    ({"model": "m", "input": "hi", "text": {"format": {"type": "json_schema", "name": 5, "schema": {}}}},
     "text.format.name"),
    ({"model": "m", "input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice"),
    ({"model": "m", "input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"model": "m", "input": "hi", "tools": [{"type": "function"}]}, "tools"),
])
def test_invalid_requests_are_400_in_openai_shape(qwen_server, body, param):
    for stream in (False, True):
        status, err, headers = qwen_server.post_json("/v1/responses", dict(body, stream=stream))
        assert status == 400, err
        assert err["error"]["type"] == "invalid_request_error" and err["error"]["param"] == param
        assert err["error"]["message"]
        assert headers.get("x-should-retry") == "false"


def test_sdk_raises_bad_request_for_previous_response_id(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="m", input="hi", previous_response_id="resp_abc")
    assert "stateless" in exc.value.message


def test_disconnect_cancels_the_generation(qwen_server):
    before = qwen_server.metrics().get("moegate_requests_cancelled_total", 0.0)
    stream = open_stream(qwen_server.base_url, "/v1/responses",
                         {"model": "m", "input": "Go.", "max_output_tokens": 2000, "stream": True,
                          "ignore_eos": True})
    while True:
        event = stream.next_event()
        assert event is not None
        if event.event == "response.output_text.delta":
            break
    stream.close()
    assert wait_until(lambda: not qwen_server.get_json("/health")["busy"], timeout=10)
    assert qwen_server.metrics()["moegate_requests_cancelled_total"] == before + 1


# ------------------------------------------------------------- engine-free translation checks

def test_input_items_become_one_assistant_turn_per_reply():
    from gateway.server.responses_protocol import parse_responses

    spec = parse_responses({"model": "m", "instructions": "Be brief.", "tools": [WEATHER], "input": [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need a tool."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "3C"}]},
        {"type": "function_call_output", "call_id": "c2", "output": "20C"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Cold and warm."}]}]})
    assert spec.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Need a tool.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3C"},
        {"role": "tool", "tool_call_id": "c2", "content": "20C"},
        {"role": "assistant", "content": "Cold and warm."}]
    assert [t["function"]["name"] for t in spec.tools] == ["get_weather"]


def test_events_satisfy_the_sdk_accumulator():
    """ResponseEvents fed straight into the SDK's own stream state: reasoning, text and two
    calls (one namespaced) rebuild into the same final response."""
    from openai._models import construct_type
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent

    from gateway.server.responses_protocol import ResponseEvents, ResponseObject

    events = ResponseEvents(ResponseObject("resp_x", "m", {"tools": [WEATHER]}, temperature=1.0, top_p=1.0),
                            {"read_file": "mcp__fs"})
    batches = [events.start(),
               events.delta({"reasoning_content": "hm"}), events.delta({"reasoning_content": "m"}),
               events.delta({"content": "Hi"}), events.delta({"content": "!"}),
               events.delta({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                             "function": {"name": "get_weather", "arguments": '{"ci'}}]}),
               events.delta({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}),
               events.delta({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                                             "function": {"name": "read_file", "arguments": "{}"}}]}),
               events.end("tool_calls", {"input_tokens": 3, "output_tokens": 9, "total_tokens": 12,
                                         "input_tokens_details": {"cached_tokens": 0},
                                         "output_tokens_details": {"reasoning_tokens": 2}})]
    state = ResponseStreamState(input_tools=[WEATHER], text_format=openai.NOT_GIVEN)
    for name, data in (e for batch in batches for e in batch):
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=data))
    final = state._completed_response
    assert final is not None and final.status == "completed"
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call", "function_call"]
    assert final.output[0].content[0].text == "hmm" and final.output_text == "Hi!"
    assert final.output[2].parsed_arguments == {"city": "Oslo"}
    assert final.output[3].namespace == "mcp__fs" and final.output[3].call_id == "call_2"


def test_builtin_tool_records_and_tool_output_parts():
    from gateway.server.errors import ApiError
    from gateway.server.responses_protocol import parse_responses

    spec = parse_responses({"model": "m", "input": [
        {"role": "user", "content": "List."},
        {"type": "shell_call", "call_id": "s1", "action": {"commands": ["ls"]}},
        {"type": "shell_call_output", "call_id": "s1", "output": [{"stdout": "a.txt", "stderr": ""}]}]})
    assert spec.messages[1]["tool_calls"][0]["function"] == {"name": "shell", "arguments": '{"commands": ["ls"]}'}
    assert json.loads(spec.messages[2]["content"]) == [{"stdout": "a.txt", "stderr": ""}]
    with pytest.raises(ApiError) as err:
        parse_responses({"model": "m", "input": [
            {"role": "user", "content": "Look."},
            {"type": "function_call", "call_id": "c", "name": "shot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "x"}]}]})
    assert err.value.status == 400 and "input_image" in err.value.message


# ------------------------------------------------------------------ issue 16: bad input is a 400, never a 5xx

@pytest.mark.parametrize("raw", [
    b'{"input": "a\\ud800b"}',
    b'{"input": [{"role": "user", "content": [{"type": "input_text", "text": "a\\udc00"}]}]}',
    b'{"input": "hi", "tools": [{"type": "function", "name": "f\\ud800"}]}',
    b'{"input": ' + b"[" * 500 + b"]" * 500 + b"}",
])
def test_bad_bodies_are_400(qwen_server, raw):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", qwen_server.port, timeout=60)
    conn.request("POST", "/v1/responses", body=raw, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = json.loads(resp.read())
    conn.close()
    assert resp.status == 400 and out["error"]["type"] == "invalid_request_error", out


@pytest.mark.parametrize("extra, param", [
    ({"stream": "false"}, "stream"), ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"user": 5}, "user"), ({"metadata": []}, "metadata"), ({"seed": -1}, "seed"), ({"model": 1}, "model"),
    ({"max_output_tokens": 10**12}, "max_output_tokens"), ({"max_output_tokens": 10**400}, "max_output_tokens"),
    ({"reasoning": {"effort": 1}}, "reasoning.effort"),
])
def test_loose_types_are_400(qwen_server, extra, param):
    for stream in (False, True):
        body = {"model": "m", "input": "hi", "max_output_tokens": 4, "stream": stream, **extra}
        status, err, _ = qwen_server.post_json("/v1/responses", body)
        assert status == 400, err
        assert err["error"]["type"] == "invalid_request_error" and err["error"]["param"] == param
