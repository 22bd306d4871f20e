"""Request parsing (server/openai_protocol.py, anthropic_protocol.py, responses_protocol.py):
every API into one ChatSpec, Anthropic translated to the OpenAI message form, every bad field a
400 naming it."""
from __future__ import annotations

import json

import pytest

from gateway.server.anthropic_protocol import parse_anthropic
from gateway.server.body import parse_json_body
from gateway.server.errors import ApiError
from gateway.server.openai_protocol import parse_openai_chat

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
HI = [{"role": "user", "content": "hi"}]


def test_openai_defaults_and_fields():
    spec = parse_openai_chat({"model": "m", "messages": HI})
    assert spec.tool_choice == "auto" and spec.parallel_tool_calls and not spec.stream
    assert spec.sampling.temperature == 1.0 and spec.max_tokens is None
    spec = parse_openai_chat({"messages": HI, "tools": [TOOL], "tool_choice": "none", "parallel_tool_calls": None,
                              "max_completion_tokens": 7, "stop": "END", "seed": 3, "stream": True,
                              "stream_options": {"include_usage": True}, "top_logprobs": 2, "ignore_eos": True,
                              "chat_template_kwargs": {"enable_thinking": False}, "logit_bias": {"5": -100}})
    assert spec.active_tools == [] and spec.tools == [TOOL]
    assert spec.parallel_tool_calls, "null means the default"
    assert spec.max_tokens == 7 and spec.stop == ["END"] and spec.sampling.seed == 3
    assert spec.include_usage and spec.sampling.logprobs and spec.sampling.top_logprobs == 2
    assert spec.ignore_eos and spec.thinking is False and spec.sampling.logit_bias == {5: -100.0}


def test_openai_tool_choice_forms():
    named = parse_openai_chat({"messages": HI, "tools": [TOOL],
                               "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert named.tool_choice == "function" and named.forced_name == "get_weather" and named.forces_call
    required = parse_openai_chat({"messages": HI, "tools": [TOOL], "tool_choice": "required",
                                  "parallel_tool_calls": False})
    assert required.forces_call and required.forced_name is None and not required.parallel_tool_calls


@pytest.mark.parametrize("body, param", [
    ({"messages": HI, "tool_choice": {"type": "function", "function": {"name": "x"}}, "tools": [TOOL]}, "tool_choice"),
    ({"messages": HI, "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": HI, "tool_choice": {}}, "tool_choice"),
    ({"messages": HI, "tools": [{"type": "function", "function": {}}]}, "tools"),
    ({"messages": HI, "stop": [1]}, "stop"),
    ({"messages": HI, "stop": ["s"] * 17}, "stop"),
    ({"messages": HI, "top_p": 0}, "top_p"),
    ({"messages": HI, "seed": "1"}, "seed"),
    ({"messages": HI, "stream_options": []}, "stream_options"),
    ({"messages": HI, "response_format": {"type": "xml"}}, "response_format"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]}, "messages"),
    ({"messages": "hi"}, "messages"),
])
def test_openai_errors_name_the_field(body, param):
    with pytest.raises(ApiError) as err:
        parse_openai_chat(body)
    assert err.value.status == 400 and err.value.param == param


def test_body_must_be_json_object():
    with pytest.raises(ApiError) as err:
        parse_json_body(b"\xff\xfe")
    assert err.value.status == 400
    with pytest.raises(ApiError):
        parse_openai_chat(["not", "an", "object"])


def test_anthropic_translation():
    body = {"model": "claude", "max_tokens": 10, "system": [{"type": "text", "text": "Be "}, {"type": "text",
                                                                                              "text": "brief."}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "need tool", "signature": "abc"},
                    {"type": "redacted_thinking", "data": "xyz"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "31 C"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
                    {"type": "text", "text": "Thanks"}]}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"], "thinking": {"type": "adaptive", "display": "omitted"},
            "output_config": {"effort": "low"}, "top_k": 5}
    spec = parse_anthropic(body)
    assert spec.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "need tool",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Rome"})}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "31 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"},
        {"role": "user", "content": "Thanks"}]
    assert spec.tools[0]["function"]["name"] == "get_weather"
    assert spec.tool_choice == "function" and spec.forced_name == "get_weather" and not spec.parallel_tool_calls
    assert spec.stop == ["END"] and spec.thinking is True and spec.omit_thinking
    assert spec.reasoning_effort == "low" and spec.sampling.top_k == 5 and spec.max_tokens == 10


def test_anthropic_tool_choice_mapping():
    tools = [{"name": "a", "input_schema": {"type": "object"}}]
    for kind, expected in (("auto", "auto"), ("any", "required"), ("none", "none")):
        spec = parse_anthropic({"max_tokens": 1, "messages": HI, "tools": tools, "tool_choice": {"type": kind}})
        assert spec.tool_choice == expected
    assert parse_anthropic({"max_tokens": 1, "messages": HI, "thinking": {"type": "disabled"}}).thinking is False


@pytest.mark.parametrize("body, param", [
    ({"messages": HI}, "max_tokens"),
    ({"max_tokens": 0, "messages": HI}, "max_tokens"),
    ({"max_tokens": 1, "messages": []}, "messages"),
    ({"max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]}, "messages"),
    ({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "document"}]}]}, "messages"),
    ({"max_tokens": 1, "messages": HI, "tool_choice": {"type": "maybe"}}, "tool_choice"),
    ({"max_tokens": 1, "messages": HI, "tool_choice": {"type": {}}}, "tool_choice"),  # schemathesis: was a 500
    ({"max_tokens": 1, "messages": HI, "tools": [{"input_schema": {}}]}, "tools"),
    ({"max_tokens": 1, "messages": HI, "thinking": "on"}, "thinking"),
    ({"max_tokens": 1, "messages": HI, "stop_sequences": "END!"}, "stop_sequences"),  # a list only (issue 16)
])
def test_anthropic_errors(body, param):
    with pytest.raises(ApiError) as err:
        parse_anthropic(body)
    assert err.value.status == 400 and err.value.param == param


def test_anthropic_stop_sequences_must_be_a_list():
    """Anthropic takes a list only (issue 16 item 8: a bare string used to be accepted)."""
    with pytest.raises(ApiError) as err:
        parse_anthropic({"max_tokens": 1, "messages": HI, "stop_sequences": "x"})
    assert err.value.status == 400 and err.value.param == "stop_sequences"
    assert parse_anthropic({"max_tokens": 1, "messages": HI, "stop_sequences": ["x"]}).stop == ["x"]


# ------------------------------------------------------------------ issue 16: every field typed

@pytest.mark.parametrize("key, value", [
    ("stream", "false"), ("logprobs", "false"), ("parallel_tool_calls", "no"), ("ignore_eos", 1),
    ("repetition_penalty", "1.1"), ("model", 5), ("user", 5), ("metadata", "x"), ("stream", 0),
    ("reasoning_effort", 1), ("chat_template_kwargs", "x"), ("temperature", True), ("seed", 1.5),
    ("n", True), ("top_logprobs", "2"),
])
def test_openai_chat_field_types(key, value):
    with pytest.raises(ApiError) as err:
        parse_openai_chat({"messages": HI, key: value})
    assert err.value.status == 400 and err.value.param == key


def test_openai_nested_field_types():
    for body, param in (({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
                        ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking"),
                        ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]},
                         "tools[0].function.description")):
        with pytest.raises(ApiError) as err:
            parse_openai_chat(dict(body, messages=HI))
        assert err.value.param == param


def test_typed_fields_keep_their_values():
    spec = parse_openai_chat({"messages": HI, "stream": False, "logprobs": False, "parallel_tool_calls": False,
                              "ignore_eos": False, "model": "m", "user": "u", "metadata": {"a": "b"},
                              "repetition_penalty": 1.1})
    assert not spec.stream and not spec.sampling.logprobs and not spec.parallel_tool_calls
    assert spec.model == "m"


@pytest.mark.parametrize("key, value", [
    ("stream", "true"), ("model", ["m"]), ("metadata", []), ("ignore_eos", "1"), ("top_k", 2.5),
])
def test_anthropic_field_types(key, value):
    with pytest.raises(ApiError) as err:
        parse_anthropic({"max_tokens": 1, "messages": HI, key: value})
    assert err.value.status == 400 and err.value.param == key


@pytest.mark.parametrize("key, value", [
    ("stream", "false"), ("parallel_tool_calls", 0), ("user", 1), ("metadata", "x"), ("store", "no"),
    ("model", 1), ("background", "no"),
])
def test_responses_field_types(key, value):
    from gateway.server.responses_protocol import parse_responses

    with pytest.raises(ApiError) as err:
        parse_responses({"input": "hi", key: value})
    assert err.value.status == 400 and err.value.param == key


@pytest.mark.parametrize("seed", [-1, 2**64, -(2**70)])
def test_seed_out_of_range(seed):
    with pytest.raises(ApiError) as err:
        parse_openai_chat({"messages": HI, "seed": seed})
    assert err.value.param == "seed"
    assert parse_openai_chat({"messages": HI, "seed": 2**64 - 1}).sampling.seed == 2**64 - 1


# ------------------------------------------------------------------ issue 16: the body itself

@pytest.mark.parametrize("raw", [
    b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',           # lone high surrogate
    b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}',           # lone low surrogate
    b'{"a\\ud800": 1}',                                                    # in a key
    b'{"messages": [{"role": "user", "content": "a\xed\xa0\x80b"}]}',      # a surrogate as raw bytes
    b"[" * 1000 + b"]" * 1000,                                             # RecursionError in json
    b'{"a": ' + b"[" * 150 + b"]" * 150 + b"}",                            # under Python's limit, over ours
    b'{"temperature": NaN}', b'{"temperature": Infinity}',
    b'{"max_tokens": 1' + b"0" * 5000 + b"}",                              # over int's 4300 digits
])
def test_bodies_that_used_to_fail_deep_inside(raw):
    with pytest.raises(ApiError) as err:
        parse_json_body(raw)
    assert err.value.status == 400


def test_valid_bodies_pass_the_body_checks():
    assert parse_json_body('{"a": "\\ud83d\\ude00 ok"}'.encode()) == {"a": "\U0001f600 ok"}
    nested = b'{"a": ' + b"[" * 90 + b"]" * 90 + b"}"
    assert parse_json_body(nested)["a"]


def test_infinite_numbers_are_refused():
    with pytest.raises(ApiError) as err:
        parse_openai_chat({"messages": HI, "temperature": float("inf")})  # what 1e400 parses to
    assert err.value.param == "temperature"


# ------------------------------------------------------------------ issue 16: thinking budget

@pytest.mark.parametrize("thinking, max_tokens", [
    ({"type": "enabled"}, 4000),                              # budget required when enabled
    ({"type": "enabled", "budget_tokens": 1023}, 4000),       # below Anthropic's minimum
    ({"type": "enabled", "budget_tokens": 2048}, 2048),       # not below max_tokens
    ({"type": "enabled", "budget_tokens": "2048"}, 4000),
    ({"type": "enabled", "budget_tokens": 2048.0}, 4000),
    ({"type": "adaptive", "budget_tokens": 10}, 4000),
    ({"type": "enabled", "budget_tokens": 2048, "display": 1}, 4000),
])
def test_thinking_budget_is_checked_as_anthropic_does(thinking, max_tokens):
    with pytest.raises(ApiError) as err:
        parse_anthropic({"max_tokens": max_tokens, "messages": HI, "thinking": thinking})
    assert err.value.status == 400 and err.value.param.startswith("thinking")


def test_thinking_budget_is_kept():
    spec = parse_anthropic({"max_tokens": 2000, "messages": HI, "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert spec.thinking is True and spec.thinking_budget == 1024
    assert parse_anthropic({"max_tokens": 1, "messages": HI, "thinking": {"type": "adaptive"}}).thinking_budget is None
    off = parse_anthropic({"max_tokens": 1, "messages": HI, "thinking": {"type": "disabled", "budget_tokens": 5000}})
    assert off.thinking is False and off.thinking_budget is None


# ------------------------------------------------------------------ issue 16: minor items

def test_completions_prompt_forms():
    from gateway.server.openai_protocol import parse_completion

    assert parse_completion({"prompt": "a"}).prompts == ["a"]
    assert parse_completion({"prompt": [1, 2]}).prompts == [[1, 2]]
    assert parse_completion({"prompt": ["a", "b"]}).prompts == ["a", "b"]
    assert parse_completion({"prompt": [[1], [2, 3]], "n": 2}).prompts == [[1], [2, 3]]
    for bad in ([], [1, "a"], [["a"]], [True], {"a": 1}, None, ["a", 2]):
        with pytest.raises(ApiError) as err:
            parse_completion({"prompt": bad})
        assert err.value.param == "prompt"
    with pytest.raises(ApiError):
        parse_completion({"prompt": ["a"] * 3, "n": 8})  # 24 choices: over the bound
    for key, value in (("echo", "yes"), ("stream", 1), ("logprobs", True), ("logprobs", -1), ("model", 2)):
        with pytest.raises(ApiError) as err:
            parse_completion({"prompt": "a", key: value})
        assert err.value.param == key


def test_anthropic_tool_use_ids_start_with_toolu():
    from gateway.server.anthropic_protocol import AnthropicBlocks, anthropic_content

    message = {"content": None, "tool_calls": [
        {"id": "call_abc123", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert anthropic_content(message)[0]["id"] == "toolu_abc123"
    events = AnthropicBlocks().delta({"tool_calls": [{"index": 0, "id": "call_abc123", "type": "function",
                                                      "function": {"name": "f", "arguments": "{}"}}]})
    assert events[0][1]["content_block"]["id"] == "toolu_abc123"


def test_message_fields_are_typed():
    for message, param in (({"role": "user", "content": "x", "name": 5}, "messages[0].name"),
                           ({"role": "assistant", "content": None, "tool_calls": [
                               {"id": 5, "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                            "messages[0].tool_calls[0].id")):
        with pytest.raises(ApiError) as err:
            parse_openai_chat({"messages": [message]})
        assert err.value.param == param


@pytest.mark.parametrize("message, param", [
    ({"role": "user", "content": "x", "reasoning_content": 5}, "messages[0].reasoning_content"),
    ({"role": "assistant", "content": "x", "reasoning_content": "ok", "reasoning": 5}, "messages[0].reasoning"),
    ({"role": "user", "content": "x", "thinking": {}}, "messages[0].thinking"),
    ({"role": "user", "content": "x", "tool_call_id": 5}, "messages[0].tool_call_id"),
    ({"role": "user", "content": [{"type": "text", "text": 5}]}, "messages[0].content[0].text"),
    ({"role": "assistant", "content": None, "tool_calls": [{"type": "x", "function": {"name": "f"}}]},
     "messages[0].tool_calls[0].type"),
    # found by make fuzz: calls on a system message were never read, their arguments never checked
    ({"role": "system", "content": None, "tool_calls": [{"function": {"name": "", "arguments": [None]}}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_message_fields_are_typed_for_every_role(message, param):
    """Found by make fuzz: a non-string reasoning_content passed on a user message (the encoder
    only read it on assistant ones).  Every route reading OpenAI-form messages uses this check."""
    with pytest.raises(ApiError) as err:
        parse_openai_chat({"messages": [message]})
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("fmt, param", [
    ({"type": "text", "json_schema": {"schema": {}}}, "response_format"),
    ({"type": "json_object", "json_schema": "junk"}, "response_format"),
    ({"type": "json_schema", "json_schema": {"name": 5, "schema": {}}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"strict": "yes", "schema": {}}}, "response_format.json_schema.strict"),
])
def test_response_format_members_are_typed(fmt, param):
    with pytest.raises(ApiError) as err:
        parse_openai_chat({"messages": HI, "response_format": fmt})
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("body, param", [
    ({"output_config": {"format": {"type": "text", "schema": 5}}}, "output_config.format"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "signature": 5}]}]},
     "messages[0].content[0].signature"),
    ({"messages": [{"role": "assistant", "content": [{"type": "text", "text": "x", "input": "y"}]}]},
     "messages[0].content[0].input"),
])
def test_anthropic_members_are_typed(body, param):
    with pytest.raises(ApiError) as err:
        parse_anthropic({"max_tokens": 1, "messages": HI, **body})
    assert err.value.status == 400 and err.value.param == param


def test_text_formats_without_schema_still_pass():
    from gateway.server.responses_protocol import parse_responses

    assert parse_openai_chat({"messages": HI, "response_format": {"type": "text", "json_schema": None}}).response_format is None
    assert parse_responses({"input": "hi", "text": {"format": {"type": "text"}}}).response_format is None
    assert parse_anthropic({"max_tokens": 1, "messages": HI,
                            "output_config": {"format": {"type": "text", "schema": None}}}).response_format is None


@pytest.mark.parametrize("tool, param", [
    ({"type": "", "name": None, "parameters": [None, None]}, "tools[0].parameters"),  # found by make fuzz
    ({"type": "web_search", "name": 5}, "tools[0].name"),
    ({"type": "function", "name": "f", "description": ["x"]}, "tools[0].description"),
])
def test_responses_tool_members_are_typed_whatever_the_type(tool, param):
    from gateway.server.responses_protocol import parse_responses

    with pytest.raises(ApiError) as err:
        parse_responses({"input": "hi", "tools": [tool]})
    assert err.value.status == 400 and err.value.param == param
