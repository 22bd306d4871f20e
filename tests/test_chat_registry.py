"""Format registry, checkpoint detection, the sandboxed Jinja environment and input
normalisation."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.chat import ChatEncodingError, ChatTemplateError
from gateway.chat.jinja_render import render_template
from gateway.families import FAMILIES, bundled_template, detect_format, encode, load_chat_setup
from reference_data import TEMPLATES_DIR, template_text

HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


# --------------------------------------------------------------------------- registry facts

def test_every_format_declares_dialect_and_stops() -> None:
    assert set(FAMILIES) == {"dsml", "glm45", "glm47", "qwen3", "qwen3_coder", "qwen35", "jinja"}
    assert FAMILIES["dsml"].tool_dialect == "dsml" and "<｜end▁of▁sentence｜>" in FAMILIES["dsml"].stop_strings
    assert FAMILIES["glm45"].tool_dialect == FAMILIES["glm47"].tool_dialect == "glm"
    assert set(FAMILIES["glm45"].stop_strings) == {"<|endoftext|>", "<|user|>", "<|observation|>"}
    assert FAMILIES["qwen3"].tool_dialect == "hermes"
    assert FAMILIES["qwen3_coder"].tool_dialect == FAMILIES["qwen35"].tool_dialect == "qwen_xml"
    assert set(FAMILIES["qwen35"].stop_strings) == {"<|im_end|>", "<|endoftext|>"}
    for name, fmt in FAMILIES.items():
        if fmt.reference_template:
            assert bundled_template(name)


@pytest.mark.parametrize("fmt,thinking,opens", [
    ("dsml", None, False), ("dsml", True, True), ("glm45", None, False), ("glm45", False, False),
    ("glm47", None, True), ("glm47", False, False), ("qwen3", None, False), ("qwen3", False, False),
    ("qwen3_coder", None, False), ("qwen35", None, True), ("qwen35", True, True), ("qwen35", False, False),
])
def test_prompt_opens_reasoning(fmt: str, thinking: bool | None, opens: bool) -> None:
    got = encode(fmt, HI, thinking=thinking)
    assert got.prompt_opens_reasoning is opens
    assert FAMILIES[fmt].reasoning_opened is (fmt in ("glm47", "qwen35"))
    assert not encode(fmt, HI, thinking=thinking, add_generation_prompt=False).prompt_opens_reasoning


def test_thinking_switch_from_chat_template_kwargs() -> None:
    assert encode("qwen35", HI, extra={"enable_thinking": False}).text.endswith("<think>\n\n</think>\n\n")
    assert encode("dsml", HI, extra={"thinking": True}).text.endswith("<think>")
    # An explicit argument wins over the kwargs.
    assert encode("dsml", HI, thinking=False, extra={"thinking": True}).text.endswith("</think>")


@pytest.mark.parametrize("fmt,name,expected", [
    ("glm45", None, "\n<tool_call>"), ("glm45", "f", "\n<tool_call>f\n"),
    ("glm47", None, "<tool_call>"), ("glm47", "f", "<tool_call>f"),
    ("qwen3", None, '<tool_call>\n{"name": "'), ("qwen3", "f", '<tool_call>\n{"name": "f", "arguments": '),
    ("qwen3_coder", "f", "<tool_call>\n<function=f>\n"), ("qwen35", None, "<tool_call>\n<function="),
])
def test_forced_call_prefixes(fmt: str, name: str | None, expected: str) -> None:
    assert FAMILIES[fmt].calls.opener(name) == expected
    choice: Any = "required" if name is None else {"type": "function", "function": {"name": name}}
    assert encode(fmt, HI, [TOOL], tool_choice=choice).forced_call_prefix == expected


def test_tool_choice_validation() -> None:
    assert encode("qwen3", HI, [TOOL], tool_choice="auto").forced_call_prefix is None
    assert encode("qwen3", HI, [TOOL], tool_choice="none").forced_call_prefix is None
    assert encode("qwen3", HI, [TOOL], tool_choice={"type": "tool", "name": "f"}).forced_call_prefix is not None
    with pytest.raises(ChatEncodingError):
        encode("qwen3", HI, None, tool_choice="required")
    with pytest.raises(ChatEncodingError):
        encode("qwen3", HI, [TOOL], tool_choice="sometimes")


# --------------------------------------------------------------------------- detection

@pytest.mark.parametrize("model_type,template,expected", [
    ("deepseek_v4", None, "dsml"),
    ("glm4_moe", "GLM-4.5.jinja", "glm45"),
    ("glm4_moe", "GLM-4.6.jinja", "glm45"),
    ("glm4_moe", "GLM-4.7-Flash.jinja", "glm47"),
    ("glm4_moe_lite", "GLM-4.7-Flash.jinja", "glm47"),
    ("glm4_moe", None, "glm45"),
    ("qwen3_moe", "Qwen3.jinja", "qwen3"),
    ("qwen3_moe", "Qwen3-Coder.jinja", "qwen3_coder"),
    ("qwen3_moe", None, "qwen3"),
    ("qwen3_5_moe", "Qwen3.5.jinja", "qwen35"),
    ("bailing_hybrid", "Ling-3.0-flash.jinja", "jinja"),
    ("deepseek_v3", "DeepSeek-V3.1.jinja", "jinja"),
])
def test_detect_format(model_type: str, template: str | None, expected: str) -> None:
    tokenizer_config = {"chat_template": template_text(template)} if template else {}
    assert detect_format({"model_type": model_type}, tokenizer_config) == expected


MODEL_TYPES = ("deepseek_v4", "glm4_moe", "glm4_moe_lite", "qwen3_moe", "qwen3_5_moe", "bailing_hybrid", "x")


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_at_most_one_family_recognizes_a_checkpoint(model_type: str) -> None:
    """Detection asks each family record (Family.recognizes) in registry order: for any model
    type and any real template (or none), at most one hand-written family claims it, so adding
    a family is its file and its registry line, and the order never decides between two."""
    templates = [None, *sorted(p.name for p in TEMPLATES_DIR.glob("*.jinja"))]
    for name in templates:
        text = template_text(name) if name else None
        claims = [f.name for f in FAMILIES.values() if f.name != "jinja" and f.recognizes is not None
                  and f.recognizes(frozenset({model_type}), text)]
        assert len(claims) <= 1, (model_type, name, claims)
    assert all(f.recognizes is not None for f in FAMILIES.values())
    assert list(FAMILIES)[-1] == "jinja"  # the fallback is asked last


def test_detect_format_reads_nested_text_config_and_named_templates() -> None:
    assert detect_format({"model_type": "x", "text_config": {"model_type": "qwen3_5_moe"}}) == "qwen35"
    named = {"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template_text("Qwen3.jinja")}]}
    assert detect_format({"model_type": "qwen3_moe"}, named) == "qwen3"
    with pytest.raises(ChatTemplateError):
        detect_format({"model_type": "llama"}, {})


def _checkpoint(tmp_path: Path, config: dict, tokenizer_config: dict | None = None,
                template_file: str | None = None) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if tokenizer_config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    if template_file is not None:
        (tmp_path / "chat_template.jinja").write_text(template_file, encoding="utf-8")
    return tmp_path


def test_setup_verifies_hand_written_encoder(tmp_path: Path) -> None:
    root = _checkpoint(tmp_path, {"model_type": "glm4_moe"}, {"eos_token": "<|endoftext|>"}, template_text("GLM-4.6.jinja"))
    setup = load_chat_setup(root)
    assert (setup.format, setup.tool_dialect, setup.note) == ("glm45", "glm", "")
    assert setup.encode(HI).text == "[gMASK]<sop><|user|>\nhi<|assistant|>"


def test_setup_falls_back_to_the_template_when_it_differs(tmp_path: Path) -> None:
    # A revised Qwen3 template (thinking-2507 style: the generation prompt opens <think>).
    revised = template_text("Qwen3.jinja").replace("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}")
    assert revised != template_text("Qwen3.jinja")
    root = _checkpoint(tmp_path, {"model_type": "qwen3_moe"}, {"chat_template": revised, "eos_token": "<|im_end|>"})
    setup = load_chat_setup(root)
    assert setup.format == "jinja" and setup.tool_dialect == "hermes" and "differs" in setup.note
    assert "<|im_end|>" in setup.stop_strings
    got = setup.encode(HI)
    assert got.text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n" and got.prompt_opens_reasoning


def test_setup_jinja_passes_special_tokens(tmp_path: Path) -> None:
    bos = "<｜begin▁of▁sentence｜>"
    root = _checkpoint(tmp_path, {"model_type": "deepseek_v3"},
                       {"chat_template": template_text("DeepSeek-V3.1.jinja"), "bos_token": {"content": bos},
                        "eos_token": {"content": "<｜end▁of▁sentence｜>"}})
    setup = load_chat_setup(root)
    assert setup.format == "jinja" and "<｜end▁of▁sentence｜>" in setup.stop_strings
    assert setup.encode(HI).text == f"{bos}<｜User｜>hi<｜Assistant｜></think>"


def test_setup_dsml_effort_table_from_checkpoint_name(tmp_path: Path) -> None:
    plain = tmp_path / "DeepSeek-V4-Flash"
    plain.mkdir()
    _checkpoint(plain, {"model_type": "deepseek_v4"})
    assert load_chat_setup(plain).default_extra == {"effort_table": "preview"}
    newer = tmp_path / "DeepSeek-V4-Flash-0731"
    newer.mkdir()
    _checkpoint(newer, {"model_type": "deepseek_v4"})
    setup = load_chat_setup(newer)
    assert setup.format == "dsml" and setup.default_extra == {"effort_table": "0731"}
    assert "Beyond maximum" in setup.encode(HI, thinking=True, reasoning_effort="max").text


def test_setup_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ChatTemplateError, match="config.json"):
        load_chat_setup(tmp_path)
    (tmp_path / "config.json").write_text("{broken", encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="config.json"):
        load_chat_setup(tmp_path)


# --------------------------------------------------------------------------- sandbox

def test_hf_compatible_filters_and_globals() -> None:
    t = ("{{ {'b': 1, 'a': 'ü<'} | tojson }}|{{ {'a': 1} | tojson(indent=2) }}|{{ [1] | tojson(separators=(',', ':')) }}"
         "|{{ strftime_now('%Y') | length }}{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
         "{% generation %}|gen{% endgeneration %}")
    assert render_template(t) == '{"b": 1, "a": "ü<"}|{\n  "a": 1\n}|[1]|401|gen'


def test_template_exceptions_become_request_errors() -> None:
    with pytest.raises(ChatEncodingError, match="no system"):
        render_template("{{ raise_exception('no system') }}")
    with pytest.raises(ChatEncodingError, match="No user query"):
        encode("jinja", [{"role": "system", "content": "s"}], chat_template=template_text("Qwen3.5.jinja"))


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% set ns = namespace(_private=1) %}",
    "{% set l = [1] %}{{ l.append(2) }}",
    "{{ messages.__class__ }}{{ cycler.__init__.__globals__ }}",
])
def test_sandbox_blocks_escapes(template: str) -> None:
    with pytest.raises(ChatTemplateError):
        render_template(template, messages=[])


def test_broken_template_is_a_template_error() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        encode("jinja", HI, chat_template="{% if %}")
    with pytest.raises(ChatTemplateError):
        encode("jinja", HI)


# --------------------------------------------------------------------------- normalisation

@pytest.mark.parametrize("messages,match", [
    ([], "empty"),
    ("hi", "expected a list"),
    ([{"content": "x"}], r"messages\[0\]\.role"),
    ([{"role": "function", "content": "x"}], "unsupported role"),
    ([{"role": "user", "content": 5}], r"messages\[0\]\.content"),
    ([{"role": "user", "content": [{"type": "text"}]}], "text part"),
    ([{"role": "assistant", "content": "", "tool_calls": {"a": 1}}], "tool_calls"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}], "name"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}], "JSON object"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "image_url"),
])
def test_bad_messages_are_rejected_clearly(messages: Any, match: str) -> None:
    with pytest.raises(ChatEncodingError, match=match):
        encode("glm45", messages)


def test_bad_tools_are_rejected() -> None:
    with pytest.raises(ChatEncodingError, match=r"tools\[0\]"):
        encode("qwen3", HI, [{"type": "function"}])
    with pytest.raises(ChatEncodingError, match="unknown chat format"):
        encode("llama3", HI)


def test_content_forms_are_equivalent() -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "h"}, "i"]}]
    assert encode("qwen3", parts).text == encode("qwen3", HI).text
    null_assistant = HI + [{"role": "assistant", "content": None}]
    assert encode("glm47", null_assistant, add_generation_prompt=False).text == "[gMASK]<sop><|user|>hi<|assistant|></think>"


def test_string_and_object_arguments_render_the_same_for_mapping_templates() -> None:
    def conv(args: Any) -> list[dict]:
        return HI + [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": args}}]}]

    for fmt in ("glm45", "glm47", "qwen3_coder", "qwen35"):
        assert encode(fmt, conv('{"a": true}')).text == encode(fmt, conv({"a": True})).text
    # Qwen3 prints a string verbatim (keeps the model's own spelling for prefix reuse).
    assert '"arguments": {"a":true}}' in encode("qwen3", conv('{"a":true}')).text
    assert '"arguments": {}}' in encode("qwen3", conv("")).text
