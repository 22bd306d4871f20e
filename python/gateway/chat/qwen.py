"""Qwen3 (`qwen3`, hermes JSON calls), Qwen3-Coder (`qwen3_coder`, XML calls) and Qwen3.5
(`qwen35`, XML calls + thinking) prompt encoders.

Hand-written equivalents of templates/Qwen3.jinja, Qwen3-Coder.jinja and Qwen3.5.jinja;
tests render both ways and compare bytes.  All three are ChatML
(`<|im_start|>ROLE\\n...<|im_end|>\\n`) and put tool results in a user turn.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .common import is_jinja_sequence_container, jinja_string, split_inline_reasoning, tojson
from .types import ChatEncodingError, Message, ToolCall

_QWEN3_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_QWEN3_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)
# The XML-call instruction shared by Qwen3-Coder and Qwen3.5.
_XML_CALL_INSTRUCTIONS = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\n- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\n</IMPORTANT>"
)
_CODER_DEFAULT_SYSTEM = "You are Qwen, a helpful AI assistant that can interact with a computer to solve tasks."


# --------------------------------------------------------------------------- Qwen3 (hermes)

def _last_query_index(messages: Sequence[Message], content_of: Any) -> int | None:
    """Index of the last user message that is a real query (not a wrapped tool response)."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.role == "user":
            text = content_of(m)
            if not (text.startswith("<tool_response>") and text.endswith("</tool_response>")):
                return i
    return None


def _hermes_arguments(call: ToolCall) -> str:
    # The template prints a string verbatim and a mapping through tojson.
    return call.arguments_text if call.arguments_text is not None else tojson(call.arguments)


def encode_qwen3(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    thinking: bool | None,
) -> str:
    out: list[str] = []
    first_is_system = messages[0].role == "system"
    if tools:
        out.append("<|im_start|>system\n")
        if first_is_system:
            out.append(messages[0].content + "\n\n")
        out.append(_QWEN3_TOOLS_HEAD)
        out.extend("\n" + tojson(t) for t in tools)
        out.append(_QWEN3_TOOLS_TAIL)
    elif first_is_system:
        out.append("<|im_start|>system\n" + messages[0].content + "<|im_end|>\n")
    found = _last_query_index(messages, lambda m: m.content)
    last_query = len(messages) - 1 if found is None else found
    n = len(messages)
    for i, m in enumerate(messages):
        if m.role == "user" or (m.role == "system" and i > 0):
            out.append(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n")
        elif m.role == "assistant":
            content = m.content
            reasoning = ""
            if m.reasoning is not None:
                reasoning = m.reasoning
            elif "</think>" in content:
                reasoning, content = split_inline_reasoning(content)
            if i > last_query and (i == n - 1 or reasoning):
                out.append("<|im_start|>assistant\n<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
                           + content.lstrip("\n"))
            else:
                out.append("<|im_start|>assistant\n" + content)
            for j, call in enumerate(m.tool_calls):
                if j > 0 or content:
                    out.append("\n")
                out.append('<tool_call>\n{"name": "' + call.name + '", "arguments": ' + _hermes_arguments(call)
                           + "}\n</tool_call>")
            out.append("<|im_end|>\n")
        elif m.role == "tool":
            if i == 0 or messages[i - 1].role != "tool":
                out.append("<|im_start|>user")
            out.append("\n<tool_response>\n" + m.content + "\n</tool_response>")
            if i == n - 1 or messages[i + 1].role != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if thinking is False:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


# --------------------------------------------------------------------------- XML calls (Coder, 3.5)

def _xml_param_value(value: Any) -> str:
    return tojson(value) if is_jinja_sequence_container(value) else jinja_string(value)


def _xml_call_body(call: ToolCall) -> str:
    params = "".join(f"<parameter={k}>\n{_xml_param_value(v)}\n</parameter>\n" for k, v in call.arguments.items())
    return f"<function={call.name}>\n{params}</function>\n</tool_call>"


def _extra_keys(schema: Any, handled: tuple[str, ...]) -> str:
    """Qwen3-Coder's render_extra_keys macro: every unhandled key as `<key>value</key>`."""
    if not isinstance(schema, Mapping):
        return ""
    out = []
    for key, value in schema.items():
        if key in handled:
            continue
        text = tojson(value) if is_jinja_sequence_container(value) else jinja_string(value)
        out.append(f"\n<{key}>{text}</{key}>")
    return "".join(out)


def _coder_tool(tool: Mapping[str, Any]) -> str:
    fn = tool["function"] if "function" in tool else tool
    out = ["\n<function>\n<name>" + jinja_string(fn.get("name")) + "</name>"]
    if "description" in fn:
        out.append("\n<description>" + jinja_string(fn["description"]).strip() + "</description>")
    out.append("\n<parameters>")
    params = fn.get("parameters")
    if isinstance(params, Mapping) and isinstance(params.get("properties"), Mapping):
        for pname, fields in params["properties"].items():
            out.append("\n<parameter>\n<name>" + jinja_string(pname) + "</name>")
            if isinstance(fields, Mapping):
                if "type" in fields:
                    out.append("\n<type>" + jinja_string(fields["type"]) + "</type>")
                if "description" in fields:
                    out.append("\n<description>" + jinja_string(fields["description"]).strip() + "</description>")
            out.append(_extra_keys(fields, ("name", "type", "description")))
            out.append("\n</parameter>")
    out.append(_extra_keys(params, ("type", "properties")))
    out.append("\n</parameters>")
    out.append(_extra_keys(fn, ("type", "name", "description", "parameters")))
    out.append("\n</function>")
    return "".join(out)


def encode_qwen3_coder(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    thinking: bool | None = None,
) -> str:
    """Qwen3-Coder has no reasoning mode: `thinking` and assistant reasoning are ignored."""
    out: list[str] = []
    has_system = messages[0].role == "system"
    loop_messages = messages[1:] if has_system else messages
    if has_system:
        out.append("<|im_start|>system\n" + messages[0].content)
    elif tools:
        out.append("<|im_start|>system\n" + _CODER_DEFAULT_SYSTEM)
    if tools:
        out.append("\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>")
        out.extend(_coder_tool(t) for t in tools)
        out.append("\n</tools>" + _XML_CALL_INSTRUCTIONS)
    if has_system or tools:
        out.append("<|im_end|>\n")
    n = len(loop_messages)
    for i, m in enumerate(loop_messages):
        if m.role == "assistant" and m.tool_calls:
            out.append("<|im_start|>assistant")
            if m.content.strip():
                out.append("\n" + m.content.strip() + "\n")
            out.extend("\n<tool_call>\n" + _xml_call_body(c) for c in m.tool_calls)
            out.append("<|im_end|>\n")
        elif m.role == "tool":
            # The template opens the user turn only when a previous item exists (loop.previtem).
            if i > 0 and loop_messages[i - 1].role != "tool":
                out.append("<|im_start|>user\n")
            out.append("<tool_response>\n" + m.content + "\n</tool_response>\n")
            if i == n - 1 or loop_messages[i + 1].role != "tool":
                out.append("<|im_end|>\n")
        else:
            out.append(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def encode_qwen35(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    thinking: bool | None,
) -> str:
    """Qwen3.5: the generation prompt opens `<think>\\n` unless thinking is False."""
    out: list[str] = []
    first_is_system = messages[0].role == "system"
    if tools:
        out.append("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>")
        out.extend("\n" + tojson(t) for t in tools)
        out.append("\n</tools>" + _XML_CALL_INSTRUCTIONS)
        if first_is_system:
            system_text = messages[0].content.strip()
            if system_text:
                out.append("\n\n" + system_text)
        out.append("<|im_end|>\n")
    elif first_is_system:
        out.append("<|im_start|>system\n" + messages[0].content.strip() + "<|im_end|>\n")
    last_query = _last_query_index(messages, lambda m: m.content.strip())
    if last_query is None:
        raise ChatEncodingError("No user query found in messages.")
    n = len(messages)
    for i, m in enumerate(messages):
        content = m.content.strip()
        if m.role == "system":
            if i != 0:
                raise ChatEncodingError("System message must be at the beginning.")
        elif m.role == "user":
            out.append("<|im_start|>user\n" + content + "<|im_end|>\n")
        elif m.role == "assistant":
            reasoning = ""
            if m.reasoning is not None:
                reasoning = m.reasoning
            elif "</think>" in content:
                reasoning, content = split_inline_reasoning(content)
            reasoning = reasoning.strip()
            if i > last_query:
                out.append("<|im_start|>assistant\n<think>\n" + reasoning + "\n</think>\n\n" + content)
            else:
                out.append("<|im_start|>assistant\n" + content)
            for j, call in enumerate(m.tool_calls):
                if j == 0:
                    out.append("\n\n<tool_call>\n" if content.strip() else "<tool_call>\n")
                else:
                    out.append("\n<tool_call>\n")
                out.append(_xml_call_body(call))
            out.append("<|im_end|>\n")
        elif m.role == "tool":
            if i > 0 and messages[i - 1].role != "tool":
                out.append("<|im_start|>user")
            out.append("\n<tool_response>\n" + content + "\n</tool_response>")
            if i == n - 1 or messages[i + 1].role != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        out.append("<think>\n\n</think>\n\n" if thinking is False else "<think>\n")
    return "".join(out)
