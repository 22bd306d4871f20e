"""The chat families, by name, and the one function that renders a prompt in any of them.

    encode(format_name, messages, tools=None, *, add_generation_prompt=True, thinking=None,
           reasoning_effort=None, tool_choice=None, extra=None, chat_template=None)
        -> EncodedPrompt

`thinking`: None keeps the family's default; True/False is the template's `enable_thinking`.
For every family `enable_thinking` / `thinking` in `extra` (vLLM-style chat_template_kwargs)
stand in for the `thinking` argument when that is None; the family files list their other
options.  `tool_choice`: None/"auto"/"none" change nothing in the prompt (tools stay declared,
as vLLM does by default, which keeps prompt prefixes stable); "required" / {"type": "function",
"function": {"name": N}} (Anthropic {"type": "any"} / {"type": "tool", "name": N} too) set
`EncodedPrompt.forced_call_prefix` to the family's opener.  `control`: the checkpoint's tokenizer
(any gateway.chat.untrusted.ControlScanner); given, control-token spellings in the request's text
are kept out of the template's markers (`EncodedPrompt.prompt`, gateway.chat.untrusted).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..chat.normalize import normalize_messages, normalize_tools, tool_names
from ..chat.types import ChatEncodingError
from ..chat.untrusted import ControlScanner, PromptText, neutralize
from . import dsml, glm45, glm47, jinja, qwen3, qwen3_coder, qwen35
from .record import Family

FAMILIES: dict[str, Family] = {f.name: f for f in (
    dsml.FAMILY, glm45.FAMILY, glm47.FAMILY, qwen3.FAMILY, qwen3_coder.FAMILY, qwen35.FAMILY, jinja.FAMILY)}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ChatEncodingError(f"unknown chat format {name!r} (known: {', '.join(FAMILIES)})") from None


@dataclass(frozen=True)
class EncodedPrompt:
    """What `encode` produced.

    text                    the prompt as the template writes it; no BOS is to be added (every
                            family writes its own).
    prompt_opens_reasoning  the prompt ends inside an opened reasoning block (`<think>`), so
                            the model's output starts as reasoning and only contains `</think>`.
    thinking                the effective thinking switch (None: the family/template default).
    forced_call_prefix      set when tool_choice forces a call: the family's opener, which the
                            server appends where the answer starts.
    prompt                  what to tokenise (`Tokenizer.encode_prompt`): the text with which of
                            its control tokens are the template's own.  Without `control` every
                            one counts as the template's.
    """

    text: str
    prompt_opens_reasoning: bool
    thinking: bool | None = None
    forced_call_prefix: str | None = None
    prompt: PromptText | None = None


def forced_function(tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> tuple[bool, str | None]:
    """A client's tool_choice (OpenAI or Anthropic spelling) as (forced?, function name or None
    for any tool)."""
    if tool_choice is None or tool_choice in ("auto", "none"):
        return False, None
    if tool_choice in ("required", "any"):
        name = None
    elif isinstance(tool_choice, Mapping):
        kind = tool_choice.get("type")
        if kind == "function" and isinstance(tool_choice.get("function"), Mapping):
            name = tool_choice["function"].get("name")
        elif kind == "tool":
            name = tool_choice.get("name")
        elif kind in ("auto", "none"):
            return False, None
        elif kind == "any":
            name = None
        else:
            raise ChatEncodingError(f"tool_choice: unsupported value {tool_choice!r}")
        if not isinstance(name, str) or not name:
            raise ChatEncodingError("tool_choice: the function name is missing")
    else:
        raise ChatEncodingError(f"tool_choice: unsupported value {tool_choice!r}")
    if not tools:
        raise ChatEncodingError("tool_choice forces a tool call but no tools were given")
    if name is not None and name not in tool_names(tools):
        raise ChatEncodingError(f"tool_choice names {name!r}, which is not among the tools")
    return True, name


def _thinking_from_extra(thinking: bool | None, extra: Mapping[str, Any]) -> bool | None:
    if thinking is not None:
        return thinking
    for key in ("enable_thinking", "thinking"):
        value = extra.get(key)
        if isinstance(value, bool):
            return value
    return None


def render(family: Family, messages: Any, tools: Any = None, *, add_generation_prompt: bool = True,
           thinking: bool | None = None, reasoning_effort: str | None = None, tool_choice: Any = None,
           extra: Mapping[str, Any] | None = None, chat_template: str | None = None,
           control: ControlScanner | None = None) -> EncodedPrompt:
    """`encode` for a family already bound to its checkpoint (`Family.bind`)."""
    extra = dict(extra or {})
    tools_list = normalize_tools(tools)
    msgs = normalize_messages(messages)
    forced, forced_name = forced_function(tool_choice, tools_list)
    thinking = _thinking_from_extra(thinking, extra)
    request = neutralize(msgs, tools_list, extra, control, chat_template or "") if control is not None else None
    if request is not None:
        msgs, tools_list, extra = request.messages, request.tools, request.extra
    neutral, effective = family.encode(msgs, tools_list, add_generation_prompt=add_generation_prompt,
                                       thinking=thinking, reasoning_effort=reasoning_effort, extra=extra,
                                       chat_template=chat_template)
    prompt = request.prompt(neutral) if request is not None else PromptText.trusted(neutral)
    text = prompt.text
    prefix = None
    if forced:
        if family.calls is None:
            raise ChatEncodingError("tool_choice cannot be forced: this chat template has no known tool-call syntax")
        prefix = family.calls.opener(forced_name)
    return EncodedPrompt(text=text,
                         prompt_opens_reasoning=add_generation_prompt and text.rstrip().endswith("<think>"),
                         thinking=effective, forced_call_prefix=prefix, prompt=prompt)


def encode(format_name: str, messages: Any, tools: Any = None, *, extra: Mapping[str, Any] | None = None,
           chat_template: str | None = None, **options: Any) -> EncodedPrompt:
    """Render OpenAI-style `messages` (+ `tools`) into the prompt text of `format_name`.

    Raises ChatEncodingError for bad input (HTTP 400) and ChatTemplateError when the
    checkpoint's template is unusable."""
    family = get_family(format_name).bind(chat_template, extra or {})
    return render(family, messages, tools, extra=extra, chat_template=chat_template, **options)
