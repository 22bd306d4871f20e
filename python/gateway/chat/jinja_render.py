"""Generic fallback: render a checkpoint's own `chat_template` the way transformers does.

Templates come from model repositories, so they are untrusted code: they run in Jinja's
ImmutableSandboxedEnvironment.  The environment mirrors Hugging Face's `apply_chat_template`
so that renders are byte-identical: trim_blocks + lstrip_blocks, the loopcontrols extension,
a `tojson` filter that is plain `json.dumps` (no key sorting, no HTML escaping,
ensure_ascii=False by default, optional indent/separators/sort_keys), and the globals
`raise_exception`, `strftime_now`, `namespace` (refusing `_`-prefixed names) and `dict`.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .types import ChatEncodingError, ChatTemplateError, Message


def _hf_tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _SafeNamespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore-prefixed attribute names (as transformers does),
    which closes a route to CPython internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - same trick as jinja's Namespace
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for key in attrs:
            _SafeNamespace._check(key)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} may not start with '_'")


class _DictFactory:
    """The template-visible `dict`: builds plain dicts, exposes nothing else."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _GenerationTag(jinja2.ext.Extension):
    """Accept `{% generation %}...{% endgeneration %}` (used by some training templates) and
    render its body unchanged; we never need the assistant-token mask."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _hf_tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    env.globals["dict"] = _DictFactory()
    return env


_ENV = _make_environment()


@lru_cache(maxsize=16)
def compile_template(template_text: str) -> jinja2.Template:
    """Compile once per template text.  A broken template is a ChatTemplateError."""
    try:
        return _ENV.from_string(template_text)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc.message} (line {exc.lineno})") from None


def render_template(template_text: str, **context: Any) -> str:
    """Render `template_text` with `context` exactly as given (no input normalisation)."""
    template = compile_template(template_text)
    try:
        return template.render(**context)
    except jinja2.exceptions.SecurityError as exc:
        raise ChatTemplateError(f"chat template violated the sandbox: {exc}") from None
    except jinja2.exceptions.TemplateError as exc:
        # raise_exception() and undefined errors: the template refused this input.
        raise ChatEncodingError(f"chat template rejected the request: {exc}") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise ChatEncodingError(f"chat template failed on this input: {type(exc).__name__}: {exc}") from None


class ToolArguments(dict):
    """Tool-call arguments handed to templates: a real mapping (GLM/Qwen-XML iterate
    `.items()`), which turns into its JSON text when a template concatenates or prints it
    (DeepSeek-V3.1 does `'...' + arguments + '...'`).  The JSON text is the client's original
    string when there was one."""

    def __init__(self, mapping: Mapping[str, Any], text: str | None) -> None:
        super().__init__(mapping)
        self.json_text = text if text is not None else json.dumps(mapping, ensure_ascii=False)

    def __str__(self) -> str:
        return self.json_text

    def __add__(self, other: Any) -> Any:
        if isinstance(other, str):
            return self.json_text + other
        return NotImplemented

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, str):
            return other + self.json_text
        return NotImplemented


def _template_reads_string_arguments(template_text: str) -> bool:
    # Templates that test `arguments is string` print a string verbatim and a mapping via
    # tojson; giving them the client's string keeps the echo byte-identical.
    return "arguments is string" in template_text or "arguments is not string" in template_text


def messages_for_template(messages: Sequence[Message], template_text: str) -> list[dict[str, Any]]:
    """Build the plain dicts a Hugging Face template expects from normalised messages."""
    keep_strings = _template_reads_string_arguments(template_text)
    out: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = dict(m.extras)
        d["role"] = m.role
        d["content"] = m.content
        if m.reasoning is not None:
            # transformers 5 exposes reasoning under both names before rendering.
            d["reasoning_content"] = m.reasoning
            d.setdefault("thinking", m.reasoning)
        if m.tool_calls:
            calls = []
            for tc in m.tool_calls:
                if keep_strings and tc.arguments_text is not None:
                    args: Any = tc.arguments_text
                else:
                    args = ToolArguments(tc.arguments, tc.arguments_text)
                call: dict[str, Any] = {"type": "function", "function": {"name": tc.name, "arguments": args}}
                if tc.id is not None:
                    call["id"] = tc.id
                calls.append(call)
            d["tool_calls"] = calls
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def encode_jinja(
    template_text: str,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    add_generation_prompt: bool,
    thinking: bool | None,
    reasoning_effort: str | None,
    template_vars: Mapping[str, Any] | None = None,
) -> str:
    """Render normalised messages through a checkpoint template.

    `thinking` is passed as both `enable_thinking` and `thinking` (DeepSeek-V3.1 reads the
    latter); None passes neither so the template keeps its own default.  `template_vars`
    carries special-token strings (bos_token, eos_token, ...) and template-specific switches
    such as `clear_thinking`."""
    context: dict[str, Any] = {}
    if template_vars:
        context.update(template_vars)
    if thinking is not None:
        context["enable_thinking"] = thinking
        context["thinking"] = thinking
    if reasoning_effort is not None:
        context["reasoning_effort"] = reasoning_effort
    context["messages"] = messages_for_template(messages, template_text)
    context["tools"] = list(tools) if tools else None
    context["documents"] = None
    context["add_generation_prompt"] = add_generation_prompt
    return render_template(template_text, **context)
