"""Any other checkpoint: its own chat_template, rendered in a sandbox.

Every key of `extra` becomes a template variable (bos_token, eos_token, clear_thinking, ...);
the thinking switch is passed as `enable_thinking` / `thinking`.  The tool-call syntax and the
stop strings are read off the template (`for_template`): the markers it writes pick the syntax
of the family that writes them the same way.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..chat.jinja_render import encode_jinja
from ..chat.normalize import require_text_only
from ..chat.types import ChatTemplateError, Message
from ..tokenizer import special_token_text
from . import dsml, glm45, qwen3, qwen3_coder
from .record import CallSyntax, Family

# Marker the template writes -> the call syntax, first match wins.
_CALL_MARKERS: tuple[tuple[str, CallSyntax], ...] = (
    ("｜DSML｜", dsml.CALLS), ("<arg_key>", glm45.CALLS), ("<function=", qwen3_coder.CALLS),
    ("<tool_call>", qwen3.CALLS))

_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|user|>", "<|observation|>", "<|role_end|>",
                "<｜end▁of▁sentence｜>", "<|eot_id|>", "<|end|>", "<|return|>")


def guess_calls(template_text: str) -> CallSyntax | None:
    """Tool-call syntax of an unknown template, from the markers it writes."""
    return next((calls for marker, calls in _CALL_MARKERS if marker in template_text), None)


def guess_stop_strings(template_text: str, template_vars: Mapping[str, Any]) -> tuple[str, ...]:
    """Stop strings for an unknown template: its EOS plus the end markers it writes."""
    stops: list[str] = []
    eos = special_token_text(template_vars.get("eos_token"))
    if eos:
        stops.append(eos)
    stops.extend(m for m in _END_MARKERS if m in template_text and m not in stops)
    return tuple(stops)


def for_template(family: Family, template_text: str, template_vars: Mapping[str, Any]) -> Family:
    return dataclasses.replace(family, calls=guess_calls(template_text),
                               stop_strings=guess_stop_strings(template_text, template_vars))


def encode(messages: list[Message], tools: list[dict[str, Any]], *, add_generation_prompt: bool,
           thinking: bool | None, reasoning_effort: str | None, extra: Mapping[str, Any],
           chat_template: str | None) -> tuple[str, bool | None]:
    require_text_only(messages)
    if not chat_template:
        raise ChatTemplateError("format 'jinja' needs the checkpoint's chat_template")
    template_vars = {k: v for k, v in extra.items() if k not in ("enable_thinking", "thinking")}
    text = encode_jinja(chat_template, messages, tools, add_generation_prompt=add_generation_prompt,
                        thinking=thinking, reasoning_effort=reasoning_effort, template_vars=template_vars)
    return text, thinking


def recognizes(model_types: frozenset[str], template: str | None) -> bool:
    """The fallback (asked last): any checkpoint that ships a template."""
    return bool(template)


FAMILY = Family("jinja", encode, (), None, for_template=for_template, recognizes=recognizes)
