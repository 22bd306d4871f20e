"""Randomised robustness for gateway.toolcalls: any mixture of markers, partial markers, fences,
think tags and calls must parse without exceptions, identically for every chunking, with deltas
that rebuild the message and never run ahead of it (checked by run_all_ways)."""

from __future__ import annotations

import json
import random
import time

import pytest

from gateway.toolcalls import DIALECTS, make_parser
from test_toolcalls_stream import BAR, TOOLS, call_text, calls_of, run, run_all_ways, run_both_modes

D = f"{BAR}DSML{BAR}"
COMMON = ["<think>", "</think>", "\n", "\n\n", " ", "  \t", "```", "```xml\n", "~~~\n", "`", "Hello",
          "東京", "a < b", "{", "}", '"', "\\", "<", ">", "</", "</tool_call>", "<tool_call>", "<tool_",
          "get_weather", "get_time", "launch", "=", "null"]
PER_DIALECT = {
    "glm": ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "city", "days", "3", "<arg_"],
    "qwen_xml": ["<function=", "</function>", "<parameter=", "</parameter>", "<function=get_time>",
                 "<parameter=city>", "</param"],
    "hermes": ['{"name": "get_weather", "arguments": {', '"city": "', '"days": 3', "}}", ", ", ":",
               '{"name": "get_time"}', '"arguments": "{}"'],
    "dsml": [f"<{D}tool_calls>", f"</{D}tool_calls>", f'<{D}invoke name="get_weather">', f"</{D}invoke>",
             f'<{D}parameter name="city" string="true">', f'<{D}parameter name="days" string="false">',
             f"</{D}parameter>", f"<{D}tool_", "<|DSML|tool_calls>"],
}
CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {}),
         ("write_file", {"path": "x", "content": "a\n<b>\n"}), ("launch", {"n": 1})]


def random_text(dialect: str, rng: random.Random) -> str:
    frags = COMMON + PER_DIALECT[dialect]
    parts = []
    for _ in range(rng.randint(1, 18)):
        if rng.random() < 0.15:
            parts.append(call_text(dialect, [rng.choice(CALLS)]))
        else:
            parts.append(rng.choice(frags))
    return "".join(parts)


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("seed", range(25))
def test_random_mixture_is_chunking_invariant(dialect: str, seed: int) -> None:
    rng = random.Random(f"{dialect}-{seed}")
    text = random_text(dialect, rng)
    kwargs = {"in_reasoning": rng.random() < 0.3, "finish": rng.choice(["stop", "stop", "length"])}
    if rng.random() < 0.2:
        kwargs["tools"] = []
    # As a whole response and as a stream that streams long values early (run_both_modes checks
    # that the stream only adds failed calls).
    run_both_modes(f"fuzz-{dialect}-{seed}", dialect, text, **kwargs)


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_every_cut_of_a_call_is_consistent(dialect: str) -> None:
    """Each prefix of a call (a stream cut by max_tokens anywhere) parses without error."""
    text = "Sure.\n" + call_text(dialect, [("get_weather", {"city": "Oslo", "days": 2}), ("get_time", {})])
    for cut in range(len(text) + 1):
        r = run(dialect, [text[:cut]], finish="length")
        whole = run(dialect, list(text[:cut]), finish="length")
        assert r.message == whole.message
        for call in r.message.get("tool_calls", []):
            assert isinstance(json.loads(call["function"]["arguments"]), dict)


ADVERSARIAL = {
    "glm": "<tool_call>" + "a" * 30000,
    "qwen_xml": "<tool_call><function=f><parameter=" + "k" * 30000,
    "hermes": '<tool_call>{"name": "' + "n" * 30000,
    "dsml": f'<{D}tool_calls><{D}invoke name="' + "n" * 30000,
}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_adversarial_long_tokens_stay_fast(dialect: str) -> None:
    text = ADVERSARIAL[dialect]
    parser = make_parser(dialect, TOOLS)
    began = time.perf_counter()
    for i in range(0, len(text), 2):
        parser.feed(text[i:i + 2])
    parser.finish("length")
    assert time.perf_counter() - began < 5.0
    assert "tool_calls" not in parser.message()


def test_hermes_reasoning_block_with_extra_key_is_delivered_once() -> None:
    block = '<tool_call>{"name": "get_time", "arguments": {}, "id": 1}</tool_call>'
    r = run_all_ways("hermes-reset-reasoning", "hermes", "<think>Now:\n" + block)
    assert calls_of(r.message) == [("get_time", {})]
    assert r.counters["reasoning_calls_delivered"] == 1
    assert r.counters["reasoning_calls_kept_as_text"] == 0
