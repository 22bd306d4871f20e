"""Which family a checkpoint speaks, and how to talk to it.

    detect_format(config, tokenizer_config=None, chat_template=None) -> str
    load_chat_setup(model_dir) -> ChatSetup     (reads the checkpoint, a folder or a .gguf file,
                                                 verifies the hand-written encoder against its template)
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..chat.types import ChatEncodingError, ChatTemplateError
from ..gguf_vocab import GGUFVocab, chat_inputs, read_vocab
from ..model_path import is_gguf
from ..tokenizer import special_token_text
from .record import Family
from .registry import FAMILIES, EncodedPrompt, encode, get_family, render

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "chat" / "templates"


def bundled_template(format_name: str) -> str | None:
    """The reference template shipped for a hand-written family (None for dsml/jinja)."""
    ref = get_family(format_name).reference_template
    return (TEMPLATES_DIR / ref).read_text(encoding="utf-8") if ref else None


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


def detect_format(config: Mapping[str, Any], tokenizer_config: Mapping[str, Any] | None = None,
                  chat_template: str | None = None) -> str:
    """Pick the chat format from a checkpoint's config.json (+ tokenizer_config.json and the
    chat template text, which may live in chat_template.jinja)."""
    template = chat_template if chat_template is not None else template_from_tokenizer_config(tokenizer_config)
    types = _model_types(config)
    for family in FAMILIES.values():  # each family's own test (Family.recognizes); jinja is last
        if family.recognizes is not None and family.recognizes(frozenset(types), template):
            return family.name
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
    """How to talk to one checkpoint: its family (bound to its template) and the defaults it
    needs.  `encode(...)` takes the same arguments as `registry.encode` minus the format,
    template and checkpoint defaults."""

    family: Family
    chat_template: str | None
    default_extra: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def format(self) -> str:
        return self.family.name

    @property
    def tool_dialect(self) -> str | None:
        return self.family.tool_dialect

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.family.stop_strings

    def encode(self, messages: Any, tools: Any = None, **kwargs: Any) -> EncodedPrompt:
        extra = {**self.default_extra, **(kwargs.pop("extra", None) or {})}
        return render(self.family, messages, tools, extra=extra, chat_template=self.chat_template, **kwargs)


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
    """Inspect a checkpoint (a folder, or one .gguf file) and decide how to render its prompts."""
    root = Path(model_dir)
    if is_gguf(root):
        return gguf_chat_setup(read_vocab(root))
    config = _read_json(root / "config.json")
    if config is None:
        raise ChatTemplateError(f"{root / 'config.json'}: file not found")
    tokenizer_config = _read_json(root / "tokenizer_config.json")
    return _chat_setup(root, config, tokenizer_config, _read_checkpoint_template(root, tokenizer_config))


def gguf_chat_setup(vocab: GGUFVocab) -> ChatSetup:
    """`load_chat_setup` for a GGUF file already read (the server reads it once for the
    tokenizer too).  The file carries the same three inputs as a folder: the architecture stands
    for config.json's model_type, tokenizer.chat_template for the folder's template, the
    special ids' spellings for tokenizer_config.json's."""
    config, tokenizer_config, template = chat_inputs(vocab)
    return _chat_setup(vocab.path, config, tokenizer_config, template)


def _chat_setup(root: Path, config: Mapping[str, Any], tokenizer_config: Mapping[str, Any] | None,
                template: str | None) -> ChatSetup:
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
        return ChatSetup(FAMILIES["jinja"].bind(template, template_vars), template, template_vars, note)
    default_extra: dict[str, Any] = {}
    if name == "dsml":
        where = f"{root.name} {config.get('_name_or_path', '')}"
        default_extra["effort_table"] = "0731" if "0731" in where else "preview"
    return ChatSetup(FAMILIES[name], template, default_extra, note)


@lru_cache(maxsize=8)
def _cached_match(name: str, template: str, template_vars: tuple[tuple[str, str], ...]) -> bool:
    return matches_template(name, template, dict(template_vars))
