"""GLM-4.5 / GLM-4.6 (`glm45`) and GLM-4.7 (`glm47`) prompt encoders.

Hand-written equivalents of the checkpoints' Jinja templates (shipped as data in
templates/GLM-4.5.jinja, GLM-4.6.jinja, GLM-4.7-Flash.jinja); tests render both ways and
compare bytes.  Differences between the two generations:
* 4.5/4.6 put `\\n` after every role marker, write tool calls with one tag per line, and leave
  the reasoning block to the model (generation prompt `<|assistant|>`); thinking off appends
  `/nothink` to every user turn and pre-fills an empty `<think></think>`.
* 4.7 packs everything without newlines and opens `<think>` in the generation prompt
  (thinking off: `</think>`); `clear_thinking=False` keeps reasoning of older turns.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .common import split_inline_reasoning, tojson
from .types import Message, ToolCall

GLM_PREFIX = "[gMASK]<sop>"

_TOOLS_HEAD = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_TAIL_45 = (
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
    "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
)
_TOOLS_TAIL_47 = (
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
)


def _tools_block(tools: Sequence[Mapping[str, Any]], tail: str) -> str:
    return _TOOLS_HEAD + "".join(tojson(t) + "\n" for t in tools) + tail


def _arg_value(value: Any) -> str:
    return value if isinstance(value, str) else tojson(value)


def _call_45(call: ToolCall) -> str:
    pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_arg_value(v)}</arg_value>\n" for k, v in call.arguments.items())
    return f"\n<tool_call>{call.name}\n{pairs}</tool_call>"


def _call_47(call: ToolCall) -> str:
    pairs = "".join(f"<arg_key>{k}</arg_key><arg_value>{_arg_value(v)}</arg_value>" for k, v in call.arguments.items())
    return f"<tool_call>{call.name}{pairs}</tool_call>"


def _reasoning_and_content(m: Message) -> tuple[str, str]:
    if m.reasoning is not None:
        return m.reasoning, m.content
    if "</think>" in m.content:
        return split_inline_reasoning(m.content)
    return "", m.content


def _last_user_index(messages: Sequence[Message]) -> int:
    last = -1
    for i, m in enumerate(messages):
        if m.role == "user":
            last = i
    return last


def encode_glm45(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    thinking: bool | None,
) -> str:
    """GLM-4.5/4.6: `thinking=False` is the template's `enable_thinking=false`."""
    thinking_off = thinking is False
    out = [GLM_PREFIX]
    if tools:
        out.append(_tools_block(tools, _TOOLS_TAIL_45))
    last_user = _last_user_index(messages)
    for i, m in enumerate(messages):
        if m.role == "user":
            out.append("<|user|>\n" + m.content)
            if thinking_off and not m.content.endswith("/nothink"):
                out.append("/nothink")
        elif m.role == "assistant":
            reasoning, content = _reasoning_and_content(m)
            out.append("<|assistant|>")
            if i > last_user and reasoning:
                out.append("\n<think>" + reasoning.strip() + "</think>")
            else:
                out.append("\n<think></think>")
            if content.strip():
                out.append("\n" + content.strip())
            out.extend(_call_45(c) for c in m.tool_calls)
        elif m.role == "tool":
            if i == 0 or messages[i - 1].role != "tool":
                out.append("<|observation|>")
            out.append("\n<tool_response>\n" + m.content + "\n</tool_response>")
        elif m.role == "system":
            out.append("<|system|>\n" + m.content)
    if add_generation_prompt:
        out.append("<|assistant|>\n<think></think>" if thinking_off else "<|assistant|>")
    return "".join(out)


def encode_glm47(
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    thinking: bool | None,
    clear_thinking: bool | None = None,
) -> str:
    """GLM-4.7: `clear_thinking=False` renders the reasoning of every past turn."""
    keep_all_reasoning = clear_thinking is not None and not clear_thinking
    out = [GLM_PREFIX]
    if tools:
        out.append(_tools_block(tools, _TOOLS_TAIL_47))
    last_user = _last_user_index(messages)
    for i, m in enumerate(messages):
        if m.role == "user":
            out.append("<|user|>" + m.content)
        elif m.role == "assistant":
            reasoning, content = _reasoning_and_content(m)
            out.append("<|assistant|>")
            if (keep_all_reasoning or i > last_user) and reasoning:
                out.append("<think>" + reasoning.strip() + "</think>")
            else:
                out.append("</think>")
            out.append(content.strip())
            out.extend(_call_47(c) for c in m.tool_calls)
        elif m.role == "tool":
            if i == 0 or messages[i - 1].role != "tool":
                out.append("<|observation|>")
            out.append("<tool_response>" + m.content + "</tool_response>")
        elif m.role == "system":
            out.append("<|system|>" + m.content)
    if add_generation_prompt:
        out.append("<|assistant|></think>" if thinking is False else "<|assistant|><think>")
    return "".join(out)
