"""Budget steering against adversarial "models" (gateway.structured), real tokenizers, no server.

Each run picks, among the tokens the constraint allows, the one a fixed preference scores highest
(plus seeded noise): the way a real model at temperature 1 keeps choosing the same kind of token.
Whenever the shortest completion fits in max_tokens at the start, the reply must finish with the
stop token inside the budget and parse into calls that validate.

The two failures these reproduce (live: DeepSeek-V4 `point` at max_tokens 96 ended with
finish_reason "length" and no call):
* after a "-" the closing planner wrote "-0", "-0.0", "-0.00"... (the grammar admits no negative
  zero), never found a plan, and budget steering stayed off for the rest of the reply;
* near the limit, plain-letter tokens counted as harmless, but at a markup branch they are not:
  after DSML's "<", "｜" opens another invoke where "/" closes the block.
"""
from __future__ import annotations

import json
from collections.abc import Callable

import jsonschema
import numpy as np
import pytest

from gateway.families import FAMILIES
from gateway.structured import build_constraint
from test_structured import FORMATS, SCHEMAS, _check_calls, _parse, tokenizers  # noqa: F401  (the module-scoped tokenizers fixture)

Preference = Callable[[str], float]
SCORED_AT_MOST = 4096  # larger allowed sets (free text) are sampled uniformly: scoring is slow


def _by_name(name: str) -> dict:
    return next(t for t in SCHEMAS if t["function"]["name"] == name)


def _run_biased(constraint, stops: list[int], max_tokens: int, seed: int,
                prefer: Preference) -> tuple[list[int], str]:
    rng = np.random.default_rng(seed)
    hook = constraint.token_mask_hook(max_tokens)
    out: list[int] = []
    while len(out) < max_tokens:
        allowed = np.flatnonzero(hook(out))
        assert len(allowed), "the constraint allowed no token"
        if len(allowed) > SCORED_AT_MOST:
            tid = int(rng.choice(allowed))
        else:
            texts = [constraint.ctx.lltok.decode_str([int(t)]) for t in allowed]
            scores = np.array([prefer(t) for t in texts]) + rng.gumbel(size=len(allowed))
            tid = int(allowed[int(np.argmax(scores))])
        out.append(tid)
        if tid in stops:
            return out, "stop"
    return out, "length"


def _negative_and_long(text: str) -> float:
    """Signs first, then the longest digit runs: numbers that never want to end."""
    return 6.0 * ("-" in text) + len(text) - 20.0 * ("," in text or "}" in text or "<" in text)


def _plain_letters(text: str) -> float:
    """Markup letters and the DSML bar over punctuation: opens whatever a letter can open."""
    return 8.0 * ("\uff5c" in text) + 4.0 * any(c.isalpha() for c in text) - 4.0 * ("/" in text)


def _build(tokenizers, fmt: str, tools: list[dict], forced: str | None, parallel: bool):
    path, stops, n_vocab, dialect = tokenizers[fmt]
    c = build_constraint(path, kind="tool_call", calls=FAMILIES[fmt].calls, tools=tools, forced_name=forced,
                         parallel=parallel, stop_token_ids=stops, n_vocab=n_vocab)
    return c, stops, dialect


def _assert_closes(tokenizers, fmt: str, tools: list[dict], forced: str | None, parallel: bool,
                   max_tokens: int, seed: int, prefer: Preference) -> None:
    c, stops, dialect = _build(tokenizers, fmt, tools, forced, parallel)
    need = c.need()
    assert need is not None and need <= max_tokens, (need, max_tokens)
    out, finish = _run_biased(c, stops, max_tokens, seed, prefer)
    text = c.ctx.lltok.decode_str([t for t in out if t not in stops])
    assert finish == "stop", f"{fmt} budget {max_tokens} (need {need}) ran out: {text[-160:]!r}"
    _, msg = _parse(fmt, dialect, tools, c, out, stops)
    _check_calls(msg, tools, forced, parallel, text)


def test_planner_finishes_a_negative_number(tokenizers):
    """Right after "-" a completion exists and is short; the grammar has no negative zero."""
    tool = _by_name("point")
    c, _, _ = _build(tokenizers, "dsml", [tool], "point", False)
    start = c.need()
    for tid in c.ctx.ids('<\uff5cDSML\uff5cparameter name="p" string="false">{"x": -'):
        c.advance(tid)
    plan = c.closing_plan()
    assert plan is not None, "no closing plan after a minus sign"
    assert len(plan) <= start, (len(plan), start)
    # Following it really completes the call ("-0.1" where the shortest digit would go on for ever).
    for tid in plan[:-1]:
        c.advance(tid)
    assert c.is_complete()


@pytest.mark.parametrize("name", ["point", "scale", "matrix", "mixed"])
def test_negative_numbers_close_in_budget(tokenizers, name):
    tool = _by_name(name)
    c, _, _ = _build(tokenizers, "dsml", [tool], name, False)
    need = c.need()
    for seed, extra in enumerate([1, 8, 25, 57]):  # `point` at 96 was the live failure
        _assert_closes(tokenizers, "dsml", [tool], name, False, need + extra, seed, _negative_and_long)


def test_negative_json_reply_closes_in_budget(tokenizers):
    path, stops, n_vocab, _ = tokenizers["dsml"]
    schema = {"type": "object", "properties": {"v": {"type": "number"}, "w": {"type": "number"}},
              "required": ["v", "w"], "additionalProperties": False}
    for seed, budget in [(0, 24), (1, 40)]:
        c = build_constraint(path, kind="json_schema", json_schema=schema, stop_token_ids=stops,
                             n_vocab=n_vocab)
        out, finish = _run_biased(c, stops, budget, seed, _negative_and_long)
        assert finish == "stop", c.ctx.lltok.decode_str(out)


def test_dsml_bar_after_lt_is_not_harmless(tokenizers):
    """One call complete, "\\n<" written, budget tight: "｜" (another invoke) is not allowed."""
    tool = _by_name("toggle")
    c, _, _ = _build(tokenizers, "dsml", [tool], None, True)
    for tid in c.ctx.ids('toggle">\n<\uff5cDSML\uff5cparameter name="on" string="false">false'
                         '</\uff5cDSML\uff5cparameter>\n</\uff5cDSML\uff5cinvoke>\n<'):
        c.advance(tid)
    need = c.closing_plan()
    assert need is not None
    bar = c.ctx.ids("\uff5c")
    assert len(bar) == 1 and c._grammar_mask()[bar[0]], "the grammar itself allows the bar here"
    for remaining in range(len(need), len(need) + 12):
        c.closing_plan()
        assert not c.allowed(remaining)[bar[0]], remaining


@pytest.mark.parametrize("name", ["toggle", "set_unit", "optional_only", "point", "const_str"])
def test_parallel_calls_close_in_tight_budgets(tokenizers, name):
    tool = _by_name(name)
    c, _, _ = _build(tokenizers, "dsml", [tool], None, True)
    need = c.need()
    for seed, extra in enumerate([0, 3, 9, 19, 35]):
        _assert_closes(tokenizers, "dsml", [tool], None, True, need + extra, seed, _plain_letters)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_resists_letter_loving_models(tokenizers, fmt):
    """The same adversary on every dialect: required (any of six tools, parallel) and a forced
    call with optional parameters, at budgets from the shortest completion up."""
    tools = SCHEMAS[:6]
    c, _, _ = _build(tokenizers, fmt, tools, None, True)
    need = c.need()
    for seed, extra in enumerate([0, 5, 14, 30]):
        _assert_closes(tokenizers, fmt, tools, None, True, need + extra, seed, _plain_letters)
    opt = _by_name("optional_only")
    c, _, _ = _build(tokenizers, fmt, [opt], "optional_only", False)
    need = c.need()
    for seed, extra in enumerate([0, 4, 12]):
        _assert_closes(tokenizers, fmt, [opt], "optional_only", False, need + extra, seed, _plain_letters)


# ------------------------------------------------------------------ JSON replies: the real shortest

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"]}
PERSON_SHORTEST = '{"name": "", "age": 0, "tags": []}'


def _json_constraint(tokenizers, fmt: str, schema):
    path, stops, n_vocab, _ = tokenizers[fmt]
    return build_constraint(path, kind="json_schema", json_schema=schema, stop_token_ids=stops,
                            n_vocab=n_vocab), stops


def _spelled(constraint, text: str) -> int:
    """Tokens the tokenizer itself spells `text` with, plus the stop token."""
    return len(constraint.ctx.ids(text)) + 1


@pytest.mark.parametrize("fmt", ["dsml", "qwen3"])
def test_json_need_is_the_shortest_answer_in_real_tokens(tokenizers, fmt):
    """Live (demo, max_tokens 16-21): `{"name": "", "age": 0, "tags": [""` and finish_reason
    "length", where the 15-token answer fits.  The planner spelled its completion one character
    at a time and wrote `[""]` for `[]`, so it thought 23 tokens were needed."""
    c, _ = _json_constraint(tokenizers, fmt, PERSON)
    assert c.need() <= _spelled(c, PERSON_SHORTEST), (c.need(), c.ctx.lltok.decode_str(c._plan))
    empty = {"type": "object", "properties": {"a": {"type": "string"}}}  # nothing required: "{}"
    c, _ = _json_constraint(tokenizers, fmt, empty)
    assert c.need() <= _spelled(c, "{}"), c.ctx.lltok.decode_str(c._plan)


def _string_lover(text: str) -> float:
    """Opens strings and array items whenever it may, and writes long words inside them."""
    return 6.0 * ('"' in text) + len(text) - 20.0 * ("]" in text or "}" in text)


@pytest.mark.parametrize("fmt", ["dsml", "qwen3"])
def test_json_reply_finishes_at_every_budget_that_fits(tokenizers, fmt):
    c, stops = _json_constraint(tokenizers, fmt, PERSON)
    shortest = _spelled(c, PERSON_SHORTEST)
    for budget in range(shortest, shortest + 10):
        for seed, prefer in enumerate([_string_lover, _plain_letters, _negative_and_long]):
            c, _ = _json_constraint(tokenizers, fmt, PERSON)
            out, finish = _run_biased(c, stops, budget, seed, prefer)
            text = c.ctx.lltok.decode_str([t for t in out if t not in stops])
            assert finish == "stop", f"budget {budget} (shortest {shortest}): {text!r}"
            jsonschema.validate(json.loads(text), PERSON)
