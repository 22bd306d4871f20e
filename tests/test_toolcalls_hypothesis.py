"""Hypothesis-generated tool-call texts for every dialect (issue 16, "keep them found").

Three generators, each derandomised and bounded so the file runs in seconds:

* well-formed calls between prose: the exact calls and content come out, however the text is cut
  into chunks (hypothesis picks the cuts too), as a whole response and as a stream;
* malformed blocks (a value's close tag dropped, a stray word before the block's close, a cut
  anywhere inside the block) with values short and long, on both sides of the streaming commit
  point: a whole response keeps the raw text as content and gives no call (issues 16.1, 16.2); a
  stream shows only failed calls and the very same content;
* free mixtures of markers, partial markers, think tags, fences and blocks: no exception, every
  chunking gives the same result, and the stream agrees with the whole response.

The checks themselves are test_toolcalls_stream's run_all_ways (deltas rebuild the message, no
marker leaks, chunking invariance) and run_both_modes (what a stream may add: failed calls only).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.toolcalls import DIALECTS
from gateway.toolcalls.core import STREAM_AFTER_CHARS
from test_toolcalls_stream import BAR, calls_of, run, run_both_modes

D = f"{BAR}DSML{BAR}"
DIALECT_NAMES = sorted(DIALECTS)
FUZZ = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Characters that can never form a tag, marker, fence or think tag (no letters but x, no bars or
# backticks), while still giving the parser '<', '>', '/', quotes, escapes and non-ASCII to chew on.
SAFE = st.sampled_from(list("x <>/\\\"'{}[]:,=&;\n\t") + ["東", "é", "\u2581"])
PROSE = st.text(SAFE, max_size=30)
# Strings for schema-`string` parameters: short ones (checked before streaming) and long ones
# (past the commit point of a streamed response).
SHORT_VALUE = st.text(SAFE, max_size=20)
LONG_VALUE = st.text(SAFE, min_size=STREAM_AFTER_CHARS + 1, max_size=STREAM_AFTER_CHARS + 120)
VALUE = st.one_of(SHORT_VALUE, LONG_VALUE)


@st.composite
def call(draw: st.DrawFn, value: st.SearchStrategy[str] = VALUE) -> tuple[str, dict[str, Any]]:
    """A call to one of test_toolcalls_stream.TOOLS with arguments its schema types exactly."""
    kind = draw(st.sampled_from(["get_weather", "write_file", "get_time", "calc"]))
    if kind == "get_time":
        return kind, {}
    if kind == "write_file":
        keys = draw(st.lists(st.sampled_from(["path", "content"]), min_size=1, max_size=2, unique=True))
        return kind, {k: draw(value) for k in keys}
    if kind == "calc":
        args: dict[str, Any] = {"n": draw(st.integers(-10**6, 10**6))}
        if draw(st.booleans()):
            args["flag"] = draw(st.booleans())
        return kind, args
    args = {"city": draw(value)}
    if draw(st.booleans()):
        args["days"] = draw(st.integers(0, 30))
    return kind, args


def _raw(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def block(dialect: str, calls: list[tuple[str, dict[str, Any]]], compact: bool = False) -> str:
    """One block in the dialect's own layout (no leading whitespace: that is the prose's);
    `compact`: glm / qwen_xml without newlines between the tags (GLM-4.7's layout)."""
    nl = "" if compact else "\n"
    if dialect == "dsml":
        invokes = "".join(
            f'<{D}invoke name="{name}">\n' + "".join(
                f'<{D}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                f"{_raw(v)}</{D}parameter>\n" for k, v in args.items()) + f"</{D}invoke>\n"
            for name, args in calls)
        return f"<{D}tool_calls>\n{invokes}</{D}tool_calls>"
    [(name, args)] = calls
    if dialect == "glm":
        pairs = "".join(f"<arg_key>{k}</arg_key>{nl}<arg_value>{_raw(v)}</arg_value>{nl}" for k, v in args.items())
        return f"<tool_call>{name}{nl}{pairs}</tool_call>"
    if dialect == "qwen_xml":
        params = "".join(f"<parameter={k}>{nl}{_raw(v)}{nl}</parameter>{nl}" for k, v in args.items())
        return f"<tool_call>{nl}<function={name}>{nl}{params}</function>{nl}</tool_call>"
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def cut_at(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:])]


def check_cuts(dialect: str, text: str, cuts: list[int], expected: dict, **kwargs: Any) -> None:
    """Hypothesis' own chunking gives the message of the whole text (run_all_ways tried 3)."""
    assert run(dialect, cut_at(text, cuts), **kwargs).message == expected


# ---------------------------------------------------------------------------- well formed
@st.composite
def well_formed(draw: st.DrawFn, dialect: str) -> tuple[str, list, str | None]:
    """(text, expected calls, expected content): prose and blocks, alternating."""
    parts, calls, content = [], [], []
    after_block = False
    for _ in range(draw(st.integers(1, 3))):
        prose = draw(PROSE)
        parts.append(prose)
        content.append(prose.lstrip() if after_block else prose)  # a block takes its trailing space
        compact = dialect in COMPACT and draw(st.booleans())
        value = VALUE.map(_edge_newlines_dropped) if compact and dialect == "qwen_xml" else VALUE
        block_calls = [draw(call(value=value))]
        if dialect == "dsml" and draw(st.booleans()):
            block_calls.append(draw(call()))
        parts.append(block(dialect, block_calls, compact))
        calls += block_calls
        after_block = True
    tail = draw(PROSE)
    parts.append(tail)
    content.append(tail.lstrip())
    joined = "".join(content).strip()
    return "".join(parts), calls, joined or None


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@FUZZ
@given(data=st.data(), cuts=st.lists(st.integers(0, 10**4), max_size=12))
def test_generated_well_formed_calls_parse_exactly(data: st.DataObject, dialect: str, cuts: list[int]) -> None:
    text, calls, content = data.draw(well_formed(dialect))
    whole, streamed = run_both_modes("hyp-good", dialect, text)
    assert calls_of(whole.message) == calls
    assert whole.message["content"] == content
    assert streamed.failed == []
    check_cuts(dialect, text, cuts, whole.message)
    check_cuts(dialect, text, cuts, streamed.message, stream_long_values=True)


# ---------------------------------------------------------------------------- malformed
VALUE_CLOSES = {"glm": "</arg_value>", "qwen_xml": "\n</parameter>", "dsml": f"</{D}parameter>", "hermes": '"'}
COMPACT = {"glm", "qwen_xml"}


def _edge_newlines_dropped(value: str) -> str:
    # Compact qwen_xml: the one newline after <parameter=K> and before </parameter> is layout.
    return value.strip("\n")
BLOCK_CLOSES = {"glm": "</tool_call>", "qwen_xml": "</tool_call>", "dsml": f"</{D}tool_calls>",
                "hermes": "\n</tool_call>"}


@st.composite
def malformed(draw: st.DrawFn, dialect: str) -> tuple[str, str]:
    """(block text, how it was broken): a block that can no longer be well formed."""
    compact = dialect in COMPACT and draw(st.booleans())
    value = VALUE.map(_edge_newlines_dropped) if compact else VALUE
    name, args = draw(call(value=value).filter(lambda c: any(isinstance(v, str) for v in c[1].values())))
    good = block(dialect, [(name, args)], compact)
    how = draw(st.sampled_from(["drop_value_close", "stray_word", "cut"]))
    close = VALUE_CLOSES[dialect].lstrip("\n") if compact else VALUE_CLOSES[dialect]
    if how == "drop_value_close":
        # A string value's close goes missing: the next key, or the block's end, comes first.
        strings = [v for v in args.values() if isinstance(v, str)]
        value = draw(st.sampled_from(strings))
        encoded = json.dumps(value, ensure_ascii=False)[1:-1] if dialect == "hermes" else value
        at = good.index(encoded + close, good.index(">") + 1) + len(encoded)
        return good[:at] + good[at + len(close):], how
    if how == "stray_word":
        at = good.rindex(BLOCK_CLOSES[dialect])
        return good[:at] + "oops" + good[at:], how
    return good[:draw(st.integers(1, len(good) - 1))], how  # max_tokens ran out inside the block


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@settings(FUZZ, max_examples=30)  # the generator the defects hide in gets more tries
@given(data=st.data(), cuts=st.lists(st.integers(0, 10**4), max_size=12))
def test_generated_malformed_blocks_stay_text(data: st.DataObject, dialect: str, cuts: list[int]) -> None:
    bad, how = data.draw(malformed(dialect))
    before, after = data.draw(PROSE), data.draw(PROSE)
    text = before + bad + ("" if how == "cut" else after)
    finish = "length" if how == "cut" else "stop"
    whole, streamed = run_both_modes(f"hyp-bad-{how}", dialect, text, finish=finish)
    assert "tool_calls" not in whole.message, how
    assert whole.message["content"] == (text.strip() or None)
    assert streamed.complete_calls == 0 and streamed.failed == list(range(len(streamed.message.get("tool_calls", []))))
    check_cuts(dialect, text, cuts, whole.message, finish=finish)
    check_cuts(dialect, text, cuts, streamed.message, finish=finish, stream_long_values=True)


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@FUZZ
@given(data=st.data())
def test_malformed_block_next_to_a_good_one(data: st.DataObject, dialect: str) -> None:
    """Per block: the good one is delivered in both modes, the bad one stays text."""
    bad, how = data.draw(malformed(dialect).filter(lambda b: b[1] != "cut"))
    good_call = data.draw(call(value=SHORT_VALUE))
    good = block(dialect, [good_call])
    bad_first = data.draw(st.booleans())
    text = f"{bad}\n{good}" if bad_first else f"{good}\n{bad}"
    whole, streamed = run_both_modes("hyp-bad-and-good", dialect, text)
    assert calls_of(whole.message) == [good_call], how
    assert whole.message["content"] == bad.strip()


# ---------------------------------------------------------------------------- free mixtures
FRAGMENTS = {
    "glm": ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<arg_",
            "get_weather", "city", "days", "write_file", "content"],
    "qwen_xml": ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>",
                 "<function=get_time>", "<parameter=city>", "<parameter=content>", "</param", "write_file>"],
    "hermes": ["<tool_call>", "</tool_call>", '{"name": "get_weather", "arguments": {', '"city": "', '"days": 3',
               "}}", ", ", ":", '{"name": "get_time"}', '"arguments": "{}"', "<tool_"],
    "dsml": [f"<{D}tool_calls>", f"</{D}tool_calls>", f'<{D}invoke name="write_file">', f"</{D}invoke>",
             f'<{D}parameter name="content" string="true">', f'<{D}parameter name="days" string="false">',
             f"</{D}parameter>", f"<{D}tool_", "<|DSML|tool_calls>"],
}
COMMON = ["<think>", "</think>", "\n", "\n\n", " ", "```", "```xml\n", "~~~\n", "`", "Hello", "東京", "<", ">"]


@st.composite
def mixture(draw: st.DrawFn, dialect: str) -> str:
    piece = st.one_of(
        st.sampled_from(COMMON + FRAGMENTS[dialect]),
        PROSE,
        st.builds(lambda c: block(dialect, [c]), call()),
        malformed(dialect).map(lambda b: b[0]),
    )
    return "".join(draw(st.lists(piece, min_size=1, max_size=12)))


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@FUZZ
@given(data=st.data(), in_reasoning=st.booleans(),
       finish=st.sampled_from(["stop", "length"]), cuts=st.lists(st.integers(0, 10**4), max_size=12))
def test_generated_mixtures_are_chunking_invariant(data: st.DataObject, dialect: str, in_reasoning: bool,
                                                   finish: str, cuts: list[int]) -> None:
    text = data.draw(mixture(dialect))
    whole, streamed = run_both_modes("hyp-mix", dialect, text, in_reasoning=in_reasoning, finish=finish)
    check_cuts(dialect, text, cuts, whole.message, in_reasoning=in_reasoning, finish=finish)
    check_cuts(dialect, text, cuts, streamed.message, in_reasoning=in_reasoning, finish=finish,
               stream_long_values=True)
