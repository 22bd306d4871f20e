"""Request parsing (server/openai_protocol.py, anthropic_protocol.py, responses_protocol.py):
every API into one ChatSpec, Anthropic translated to the OpenAI message form, every bad field a
400 naming it."""
from __future__ import annotations

import json

import pytest

from gateway.server.anthropic_protocol import parse_anthropic
from gateway.server.errors import ApiError
from gateway.server.openai_protocol import parse_openai_chat
from gateway.server.spec import parse_json_body

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
    ({"max_tokens": 1, "messages": HI, "tools": [{"input_schema": {}}]}, "tools"),
    ({"max_tokens": 1, "messages": HI, "thinking": "on"}, "thinking"),
    ({"max_tokens": 1, "messages": HI, "stop_sequences": "END!"}, None),
])
def test_anthropic_errors(body, param):
    if param is None:  # a single string is accepted as one stop sequence
        assert parse_anthropic(body).stop == ["END!"]
        return
    with pytest.raises(ApiError) as err:
        parse_anthropic(body)
    assert err.value.status == 400 and err.value.param == param
