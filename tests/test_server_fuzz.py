"""Hypothesis-generated request bodies for every POST route, against one live server (issue 16,
"keep them found").

Each route gets bodies built from its own fields with values of every JSON type (lone surrogates
among the strings, huge and negative integers, deep nesting, wrong shapes), plus raw byte bodies
that are no JSON at all.  Whatever comes in:

* the status is never 5xx;
* a 4xx body is in the route's own error shape (Anthropic's under /v1/messages, OpenAI's
  elsewhere), and a 200 stream carries no server error in its events;
* the server still answers /health afterwards.

Derandomized and bounded (a few dozen examples per route, max_tokens at most 4 whenever it is
valid), so the whole module runs in well under a minute.
"""
from __future__ import annotations

import http.client
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest_plugins = ["server_fixtures"]

FUZZ = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# ------------------------------------------------------------------------------- value strategies

# Strings with lone surrogates too: json.dumps writes them as \udXXX escapes, as a careless client would.
# One surrogate between ordinary characters is always lone (two in a row may make a valid pair,
# which JSON decodes to one character); st.characters gives surrogates only when asked by category.
weird_text = st.builds(lambda head, surrogate, tail: head + surrogate + tail, st.text(max_size=5),
                       st.characters(categories=["Cs"]), st.text(max_size=5))
texts = st.one_of(st.text(max_size=16), weird_text, st.sampled_from(["", "auto", "none", "required", "text",
                                                                      "json_object", "json_schema", "function"]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False), texts,
                    st.sampled_from([10**400, -1, 0, 2**64, 1.5, "false", "true"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(texts, inner, max_size=4), max_leaves=10)


def deep(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


def mostly(good: st.SearchStrategy, weight: int = 8) -> st.SearchStrategy:
    """Usually a well-formed value, one time in `weight` + 1 any JSON at all (a wrong type, a lone
    surrogate ...).  (st.one_of would not weigh repeated branches.)"""
    return st.sampled_from([True] * weight + [False]).flatmap(lambda ok: good if ok else json_values)


# A count that is valid only when small: the server never generates more than 4 tokens.
counts = st.one_of(st.integers(min_value=1, max_value=4), st.integers(min_value=1, max_value=4),
                   st.integers(min_value=10**6, max_value=10**13),
                   st.sampled_from([0, -3, 2**64, 10**400, 2.0, "4", True, None]))
numbers = mostly(st.floats(min_value=0.1, max_value=1.0))
flags = mostly(st.booleans())
words = st.one_of(st.text(max_size=12), st.text(max_size=12), weird_text)
part_types = st.sampled_from(["text", "input_text", "image", "tool_result", "tool_use", "thinking", "image_url",
                              "output_text"])
parts = st.fixed_dictionaries({"type": mostly(part_types), "text": mostly(words)},
                              optional={"id": json_values, "name": json_values, "input": json_values,
                                        "content": json_values, "tool_use_id": mostly(st.just("call_1")),
                                        "is_error": flags})
contents = mostly(st.one_of(words, st.lists(parts, min_size=1, max_size=2)))
call = st.fixed_dictionaries({"id": mostly(st.just("call_1")), "type": mostly(st.just("function")),
                              "function": mostly(st.fixed_dictionaries({
                                  "name": mostly(st.just("get_weather")),
                                  "arguments": mostly(st.sampled_from(['{"city": "Rome"}', "{", "[]", ""]))}))})
message = st.fixed_dictionaries({"role": mostly(st.sampled_from(["user", "user", "assistant", "system", "tool"])),
                                 "content": contents},
                                optional={"tool_calls": mostly(st.lists(call, max_size=2)),
                                          "tool_call_id": mostly(st.just("call_1")),
                                          "reasoning_content": mostly(words)})
messages = mostly(st.lists(message, min_size=1, max_size=3))
schemas = st.one_of(st.just({"type": "object", "properties": {"city": {"type": "string"}}}),
                    st.dictionaries(st.sampled_from(["type", "properties", "required", "items", "enum", "$ref"]),
                                    json_values, max_size=3),
                    json_values)
function = st.fixed_dictionaries({"name": mostly(st.just("get_weather"))},
                                 optional={"parameters": schemas, "description": mostly(words), "strict": json_values})
openai_tools = mostly(st.lists(st.fixed_dictionaries({"type": mostly(st.just("function")),
                                                      "function": mostly(function)}), max_size=2))
anthropic_tools = mostly(st.lists(st.fixed_dictionaries({"name": mostly(st.just("get_weather"))},
                                                        optional={"input_schema": schemas,
                                                                  "description": mostly(words),
                                                                  "type": json_values}), max_size=2))
responses_tools = mostly(st.lists(st.fixed_dictionaries({"type": mostly(st.just("function")),
                                                         "name": mostly(st.just("get_weather"))},
                                                        optional={"parameters": schemas,
                                                                  "description": mostly(words)}), max_size=2))
openai_choice = mostly(st.sampled_from(["auto", "none", "required",
                                        {"type": "function", "function": {"name": "get_weather"}}]))
anthropic_choice = mostly(st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"},
                                           {"type": "tool", "name": "get_weather"},
                                           {"type": "auto", "disable_parallel_tool_use": True}]))
thinking = mostly(st.fixed_dictionaries({"type": mostly(st.sampled_from(["enabled", "adaptive", "disabled"]))},
                                        optional={"budget_tokens": json_values, "display": json_values}))
response_formats = mostly(st.sampled_from([{"type": "text"}, {"type": "json_object"},
                                           {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                                               "type": "object", "properties": {"a": {"type": "integer"}}}}}]))

text_formats = mostly(st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "json_schema", "schema": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}]))

COMMON = {"model": mostly(st.just("m")), "temperature": numbers, "top_p": numbers,
          "top_k": mostly(st.integers(0, 50)), "seed": mostly(st.integers(0, 2**64 - 1)), "stream": flags,
          "stop": mostly(st.lists(words, max_size=2)), "ignore_eos": flags, "metadata": mostly(st.just({})),
          "user": mostly(words), "logprobs": flags, "top_logprobs": mostly(st.integers(0, 3)),
          "min_p": numbers}
CHAT_FIELDS = dict(COMMON, tools=openai_tools, tool_choice=openai_choice, parallel_tool_calls=flags,
                   response_format=response_formats, n=mostly(st.integers(min_value=1, max_value=2)),
                   stream_options=mostly(st.fixed_dictionaries({"include_usage": flags})),
                   reasoning_effort=mostly(st.sampled_from(["low", "high", "none"])),
                   chat_template_kwargs=mostly(st.fixed_dictionaries({"enable_thinking": flags})),
                   logit_bias=mostly(st.dictionaries(st.integers(0, 900).map(str), st.integers(-100, 100),
                                                     max_size=2)),
                   presence_penalty=numbers, frequency_penalty=numbers,
                   repetition_penalty=numbers, guided_regex=mostly(st.just("[ab]{1,3}")),
                   guided_choice=mostly(st.just(["yes", "no"])), structured_outputs=mostly(st.none(), 12),
                   max_completion_tokens=counts)
COMPLETION_FIELDS = dict(COMMON, echo=flags, n=mostly(st.integers(min_value=1, max_value=2)),
                         logprobs=mostly(st.integers(0, 3)),
                         stream_options=mostly(st.fixed_dictionaries({"include_usage": flags})),
                         suffix=mostly(st.none(), 12))
MESSAGES_FIELDS = dict(COMMON, system=contents, tools=anthropic_tools, tool_choice=anthropic_choice,
                       stop_sequences=mostly(st.lists(words, max_size=2)), thinking=thinking,
                       output_config=mostly(st.fixed_dictionaries({"effort": mostly(st.just("low"))})))
RESPONSES_FIELDS = {"model": mostly(st.just("m")), "temperature": numbers, "top_p": numbers,
                    "seed": mostly(st.integers(0, 100)), "stream": flags, "instructions": contents,
                    "tools": responses_tools, "tool_choice": openai_choice, "parallel_tool_calls": flags,
                    "reasoning": mostly(st.fixed_dictionaries({"effort": mostly(st.just("low"))})),
                    "text": mostly(st.fixed_dictionaries({"format": text_formats})), "metadata": mostly(st.just({})),
                    "user": mostly(words), "store": flags,
                    "previous_response_id": mostly(st.none(), 20), "background": mostly(st.just(False))}
responses_items = st.lists(st.one_of(message, st.fixed_dictionaries({
    "type": mostly(st.sampled_from(["function_call", "function_call_output", "reasoning", "message"])),
    "call_id": mostly(st.just("call_1")), "name": mostly(st.just("get_weather")),
    "arguments": mostly(st.just("{}")), "output": json_values})), min_size=1, max_size=3)


def bodies(required: dict, optional: dict) -> st.SearchStrategy:
    """Mostly the route's own body with some fields wrong; now and then any JSON, or a deep one."""
    own = st.fixed_dictionaries(required, optional=optional)
    return mostly(own, 12) | st.sampled_from([deep(150), {"messages": deep(120)}])


ROUTES = {
    "/v1/chat/completions": bodies({"messages": messages, "max_tokens": counts}, CHAT_FIELDS),
    "/v1/completions": bodies({"prompt": mostly(st.one_of(words, st.lists(words, min_size=1, max_size=2),
                                                          st.lists(st.integers(-5, 2000), min_size=1, max_size=4))),
                               "max_tokens": counts}, COMPLETION_FIELDS),
    "/v1/responses": bodies({"input": mostly(st.one_of(words, responses_items)), "max_output_tokens": counts},
                            RESPONSES_FIELDS),
    "/v1/messages": bodies({"messages": messages, "max_tokens": counts}, MESSAGES_FIELDS),
    "/v1/messages/count_tokens": bodies({"messages": messages}, MESSAGES_FIELDS),
    "/tokenize": bodies({}, {"content": contents, "messages": messages,
                             "with_pieces": flags, "tools": openai_tools}),
    "/detokenize": bodies({"tokens": mostly(st.lists(st.integers(min_value=-3, max_value=2000), max_size=5))}, {}),
}

raw_bodies = st.one_of(
    st.binary(max_size=48),
    st.sampled_from([b"", b"{", b"null", b"[]", b'"x"', b"{\"messages\": [}", b"\xff\xfe{}", b"{}" * 3,
                     b'{"max_tokens": 1e999}', b'{"a": NaN}', b'{"a": -Infinity}', b"\xed\xa0\x80",
                     b'{"messages": "\\ud800"}', b"[" * 5000]),
    st.binary(max_size=24).map(lambda b: b'{"messages": [{"role": "user", "content": "' + b + b'"}]}'),
)


# ------------------------------------------------------------------------------- the checks

def post(server, path: str, raw: bytes) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def check_reply(path: str, status: int, content_type: str, data: bytes, sent: bytes) -> None:
    where = f"{path} {sent[:300]!r} -> {status} {data[:300]!r}"
    assert status < 500, where
    anthropic = path.startswith("/v1/messages")
    if status >= 400:
        body = json.loads(data)
        if anthropic:
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, where
            assert body["error"]["message"] and body["request_id"].startswith("req_"), where
        else:
            assert set(body) == {"error"}, where
            assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"], where
        return
    assert status == 200, where
    if content_type.startswith("text/event-stream"):
        # A stream is opened only after every check passed: no error may travel inside it.
        for line in data.decode("utf-8").splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                assert "error" not in event and event.get("type") not in ("error", "response.failed"), where
    else:
        json.loads(data)


@pytest.fixture(scope="module")
def server(qwen_server):
    yield qwen_server
    assert qwen_server.get_json("/health")["status"] == "ok"
    assert qwen_server.proc.poll() is None


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_generated_bodies_never_give_5xx(server, path):
    @FUZZ
    @given(body=ROUTES[path])
    def run(body):
        sent = json.dumps(body).encode()  # ensure_ascii: a lone surrogate goes out as \udXXX
        check_reply(path, *post(server, path, sent), sent)

    run()


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_raw_bodies_never_give_5xx(server, path):
    @settings(FUZZ, max_examples=12)
    @given(raw=raw_bodies)
    def run(raw):
        check_reply(path, *post(server, path, raw), raw)

    run()
