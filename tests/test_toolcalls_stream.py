"""Streaming tool-call parsers (gateway.toolcalls): contract cases for every dialect.

Every case runs three ways (whole, one character at a time, random 1-9 character chunks) and
must give the same message; the deltas must rebuild that message; and at every point of the
stream the text streamed so far must be a prefix of the final text, which is how we check that
no marker or partial marker ever leaks into streamed content.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.toolcalls import DIALECTS, make_parser

BAR = "\uff5c"
EOS = f"<{BAR}end\u2581of\u2581sentence{BAR}>"


def fn(name: str, props: dict[str, Any]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": name,
        "parameters": {"type": "object", "properties": props}}}


TOOLS = [
    fn("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"},
                       "units": {"type": ["string", "null"]}}),
    fn("set_alarm", {"times": {"type": "array"}, "repeat": {"type": "boolean"},
                     "label": {"type": "string"}}),
    fn("notify", {"opts": {"type": "object"}}),
    fn("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}),
    fn("calc", {"x": {"type": "number"}, "n": {"type": "integer"}, "flag": {"type": "boolean"},
                "meta": {"type": "object"}, "tags": {"type": "array"},
                "maybe": {"type": ["string", "null"]},
                "either": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}),
    fn("get_time", {}),
]


# ---------------------------------------------------------------------------- call writers
def _raw(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def call_text(dialect: str, calls: list[tuple[str, dict]], compact: bool = False) -> str:
    """The block(s) a model writes for `calls`, in each dialect's own layout."""
    if dialect == "dsml":
        invokes = []
        for name, args in calls:
            params = "".join(
                f'<{BAR}DSML{BAR}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                f"{_raw(v)}</{BAR}DSML{BAR}parameter>\n" for k, v in args.items())
            invokes.append(f'<{BAR}DSML{BAR}invoke name="{name}">\n{params or chr(10)}</{BAR}DSML{BAR}invoke>')
        return f"\n\n<{BAR}DSML{BAR}tool_calls>\n" + "\n".join(invokes) + f"\n</{BAR}DSML{BAR}tool_calls>"
    blocks = []
    for name, args in calls:
        if dialect == "glm":
            nl = "" if compact else "\n"
            pairs = "".join(f"<arg_key>{k}</arg_key>{nl}<arg_value>{_raw(v)}</arg_value>{nl}"
                            for k, v in args.items())
            blocks.append(f"<tool_call>{name}{nl}{pairs}</tool_call>")
        elif dialect == "qwen_xml":
            params = "".join(f"<parameter={k}>\n{_raw(v)}\n</parameter>\n" for k, v in args.items())
            blocks.append(f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
        else:
            body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
            blocks.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(blocks)


# ---------------------------------------------------------------------------- running
def chunkings(text: str, seed: str) -> dict[str, list[str]]:
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(text):
        step = rng.randint(1, 9)
        pieces.append(text[i:i + step])
        i += step
    return {"whole": [text], "chars": list(text), "random": pieces}


@dataclass
class Run:
    message: dict
    deltas: list[dict]
    counters: dict
    fed_so_far: list[tuple[str, str, dict[int, str]]] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)  # parser.failed_calls
    complete_calls: int = 0  # parser.tool_calls_emitted


def run(dialect: str, pieces: list[str], tools: Any = TOOLS, finish: str = "stop",
        **kwargs: Any) -> Run:
    parser = make_parser(dialect, tools, **kwargs)
    deltas: list[dict] = []
    snapshots = []
    content: list[str] = []
    reasoning: list[str] = []
    args: dict[int, list[str]] = {}

    def take(new: list[dict]) -> None:
        # Running totals (not re-joined per feed) keep long per-character runs linear.
        deltas.extend(new)
        for d in new:
            content.append(d.get("content", ""))
            reasoning.append(d.get("reasoning_content", ""))
            for tc in d.get("tool_calls", []):
                args.setdefault(tc["index"], []).append(tc["function"].get("arguments", ""))
        if new or not snapshots:
            snapshots.append(("".join(content), "".join(reasoning),
                              {i: "".join(parts) for i, parts in args.items()}))
            content[:] = [snapshots[-1][0]]
            reasoning[:] = [snapshots[-1][1]]
            for i, text in snapshots[-1][2].items():
                args[i] = [text]

    for piece in pieces:
        take(parser.feed(piece))
    take(parser.finish(finish))
    return Run(parser.message(), deltas, dict(parser.counters), snapshots, parser.failed_calls,
               parser.tool_calls_emitted)


def _accumulate(deltas: list[dict]) -> tuple[str, str, dict[int, str]]:
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    args: dict[int, str] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            args[tc["index"]] = args.get(tc["index"], "") + tc["function"].get("arguments", "")
    return content, reasoning, args


def check_stream(r: Run) -> None:
    """Deltas rebuild message(); streamed text is always a prefix of the final text."""
    msg = r.message
    content, reasoning, args = _accumulate(r.deltas)
    assert content == (msg["content"] or "")
    assert reasoning == (msg.get("reasoning_content") or "")
    calls = msg.get("tool_calls", [])
    assert sorted(args) == list(range(len(calls)))
    seen: set[int] = set()
    for d in r.deltas:
        assert len(d) == 1 and next(iter(d.values())) != ""  # one non-empty field per delta
        for tc in d.get("tool_calls", []):
            call = calls[tc["index"]]
            if tc["index"] not in seen:
                assert tc["index"] == len(seen)  # calls arrive in order
                assert tc["id"] == call["id"] and tc["type"] == "function"
                assert tc["function"]["name"] == call["function"]["name"]
                seen.add(tc["index"])
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
    for i, call in enumerate(calls):
        assert args[i] == call["function"]["arguments"]
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
        assert call["id"].startswith("call_") and call["type"] == "function"
    for so_far_content, so_far_reasoning, so_far_args in r.fed_so_far:
        assert (msg["content"] or "").startswith(so_far_content)
        assert (msg.get("reasoning_content") or "").startswith(so_far_reasoning)
        for i, text in so_far_args.items():
            assert calls[i]["function"]["arguments"].startswith(text)
    if msg["content"] is not None:
        assert msg["content"] == msg["content"].strip() and msg["content"]


def run_all_ways(case_id: str, dialect: str, text: str, **kwargs: Any) -> Run:
    results = {}
    for how, pieces in chunkings(text, case_id).items():
        r = run(dialect, pieces, **kwargs)
        check_stream(r)
        results[how] = r
    first = results["whole"]
    for how, r in results.items():
        assert r.message == first.message, how
        assert r.counters == first.counters, how
        assert r.failed == first.failed, how
    n_calls = len(first.message.get("tool_calls", []))
    assert first.complete_calls == n_calls - len(first.failed)
    if not kwargs.get("stream_long_values"):
        assert first.failed == [], "only a streamed response can show a failed call"
    return first


def without_failed(r: Run) -> list[tuple[str, Any]]:
    """The run's calls minus the failed ones, as (name, arguments)."""
    failed = set(r.failed)
    return [call for i, call in enumerate(calls_of(r.message)) if i not in failed]


def run_both_modes(case_id: str, dialect: str, text: str, **kwargs: Any) -> tuple[Run, Run]:
    """The text as a whole response and as a stream that streams long values early; the
    stream may only add failed calls (core.py's docstring): same content, same reasoning, the
    same calls once the failed ones are left out."""
    whole = run_all_ways(case_id, dialect, text, **kwargs)
    streamed = run_all_ways(case_id, dialect, text, stream_long_values=True, **kwargs)
    assert streamed.message["content"] == whole.message["content"]
    assert streamed.message.get("reasoning_content") == whole.message.get("reasoning_content")
    assert without_failed(streamed) == calls_of(whole.message)
    assert streamed.counters == whole.counters
    return whole, streamed


def calls_of(msg: dict) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in msg.get("tool_calls", [])]


# ---------------------------------------------------------------------------- generic cases
W1 = ("get_weather", {"city": "Zürich", "days": 3})
W2 = ("get_time", {})
W3 = ("write_file", {"path": "a.py", "content": 'print("hi")\nx = 1 < 2 & 3\n'})
CJK = ("get_weather", {"city": "東京 / 北京", "days": 2})
UNDECLARED = ("launch_rocket", {"target": "moon"})
DIALECT_NAMES = sorted(DIALECTS)


def generic_cases(d: str) -> list[tuple[str, str, dict, dict]]:
    """(id, text, kwargs, expected) for dialect d; expected has content/reasoning/calls."""
    one = call_text(d, [W1])
    two = call_text(d, [W1, W2])
    cases = [
        ("plain", "Hello, world. 2 < 3 and <b>bold</b>.", {},
         {"content": "Hello, world. 2 < 3 and <b>bold</b>."}),
        ("empty", "", {}, {"content": None}),
        ("single", one, {}, {"content": None, "calls": [W1]}),
        ("parallel", two, {}, {"content": None, "calls": [W1, W2]}),
        ("three_sequential", call_text(d, [W1]) + "\n" + call_text(d, [W3]) + "\n" + call_text(d, [W2]),
         {}, {"content": None, "calls": [W1, W3, W2]}),
        ("prose_before", "Let me check the weather.\n\n" + one, {},
         {"content": "Let me check the weather.", "calls": [W1]}),
        ("prose_after", one + "\n\nDone, that was the call.", {},
         {"content": "Done, that was the call.", "calls": [W1]}),
        ("prose_between", "First " + call_text(d, [W1]).strip() + " then " + call_text(d, [W2]).strip()
         + " end.", {},
         {"content": "First then end.", "calls": [W1, W2]}),
        ("unicode_args", "好的。" + call_text(d, [CJK]), {},
         {"content": "好的。", "calls": [CJK]}),
        ("multiline_string", call_text(d, [W3]), {}, {"content": None, "calls": [W3]}),
        ("undeclared_in_answer", call_text(d, [UNDECLARED]), {},
         {"content": None, "calls": [UNDECLARED]}),
        ("fenced", "Example:\n```xml\n" + one.strip() + "\n```\nThat is all.", {},
         {"content": "Example:\n```xml\n" + one.strip() + "\n```\nThat is all."}),
        ("tilde_fence", "~~~\n" + one.strip() + "\n~~~", {}, {"content": "~~~\n" + one.strip() + "\n~~~"}),
        ("inline_code", "Write `" + one.strip() + "` to call it.", {},
         {"content": "Write `" + one.strip() + "` to call it."}),
        ("after_fence_closes", "```\ncode\n```\n" + one, {},
         {"content": "```\ncode\n```", "calls": [W1]}),
        ("no_tools", one, {"tools": []}, {"content": one.strip()}),
        ("no_tools_none", "a " + one, {"tools": None}, {"content": ("a " + one).strip()}),
        ("think_then_call", "<think>Need the weather.</think>\n" + one, {},
         {"reasoning": "Need the weather.", "content": None, "calls": [W1]}),
        ("in_reasoning_then_call", "Need it.\n</think>\n\nSure.\n" + one, {"in_reasoning": True},
         {"reasoning": "Need it.", "content": "Sure.", "calls": [W1]}),
        ("think_not_at_start", "Hi <think>x</think> there", {},
         {"content": "Hi <think>x</think> there"}),
        ("leading_space_think", "  \n<think>r</think>a", {}, {"reasoning": "r", "content": "a"}),
        ("stray_close_think_in_answer", "a</think>b", {}, {"content": "a</think>b"}),
        ("reasoning_never_closes", "<think>thinking forever", {"finish": "length"},
         {"reasoning": "thinking forever", "content": None}),
        ("in_reasoning_never_closes", "thinking " + one, {"in_reasoning": True, "finish": "length"},
         {"reasoning": ("thinking " + one).strip(), "content": None}),
        ("answer_call_survives_length", "Ok.\n" + one.strip() + "\nand then some", {"finish": "length"},
         {"content": "Ok.\nand then some", "calls": [W1]}),
        ("no_tools_think", "<think>r</think>" + one, {"tools": []},
         {"reasoning": "r", "content": one.strip()}),
    ]
    return cases


def reasoning_gate_cases(d: str) -> list[tuple[str, str, dict, dict]]:
    one = call_text(d, [W1]).strip()
    two_lines = call_text(d, [W1]).strip() + "\n" + call_text(d, [W2]).strip()
    undeclared = call_text(d, [UNDECLARED]).strip()
    return [
        ("r_deliver", "<think>I will check.\n" + one + "\n", {},
         {"reasoning": "I will check.", "content": None, "calls": [W1],
          "counters": (1, 0)}),
        ("r_deliver_in_reasoning", "I will check.\n" + one, {"in_reasoning": True},
         {"reasoning": "I will check.", "content": None, "calls": [W1], "counters": (1, 0)}),
        ("r_deliver_at_start", "<think>" + one, {},
         {"reasoning": None, "content": None, "calls": [W1], "counters": (1, 0)}),
        ("r_deliver_indented", "<think>Plan:\n  \t" + one + "\n\n", {},
         {"reasoning": "Plan:", "content": None, "calls": [W1], "counters": (1, 0)}),
        ("r_two_adjacent", "<think>Both.\n" + two_lines, {},
         {"reasoning": "Both.", "content": None, "calls": [W1, W2], "counters": (2, 0)}),
        ("r_length_keeps_text", "<think>I will check.\n" + one, {"finish": "length"},
         {"reasoning": "I will check.\n" + one, "content": None, "counters": (0, 1)}),
        ("r_cancel_keeps_text", "<think>I will check.\n" + one, {"finish": "cancelled"},
         {"reasoning": "I will check.\n" + one, "content": None, "counters": (0, 1)}),
        ("r_undeclared_stays", "<think>Hmm.\n" + undeclared, {},
         {"reasoning": "Hmm.\n" + undeclared, "content": None, "counters": (0, 0)}),
        ("r_undeclared_then_declared", "<think>Hmm.\n" + undeclared + "\n" + one, {},
         {"reasoning": "Hmm.\n" + undeclared, "content": None, "calls": [W1], "counters": (1, 0)}),
        ("r_mid_sentence", "<think>I could write " + one, {},
         {"reasoning": "I could write " + one, "content": None, "counters": (0, 1)}),
        ("r_more_thought_after", "<think>Like:\n" + one + "\nBut maybe not.", {},
         {"reasoning": "Like:\n" + one + "\nBut maybe not.", "content": None, "counters": (0, 1)}),
        ("r_fenced", "<think>Like:\n```\n" + one + "\n```", {},
         {"reasoning": "Like:\n```\n" + one + "\n```", "content": None, "counters": (0, 1)}),
        ("r_fence_unclosed", "<think>Like:\n```\n" + one, {},
         {"reasoning": "Like:\n```\n" + one, "content": None, "counters": (0, 1)}),
        ("r_inline_code", "<think>Like `x\n" + one + "` ok", {},
         {"reasoning": "Like `x\n" + one + "` ok", "content": None, "counters": (0, 1)}),
        ("r_then_close_think", "<think>Plan:\n" + one + "\n</think>", {},
         {"reasoning": "Plan:\n" + one, "content": None, "counters": (0, 1)}),
        ("r_then_answer", "<think>Plan:\n" + one + "\n</think>\nAnswer.", {},
         {"reasoning": "Plan:\n" + one, "content": "Answer.", "counters": (0, 1)}),
        ("r_prose_between", "<think>A:\n" + call_text(d, [W1]).strip() + "\nand\n"
         + call_text(d, [W2]).strip(), {},
         {"reasoning": "A:\n" + call_text(d, [W1]).strip() + "\nand", "content": None,
          "calls": [W2], "counters": (1, 1)}),
        ("r_second_mid_line", "<think>A:\n" + call_text(d, [W1]).strip()
         + call_text(d, [W2]).strip(), {},
         {"reasoning": "A:\n" + call_text(d, [W1]).strip() + call_text(d, [W2]).strip(),
          "content": None, "counters": (0, 2)}),
        ("r_truncated_block", "<think>Go:\n" + one[:-3], {},
         {"reasoning": "Go:\n" + one[:-3], "content": None, "counters": (0, 0)}),
        ("r_no_tools", "<think>Go:\n" + one, {"tools": []},
         {"reasoning": "Go:\n" + one, "content": None, "counters": (0, 0)}),
    ]


def _check_expected(r: Run, expected: dict) -> None:
    msg = r.message
    assert msg["role"] == "assistant"
    assert msg["content"] == expected.get("content")
    assert msg.get("reasoning_content") == expected.get("reasoning")
    assert calls_of(msg) == [(n, a) for n, a in expected.get("calls", [])]
    if "calls" not in expected:
        assert "tool_calls" not in msg
    if "counters" in expected:
        delivered, kept = expected["counters"]
        assert r.counters["reasoning_calls_delivered"] == delivered
        assert r.counters["reasoning_calls_kept_as_text"] == kept


ALL_CASES = [(d, cid, text, kw, exp) for d in DIALECT_NAMES
             for cid, text, kw, exp in generic_cases(d) + reasoning_gate_cases(d)]


@pytest.mark.parametrize("dialect,case_id,text,kwargs,expected", ALL_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in ALL_CASES])
def test_contract_case(dialect: str, case_id: str, text: str, kwargs: dict, expected: dict) -> None:
    r = run_all_ways(f"{dialect}-{case_id}", dialect, text, **kwargs)
    _check_expected(r, expected)


def test_glm47_compact_layout() -> None:
    text = "Sure." + call_text("glm", [W1, W2], compact=True)
    r = run_all_ways("glm47", "glm", text)
    assert r.message["content"] == "Sure."
    assert calls_of(r.message) == [W1, W2]
