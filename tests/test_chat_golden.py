"""Golden renders: every conversation of tests/data/templates/golden-renders.json, rendered by the
hand-written encoders and by the sandboxed Jinja fallback, must match byte for byte."""
from __future__ import annotations

import json

import pytest

from gateway.chat import ChatEncodingError
from gateway.chat.jinja_render import render_template
from gateway.families import encode
from gateway.families.checkpoint import TEMPLATES_DIR
from reference_data import TEMPLATES_DIR as REFERENCE_TEMPLATES
from reference_data import template_text

GOLDEN = json.loads((REFERENCE_TEMPLATES / "golden-renders.json").read_text(encoding="utf-8"))
CASES = GOLDEN["_about"]["cases"]
EXTRA_CONTEXT = GOLDEN["_about"]["extra_context"]
HAND_WRITTEN = {
    "GLM-4.5.jinja": "glm45",
    "GLM-4.6.jinja": "glm45",
    "GLM-4.7-Flash.jinja": "glm47",
    "Qwen3.jinja": "qwen3",
    "Qwen3-Coder.jinja": "qwen3_coder",
    "Qwen3.5.jinja": "qwen35",
}
# DeepSeek-V3.1 concatenates arguments as text; every other file iterates a mapping.
STRING_ARGUMENT_TEMPLATES = {"DeepSeek-V3.1.jinja"}

ALL = [(t, c) for t, renders in GOLDEN["renders"].items() for c in renders]


def test_golden_file_covers_every_template_and_case() -> None:
    assert len(GOLDEN["renders"]) == 9
    for renders in GOLDEN["renders"].values():
        assert set(renders) == set(CASES)



def _thinking(case: dict) -> bool | None:
    return case["kwargs"].get("enable_thinking")


def _wire_form(messages: list[dict]) -> list[dict]:
    """The conversation as an OpenAI client sends it: arguments as JSON strings."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        for call in m.get("tool_calls") or []:
            args = call["function"]["arguments"]
            if not isinstance(args, str):
                call["function"]["arguments"] = json.dumps(args, ensure_ascii=False)
        out.append(m)
    return out


def _template_form(messages: list[dict], template_name: str) -> list[dict]:
    """The conversation in the shape the raw template expects (mapping or string arguments)."""
    out = _wire_form(messages)
    if template_name not in STRING_ARGUMENT_TEMPLATES:
        for m in out:
            for call in m.get("tool_calls") or []:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


@pytest.mark.parametrize("template_name,case_name", ALL)
def test_raw_render_reproduces_golden(template_name: str, case_name: str) -> None:
    """Our sandboxed environment, given the exact golden input, behaves like transformers:
    same text, or a failure where transformers failed."""
    case, expected = CASES[case_name], GOLDEN["renders"][template_name][case_name]
    context = dict(EXTRA_CONTEXT, **case["kwargs"])

    def render() -> str:
        return render_template(template_text(template_name), messages=case["messages"], tools=case["tools"],
                               documents=None, add_generation_prompt=case["add_generation_prompt"], **context)

    if expected["ok"]:
        assert render() == expected["text"]
    else:
        with pytest.raises(ChatEncodingError):
            render()


# Inputs transformers itself could not render (string arguments for mapping templates) are
# covered by test_wire_form_renders_like_template_form.
@pytest.mark.parametrize("template_name,case_name",
                         [a for a in ALL if a[0] in HAND_WRITTEN and GOLDEN["renders"][a[0]][a[1]]["ok"]])
def test_hand_written_encoder_matches_golden(template_name: str, case_name: str) -> None:
    case, expected = CASES[case_name], GOLDEN["renders"][template_name][case_name]
    got = encode(HAND_WRITTEN[template_name], case["messages"], case["tools"], thinking=_thinking(case),
                 add_generation_prompt=case["add_generation_prompt"])
    assert got.text == expected["text"]


@pytest.mark.parametrize("template_name,case_name", ALL)
def test_jinja_fallback_matches_golden(template_name: str, case_name: str) -> None:
    case, expected = CASES[case_name], GOLDEN["renders"][template_name][case_name]
    got = encode("jinja", case["messages"], case["tools"], thinking=_thinking(case), extra=EXTRA_CONTEXT,
                 add_generation_prompt=case["add_generation_prompt"], chat_template=template_text(template_name))
    if expected["ok"]:
        assert got.text == expected["text"]
    elif case_name == "tool_conv_dict_args":
        # Normalisation hands DeepSeek-V3.1 arguments it can concatenate: equal to the string form.
        sibling = GOLDEN["renders"][template_name]["tool_conv_string_args"]
        assert sibling["ok"] and got.text == sibling["text"]
    elif case_name == "tool_conv_string_args":
        # Normalisation decodes the strings for mapping templates: equal to the dict form.
        sibling = GOLDEN["renders"][template_name]["tool_conv_dict_args"]
        assert sibling["ok"] and got.text == sibling["text"]
    else:  # other failures are checked against the template-form render in the next test
        assert got.text


@pytest.mark.parametrize("template_name,case_name", ALL)
def test_wire_form_renders_like_template_form(template_name: str, case_name: str) -> None:
    """A real client sends arguments as JSON strings: both our paths must render exactly what
    the template renders from the input form it needs, for every golden conversation."""
    case = CASES[case_name]
    expected = render_template(template_text(template_name), messages=_template_form(case["messages"], template_name),
                               tools=case["tools"], documents=None,
                               add_generation_prompt=case["add_generation_prompt"],
                               **dict(EXTRA_CONTEXT, **case["kwargs"]))
    wire = _wire_form(case["messages"])
    kwargs = dict(thinking=_thinking(case), add_generation_prompt=case["add_generation_prompt"])
    fallback = encode("jinja", wire, case["tools"], extra=EXTRA_CONTEXT, chat_template=template_text(template_name), **kwargs)
    assert fallback.text == expected
    if template_name in HAND_WRITTEN:
        assert encode(HAND_WRITTEN[template_name], wire, case["tools"], **kwargs).text == expected


@pytest.mark.parametrize("template_name", sorted(set(HAND_WRITTEN)))
def test_bundled_templates_are_the_reference_files(template_name: str) -> None:
    assert (TEMPLATES_DIR / template_name).read_bytes() == (REFERENCE_TEMPLATES / template_name).read_bytes()
