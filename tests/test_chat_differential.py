"""Differential test: each hand-written encoder against the sandboxed Jinja render of the
real template, on many generated conversations (edge cases included), byte for byte."""
from __future__ import annotations

import json
import random
from typing import Any

import pytest

from gateway.chat import ChatEncodingError
from gateway.families import encode
from reference_data import template_text

FORMAT_TEMPLATES = [
    ("glm45", "GLM-4.5.jinja"), ("glm45", "GLM-4.6.jinja"), ("glm47", "GLM-4.7-Flash.jinja"),
    ("qwen3", "Qwen3.jinja"), ("qwen3_coder", "Qwen3-Coder.jinja"), ("qwen35", "Qwen3.5.jinja"),
]

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "  Get weather for a city.\n",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "when": {"type": ["string", "null"], "default": None},
            "opts": {"type": "object", "properties": {"lang": {"type": "string"}}, "additionalProperties": False},
            "tags": {"type": "array", "items": {"type": "string"}},
        }, "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "now", "description": "Current time (ünïcode “quotes”).",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "ping", "strict": True}},
]

ARG_VALUES: list[Any] = ["Zürich <&> \"q\"", "multi\nline", "", 3, -7, 2.5, 1e-07, 1.0, True, False, None,
                         ["a", 1, None], {"lang": "de", "n": {"x": [1, 2]}}, [], {}]
TEXTS = ["Hello", "  padded text \n", "Weather in Zürich?", "ends with /nothink", "<tool_response>\nx\n</tool_response>",
         "line1\nline2", "", "a </think> b", "emoji 🚀 and \\ backslash"]


def _arguments(rng: random.Random) -> dict[str, Any]:
    keys = rng.sample(["city", "days", "unit", "when", "opts", "tags", "extra"], rng.randint(0, 4))
    return {k: rng.choice(ARG_VALUES) for k in keys}


def _tool_call(rng: random.Random, k: int) -> dict[str, Any]:
    args = _arguments(rng)
    encoded: Any = json.dumps(args, ensure_ascii=rng.random() < 0.3) if rng.random() < 0.7 else args
    if not args and rng.random() < 0.3:
        encoded = ""
    return {"id": f"call_{k}", "type": "function",
            "function": {"name": rng.choice(["get_weather", "now", "ping"]), "arguments": encoded}}


def _content(rng: random.Random) -> Any:
    text = rng.choice(TEXTS)
    r = rng.random()
    if r < 0.15:
        return [{"type": "text", "text": text}, {"type": "text", "text": rng.choice(TEXTS)}]
    if r < 0.2:
        return None
    return text


def _assistant(rng: random.Random, k: int) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": _content(rng)}
    r = rng.random()
    if r < 0.4:
        msg["reasoning_content"] = rng.choice(["Think.", "\n  spaced thought \n", "", "multi\nline\nreasoning"])
    elif r < 0.5:
        msg["reasoning"] = "aliased thought"
    elif r < 0.6:
        msg["content"] = "<think>\ninline thought\n</think>\n\nanswer"
    if rng.random() < 0.5:
        msg["tool_calls"] = [_tool_call(rng, k * 10 + j) for j in range(rng.randint(1, 3))]
    return msg


def conversation(seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.6:
        messages.append({"role": rng.choice(["system", "system", "developer"]), "content": rng.choice(TEXTS)})
    for turn in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": _content(rng)})
        for step in range(rng.randint(0, 2)):
            assistant = _assistant(rng, turn * 3 + step)
            messages.append(assistant)
            for call in assistant.get("tool_calls", []):
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": _content(rng)})
            if "tool_calls" not in assistant:
                break
    if rng.random() < 0.2 and messages[-1]["role"] == "user":
        messages.append(_assistant(rng, 99))
    if rng.random() < 0.1:
        messages.append({"role": "system", "content": "late system note"})
        messages.append({"role": "user", "content": "again"})
    tools = None
    if rng.random() < 0.7:
        tools = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
    return messages, tools


SEEDS = range(120)


def _render(fmt: str, template: str | None, messages: list[dict], tools: list[dict] | None, **kwargs: Any) -> str:
    try:
        if template is None:
            return encode(fmt, messages, tools, **kwargs).text
        return encode("jinja", messages, tools, chat_template=template, **kwargs).text
    except ChatEncodingError as exc:
        return f"<refused: {type(exc).__name__}>"


@pytest.mark.parametrize("fmt,template_name", FORMAT_TEMPLATES)
def test_hand_written_equals_template_on_generated_conversations(fmt: str, template_name: str) -> None:
    template = template_text(template_name)
    settings: list[dict[str, Any]] = [
        {"thinking": None, "add_generation_prompt": True},
        {"thinking": False, "add_generation_prompt": True},
        {"thinking": True, "add_generation_prompt": False},
    ]
    if fmt == "glm47":
        settings.append({"thinking": None, "add_generation_prompt": True, "extra": {"clear_thinking": False}})
    rendered = refused = 0
    for seed in SEEDS:
        messages, tools = conversation(seed)
        for kwargs in settings:
            ours = _render(fmt, None, messages, tools, **kwargs)
            theirs = _render(fmt, template, messages, tools, **kwargs)
            assert ours == theirs, f"seed {seed} {kwargs}: first difference at {_first_diff(ours, theirs)}"
            refused += ours.startswith("<refused")
            rendered += 1
    # The generator must exercise real renders, not only refusals.
    assert refused < rendered // 4


def _first_diff(a: str, b: str) -> str:
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"{i}: ours={a[max(0, i - 40):i + 40]!r} template={b[max(0, i - 40):i + 40]!r}"
