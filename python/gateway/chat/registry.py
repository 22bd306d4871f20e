"""Chat formats: which encoder renders a checkpoint's prompts and what the server needs to
know about its output (tool-call dialect, stop strings, reasoning switches).

Public API (what the server imports):

    encode(format_name, messages, tools=None, *, add_generation_prompt=True, thinking=None,
           reasoning_effort=None, tool_choice=None, extra=None, chat_template=None)
        -> EncodedPrompt
    detect_format(config, tokenizer_config=None, chat_template=None) -> str
    load_chat_setup(model_dir) -> ChatSetup        (reads the checkpoint, verifies the
                                                    hand-written encoder against its template)
    FORMATS[name] -> ChatFormat                    (static facts per format)
    forced_call_prefix(format_name, function_name=None, tool_dialect=None) -> str | None

Formats: "dsml" (DeepSeek-V4), "glm45" (GLM-4.5/4.6), "glm47" (GLM-4.7), "qwen3" (Qwen3
hermes JSON calls), "qwen3_coder" (Qwen3-Coder XML calls), "qwen35" (Qwen3.5 XML calls with
thinking), "jinja" (any other checkpoint: its own chat_template, sandboxed).

`thinking`: None keeps the format's default; True/False is the template's
`enable_thinking`.  DSML defaults to chat mode unless a reasoning_effort is given.
`extra`: format options.  dsml: `effort_table` ("preview" | "0731"), `drop_thinking` (bool),
`response_format` (object, appended to the system turn).  glm47: `clear_thinking`.
jinja: every key becomes a template variable (bos_token, eos_token, clear_thinking, ...).
For all formats `enable_thinking` / `thinking` in `extra` (vLLM-style chat_template_kwargs)
stand in for the `thinking` argument when that is None.  Other keys are ignored by the
hand-written formats.
`tool_choice`: None/"auto"/"none" change nothing in the prompt (tools stay declared, as vLLM
does by default, which keeps prompt prefixes stable); "required" / {"type": "function",
"function": {"name": N}} (Anthropic {"type": "any"} / {"type": "tool", "name": N} too) set
`EncodedPrompt.forced_call_prefix`.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..tokenizer import special_token_text
from . import dsml, glm, qwen
from .jinja_render import encode_jinja
from .normalize import normalize_messages, normalize_tools, require_text_only, tool_names
from .types import ChatEncodingError, ChatTemplateError, EncodedPrompt, Message

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True)
class ChatFormat:
    """Static facts about one chat format.

    tool_dialect        parser to use on the output (None for "jinja": decided per template).
    stop_strings        special-token texts that end generation.
    reasoning_opened    the generation prompt opens `<think>` by default (thinking=None).
    thinking_switch     what `thinking=False` does, for logs and docs.
    reference_template  bundled template file this encoder is byte-identical to.
    """

    name: str
    description: str
    tool_dialect: str | None
    stop_strings: tuple[str, ...]
    reasoning_opened: bool
    thinking_switch: str
    reference_template: str | None = None


FORMATS: dict[str, ChatFormat] = {
    f.name: f
    for f in (
        ChatFormat("dsml", "DeepSeek-V4 (DSML tool calls)", "dsml", dsml.DSML_STOP_STRINGS, False,
                   "thinking=True opens <think> after <｜Assistant｜> (default: chat mode, </think>); "
                   "reasoning_effort adds the effort prefix in thinking mode"),
        ChatFormat("glm45", "GLM-4.5 / GLM-4.6", "glm", glm.GLM_STOP_STRINGS, False,
                   "thinking=False appends /nothink to user turns and pre-fills <think></think>",
                   "GLM-4.5.jinja"),
        ChatFormat("glm47", "GLM-4.7", "glm", glm.GLM_STOP_STRINGS, True,
                   "generation prompt opens <think>; thinking=False writes </think>", "GLM-4.7-Flash.jinja"),
        ChatFormat("qwen3", "Qwen3 hybrid (hermes JSON tool calls)", "hermes", qwen.QWEN_STOP_STRINGS, False,
                   "thinking=False pre-fills an empty <think></think> block", "Qwen3.jinja"),
        ChatFormat("qwen3_coder", "Qwen3-Coder (XML tool calls, no reasoning)", "qwen_xml",
                   qwen.QWEN_STOP_STRINGS, False, "none (no reasoning mode)", "Qwen3-Coder.jinja"),
        ChatFormat("qwen35", "Qwen3.5 (XML tool calls, thinking on by default)", "qwen_xml",
                   qwen.QWEN_STOP_STRINGS, True,
                   "generation prompt opens <think>; thinking=False pre-fills an empty block", "Qwen3.5.jinja"),
        ChatFormat("jinja", "checkpoint chat_template rendered in a sandbox", None, (), False,
                   "passed to the template as enable_thinking / thinking"),
    )
}


def get_format(name: str) -> ChatFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ChatEncodingError(f"unknown chat format {name!r} (known: {', '.join(FORMATS)})") from None


def bundled_template(format_name: str) -> str | None:
    """The reference template shipped for a hand-written format (None for dsml/jinja)."""
    ref = get_format(format_name).reference_template
    return (TEMPLATES_DIR / ref).read_text(encoding="utf-8") if ref else None


# --------------------------------------------------------------------------- tool_choice

def _forced_function(tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> tuple[bool, str | None]:
    """(forced?, function name or None for any tool)."""
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


def forced_call_prefix(format_name: str, function_name: str | None = None,
                       tool_dialect: str | None = None) -> str | None:
    """Exact text that, appended where the model's answer starts, forces a tool call in this
    format (any tool when function_name is None: the model continues with the name)."""
    dialect = tool_dialect or get_format(format_name).tool_dialect
    if dialect == "dsml":
        return dsml.forced_call_prefix(function_name)
    if dialect == "glm":
        if format_name == "glm47":
            return "<tool_call>" + (function_name or "")
        return "\n<tool_call>" + (function_name + "\n" if function_name else "")
    if dialect == "hermes":
        return '<tool_call>\n{"name": "' + (function_name + '", "arguments": ' if function_name else "")
    if dialect == "qwen_xml":
        return "<tool_call>\n<function=" + (function_name + ">\n" if function_name else "")
    return None


# --------------------------------------------------------------------------- encode

def _thinking_from_extra(thinking: bool | None, extra: Mapping[str, Any]) -> bool | None:
    if thinking is not None:
        return thinking
    for key in ("enable_thinking", "thinking"):
        value = extra.get(key)
        if isinstance(value, bool):
            return value
    return None


def _opens_reasoning(text: str) -> bool:
    return text.rstrip().endswith("<think>")


def guess_tool_dialect(template_text: str) -> str | None:
    """Tool-call dialect of an unknown template, from the markers it writes."""
    if "｜DSML｜" in template_text:
        return "dsml"
    if "<arg_key>" in template_text:
        return "glm"
    if "<function=" in template_text:
        return "qwen_xml"
    if "<tool_call>" in template_text:
        return "hermes"
    return None


_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|user|>", "<|observation|>", "<|role_end|>",
                "<｜end▁of▁sentence｜>", "<|eot_id|>", "<|end|>", "<|return|>")




def guess_stop_strings(template_text: str, template_vars: Mapping[str, Any]) -> tuple[str, ...]:
    """Stop strings for an unknown template: its EOS plus the end markers it writes."""
    stops: list[str] = []
    eos = special_token_text(template_vars.get("eos_token"))
    if eos:
        stops.append(eos)
    stops.extend(m for m in _END_MARKERS if m in template_text and m not in stops)
    return tuple(stops)


def _encode_text(
    fmt: ChatFormat,
    messages: list[Message],
    tools: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    thinking: bool | None,
    reasoning_effort: str | None,
    extra: Mapping[str, Any],
    chat_template: str | None,
) -> tuple[str, bool | None]:
    """Dispatch to the format's encoder; returns (text, effective thinking)."""
    name = fmt.name
    if name == "dsml":
        think = thinking if thinking is not None else reasoning_effort not in (None, "none")
        # Client messages may not smuggle internal DSML fields (task, wo_eos, tools...).
        clean = [Message(m.role, m.content, m.parts, m.reasoning, m.tool_calls, m.tool_call_id, m.name)
                 for m in messages]
        clean = dsml.attach_tools(clean, tools)
        if extra.get("response_format") is not None:
            if clean[0].role != "system":
                clean.insert(0, Message("system", ""))
            clean[0] = Message("system", clean[0].content, clean[0].parts,
                               extras={**clean[0].extras, "response_format": extra["response_format"]})
        text = dsml.encode_dsml_messages(
            clean, thinking=think, drop_thinking=bool(extra.get("drop_thinking", True)),
            reasoning_effort=reasoning_effort, effort_table=str(extra.get("effort_table", "preview")),
            add_generation_prompt=add_generation_prompt,
        )
        return text, think
    require_text_only(messages)
    if name == "glm45":
        return glm.encode_glm45(messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking), thinking
    if name == "glm47":
        clear = extra.get("clear_thinking")
        text = glm.encode_glm47(messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking,
                                clear_thinking=clear if isinstance(clear, bool) else None)
        return text, thinking
    if name == "qwen3":
        return qwen.encode_qwen3(messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking), thinking
    if name == "qwen3_coder":
        return qwen.encode_qwen3_coder(messages, tools, add_generation_prompt=add_generation_prompt), None
    if name == "qwen35":
        return qwen.encode_qwen35(messages, tools, add_generation_prompt=add_generation_prompt, thinking=thinking), thinking
    if name == "jinja":
        if not chat_template:
            raise ChatTemplateError("format 'jinja' needs the checkpoint's chat_template")
        template_vars = {k: v for k, v in extra.items() if k not in ("enable_thinking", "thinking")}
        text = encode_jinja(chat_template, messages, tools, add_generation_prompt=add_generation_prompt,
                            thinking=thinking, reasoning_effort=reasoning_effort, template_vars=template_vars)
        return text, thinking
    raise ChatEncodingError(f"no encoder for format {name!r}")  # pragma: no cover


def encode(
    format_name: str,
    messages: Any,
    tools: Any = None,
    *,
    add_generation_prompt: bool = True,
    thinking: bool | None = None,
    reasoning_effort: str | None = None,
    tool_choice: Any = None,
    extra: Mapping[str, Any] | None = None,
    chat_template: str | None = None,
) -> EncodedPrompt:
    """Render OpenAI-style `messages` (+ `tools`) into the prompt text of `format_name`.

    Raises ChatEncodingError for bad input (HTTP 400) and ChatTemplateError when the
    checkpoint's template is unusable."""
    fmt = get_format(format_name)
    extra = dict(extra or {})
    tools_list = normalize_tools(tools)
    msgs = normalize_messages(messages)
    forced, forced_name = _forced_function(tool_choice, tools_list)
    think = _thinking_from_extra(thinking, extra)
    text, effective = _encode_text(fmt, msgs, tools_list, add_generation_prompt=add_generation_prompt,
                                   thinking=think, reasoning_effort=reasoning_effort, extra=extra,
                                   chat_template=chat_template)
    dialect = fmt.tool_dialect
    stops = fmt.stop_strings
    if fmt.name == "jinja":
        dialect = guess_tool_dialect(chat_template or "")
        stops = guess_stop_strings(chat_template or "", extra)
    prefix = forced_call_prefix(fmt.name, forced_name, dialect) if forced else None
    if forced and prefix is None:
        raise ChatEncodingError("tool_choice cannot be forced: this chat template has no known tool-call syntax")
    return EncodedPrompt(
        text=text,
        prompt_opens_reasoning=add_generation_prompt and _opens_reasoning(text),
        format=fmt.name,
        tool_dialect=dialect,
        stop_strings=stops,
        thinking=effective,
        forced_call_prefix=prefix,
    )


# --------------------------------------------------------------------------- detection

def _model_types(config: Mapping[str, Any]) -> list[str]:
    types = [config.get("model_type")]
    text_config = config.get("text_config")
    if isinstance(text_config, Mapping):
        types.append(text_config.get("model_type"))
    return [t for t in types if isinstance(t, str)]


def template_from_tokenizer_config(tokenizer_config: Mapping[str, Any] | None) -> str | None:
    """`chat_template` of a tokenizer_config: a string, or the "default" of a named list."""
    if not tokenizer_config:
        return None
    value = tokenizer_config.get("chat_template")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        chosen = named.get("default") or next(iter(named.values()), None)
        return chosen if isinstance(chosen, str) else None
    return None


def _glm_format(template: str | None, default: str) -> str:
    if template is None:
        return default
    if "<arg_value>{arg-value-1}</arg_value><arg_key>" in template or "clear_thinking" in template:
        return "glm47"
    if "<arg_key>" in template:
        return "glm45"
    return "jinja"


def _qwen3_format(template: str | None) -> str:
    if template is None:
        return "qwen3"
    if "<function=" in template:
        return "qwen35" if "<think>" in template else "qwen3_coder"
    if "<tool_call>" in template or "<|im_start|>" in template:
        return "qwen3"
    return "jinja"


def detect_format(config: Mapping[str, Any], tokenizer_config: Mapping[str, Any] | None = None,
                  chat_template: str | None = None) -> str:
    """Pick the chat format from a checkpoint's config.json (+ tokenizer_config.json and the
    chat template text, which may live in chat_template.jinja)."""
    template = chat_template if chat_template is not None else template_from_tokenizer_config(tokenizer_config)
    types = _model_types(config)
    if any(t.startswith("deepseek_v4") for t in types):
        return "dsml"
    if "glm4_moe" in types:
        return _glm_format(template, "glm45")
    if "glm4_moe_lite" in types:
        return _glm_format(template, "glm47")
    if "qwen3_5_moe" in types or "qwen3_5_moe_text" in types:
        return "qwen35" if template is None or "<function=" in template else "jinja"
    if "qwen3_moe" in types:
        return _qwen3_format(template)
    if template:
        return "jinja"
    raise ChatTemplateError(f"model_type {types or None} has no built-in chat format and the checkpoint has no chat_template")


# --------------------------------------------------------------------------- checkpoint setup

# Conversations on which a hand-written encoder must match the checkpoint template before
# we trust it (a revised upstream template falls back to rendering the template itself).
_WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"},
                                                    "days": {"type": "integer"}}, "required": ["city"]}}}
_PROBES: tuple[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool | None], ...] = (
    ([{"role": "user", "content": "Hi"}], None, None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet."},
      {"role": "user", "content": "Bye"}], None, False),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": "Checking.", "reasoning_content": "Need tool.", "tool_calls": [
          {"id": "c1", "type": "function",
           "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "Rain"}], [_WEATHER_TOOL], None),
    ([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "A"}'}},
          {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "B"}'}}]},
      {"role": "tool", "tool_call_id": "a", "content": "Sun"}, {"role": "tool", "tool_call_id": "b", "content": "Snow"},
      {"role": "assistant", "content": "Sun and snow."}, {"role": "user", "content": "Thanks"}],
     [_WEATHER_TOOL], True),
)


def _render_or_error(fn: Callable[[], str]) -> str:
    try:
        return fn()
    except ChatEncodingError:
        return "<error>"


def matches_template(format_name: str, chat_template: str, template_vars: Mapping[str, Any] | None = None) -> bool:
    """True when the hand-written encoder renders the probe conversations exactly like the
    template (both refusing an input counts as agreement)."""
    vars_ = dict(template_vars or {})
    for messages, tools, thinking in _PROBES:
        for gen in (True, False):
            ours = _render_or_error(lambda: encode(format_name, messages, tools, thinking=thinking,
                                                   add_generation_prompt=gen).text)
            theirs = _render_or_error(lambda: encode("jinja", messages, tools, thinking=thinking,
                                                     add_generation_prompt=gen, extra=vars_,
                                                     chat_template=chat_template).text)
            if ours != theirs:
                return False
    return True


@dataclass(frozen=True)
class ChatSetup:
    """How to talk to one checkpoint.  `encode(...)` takes the same arguments as the module
    level `encode` minus the format, template and checkpoint defaults."""

    format: str
    chat_template: str | None
    tool_dialect: str | None
    stop_strings: tuple[str, ...]
    default_extra: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    def encode(self, messages: Any, tools: Any = None, **kwargs: Any) -> EncodedPrompt:
        extra = {**self.default_extra, **(kwargs.pop("extra", None) or {})}
        return encode(self.format, messages, tools, extra=extra, chat_template=self.chat_template, **kwargs)


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        with path.open(encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ChatTemplateError(f"{path}: cannot read JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ChatTemplateError(f"{path}: expected a JSON object")
    return data


def _read_checkpoint_template(model_dir: Path, tokenizer_config: Mapping[str, Any] | None) -> str | None:
    # transformers 5 writes the template next to the weights; older checkpoints keep it in
    # tokenizer_config.json or chat_template.json.
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    json_file = _read_json(model_dir / "chat_template.json")
    if json_file and isinstance(json_file.get("chat_template"), str):
        return json_file["chat_template"]
    return template_from_tokenizer_config(tokenizer_config)


def _special_token_vars(tokenizer_config: Mapping[str, Any] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        text = special_token_text((tokenizer_config or {}).get(key))
        if text is not None:
            out[key] = text
    return out


def load_chat_setup(model_dir: str | os.PathLike[str]) -> ChatSetup:
    """Inspect a checkpoint directory and decide how to render its prompts."""
    root = Path(model_dir)
    config = _read_json(root / "config.json")
    if config is None:
        raise ChatTemplateError(f"{root / 'config.json'}: file not found")
    tokenizer_config = _read_json(root / "tokenizer_config.json")
    template = _read_checkpoint_template(root, tokenizer_config)
    template_vars = _special_token_vars(tokenizer_config)
    name = detect_format(config, tokenizer_config, template)
    note = ""
    if name not in ("dsml", "jinja") and template is not None and not _cached_match(name, template,
                                                                                  tuple(sorted(template_vars.items()))):
        note = f"checkpoint template differs from the built-in '{name}' encoder; rendering the template itself"
        name = "jinja"
    if name == "jinja":
        if template is None:
            raise ChatTemplateError(f"{root}: no chat template found")
        return ChatSetup("jinja", template, guess_tool_dialect(template), guess_stop_strings(template, template_vars),
                         template_vars, note)
    default_extra: dict[str, Any] = {}
    if name == "dsml":
        where = f"{root.name} {config.get('_name_or_path', '')}"
        default_extra["effort_table"] = "0731" if "0731" in where else "preview"
    fmt = FORMATS[name]
    return ChatSetup(name, template, fmt.tool_dialect, fmt.stop_strings, default_extra, note)


@lru_cache(maxsize=8)
def _cached_match(name: str, template: str, template_vars: tuple[tuple[str, str], ...]) -> bool:
    return matches_template(name, template, dict(template_vars))
