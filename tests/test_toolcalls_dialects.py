"""Dialect-specific contract cases for gateway.toolcalls: malformed blocks, schema coercion,
the DSML worked examples, forced calls (start_in_call), the streaming commit policy."""

from __future__ import annotations

import json
import time

import pytest

from gateway.families import FAMILIES
from gateway.toolcalls import DIALECTS, coerce, make_parser, schema_types
from test_toolcalls_stream import BAR, EOS, TOOLS, calls_of, run, run_all_ways, run_both_modes

D = f"{BAR}DSML{BAR}"


def dsml_param(key: str, value: str, string: str = "true") -> str:
    return f'<{D}parameter name="{key}" string="{string}">{value}</{D}parameter>'


def dsml_block(*invokes: tuple[str, list[str]]) -> str:
    body = "\n".join(f'<{D}invoke name="{n}">\n' + "\n".join(ps) + f"\n</{D}invoke>"
                     for n, ps in invokes)
    return f"\n\n<{D}tool_calls>\n{body}\n</{D}tool_calls>"


def glm(name: str, *pairs: tuple[str, str]) -> str:
    return f"<tool_call>{name}\n" + "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs) + "</tool_call>"


def qx(name: str, *pairs: tuple[str, str]) -> str:
    return f"<tool_call>\n<function={name}>\n" + "".join(
        f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in pairs) + "</function>\n</tool_call>"


DOC_CALL = "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"

# (id, dialect, text, kwargs, expected content, expected calls)
CASES = [
    # ------------------------------------------------------------------ glm
    ("glm-zero-arg-inline", "glm", "<tool_call>get_time</tool_call>", {}, None, [("get_time", {})]),
    ("glm-spaces-layout", "glm",
     "<tool_call>get_weather <arg_key>city</arg_key> <arg_value>Paris</arg_value> </tool_call>", {},
     None, [("get_weather", {"city": "Paris"})]),
    ("glm-ling-indented-key", "glm",
     "<tool_call>get_weather\n    <arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
     {}, None, [("get_weather", {"city": "Paris"})]),
    ("glm-edge-spaces-verbatim", "glm", glm("get_weather", ("city", "  Paris \n")), {}, None,
     [("get_weather", {"city": "  Paris \n"})]),
    ("glm-json-text-in-string", "glm", glm("get_weather", ("city", '{"a": 1}')), {}, None,
     [("get_weather", {"city": '{"a": 1}'})]),
    ("glm-missing-arg-value-open", "glm",
     "<tool_call>get_weather\n<arg_key>days</arg_key>\n3</arg_value>\n</tool_call>", {},
     "<tool_call>get_weather\n<arg_key>days</arg_key>\n3</arg_value>\n</tool_call>", []),
    ("glm-key-without-value", "glm",
     "<tool_call>calc<arg_key>n</arg_key><arg_key>x</arg_key><arg_value>1</arg_value></tool_call>", {},
     "<tool_call>calc<arg_key>n</arg_key><arg_key>x</arg_key><arg_value>1</arg_value></tool_call>", []),
    ("glm-name-with-space", "glm", "<tool_call>get weather\n<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
     {}, "<tool_call>get weather\n<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>", []),
    ("glm-prose-after-opener", "glm", "Use the <tool_call> tag, then a name.", {},
     "Use the <tool_call> tag, then a name.", []),
    ("glm-truncated-before-commit", "glm", "Ok <tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3",
     {"finish": "length"}, "Ok <tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3", []),
    ("glm-truncated-name", "glm", "Ok <tool_call>get_wea", {"finish": "length"}, "Ok <tool_call>get_wea", []),
    ("glm-malformed-and-good", "glm",
     "<tool_call>bad name</tool_call>\n" + glm("get_weather", ("days", "2")), {},
     "<tool_call>bad name</tool_call>", [("get_weather", {"days": 2})]),
    ("glm-undeclared-tool-json", "glm", glm("launch", ("n", "5"), ("s", "hi"), ("o", '{"a": [1]}')), {},
     None, [("launch", {"n": 5, "s": "hi", "o": {"a": [1]}})]),
    ("glm-entities-literal", "glm", glm("get_weather", ("city", "a &amp; <b> &lt;")), {}, None,
     [("get_weather", {"city": "a &amp; <b> &lt;"})]),
    # ------------------------------------------------------------------ qwen_xml
    ("qx-newlines-dropped-once", "qwen_xml",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\n\nParis\n\n</parameter>\n</function>\n</tool_call>",
     {}, None, [("get_weather", {"city": "\nParis\n"})]),
    ("qx-no-newlines", "qwen_xml",
     "<tool_call><function=get_weather><parameter=city>Paris</parameter></function></tool_call>", {},
     None, [("get_weather", {"city": "Paris"})]),
    ("qx-literal-close-in-value", "qwen_xml", qx("write_file", ("content", "a</parameter>b\n</parameter> x")),
     {}, None, [("write_file", {"content": "a</parameter>b\n</parameter> x"})]),
    ("qx-documented-call-in-value", "qwen_xml",
     qx("write_file", ("path", "doc.md"), ("content", "Example:\n" + DOC_CALL + "\nend")), {}, None,
     [("write_file", {"path": "doc.md", "content": "Example:\n" + DOC_CALL + "\nend"})]),
    ("qx-prose-after-opener", "qwen_xml", "The <tool_call> tag wraps calls.", {},
     "The <tool_call> tag wraps calls.", []),
    ("qx-bare-function", "qwen_xml", "<function=get_time>\n</function>", {},
     "<function=get_time>\n</function>", []),
    ("qx-function-without-close-call", "qwen_xml",
     "<tool_call>\n<function=get_time>\n</function>\nbye", {},
     "<tool_call>\n<function=get_time>\n</function>\nbye", []),
    ("qx-implicit-parameter-close", "qwen_xml",
     "<tool_call>\n<function=calc>\n<parameter=n>\n3\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
     {}, "<tool_call>\n<function=calc>\n<parameter=n>\n3\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
     []),
    ("qx-template-echo-name", "qwen_xml", "<tool_call>\n<function={{ tc.name }}>\n</function>\n</tool_call>", {},
     "<tool_call>\n<function={{ tc.name }}>\n</function>\n</tool_call>", []),
    ("qx-value-never-ends", "qwen_xml", "<tool_call>\n<function=calc>\n<parameter=n>\n3\n", {"finish": "length"},
     "<tool_call>\n<function=calc>\n<parameter=n>\n3", []),
    ("qx-undeclared-param-json", "qwen_xml", qx("get_weather", ("extra", "[1, 2]"), ("other", "plain")), {},
     None, [("get_weather", {"extra": [1, 2], "other": "plain"})]),
    ("qx-boolean-yes-stays", "qwen_xml", qx("calc", ("flag", "yes")), {}, None, [("calc", {"flag": "yes"})]),
    # ------------------------------------------------------------------ hermes
    ("h-no-arguments", "hermes", '<tool_call>\n{"name": "get_time"}\n</tool_call>', {}, None,
     [("get_time", {})]),
    ("h-parameters-alias", "hermes", '<tool_call>{"name": "get_weather", "parameters": {"days": 2}}</tool_call>',
     {}, None, [("get_weather", {"days": 2})]),
    ("h-stringified-arguments", "hermes",
     '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>', {}, None,
     [("get_weather", {"city": "Rome"})]),
    ("h-arguments-not-object", "hermes", '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>', {},
     '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>', []),
    ("h-close-tag-inside-string", "hermes",
     '<tool_call>{"name": "write_file", "arguments": {"content": "x </tool_call> y"}}</tool_call>', {}, None,
     [("write_file", {"content": "x </tool_call> y"})]),
    ("h-name-after-arguments", "hermes", '<tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}</tool_call>',
     {}, None, [("get_weather", {"city": "Oslo"})]),
    ("h-no-coercion", "hermes", '<tool_call>{"name": "get_weather", "arguments": {"days": "3"}}</tool_call>', {},
     None, [("get_weather", {"days": "3"})]),
    ("h-bad-json-next-to-good", "hermes",
     '<tool_call>{"name": "calc", "arguments": {"n": 1,}}</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
     {}, '<tool_call>{"name": "calc", "arguments": {"n": 1,}}</tool_call>', [("get_time", {})]),
    ("h-extra-key-after-arguments", "hermes", '<tool_call>{"name": "calc", "arguments": {"n": 1}, "id": 7}</tool_call>',
     {}, None, [("calc", {"n": 1})]),
    ("h-escapes-and-nesting", "hermes",
     '<tool_call>{"name": "notify", "arguments": {"opts": {"a": [1, "x\\"y\\\\n\\u00e9", {"b": null}], "c": -1.5e3}}}</tool_call>',
     {}, None, [("notify", {"opts": {"a": [1, 'x"y\\n\u00e9', {"b": None}], "c": -1500.0}})]),
    ("h-prose-after-opener", "hermes", "Wrap it in <tool_call> tags.", {}, "Wrap it in <tool_call> tags.", []),
    ("h-truncated-before-commit", "hermes", '<tool_call>{"name": "calc", "arguments": {"n": 1',
     {"finish": "length"}, '<tool_call>{"name": "calc", "arguments": {"n": 1', []),
    ("h-complete-json-no-close-numbers", "hermes", '<tool_call>{"name": "calc", "arguments": {"n": 1}}',
     {}, '<tool_call>{"name": "calc", "arguments": {"n": 1}}', []),
    # ------------------------------------------------------------------ dsml
    ("dsml-missing-string-attr", "dsml", dsml_block(("calc", [f'<{D}parameter name="n">1</{D}parameter>'])), {},
     dsml_block(("calc", [f'<{D}parameter name="n">1</{D}parameter>'])).strip(), []),
    ("dsml-invalid-string-attr", "dsml", dsml_block(("calc", [dsml_param("n", "1", "yes")])), {},
     dsml_block(("calc", [dsml_param("n", "1", "yes")])).strip(), []),
    ("dsml-duplicate-param", "dsml", dsml_block(("calc", [dsml_param("n", "1", "false")] * 2)), {},
     dsml_block(("calc", [dsml_param("n", "1", "false")] * 2)).strip(), []),
    ("dsml-no-invoke", "dsml", f"<{D}tool_calls>\n</{D}tool_calls>", {}, f"<{D}tool_calls>\n</{D}tool_calls>", []),
    ("dsml-ascii-bars", "dsml", dsml_block(("get_time", [])).replace(BAR, "|"), {},
     dsml_block(("get_time", [])).replace(BAR, "|").strip(), []),
    ("dsml-v32-wrapper-is-text", "dsml", dsml_block(("get_time", [])).replace("tool_calls", "function_calls"), {},
     dsml_block(("get_time", [])).replace("tool_calls", "function_calls").strip(), []),
    ("dsml-no-whitespace", "dsml",
     f'<{D}tool_calls><{D}invoke name="get_weather">{dsml_param("city", "Oslo")}</{D}invoke></{D}tool_calls>', {},
     None, [("get_weather", {"city": "Oslo"})]),
    ("dsml-false-on-string-param", "dsml", dsml_block(("get_weather", [dsml_param("city", "4471", "false")])), {},
     None, [("get_weather", {"city": "4471"})]),
    ("dsml-false-undeclared-param", "dsml", dsml_block(("get_weather", [dsml_param("zip", "4471", "false")])), {},
     None, [("get_weather", {"zip": 4471})]),
    ("dsml-true-on-integer-param", "dsml", dsml_block(("get_weather", [dsml_param("days", "3", "true")])), {},
     None, [("get_weather", {"days": "3"})]),
    ("dsml-false-invalid-json", "dsml", dsml_block(("get_weather", [dsml_param("zip", "{oops", "false")])), {},
     None, [("get_weather", {"zip": "{oops"})]),
    ("dsml-false-integer-not-a-number", "dsml", dsml_block(("get_weather", [dsml_param("days", "abc", "false")])),
     {}, None, [("get_weather", {"days": "abc"})]),
    ("dsml-zero-params", "dsml", dsml_block(("get_time", [])), {}, None, [("get_time", {})]),
    ("dsml-two-blocks", "dsml", "A" + dsml_block(("get_time", [])) + "\nB" + dsml_block(("get_time", [])), {},
     "A\n\nB", [("get_time", {}), ("get_time", {})]),
    ("dsml-truncated-before-commit", "dsml", "Hi" + dsml_block(("calc", [dsml_param("n", "1", "false")]))[:-20],
     {"finish": "length"}, ("Hi" + dsml_block(("calc", [dsml_param("n", "1", "false")]))[:-20]), []),
]


@pytest.mark.parametrize("case_id,dialect,text,kwargs,content,calls", CASES, ids=[c[0] for c in CASES])
def test_dialect_case(case_id: str, dialect: str, text: str, kwargs: dict, content, calls) -> None:
    r = run_all_ways(case_id, dialect, text, **kwargs)
    assert r.message["content"] == content
    assert calls_of(r.message) == calls


# ---------------------------------------------------------------------- schema coercion (§4)
COERCE = [  # (param, raw, expected) on the `calc` / `get_weather` tools
    ("calc", "x", "2.5", 2.5), ("calc", "x", " 7 ", 7), ("calc", "x", "1e3", 1000.0),
    ("calc", "x", "abc", "abc"), ("calc", "n", " 42 ", 42), ("calc", "n", "-3", -3),
    ("calc", "n", "4.2", "4.2"), ("calc", "flag", "TRUE", True), ("calc", "flag", "false", False),
    ("calc", "flag", "yes", "yes"), ("calc", "meta", '{"k": [1]}', {"k": [1]}),
    ("calc", "meta", "[1]", "[1]"), ("calc", "tags", '["a", 2]', ["a", 2]), ("calc", "tags", "a,b", "a,b"),
    ("calc", "maybe", "null", None), ("calc", "maybe", "nil", "nil"), ("calc", "maybe", "42", "42"),
    ("calc", "either", "7", 7), ("calc", "either", "null", None), ("calc", "either", "x", "x"),
    ("get_weather", "city", "007", "007"), ("get_weather", "city", "true", "true"),
    ("get_weather", "city", "null", "null"), ("get_weather", "city", " {\"a\":1} ", ' {"a":1} '),
    ("get_weather", "undeclared", " 5 ", 5), ("get_weather", "undeclared", "text", "text"),
    ("get_weather", "undeclared", "&amp;", "&amp;"),
]


@pytest.mark.parametrize("dialect", ["glm", "qwen_xml", "dsml"])
@pytest.mark.parametrize("tool,param,raw,expected", COERCE, ids=[f"{c[0]}.{c[1]}={c[2]!r}" for c in COERCE])
def test_schema_coercion(dialect: str, tool: str, param: str, raw: str, expected) -> None:
    if dialect == "glm":
        text = glm(tool, (param, raw))
    elif dialect == "qwen_xml":
        text = qx(tool, (param, raw))
    else:
        text = dsml_block((tool, [dsml_param(param, raw, "false")]))
    msg = run(dialect, [text]).message
    assert calls_of(msg) == [(tool, {param: expected})]


def test_coerce_unit() -> None:
    assert schema_types({"type": ["string", "null"]}) == {"string", "null"}
    assert schema_types({"anyOf": [{"type": "integer"}, {"type": "null"}]}) == {"integer", "null"}
    assert schema_types({"type": "int64"}) == {"integer"}
    assert schema_types({"description": "untyped"}) is None
    assert coerce("NaN", frozenset({"number"})) == "NaN"
    assert coerce("Infinity", None) == "Infinity"


# ---------------------------------------------------------------------- DSML worked examples (dsml.md §9)
EXAMPLE3 = ("User wants a 3-day forecast for Paris.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
            "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" "
            "string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS)
EXAMPLE4 = ("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"set_alarm\">\n<｜DSML｜parameter name=\"times\" "
            "string=\"false\">[\"07:00\", \"07:30\"]</｜DSML｜parameter>\n<｜DSML｜parameter name=\"repeat\" "
            "string=\"false\">true</｜DSML｜parameter>\n<｜DSML｜parameter name=\"label\" string=\"true\">Wake up \"now\""
            "\nplease</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"notify\">\n<｜DSML｜parameter "
            "name=\"opts\" string=\"false\">{\"sound\": null, \"level\": 2.5}</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
            "</｜DSML｜tool_calls>" + EOS)


def _strip_eos(text: str) -> str:
    # The server stops on the EOS token and never feeds its text to the parser.
    return text.removesuffix(EOS)


def test_dsml_example3_thinking_round_trip() -> None:
    r = run_all_ways("ex3", "dsml", _strip_eos(EXAMPLE3), in_reasoning=True)
    assert r.message["reasoning_content"] == "User wants a 3-day forecast for Paris."
    assert r.message["content"] is None
    [call] = r.message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}


def test_dsml_example4_parallel_json_values() -> None:
    r = run_all_ways("ex4", "dsml", _strip_eos(EXAMPLE4))
    assert r.message["content"] is None
    assert [c["function"] for c in r.message["tool_calls"]] == [
        {"name": "set_alarm",
         "arguments": '{"times": ["07:00", "07:30"], "repeat": true, "label": "Wake up \\"now\\"\\nplease"}'},
        {"name": "notify", "arguments": '{"opts": {"sound": null, "level": 2.5}}'}]


# ---------------------------------------------------------------------- forced calls (seed 001)
# Prefills of the parser's own markers: any text the server prefilled is read as model output.
START_IN_CALL = [
    ("glm", "<tool_call>get_weather", "\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"),
    ("glm", "<tool_call>", "get_time</tool_call>"),
    ("qwen_xml", "<tool_call>\n<function=get_weather>\n", "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"),
    ("qwen_xml", "<tool_call>\n", "<function=get_time>\n</function>\n</tool_call>"),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": ', '{"city": "Paris"}}\n</tool_call>'),
    ("hermes", "<tool_call>\n", '{"name": "get_time", "arguments": {}}\n</tool_call>'),
    ("dsml", f'\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n', f"{dsml_param('city', 'Paris')}\n</{D}invoke>\n</{D}tool_calls>"),
    ("dsml", f"\n\n<{D}tool_calls>\n", f'<{D}invoke name="get_time">\n\n</{D}invoke>\n</{D}tool_calls>'),
]
# What each family's own opener (the production prefill) leaves the model to write:
# (family, continuation after the named opener, continuation after the any-tool opener).
AFTER_FAMILY_OPENER = [
    ("glm45", "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>", "get_time\n</tool_call>"),
    ("glm47", "<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", "get_time</tool_call>"),
    ("qwen3", '{"city": "Paris"}}\n</tool_call>', 'get_time", "arguments": {}}\n</tool_call>'),
    ("qwen3_coder", "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
     "get_time>\n</function>\n</tool_call>"),
    ("qwen35", "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>", "get_time>\n</function>\n</tool_call>"),
    ("dsml", f"{dsml_param('city', 'Paris')}\n</{D}invoke>\n</{D}tool_calls>",
     f'get_time">\n\n</{D}invoke>\n</{D}tool_calls>'),
]
START_IN_CALL += [(FAMILIES[f].calls.dialect, FAMILIES[f].calls.opener(name), output)
                  for f, named, anyone in AFTER_FAMILY_OPENER
                  for name, output in (("get_weather", named), (None, anyone))]


@pytest.mark.parametrize("dialect,prefill,output", START_IN_CALL,
                         ids=[f"{d}-{'named' if i % 2 == 0 else 'required'}" for i, (d, _, _) in enumerate(START_IN_CALL)])
@pytest.mark.parametrize("in_reasoning", [False, True])
def test_start_in_call(dialect: str, prefill: str, output: str, in_reasoning: bool) -> None:
    r = run_all_ways(f"sic-{dialect}-{prefill}", dialect, output + "\n\nAll set.",
                     start_in_call=prefill, in_reasoning=in_reasoning)
    expected = ("get_weather", {"city": "Paris"}) if "get_weather" in prefill else ("get_time", {})
    assert calls_of(r.message) == [expected]
    assert r.message["content"] == "All set."
    assert "reasoning_content" not in r.message


def test_opener_shapes() -> None:
    def opener(family: str, name: str | None = None) -> str:
        return FAMILIES[family].calls.opener(name)
    assert opener("dsml", "get_weather") == f'\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n'
    assert opener("glm47", "get_weather") == "<tool_call>get_weather"
    assert opener("glm47") == "<tool_call>"
    assert opener("qwen3_coder", "f") == "<tool_call>\n<function=f>\n"
    assert opener("qwen3", "f") == '<tool_call>\n{"name": "f", "arguments": '
    assert set(DIALECTS) == {"dsml", "glm", "qwen_xml", "hermes"}
    with pytest.raises(ValueError):
        make_parser("nope", TOOLS)


def test_start_in_call_refusal_hides_prefill() -> None:
    r = run_all_ways("sic-refuse", "glm", "I cannot call a tool for that.", start_in_call="<tool_call>")
    assert r.message["content"] == "I cannot call a tool for that."
    assert "tool_calls" not in r.message


# ---------------------------------------------------------------------- streaming policy
# core.py's commit point.  A whole response (make_parser's defaults) follows the contract exactly:
# a block is a call once it is complete and well formed, whatever its length.  A streamed one
# (stream_long_values=True) also starts streaming a call once a raw string value passes
# STREAM_AFTER_CHARS; if that block then fails, the stream shows a failed call (closed JSON)
# and then the block's raw text as content, the same content as the whole response.
LONG = "line one\nline two \"q\" " * 8  # 184 characters: past the commit point
SHORT = "partial tex"
HEADS = {
    "glm": "<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>",
    "qwen_xml": "<tool_call>\n<function=write_file>\n<parameter=content>\n",
    "hermes": '<tool_call>\n{"name": "write_file", "arguments": {"content": "',
    "dsml": f'<{D}tool_calls>\n<{D}invoke name="write_file">\n<{D}parameter name="content" string="true">',
}
TAILS = {
    "glm": "</arg_value>\n</tool_call>",
    "qwen_xml": "\n</parameter>\n</function>\n</tool_call>",
    "hermes": '"}}\n</tool_call>',
    "dsml": f"</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>",
}


def typed_value(dialect: str, value: str) -> str:
    return json.dumps(value)[1:-1] if dialect == "hermes" else value  # hermes values are JSON text


def test_commit_point_is_a_named_constant() -> None:
    from gateway.toolcalls.core import STREAM_AFTER_CHARS
    assert 16 <= STREAM_AFTER_CHARS < len(LONG) - 40 and len(SHORT) < STREAM_AFTER_CHARS


@pytest.mark.parametrize("dialect", sorted(HEADS))
def test_long_string_arguments_stream_before_the_call_closes(dialect: str) -> None:
    from gateway.toolcalls.core import STREAM_AFTER_CHARS
    parser = make_parser(dialect, TOOLS, stream_long_values=True)
    typed = typed_value(dialect, LONG)
    assert parser.feed("Writing.\n" + HEADS[dialect]) == [{"content": "Writing."}]
    headers, pieces, fed = [], [], 0
    for i in range(0, len(typed), 10):
        out = parser.feed(typed[i:i + 10])
        fed += 10
        calls = [d["tool_calls"][0] for d in out if "tool_calls" in d]
        headers += [c for c in calls if "id" in c]
        if not headers:
            assert not calls and fed <= STREAM_AFTER_CHARS + 10, "held while the value is short"
            continue
        assert calls, "once committed, each new piece of the value streams out at once"
        pieces += [c["function"]["arguments"] for c in calls]
    assert len(headers) == 1 and headers[0]["function"]["name"] == "write_file"
    assert headers[0]["id"].startswith("call_")
    parser.feed(TAILS[dialect])
    parser.finish("stop")
    args = parser.message()["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args) == {"content": LONG}
    assert "".join(pieces) in args


@pytest.mark.parametrize("dialect", sorted(HEADS))
def test_short_string_arguments_arrive_with_the_checked_call(dialect: str) -> None:
    parser = make_parser(dialect, TOOLS)
    out = parser.feed(HEADS[dialect] + typed_value(dialect, SHORT))
    assert out == []
    out = parser.feed(TAILS[dialect])
    calls = [d["tool_calls"][0] for d in out if "tool_calls" in d]
    assert calls and calls[0]["function"]["name"] == "write_file"
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"content": SHORT}


@pytest.mark.parametrize("dialect", sorted(HEADS))
def test_truncated_before_commit_stays_text(dialect: str) -> None:
    """The contract's rule, exactly: the cut-off block's raw text is the content."""
    text = "Hi " + HEADS[dialect] + typed_value(dialect, SHORT)
    r = run_all_ways(f"trunc-short-{dialect}", dialect, text, finish="length")
    assert "tool_calls" not in r.message
    assert r.message["content"] == text.strip()


@pytest.mark.parametrize("dialect", sorted(HEADS))
def test_whole_response_holds_long_values_until_the_block_closes(dialect: str) -> None:
    """Without stream_long_values nothing of a call leaves before its block is checked."""
    parser = make_parser(dialect, TOOLS)
    typed = typed_value(dialect, LONG * 3)
    assert parser.feed("Writing.\n" + HEADS[dialect]) == [{"content": "Writing."}]
    for i in range(0, len(typed), 10):
        assert parser.feed(typed[i:i + 10]) == []
    out = parser.feed(TAILS[dialect])
    assert json.loads("".join(d["tool_calls"][0]["function"]["arguments"] for d in out)) == {"content": LONG * 3}


@pytest.mark.parametrize("dialect", sorted(HEADS))
def test_truncated_long_value_stays_text(dialect: str) -> None:
    """Issue 16.2: a block cut by max_tokens inside a long value is the contract's raw text
    in a whole response (it used to be a call with the value closed)."""
    text = "Hi " + HEADS[dialect] + typed_value(dialect, LONG + "partial")
    whole, streamed = run_both_modes(f"trunc-long-{dialect}", dialect, text, finish="length")
    assert "tool_calls" not in whole.message
    assert whole.message["content"] == text.strip()
    # The stream had already shown the call: it stays, closed and marked failed, and the
    # block's text follows it as content.
    assert calls_of(streamed.message) == [("write_file", {"content": LONG + "partial"})]
    assert streamed.failed == [0] and streamed.complete_calls == 0
    assert streamed.message["content"] == text.strip()


@pytest.mark.parametrize("dialect,text", [
    ("glm", "<tool_call>write_file<arg_key>path</arg_key><arg_value>a.txt</arg_value>oops</tool_call> ok"),
    ("qwen_xml", "<tool_call><function=write_file><parameter=path>a.txt</parameter></function> oops"),
    ("dsml", f'<{D}tool_calls><{D}invoke name="write_file">{dsml_param("path", "a.txt")}{dsml_param("path", "b")}'
             f"</{D}invoke></{D}tool_calls>"),
    ("hermes", '<tool_call>{"name": "write_file", "arguments": {"path": "a.txt"} junk</tool_call>'),
])
def test_malformed_before_commit_stays_text(dialect: str, text: str) -> None:
    r = run_all_ways(f"mal-short-{dialect}", dialect, text)
    assert "tool_calls" not in r.message
    assert r.message["content"] == text


@pytest.mark.parametrize("dialect,text", [
    ("glm", f"<tool_call>write_file<arg_key>path</arg_key><arg_value>{LONG}</arg_value>oops</tool_call> ok"),
    ("qwen_xml", f"<tool_call><function=write_file><parameter=path>{LONG}</parameter></function> oops"),
    ("dsml", f'<{D}tool_calls><{D}invoke name="write_file">{dsml_param("path", LONG)}{dsml_param("path", "b")}'
             f"</{D}invoke></{D}tool_calls>"),
    ("hermes", f'<tool_call>{{"name": "write_file", "arguments": {{"path": {json.dumps(LONG)}}} junk</tool_call>'),
])
def test_malformed_long_value_stays_text(dialect: str, text: str) -> None:
    """Issue 16.2: a long value no longer makes a malformed block a call (it used to be kept,
    with the text from the failing element on as content)."""
    whole, streamed = run_both_modes(f"mal-long-{dialect}", dialect, text)
    assert "tool_calls" not in whole.message
    assert whole.message["content"] == text
    assert calls_of(streamed.message) == [("write_file", {"path": LONG})]
    assert streamed.failed == [0] and streamed.complete_calls == 0
    assert streamed.message["content"] == text


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_partial_marker_is_held_back(dialect: str) -> None:
    marker = DIALECTS[dialect].marker
    parser = make_parser(dialect, TOOLS)
    out = parser.feed("Hello " + marker[:-1])
    assert out == [{"content": "Hello"}]
    out = parser.feed("x")  # not a marker after all: the held text comes out
    assert out == [{"content": " " + marker[:-1] + "x"}]
    assert parser.finish("stop") == []


def test_partial_think_close_is_held_back() -> None:
    parser = make_parser("glm", TOOLS, in_reasoning=True)
    assert parser.feed("abc</thi") == [{"reasoning_content": "abc"}]
    assert parser.feed("nk>answer") == [{"content": "answer"}]


def test_reasoning_call_is_never_streamed_before_finish() -> None:
    parser = make_parser("glm", TOOLS)
    out = parser.feed("<think>Check.\n<tool_call>get_weather\n<arg_key>city</arg_key>"
                      "<arg_value>Paris</arg_value></tool_call>\n")
    assert all("tool_calls" not in d for d in out)
    final = parser.finish("stop")
    assert [d for d in final if "tool_calls" in d][0]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert parser.counters["reasoning_calls_delivered"] == 1


def test_ids_are_unique_deterministic_and_salted() -> None:
    text = glm("get_time") + glm("get_time")
    a = run("glm", [text]).message["tool_calls"]
    b = run("glm", list(text)).message["tool_calls"]
    c = run("glm", [text], id_salt="req-2").message["tool_calls"]
    assert [x["id"] for x in a] == [x["id"] for x in b]
    assert a[0]["id"] != a[1]["id"]
    assert {x["id"] for x in a}.isdisjoint(x["id"] for x in c)


def test_feed_after_finish_and_double_finish() -> None:
    parser = make_parser("hermes", TOOLS)
    assert parser.feed("hi <tool") == [{"content": "hi"}]
    assert parser.finish("stop") == [{"content": " <tool"}]
    assert parser.finish("stop") == []
    with pytest.raises(RuntimeError):
        parser.feed("more")


def test_dialect_none_only_splits_reasoning() -> None:
    r = run(None, ["<think>r</think>", glm("get_time")])  # type: ignore[arg-type]
    assert r.message == {"role": "assistant", "content": glm("get_time"), "reasoning_content": "r"}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_long_argument_streams_in_linear_time(dialect: str) -> None:
    body = ("x = 1 < 2 and 'q' \"dq\" \\ \n" * 800)[:20000]
    if dialect == "glm":
        text = glm("write_file", ("content", body))
    elif dialect == "qwen_xml":
        text = qx("write_file", ("content", body))
    elif dialect == "dsml":
        text = dsml_block(("write_file", [dsml_param("content", body)]))
    else:
        text = "<tool_call>" + json.dumps({"name": "write_file", "arguments": {"content": body}}) + "</tool_call>"
    began = time.perf_counter()
    r = run(dialect, [text[i:i + 3] for i in range(0, len(text), 3)])
    assert time.perf_counter() - began < 5.0
    assert calls_of(r.message) == [("write_file", {"content": body})]


# ---------------------------------------------------------------------- a value left open (issue 16.1)
# Each dialect's value must be closed before the next key / parameter opens; a block where one
# is not is malformed and stays text, whatever the value's length (short ones checked here, long
# ones under "the commit point" below).
SEARCH_TOOLS = [{"type": "function", "function": {"name": "search_docs", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}}}}}]
UNCLOSED_VALUE = [
    ("glm-issue", "glm", "<tool_call>search_docs\n<arg_key>query</arg_key>\n<arg_value>vector index\n"
                         "<arg_key>top_k</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"),
    ("glm-compact", "glm", "<tool_call>search_docs<arg_key>query</arg_key><arg_value>vector index"
                           "<arg_key>top_k</arg_key><arg_value>3</arg_value></tool_call>"),
    ("glm-typed-value", "glm", "<tool_call>search_docs<arg_key>top_k</arg_key><arg_value>3"
                               "<arg_key>query</arg_key><arg_value>v</arg_value></tool_call>"),
    ("qx-next-line", "qwen_xml", "<tool_call>\n<function=search_docs>\n<parameter=query>\nvector index\n"
                                 "<parameter=top_k>\n3\n</parameter>\n</function>\n</tool_call>"),
    ("qx-compact", "qwen_xml", "<tool_call><function=search_docs><parameter=query>vector index"
                               "<parameter=top_k>3</parameter></function></tool_call>"),
    ("dsml-next-param", "dsml", f'<{D}tool_calls>\n<{D}invoke name="search_docs">\n'
                                f'<{D}parameter name="query" string="true">vector index\n'
                                f'{dsml_param("top_k", "3", "false")}\n</{D}invoke>\n</{D}tool_calls>'),
    ("dsml-typed-value", "dsml", f'<{D}tool_calls><{D}invoke name="search_docs">'
                                 f'<{D}parameter name="top_k" string="false">3'
                                 f'{dsml_param("query", "v")}</{D}invoke></{D}tool_calls>'),
    ("dsml-next-invoke", "dsml", f'<{D}tool_calls><{D}invoke name="search_docs">'
                                 f'<{D}parameter name="query" string="true">v</{D}invoke>'
                                 f'<{D}invoke name="search_docs">{dsml_param("query", "w")}</{D}invoke>'
                                 f"</{D}tool_calls>"),
]


@pytest.mark.parametrize("case_id,dialect,text", UNCLOSED_VALUE, ids=[c[0] for c in UNCLOSED_VALUE])
def test_value_not_closed_before_the_next_key_is_text(case_id: str, dialect: str, text: str) -> None:
    r = run_all_ways(case_id, dialect, "Looking. " + text, tools=SEARCH_TOOLS)
    assert "tool_calls" not in r.message
    assert r.message["content"] == "Looking. " + text


@pytest.mark.parametrize("dialect,text,expected", [
    ("glm", glm("search_docs", ("query", "a <arg_value> b"), ("top_k", "3")), {"query": "a <arg_value> b", "top_k": 3}),
    ("qwen_xml", qx("search_docs", ("query", "see <parameter=x>1</parameter> here"), ("top_k", "3")),
     {"query": "see <parameter=x>1</parameter> here", "top_k": 3}),
    ("qwen_xml", qx("search_docs", ("query", DOC_CALL)), {"query": DOC_CALL}),
])
def test_balanced_literal_tags_in_values_still_parse(dialect: str, text: str, expected: dict) -> None:
    r = run_all_ways(f"literal-{dialect}", dialect, text, tools=SEARCH_TOOLS)
    assert calls_of(r.message) == [("search_docs", expected)]


X200 = "x" * 200
ISSUE_LONG_MALFORMED = [
    # issue 16.2's examples: each was a call whose value swallowed the rest of the block
    ("qx-no-param-close", "qwen_xml", "stop",
     "<tool_call>\n<function=write_file>\n<parameter=content>\n" + X200 + "\n</function>\n</tool_call>"),
    ("qx-cut", "qwen_xml", "length", "<tool_call>\n<function=write_file>\n<parameter=content>\n" + X200),
    ("glm-no-value-close", "glm", "stop",
     "<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>" + X200 + "\n</tool_call>"),
    ("dsml-no-param-close", "dsml", "stop",
     f'<{D}tool_calls>\n<{D}invoke name="write_file">\n<{D}parameter name="content" string="true">'
     + X200 + f"\n</{D}invoke>\n</{D}tool_calls>"),
    ("hermes-unterminated", "hermes", "stop",
     '<tool_call>\n{"name": "write_file", "arguments": {"content": "' + X200 + '"}\n</tool_call>'),
    ("hermes-cut", "hermes", "length", '<tool_call>\n{"name": "write_file", "arguments": {"content": "' + X200),
    ("hermes-bad-json", "hermes", "stop",
     '<tool_call>\n{"name": "write_file", "arguments": {"content": "' + X200 + '", oops}}\n</tool_call>'),
    # issue 16.1 with a long value
    ("glm-long-next-key", "glm", "stop",
     "<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>" + X200
     + "\n<arg_key>path</arg_key>\n<arg_value>a</arg_value>\n</tool_call>"),
    ("qx-long-next-param", "qwen_xml", "stop",
     "<tool_call>\n<function=write_file>\n<parameter=content>\n" + X200
     + "\n<parameter=path>\na\n</parameter>\n</function>\n</tool_call>"),
    ("dsml-long-next-param", "dsml", "stop",
     f'<{D}tool_calls>\n<{D}invoke name="write_file">\n<{D}parameter name="content" string="true">'
     + X200 + f'\n{dsml_param("path", "a")}\n</{D}invoke>\n</{D}tool_calls>'),
]


@pytest.mark.parametrize("case_id,dialect,finish,text", ISSUE_LONG_MALFORMED,
                         ids=[c[0] for c in ISSUE_LONG_MALFORMED])
def test_long_malformed_blocks_are_text(case_id: str, dialect: str, finish: str, text: str) -> None:
    whole, streamed = run_both_modes(case_id, dialect, "Saving it. " + text, finish=finish)
    assert "tool_calls" not in whole.message
    assert whole.message["content"] == ("Saving it. " + text).strip()
    # Streamed, the value had passed the commit point: one failed call, then the same content.
    [(name, args)] = calls_of(streamed.message)
    assert name == "write_file" and args["content"].startswith(X200)
    assert streamed.failed == [0] and streamed.complete_calls == 0


def test_a_failed_call_does_not_hide_the_calls_after_it() -> None:
    """The failed block's text is read again: a good block after it is a call in both modes,
    at index 0 in the whole response and index 1 (after the failed call) in the stream."""
    bad = "<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>" + X200 + "\n</tool_call>\n"
    good = glm("get_time")
    whole, streamed = run_both_modes("failed-then-good", "glm", bad + good)
    assert calls_of(whole.message) == [("get_time", {})]
    assert whole.message["content"] == bad.strip()
    assert [c[0] for c in calls_of(streamed.message)] == ["write_file", "get_time"]
    assert streamed.failed == [0] and streamed.complete_calls == 1
