"""Structured output through live servers with the official SDKs (issue 6).

Tiny random-weight Qwen3-MoE (hermes calls), GLM-4.5-MoE (glm calls) and DeepSeek-V4 (DSML calls)
checkpoints write noise, so everything asserted here must hold *because of* the grammar: a forced
call always parses and its arguments validate with jsonschema, a JSON reply always validates, and
max_tokens cuts a structure only when even its shortest completion cannot fit.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import anthropic
import jsonschema
import openai
import pydantic
import pytest

pytest.register_assert_rewrite("server_fixtures")
from server_fixtures import REPO_ROOT, check_anthropic_events, check_openai_chunks, open_stream  # noqa: E402
from test_structured import SCHEMAS  # noqa: E402  (22 varied tool schemas)

pytest_plugins = ["server_fixtures"]

HI = [{"role": "user", "content": "Use a tool."}]
ARCHS = ["qwen3_moe", "glm4_moe", "deepseek_v4"]
# Unbounded string plus typed values: the case budget steering exists for.
NOTE_TOOL = {"type": "function", "function": {"name": "take_note", "description": "Store a note", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}, "priority": {"type": "integer", "minimum": 1,
                                                                                "maximum": 5},
                                     "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["text", "priority"]}}}


@pytest.fixture(scope="module", params=ARCHS)
def server(request, live_server):
    if request.param == "deepseek_v4":  # same configuration as test_server_reasoning: one server
        return live_server("deepseek_v4", "--reasoning-field", "both", fmt="native")
    return live_server(request.param)


def clients(server) -> tuple[openai.OpenAI, anthropic.Anthropic]:
    return (openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=120),
            anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120))


def anthropic_tool(tool: dict) -> dict:
    fn = tool["function"]
    return {"name": fn["name"], "description": fn.get("description", ""), "input_schema": fn["parameters"]}


def openai_call(oa: openai.OpenAI, stream: bool, **kwargs):
    """(finish_reason, [(name, args dict)], completion) through the SDK (its stream helper too)."""
    if stream:
        kwargs.setdefault("stream_options", {"include_usage": True})
        try:
            with oa.chat.completions.stream(**kwargs) as s:
                completion = s.get_final_completion()
        except openai.LengthFinishReasonError as err:
            completion = err.completion
    else:
        completion = oa.chat.completions.create(**kwargs)
    choice = completion.choices[0]
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
    return choice.finish_reason, calls, completion


def anthropic_call(an: anthropic.Anthropic, stream: bool, **kwargs):
    if stream:
        with an.messages.stream(**kwargs) as s:
            message = s.get_final_message()
    else:
        message = an.messages.create(**kwargs)
    calls = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    return message.stop_reason, calls, message


def validate_calls(calls: list, tools: list[dict], forced: str | None) -> None:
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for name, args in calls:
        assert name in by_name and (forced is None or name == forced)
        jsonschema.validate(args, by_name[name])


# ------------------------------------------------------------------------- forced calls

def test_forced_named_call_validates_for_every_schema(server):
    """22 schemas, each through one of the four SDK paths (OpenAI/Anthropic x stream/not),
    sampled at temperature 1: the single call always completes and validates."""
    oa, an = clients(server)
    for i, tool in enumerate(SCHEMAS):
        name = tool["function"]["name"]
        stream = i % 2 == 1
        if i % 4 < 2:
            finish, calls, _ = openai_call(
                oa, stream, model="m", messages=HI, tools=[tool], max_tokens=96, temperature=1.0, seed=i,
                tool_choice={"type": "function", "function": {"name": name}}, parallel_tool_calls=False)
            assert finish == "tool_calls", (name, finish, calls)
        else:
            finish, calls, _ = anthropic_call(
                an, stream, model="m", messages=HI, tools=[anthropic_tool(tool)], max_tokens=96,
                tool_choice={"type": "tool", "name": name, "disable_parallel_tool_use": True})
            assert finish == "tool_use", (name, finish, calls, _.content, _.usage)
        assert len(calls) == 1, (name, calls)
        validate_calls(calls, [tool], name)


def test_required_any_tool_and_parallel(server):
    oa, an = clients(server)
    tools = SCHEMAS[:6]
    for seed in range(3):
        finish, calls, _ = openai_call(oa, seed == 1, model="m", messages=HI, tools=tools, tool_choice="required",
                                       max_tokens=128, temperature=1.0, seed=seed)
        assert finish == "tool_calls"
        validate_calls(calls, tools, None)
    finish, calls, _ = openai_call(oa, False, model="m", messages=HI, tools=tools, tool_choice="required",
                                   parallel_tool_calls=False, max_tokens=128, temperature=1.0, seed=7)
    assert finish == "tool_calls" and len(calls) == 1
    validate_calls(calls, tools, None)
    stop, calls, _ = anthropic_call(an, True, model="m", messages=HI, tools=[anthropic_tool(t) for t in tools],
                                    tool_choice={"type": "any"}, max_tokens=128)
    assert stop == "tool_use"
    validate_calls(calls, tools, None)


def _shortest_completion(server, body: dict) -> int:
    """What the server's own pipeline computes as the fewest tokens that finish the request's
    structure (the request is prepared in-process on the same checkpoint, never queued)."""
    from gateway.server.openai_protocol import parse_openai_chat
    from gateway.server.pipeline import prepare_chat

    state = _state_for(server.model_dir)
    constraint = prepare_chat(state, parse_openai_chat(body), constrain=True).constraint
    assert constraint is not None
    return int(constraint.need())


_STATES: dict[Path, object] = {}


def _state_for(model_dir: Path):
    from gateway.server.serve import ServeOptions, build_state

    if model_dir not in _STATES:
        _STATES[model_dir] = build_state(ServeOptions(model=str(model_dir), threads=1))
    return _STATES[model_dir]


def test_small_max_tokens_still_closes_the_call(server):
    """Unbounded string: with any budget from the shortest completion up, the call is finished
    (the string, the object, the call closed in time); below it, finish_reason is length."""
    oa, _ = clients(server)
    choice = {"type": "function", "function": {"name": "take_note"}}
    body = {"messages": HI, "tools": [NOTE_TOOL], "tool_choice": choice}
    need = _shortest_completion(server, body)
    assert 3 <= need <= 80, need
    for extra, seed, stream in [(0, 1, False), (1, 2, True), (4, 3, False), (12, 4, True), (30, 5, False)]:
        finish, calls, completion = openai_call(oa, stream, model="m", messages=HI, tools=[NOTE_TOOL],
                                                tool_choice=choice, max_tokens=need + extra, temperature=1.0,
                                                seed=seed)
        assert finish == "tool_calls", (need, extra, finish, calls)
        assert completion.usage.completion_tokens <= need + extra
        validate_calls(calls, [NOTE_TOOL], "take_note")
    finish, _, _ = openai_call(oa, False, model="m", messages=HI, tools=[NOTE_TOOL], tool_choice=choice,
                               max_tokens=max(1, need // 2), temperature=0)
    assert finish == "length"


def test_stream_chunks_of_a_forced_call_are_well_formed(server):
    stream = open_stream(server.base_url, "/v1/chat/completions", {
        "model": "m", "messages": HI, "tools": [NOTE_TOOL], "tool_choice": "required", "max_tokens": 64,
        "stream": True, "stream_options": {"include_usage": True}, "seed": 3})
    assert stream.status == 200
    chunks = check_openai_chunks(stream.read_all(), include_usage=True)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["tool_calls"]
    args = "".join(tc["function"].get("arguments") or "" for c in chunks if c["choices"]
                   for tc in c["choices"][0]["delta"].get("tool_calls") or [])
    jsonschema.validate(json.loads(args), NOTE_TOOL["function"]["parameters"])
    stream = open_stream(server.base_url, "/v1/messages", {
        "model": "m", "messages": HI, "tools": [anthropic_tool(NOTE_TOOL)], "tool_choice": {"type": "any"},
        "max_tokens": 64, "stream": True})
    pairs = check_anthropic_events(stream.read_all())
    assert pairs[-2][1]["delta"]["stop_reason"] == "tool_use"


# --------------------------------------------------------------------- two-turn tool loop

@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_two_turn_tool_loop(server, api, stream):
    """Forced call (small max_tokens, unbounded string) -> tool result -> free answer."""
    oa, an = clients(server)
    question = [{"role": "user", "content": "Note that the meeting moved to Friday."}]
    if api == "openai":
        finish, calls, first = openai_call(oa, stream, model="m", messages=question, tools=[NOTE_TOOL],
                                           tool_choice="required", max_tokens=64, seed=11)
        assert finish == "tool_calls"
        validate_calls(calls, [NOTE_TOOL], None)
        call = first.choices[0].message.tool_calls[0]
        messages = question + [{"role": "assistant", "content": first.choices[0].message.content,
                                "tool_calls": [call.model_dump(exclude_none=True)]},
                               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"saved": True})}]
        finish2, calls2, second = openai_call(oa, stream, model="m", messages=messages, tools=[NOTE_TOOL],
                                              max_tokens=16, seed=12)
        assert finish2 in ("stop", "length", "tool_calls")
        assert second.usage.completion_tokens <= 16
        assert second.choices[0].message.role == "assistant"
    else:
        stop, calls, first = anthropic_call(an, stream, model="m", messages=question,
                                            tools=[anthropic_tool(NOTE_TOOL)], tool_choice={"type": "any"},
                                            max_tokens=64)
        assert stop == "tool_use"
        validate_calls(calls, [NOTE_TOOL], None)
        use = next(b for b in first.content if b.type == "tool_use")
        replay = [b.model_dump(exclude_none=True, exclude={"citations", "caller"}) for b in first.content]
        messages = question + [{"role": "assistant", "content": replay},
                               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                             "content": json.dumps({"saved": True})}]}]
        stop2, _, second = anthropic_call(an, stream, model="m", messages=messages,
                                          tools=[anthropic_tool(NOTE_TOOL)], max_tokens=16)
        assert stop2 in ("end_turn", "max_tokens", "tool_use")
        assert second.role == "assistant" and second.usage.output_tokens <= 16


# ------------------------------------------------------------------------- JSON replies

class Movie(pydantic.BaseModel):
    title: str
    year: int
    genres: list[str]
    rating: float | None


MOVIE_SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
    "genres": {"type": "array", "items": {"type": "string", "enum": ["drama", "comedy", "sci-fi"]}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["title", "year", "genres", "ok"], "additionalProperties": False}


def test_openai_response_format_with_the_sdk_parse_helpers(server):
    oa, _ = clients(server)
    for seed, max_tokens in [(1, 40), (2, 120)]:
        done = oa.chat.completions.parse(model="m", messages=HI, response_format=Movie, max_tokens=max_tokens,
                                         seed=seed)
        assert done.choices[0].finish_reason == "stop"
        assert isinstance(done.choices[0].message.parsed, Movie)
    with oa.chat.completions.stream(model="m", messages=HI, response_format=Movie, max_tokens=60, seed=3) as s:
        final = s.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Movie)
    r = oa.chat.completions.create(model="m", messages=HI, response_format={"type": "json_object"}, max_tokens=30,
                                   seed=4)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = oa.chat.completions.create(model="m", messages=HI, max_tokens=50, seed=5, response_format={
        "type": "json_schema", "json_schema": {"name": "movie", "schema": MOVIE_SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), MOVIE_SCHEMA)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_anthropic_output_config_format(server, stream):
    _, an = clients(server)
    fmt = {"format": {"type": "json_schema", "schema": MOVIE_SCHEMA}}
    stop, _, message = anthropic_call(an, stream, model="m", messages=HI, max_tokens=50, output_config=fmt)
    assert stop == "end_turn"
    text = "".join(b.text for b in message.content if b.type == "text")
    jsonschema.validate(json.loads(text), MOVIE_SCHEMA)


# ------------------------------------------------------------------------------ errors

@pytest.mark.parametrize("schema, why", [
    ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength"),
    ({"enum": []}, ""),
])
def test_unsatisfiable_schemas_are_400_with_a_reason(qwen_server, schema, why):
    oa, an = clients(qwen_server)
    tool = {"type": "function", "function": {"name": "bad", "parameters": {
        "type": "object", "properties": {"x": schema}, "required": ["x"]}}}
    with pytest.raises(openai.BadRequestError) as err:
        oa.chat.completions.create(model="m", messages=HI, tools=[tool], tool_choice="required", max_tokens=8)
    assert err.value.param == "tools" and "cannot be enforced" in err.value.message
    assert why in err.value.message
    with pytest.raises(anthropic.BadRequestError) as err2:
        an.messages.create(model="m", messages=HI, max_tokens=8, tools=[anthropic_tool(tool)],
                           tool_choice={"type": "tool", "name": "bad"})
    assert "cannot be enforced" in str(err2.value)
    with pytest.raises(openai.BadRequestError) as err:
        oa.chat.completions.create(model="m", messages=HI, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert err.value.param == "response_format"
    with pytest.raises(anthropic.BadRequestError):
        an.messages.create(model="m", messages=HI, max_tokens=8,
                           output_config={"format": {"type": "json_schema", "schema": schema}})


def test_constrained_requests_are_counted(qwen_server):
    oa, _ = clients(qwen_server)
    before = qwen_server.metrics()
    oa.chat.completions.create(model="m", messages=HI, response_format={"type": "json_object"}, max_tokens=12)
    after = qwen_server.metrics()
    assert after["moegate_constrained_requests_total"] == before["moegate_constrained_requests_total"] + 1
    assert after["moegate_constraint_masks_total"] > before["moegate_constraint_masks_total"]


# ----------------------------------------------------------------- the probe on the demo

def test_try_tool_calling_force_passes_on_the_demo(tmp_path):
    """`python -m gateway` with no --model serves the demo (written into MOEGATE_CACHE); the
    two-turn probe with tool_choice required/any on turn 1 passes through both SDKs."""
    env = dict(os.environ, MOEGATE_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
    log = tmp_path / "server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", "0",
                                 "--threads", "1"], stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    try:
        base = _wait_listening(proc, log)
        done = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "try_tool_calling.py"), "--base-url", base,
                               "--force", "--max-tokens", "96", "--timeout", "300"],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[-1] == "4/4 passed"
        assert "random-weight demo" in done.stdout
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _wait_listening(proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")
        found = re.search(r"listening\s+(http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
        if found:
            try:
                with urllib.request.urlopen(found.group(1) + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return found.group(1)
            except OSError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"the demo server did not start:\n{log.read_text(errors='replace')}")


# ----------------------------------------------------------------- issue 16: budgets, nesting, invalid schemas

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"]}
PERSON_SHORTEST = '{"name": "", "age": 0, "tags": []}'


def _person_format() -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}


def test_json_reply_finishes_at_every_budget_that_fits(server):
    """Live on the demo: max_tokens 16-21 ended with length and `{"name": "", "age": 0, "tags": [""`
    although the 15-token answer fits.  From the shortest fitting budget up, every reply is
    valid JSON for the schema with finish_reason stop."""
    oa, _ = clients(server)
    body = {"messages": HI, "response_format": _person_format()}
    need = _shortest_completion(server, body)
    state = _state_for(server.model_dir)
    from gateway.server.openai_protocol import parse_openai_chat
    from gateway.server.pipeline import prepare_chat
    opens_reasoning = prepare_chat(state, parse_openai_chat(body)).in_reasoning
    # The tokenizer's own spelling of the shortest answer, the stop token, and "</think>" first
    # when the prompt opened reasoning: the planner's need is no more than that.
    spelled = len(state.tokenizer.encode(PERSON_SHORTEST)) + 1 + int(opens_reasoning)
    assert need <= spelled, (need, spelled)
    for budget in range(need, need + 8):
        stream = budget % 2 == 1
        finish, _, completion = openai_call(oa, stream, model="m", messages=HI, response_format=_person_format(),
                                            max_tokens=budget, temperature=1.0, seed=budget)
        content = completion.choices[0].message.content
        assert finish == "stop", (budget, need, content)
        assert completion.usage.completion_tokens <= budget
        jsonschema.validate(json.loads(content), PERSON)


def _nested(depth: int) -> dict:
    """`depth` objects, each holding the next under a required key (additional keys allowed)."""
    schema: dict = {"type": "string"}
    for level in range(depth):
        schema = {"type": "object", "properties": {f"k{level}": schema}, "required": [f"k{level}"]}
    return schema


def test_ten_levels_of_nesting_work_in_replies_and_forced_calls(server):
    """Was 400 "the schema admits no value that can be generated" from 5 objects deep in
    response_format and 6 in a forced call."""
    oa, an = clients(server)
    schema = _nested(10)
    r = oa.chat.completions.create(model="m", messages=HI, max_tokens=200, seed=1, response_format={
        "type": "json_schema", "json_schema": {"name": "deep", "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    tool = {"type": "function", "function": {"name": "deep", "parameters": _nested(11)}}
    for stream, seed in [(False, 2), (True, 3)]:
        finish, calls, _ = openai_call(oa, stream, model="m", messages=HI, tools=[tool], max_tokens=200, seed=seed,
                                       tool_choice={"type": "function", "function": {"name": "deep"}})
        assert finish == "tool_calls"
        validate_calls(calls, [tool], "deep")
    stop, calls, _ = anthropic_call(an, False, model="m", messages=HI, tools=[anthropic_tool(tool)],
                                    tool_choice={"type": "tool", "name": "deep"}, max_tokens=200)
    assert stop == "tool_use"
    validate_calls(calls, [tool], "deep")


@pytest.mark.parametrize("levels,why", [
    (40, "nests more than"),  # 80 containers: past the schema bound, inside the body's
    (300, "nested deeper than 100 levels"),  # the body's own bound (body.parse_json_body) comes first
])
def test_pathological_nesting_is_a_clear_400(qwen_server, levels, why):
    deep = _nested(levels)
    tool = {"type": "function", "function": {"name": "deep", "parameters": deep}}
    for body in ({"tools": [tool], "tool_choice": "required"}, {"tools": [tool]},
                 {"response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": deep}}}):
        t0 = time.monotonic()
        status, out, _ = qwen_server.post_json("/v1/chat/completions", dict(body, model="m", messages=HI,
                                                                             max_tokens=8))
        assert status == 400, out
        assert why in out["error"]["message"] and time.monotonic() - t0 < 10, out
    status, out, _ = qwen_server.post_json("/v1/messages", {
        "model": "m", "messages": HI, "max_tokens": 8, "tools": [anthropic_tool(tool)],
        "tool_choice": {"type": "any"}})
    assert status == 400 and out["type"] == "error" and why in out["error"]["message"], out
    status, _, _ = qwen_server.post_json("/v1/chat/completions", {"model": "m", "messages": HI, "max_tokens": 2})
    assert status == 200


# Invalid JSON Schemas, each with the JSON path its 400 must name.
BAD_SCHEMAS = [
    ({"$ref": "#/$defs/nope"}, "$['$ref']"),
    ({"type": "object", "properties": [{"q": {"type": "string"}}]}, "$.properties"),
    ({"type": "object", "properties": {"q": {"type": "string"}}, "required": "q"}, "$.required"),
    ({"type": "object", "properties": {"q": {"type": "strng"}}}, "$.properties.q.type"),
]


def _openai_error(status: int, out: dict, param: str, *words: str) -> None:
    assert status == 400, out
    err = out["error"]
    assert set(err) == {"message", "type", "param", "code"}, out
    assert err["type"] == "invalid_request_error" and err["param"] == param, out
    assert err["code"] == "invalid_json_schema", out
    for word in words:
        assert word in err["message"], (word, err["message"])


@pytest.mark.parametrize("schema, path", BAD_SCHEMAS)
def test_invalid_schemas_are_400_naming_the_tool_and_path_openai(qwen_server, schema, path):
    tool = {"type": "function", "function": {"name": "lookup", "parameters": schema}}
    status, out, _ = qwen_server.post_json("/v1/chat/completions", {"model": "m", "messages": HI, "tools": [tool],
                                                                     "max_tokens": 4})
    _openai_error(status, out, "tools", "tool 'lookup'", f"at {path}:")
    status, out, _ = qwen_server.post_json("/v1/chat/completions", {
        "model": "m", "messages": HI, "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    _openai_error(status, out, "response_format", "'response_format'", f"at {path}:")
    status, out, _ = qwen_server.post_json("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 4,
                                                               "guided_json": schema})
    _openai_error(status, out, "guided_json", "'guided_json'", f"at {path}:")
    # and through the SDK, which raises its own error carrying the same fields
    oa, _ = clients(qwen_server)
    with pytest.raises(openai.BadRequestError) as err:
        oa.chat.completions.create(model="m", messages=HI, tools=[tool], tool_choice="required", max_tokens=4)
    assert err.value.param == "tools" and path in err.value.message


@pytest.mark.parametrize("schema, path", BAD_SCHEMAS)
def test_invalid_schemas_are_400_naming_the_tool_and_path_responses(qwen_server, schema, path):
    status, out, _ = qwen_server.post_json("/v1/responses", {
        "model": "m", "input": "hi", "max_output_tokens": 4,
        "tools": [{"type": "function", "name": "lookup", "parameters": schema}]})
    _openai_error(status, out, "tools", "tool 'lookup'", f"at {path}:")
    status, out, _ = qwen_server.post_json("/v1/responses", {
        "model": "m", "input": "hi", "max_output_tokens": 4,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}})
    _openai_error(status, out, "text.format", "'text.format'", f"at {path}:")


@pytest.mark.parametrize("schema, path", BAD_SCHEMAS)
def test_invalid_schemas_are_400_naming_the_tool_and_path_anthropic(qwen_server, schema, path):
    status, out, _ = qwen_server.post_json("/v1/messages", {
        "model": "m", "messages": HI, "max_tokens": 4,
        "tools": [{"name": "lookup", "description": "", "input_schema": schema}]})
    assert status == 400 and out["type"] == "error", out
    assert out["error"]["type"] == "invalid_request_error", out
    assert "tool 'lookup'" in out["error"]["message"] and f"at {path}:" in out["error"]["message"], out
    status, out, _ = qwen_server.post_json("/v1/messages", {
        "model": "m", "messages": HI, "max_tokens": 4,
        "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert status == 400 and out["type"] == "error", out
    assert "'output_config.format'" in out["error"]["message"] and f"at {path}:" in out["error"]["message"], out
    _, an = clients(qwen_server)
    with pytest.raises(anthropic.BadRequestError) as err:
        an.messages.create(model="m", messages=HI, max_tokens=4,
                           tools=[{"name": "lookup", "input_schema": schema}])
    assert path in str(err.value)


def test_valid_refs_and_drafts_still_pass(qwen_server):
    """Local $refs, $defs and draft-07 definitions are fine, and the server stays up after 400s."""
    tool = {"type": "function", "function": {"name": "who", "parameters": {
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "properties": {"p": {"$ref": "#/definitions/person"}}, "required": ["p"],
        "definitions": {"person": {"type": "object", "properties": {"name": {"type": "string"}},
                                   "required": ["name"], "additionalProperties": False}}}}}
    oa, _ = clients(qwen_server)
    finish, calls, _ = openai_call(oa, False, model="m", messages=HI, tools=[tool], tool_choice="required",
                                   max_tokens=64, seed=1)
    assert finish == "tool_calls"
    validate_calls(calls, [tool], "who")
