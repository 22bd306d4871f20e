"""Other servers' constraint parameters through live servers with the official openai SDK:
vLLM's guided_regex / guided_choice / guided_json / guided_grammar and structured_outputs,
llama.cpp's GBNF `grammar` and `json_schema`, on /v1/chat/completions and /v1/completions.

Random weights write noise, so every assertion holds only because of the grammar: at
temperature 1 the reply matches the regex, is one of the choices, or follows the grammar.
The DeepSeek-V4 server runs in thinking mode: reasoning comes first, then the constrained answer.
"""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

pytest.register_assert_rewrite("server_fixtures")

pytest_plugins = ["server_fixtures"]

ASK = [{"role": "user", "content": "Answer."}]
ARCHS = ["qwen3_moe", "deepseek_v4"]
PHONE = r"\+1-[0-9]{3}-[0-9]{4}"
CHOICES = ["positive", "negative", "neutral"]
GBNF = 'root ::= "move " dir " " [1-9]\ndir ::= "north" | "south" | "east" | "west"'
GBNF_MATCH = re.compile(r"move (north|south|east|west) [1-9]")
LARK = 'start: "id-" NUM\nNUM: /[0-9]{2,4}/'
LARK_MATCH = re.compile(r"id-[0-9]{2,4}")
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0}},
          "required": ["ok", "n"], "additionalProperties": False}


@pytest.fixture(scope="module", params=ARCHS)
def server(request, live_server):
    if request.param == "deepseek_v4":  # same configuration as test_server_reasoning: one server
        return live_server("deepseek_v4", "--reasoning-field", "both", fmt="native")
    return live_server(request.param)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=120)


def chat(client: openai.OpenAI, stream: bool, seed: int, **extra) -> tuple[str, str]:
    """(content, finish_reason) of one chat reply, streamed or not."""
    kwargs = dict(model="m", messages=ASK, max_tokens=64, temperature=1.0, seed=seed, extra_body=extra)
    if not stream:
        r = client.chat.completions.create(**kwargs)
        return r.choices[0].message.content or "", r.choices[0].finish_reason
    text, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            text.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return "".join(text), finish


@pytest.mark.parametrize("extra, check", [
    ({"guided_regex": PHONE}, lambda t: re.fullmatch(PHONE, t)),
    ({"structured_outputs": {"regex": PHONE}}, lambda t: re.fullmatch(PHONE, t)),
    ({"guided_choice": CHOICES}, lambda t: t in CHOICES),
    ({"structured_outputs": {"choice": CHOICES}}, lambda t: t in CHOICES),
    ({"grammar": GBNF}, lambda t: GBNF_MATCH.fullmatch(t)),
    ({"guided_grammar": LARK}, lambda t: LARK_MATCH.fullmatch(t)),
    ({"guided_json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ({"json_schema": json.dumps(SCHEMA)}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
], ids=["guided_regex", "so_regex", "guided_choice", "so_choice", "gbnf", "lark", "guided_json", "json_schema"])
def test_chat_reply_follows_the_constraint(client, extra, check):
    for seed, stream in ((1, False), (2, True), (3, False)):
        text, finish = chat(client, stream, seed, **extra)
        assert finish == "stop", (extra, text, finish)
        assert check(text), (extra, seed, stream, text)


def test_legacy_completions_follow_the_constraint(client):
    for seed in (4, 5):
        r = client.completions.create(model="m", prompt="The answer is", max_tokens=32, temperature=1.0, seed=seed,
                                      extra_body={"guided_choice": CHOICES})
        assert r.choices[0].text in CHOICES and r.choices[0].finish_reason == "stop", r.choices[0]
    chunks = list(client.completions.create(model="m", prompt="Call", max_tokens=32, temperature=1.0, seed=6,
                                            stream=True, extra_body={"guided_regex": PHONE}))
    assert re.fullmatch(PHONE, "".join(c.choices[0].text for c in chunks if c.choices))


@pytest.mark.parametrize("extra, param", [
    ({"guided_regex": "("}, "guided_regex"),
    ({"grammar": "root ::= ("}, "grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", 3]}, "guided_choice"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
    ({"structured_outputs": "x"}, "structured_outputs"),
])
def test_bad_constraints_are_400_naming_the_parameter(server, extra, param):
    status, out, _ = server.post_json("/v1/chat/completions", dict(extra, model="m", messages=ASK))
    assert status == 400, out
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["param"] == param, out
    # and the server is fine afterwards
    status, out, _ = server.post_json("/v1/chat/completions", {"model": "m", "messages": ASK, "max_tokens": 2})
    assert status == 200, out
