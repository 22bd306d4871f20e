"""Lark grammars (llguidance dialect) for forced tool calls and JSON replies.

Each call grammar starts right after the text the server prefilled (the chat family's opener,
gateway.families) and describes only output that our own parsers in gateway.toolcalls read
back as well-formed calls whose arguments validate against the tool's schema:

* hermes   JSON arguments through `%json{...}` (llguidance's JSON-schema compiler);
* glm, qwen_xml, dsml   one rule per declared parameter, in schema order (required ones always,
  optional ones maybe).  A string-only parameter is raw text (its enum/const/length/pattern turned
  into a regex); any other parameter is JSON text that `schema_coerce.coerce` decodes back.

Raw text is a single terminal that cannot contain its closing tag (so the parser's "first closer
ends the value" reading agrees with the grammar).  Tags that the tokenizer holds as special tokens
are written as `<[id]>` because llguidance never spells a special token out of bytes.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..toolcalls.blocks import valid_name
from ..toolcalls.schema_coerce import schema_types

# Compact JSON exactly as the encoders write it (json.dumps defaults), no free whitespace: a
# weak model cannot wander off into blank space, and the budget planner has fewer ways to go.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_ANY = "/(?s:.*)/"
# Python's str.strip() also strips \x1c-\x1f, which Rust's \s does not know.
_WS = r"[\s\x1c-\x1f]*"


class ConstraintError(ValueError):
    """The request asks for output no grammar can describe (the server answers 400)."""


@dataclass
class Markup:
    """Writes literal text as a Lark sequence, splitting out the tokenizer's special tokens."""

    specials: dict[str, int]  # special-token text -> id (as llguidance sees them)
    _pattern: re.Pattern[str] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.specials:
            alts = sorted(self.specials, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(a) for a in alts))

    def parts(self, text: str) -> list[tuple[str, str | int]]:
        """[("text", s) | ("special", id)] covering `text`."""
        out: list[tuple[str, str | int]] = []
        pos = 0
        if self._pattern is not None:
            for m in self._pattern.finditer(text):
                if m.start() > pos:
                    out.append(("text", text[pos:m.start()]))
                out.append(("special", self.specials[m.group()]))
                pos = m.end()
        if pos < len(text):
            out.append(("text", text[pos:]))
        return out

    def lit(self, text: str) -> str:
        parts = self.parts(text)
        if not parts:
            return '""'
        return " ".join(lark_string(v) if k == "text" else f"<[{v}]>" for k, v in parts)


def lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=True)


def _regex_literal(text: str) -> str:
    """A regex matching `text` exactly (every non-alphanumeric character as a class or escape)."""
    out = []
    for ch in text:
        if ch.isalnum() or ch == "_":
            out.append(ch)
        elif ch == "\n":
            out.append(r"\n")
        elif ch in "\\^]-[":
            out.append("\\" + ch)
        else:
            out.append(f"[{ch}]")
    return "".join(out)


def _re(body: str) -> str:
    return "/" + body.replace("/", "\\/") + "/"


def _contains(text: str) -> str:
    return _re(f"(?s:.*){_regex_literal(text)}(?s:.*)")


# --------------------------------------------------------------------------- schemas

def _with_options(schema: Any, root: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A sub-schema ready for %json: keeps the root's $defs so $ref still resolves."""
    if schema is True or schema is None:
        schema = {}
    if schema is False:
        raise ConstraintError("a parameter schema is `false`: no value can satisfy it")
    if not isinstance(schema, Mapping):
        raise ConstraintError(f"a parameter schema must be an object, got {type(schema).__name__}")
    out = _finite_numbers(schema)
    if root is not None and root is not schema:
        for key in ("$defs", "definitions"):
            if key in root and key not in out:
                out[key] = root[key]
    guidance = dict(JSON_OPTIONS)
    if isinstance(schema.get("x-guidance"), Mapping):
        guidance.update(schema["x-guidance"])
    out["x-guidance"] = guidance
    return out


_FINITE = 1e15  # llguidance builds range regexes up to about this size


def _finite_numbers(schema: Any) -> Any:
    """A copy where every `number` gets finite bounds: a random walk through digits and exponents
    would otherwise reach 1E400, which Python reads as inf (not JSON, and coerce keeps the text)."""
    if isinstance(schema, list):
        return [_finite_numbers(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: (v if k in ("enum", "const", "default", "examples") else _finite_numbers(v))
           for k, v in schema.items()}
    declared = out.get("type")
    if declared == "number" or (isinstance(declared, list) and "number" in declared):
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = _FINITE
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -_FINITE
    return out


def json_embed(schema: Any, root: Mapping[str, Any] | None = None) -> str:
    return "%json " + json.dumps(_with_options(schema, root), ensure_ascii=True)


def _string_regex(schema: Mapping[str, Any]) -> str | None:
    """A Lark terminal expression for raw text satisfying a string-only schema (None: any)."""
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and branches and "type" not in schema:
        alts = [_string_regex(b) if isinstance(b, Mapping) else None for b in branches]
        if any(a is None for a in alts):
            return None
        return "(" + " | ".join(alts) + ")"  # type: ignore[arg-type]
    if "const" in schema:
        values = [schema["const"]]
    elif isinstance(schema.get("enum"), list):
        values = schema["enum"]
    else:
        values = None
    parts: list[str] = []
    if values is not None:
        strings = [v for v in values if isinstance(v, str)]
        if not strings:
            raise ConstraintError("a string parameter's enum/const holds no string")
        parts.append("(" + " | ".join(lark_string(v) for v in strings) + ")")
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if isinstance(lo, int) or isinstance(hi, int):
        lo_i = lo if isinstance(lo, int) else 0
        if isinstance(hi, int) and hi < lo_i:
            raise ConstraintError(f"minLength {lo_i} is greater than maxLength {hi}")
        parts.append(_re(f"(?s:.{{{lo_i},{hi if isinstance(hi, int) else ''}}})"))
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        body = pattern
        head = body.startswith("^")
        tail = body.endswith("$") and not body.endswith("\\$")
        body = body[1 if head else 0:len(body) - (1 if tail else 0)]
        parts.append(_re(("" if head else "(?s:.*)") + f"(?:{body})" + ("" if tail else "(?s:.*)")))
    if not parts:
        return None
    return " & ".join(parts)


def _coercible(types: frozenset[str]) -> list[str]:
    """Regexes for raw texts that `coerce` would turn into one of the non-string `types`."""
    out = []
    if "null" in types:
        out.append(_re(f"{_WS}null{_WS}"))
    if "boolean" in types:
        out.append(_re(f"{_WS}(?i:true|false){_WS}"))
    if "integer" in types or "number" in types:
        out.append(_re(rf"{_WS}-?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?{_WS}"))
    if "object" in types or "array" in types:
        out.append(_re(f"{_WS}[{{\\[](?s:.*)"))
    return out


def _without_string(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """The schema minus its string alternatives (None if nothing is left)."""
    out = dict(schema)
    declared = schema.get("type")
    if isinstance(declared, list):
        rest = [t for t in declared if t != "string"]
        if not rest:
            return None
        out["type"] = rest
    elif declared == "string":
        return None
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            rest = [b for b in schema[key] if schema_types(b) != frozenset({"string"})]
            if not rest:
                return None
            out[key] = rest
    for key in ("minLength", "maxLength", "pattern", "format"):
        out.pop(key, None)
    return out


def _string_part(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            for b in schema[key]:
                if schema_types(b) == frozenset({"string"}):
                    return b
    return schema


# --------------------------------------------------------------------------- grammar text

@dataclass
class GrammarText:
    """A Lark grammar plus the texts the budget planner tries first when closing it."""

    lark: str
    closers: list[str]  # tag texts that end a value / call / block, most local first
    # Named grammars the main one refers to as `@name` (a client's own grammar, kept apart so
    # its rule names cannot collide with ours).
    subgrammars: dict[str, str] = field(default_factory=dict)


class _Builder:
    def __init__(self, markup: Markup) -> None:
        self.m = markup
        self.rules: list[str] = []
        self.terminals: list[str] = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"r{self._n}_{re.sub(r'[^a-z0-9]', '', hint.lower())[:20]}"

    def term_name(self) -> str:
        self._n += 1
        return f"T{self._n}"

    def rule(self, hint: str, body: str) -> str:
        n = self.name(hint)
        self.rules.append(f"{n}: {body}")
        return n

    def terminal(self, body: str) -> str:
        n = self.term_name()
        self.terminals.append(f"{n}: {body}")
        return n

    def raw_value(self, schema: Mapping[str, Any], types: frozenset[str] | None, closer: str,
                  forbid: Sequence[str], root: Mapping[str, Any]) -> str:
        """Rule for an XML-style value followed by `closer` (the closer included).

        `forbid`: texts the raw value may not contain.  Raw text is used for string values;
        JSON text (decoded back by `coerce`) for everything else."""
        m = self.m
        parts = m.parts(closer)
        # A closer that begins with plain text before a special token (DSML's "</" + ｜DSML｜):
        # the value may not hold that plain head, so a greedy lexeme ends right at it.
        head = parts[0][1] if parts and parts[0][0] == "text" and len(parts) > 1 else ""
        tail = closer[len(head):] if head else closer
        all_plain = all(k == "text" for k, _ in parts)
        alts: list[str] = []
        if types is None or types != frozenset({"string"}):
            json_schema = schema if types is None or "string" not in types else _without_string(schema)
            if json_schema is not None:
                alts.append(f"{self.rule('json', json_embed(json_schema, root))} {m.lit(closer)}")
        if types is not None and "string" in types:
            constraint = _string_regex(_string_part(schema))
            exclusions = [_contains(t) for t in (*forbid, closer, head) if t]
            exclusions += _coercible(types - {"string"})
            body = " & ".join([_ANY, *(constraint and [constraint] or []),
                               *(f"~({e})" for e in exclusions)])
            if all_plain:
                # Plain closer inside the terminal: no extension can match, so greedy lexing
                # stops exactly after the first closer.
                alts.append(self.terminal(f"({body}) {lark_string(closer)}"))
            elif head:
                alts.append(f"{self.terminal(f'({body}) {lark_string(head)}')} {m.lit(tail)}")
            else:
                alts.append(f"{self.terminal(body)} {m.lit(closer)}")
        if not alts:
            raise ConstraintError("a parameter allows no value")
        return self.rule("value", " | ".join(alts))

    def text(self, start: str) -> str:
        return "\n".join([f"start: {start}", *self.rules, *self.terminals]) + "\n"


# --------------------------------------------------------------------------- tools

@dataclass(frozen=True)
class ToolSpec:
    name: str
    parameters: Mapping[str, Any]


def tool_specs(tools: Sequence[Mapping[str, Any]] | None) -> list[ToolSpec]:
    specs: list[ToolSpec] = []
    for tool in tools or []:
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not valid_name(name):
            raise ConstraintError(f"tool name {name!r} cannot be written as a call")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}, "additionalProperties": False}
        if not isinstance(params, Mapping):
            raise ConstraintError(f"tool {name!r}: parameters must be a JSON schema object")
        specs.append(ToolSpec(name, params))
    return specs


def _param_list(spec: ToolSpec) -> list[tuple[str, Any, bool]]:
    """(key, schema, required) in schema order, required keys missing from properties last."""
    props = spec.parameters.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = spec.parameters.get("required")
    required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    extra = spec.parameters.get("additionalProperties", {})
    out = [(k, v, k in required) for k, v in props.items()]
    for key in required:
        if key not in props:
            if extra is False:
                raise ConstraintError(f"tool {spec.name!r}: required parameter {key!r} is not allowed")
            out.append((key, extra if isinstance(extra, Mapping) else {}, True))
    return out


def _check_key(tool: str, key: str, bad: str) -> None:
    if not key or key != key.strip() or any(c in key for c in bad):
        raise ConstraintError(f"tool {tool!r}: parameter name {key!r} cannot be written in this "
                              f"tool-call syntax")


def _xml_params(b: _Builder, spec: ToolSpec, param: Any) -> str:
    """Sequence of the tool's parameter rules (optional ones with `?`)."""
    items = []
    for key, schema, required in _param_list(spec):
        if schema is False:
            if required:
                raise ConstraintError(f"tool {spec.name!r}: required parameter {key!r} has schema false")
            continue
        rule = param(key, schema if isinstance(schema, Mapping) else {})
        items.append(rule if required else f"{rule}?")
    return " ".join(items)


def _check_object_schema(spec: ToolSpec) -> None:
    t = spec.parameters.get("type")
    if t not in (None, "object") and not (isinstance(t, list) and "object" in t):
        raise ConstraintError(f"tool {spec.name!r}: parameters must describe an object")



def _call_sequence(b: "_Builder", specs: list[ToolSpec], forced: str | None, parallel: bool, lead: str,
                   call_body, named) -> str:
    """The calls after the prefilled opener: the first call continues the prefill (its body only
    when the name is forced, else any declared name), and with `parallel` more calls may follow,
    each introduced by the dialect's `lead` markup."""
    chosen = [s for s in specs if forced is None or s.name == forced]
    if forced is not None:
        first = call_body(chosen[0])
        again = f"{lead} {named(chosen[0])}"
    else:
        first = b.rule("anycall", " | ".join(named(s) for s in chosen))
        again = f"{lead} {first}"
    return f"{first} ({again})*" if parallel else first

def glm_grammar(m: Markup, specs: list[ToolSpec], forced: str | None, parallel: bool,
                newlines: bool) -> GrammarText:
    b = _Builder(m)
    nl = '"\\n"' if newlines else ""

    def call_body(spec: ToolSpec) -> str:
        _check_object_schema(spec)

        def param(key: str, schema: Mapping[str, Any]) -> str:
            _check_key(spec.name, key, "<")
            value = b.raw_value(schema, schema_types(schema), "</arg_value>", (), spec.parameters)
            return b.rule("p", f"{m.lit('<arg_key>' + key + '</arg_key>')} {nl} "
                               f"{m.lit('<arg_value>')} {value} {nl}")
        return b.rule("args", f"{_xml_params(b, spec, param)} {m.lit('</tool_call>')}")

    def named(spec: ToolSpec) -> str:
        return b.rule("call", f"{lark_string(spec.name)} {nl} {call_body(spec)}")

    lead = m.lit("\n<tool_call>" if newlines else "<tool_call>")
    start = _call_sequence(b, specs, forced, parallel, lead, call_body, named)
    return GrammarText(b.text(start), ["</arg_value>", "</tool_call>"])


def qwen_xml_grammar(m: Markup, specs: list[ToolSpec], forced: str | None,
                     parallel: bool) -> GrammarText:
    b = _Builder(m)

    def call_body(spec: ToolSpec) -> str:
        _check_object_schema(spec)

        def param(key: str, schema: Mapping[str, Any]) -> str:
            _check_key(spec.name, key, "<>\n")
            value = b.raw_value(schema, schema_types(schema), "\n</parameter>",
                                ("<parameter=", "</parameter>"), spec.parameters)
            return b.rule("p", f"{m.lit('<parameter=' + key + '>')} {lark_string(chr(10))} {value} "
                               f"{lark_string(chr(10))}")
        return b.rule("args", f"{_xml_params(b, spec, param)} {m.lit('</function>')} "
                              f"{lark_string(chr(10))} {m.lit('</tool_call>')}")

    def named(spec: ToolSpec) -> str:
        return b.rule("call", f"{lark_string(spec.name + '>' + chr(10))} {call_body(spec)}")

    start = _call_sequence(b, specs, forced, parallel, m.lit("\n<tool_call>\n<function="), call_body, named)
    return GrammarText(b.text(start), ["\n</parameter>", "</function>", "</tool_call>"])


def hermes_grammar(m: Markup, specs: list[ToolSpec], forced: str | None,
                   parallel: bool) -> GrammarText:
    b = _Builder(m)

    def call_body(spec: ToolSpec) -> str:
        _check_object_schema(spec)
        args = b.rule("json", json_embed(spec.parameters))
        return b.rule("args", f"{args} {lark_string('}')} {m.lit(chr(10) + '</tool_call>')}")

    def named(spec: ToolSpec) -> str:
        head = json.dumps(spec.name, ensure_ascii=False)[1:-1] + '", "arguments": '
        return b.rule("call", f"{lark_string(head)} {call_body(spec)}")

    start = _call_sequence(b, specs, forced, parallel, m.lit('\n<tool_call>\n{"name": "'), call_body, named)
    return GrammarText(b.text(start), ['"', "}", "]", "\n</tool_call>"])


DSML_BAR = "\uff5c"
_DSML = f"{DSML_BAR}DSML{DSML_BAR}"


def dsml_grammar(m: Markup, specs: list[ToolSpec], forced: str | None,
                 parallel: bool) -> GrammarText:
    b = _Builder(m)
    p_close = f"</{_DSML}parameter>"

    def call_body(spec: ToolSpec) -> str:
        _check_object_schema(spec)

        def param(key: str, schema: Mapping[str, Any]) -> str:
            _check_key(spec.name, key, '"<>\n')
            types = schema_types(schema)
            head = f'<{_DSML}parameter name="{key}" string='
            if types == frozenset({"string"}):
                value = b.raw_value(schema, types, p_close, (), spec.parameters)
                return b.rule("p", f"{m.lit(head + chr(34) + 'true' + chr(34) + '>')} {value} "
                                   f"{lark_string(chr(10))}")
            json_schema = schema if types is None or "string" not in types else _without_string(schema)
            alts = []
            if json_schema is not None:
                value = b.rule("json", json_embed(json_schema, spec.parameters))
                alts.append(f"{m.lit(head + chr(34) + 'false' + chr(34) + '>')} {value} {m.lit(p_close)}")
            if types is not None and "string" in types:
                # string="true" keeps any text a string, which the schema allows.
                value = b.raw_value(_string_part(schema), frozenset({"string"}), p_close, (),
                                    spec.parameters)
                alts.append(f"{m.lit(head + chr(34) + 'true' + chr(34) + '>')} {value}")
            return b.rule("p", f"({' | '.join(alts)}) {lark_string(chr(10))}")
        return b.rule("args", f"{_xml_params(b, spec, param)} {m.lit(f'</{_DSML}invoke>')}")

    def named(spec: ToolSpec) -> str:
        return b.rule("call", f"{lark_string(spec.name + chr(34) + '>' + chr(10))} {call_body(spec)}")

    calls = _call_sequence(b, specs, forced, parallel, m.lit(f'\n<{_DSML}invoke name="'), call_body, named)
    start = f"{calls} {m.lit(f'{chr(10)}</{_DSML}tool_calls>')}"
    return GrammarText(b.text(start), [p_close, f"\n</{_DSML}invoke>", f"\n</{_DSML}tool_calls>"])


def _reply(b: "_Builder", body: str, reasoning_open: bool) -> str:
    """The start rule of a constrained reply: `body`, after free reasoning when the prompt
    opened <think> (reasoning never holding </think>, so the parser's split agrees)."""
    if not reasoning_open:
        return body
    think = b.terminal(f"{_ANY} & ~({_contains('</think>')})")
    return f"{think} {b.m.lit('</think>')} {lark_string(chr(10) + chr(10))}? {body}"


def json_grammar(m: Markup, schema: Any, reasoning_open: bool) -> GrammarText:
    b = _Builder(m)
    body = b.rule("json", json_embed(schema))
    return GrammarText(b.text(_reply(b, body, reasoning_open)), ["</think>", '"', "}", "]"])


# Bounds on what a client's pattern / choice list / grammar may cost us to compile.
MAX_PATTERN_CHARS = 4096
MAX_CHOICES = 256
MAX_GRAMMAR_CHARS = 32768


def regex_grammar(m: Markup, pattern: str, reasoning_open: bool) -> GrammarText:
    """The reply matches `pattern` as a whole (Rust regex syntax, as vLLM's guided_regex)."""
    if not isinstance(pattern, str) or not pattern:
        raise ConstraintError("the regex must be a non-empty string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ConstraintError(f"the regex is longer than {MAX_PATTERN_CHARS} characters")
    b = _Builder(m)
    body = b.terminal(_re(pattern))
    return GrammarText(b.text(_reply(b, body, reasoning_open)), ["</think>"])


def choice_grammar(m: Markup, choices: Sequence[str], reasoning_open: bool) -> GrammarText:
    """The reply is exactly one of `choices`."""
    if (not isinstance(choices, (list, tuple)) or not choices
            or not all(isinstance(c, str) and c for c in choices)):
        raise ConstraintError("choices must be a non-empty list of non-empty strings")
    if len(choices) > MAX_CHOICES:
        raise ConstraintError(f"more than {MAX_CHOICES} choices")
    b = _Builder(m)
    body = b.rule("choice", " | ".join(m.lit(c) for c in dict.fromkeys(choices)))
    return GrammarText(b.text(_reply(b, body, reasoning_open)), ["</think>"])


def user_grammar(m: Markup, grammar: str, reasoning_open: bool) -> GrammarText:
    """The reply follows the client's own grammar: GBNF (llama.cpp's `grammar`) or Lark
    (llguidance's dialect, vLLM's guided_grammar), told apart by llguidance's converter."""
    from llguidance.gbnf_to_lark import any_to_lark

    if not isinstance(grammar, str) or not grammar.strip():
        raise ConstraintError("the grammar must be a non-empty string")
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise ConstraintError(f"the grammar is longer than {MAX_GRAMMAR_CHARS} characters")
    try:
        lark = any_to_lark(grammar)
    except Exception as exc:  # the converter raises its own error types, all of them 400s
        raise ConstraintError(f"cannot read the grammar: {exc}") from None
    b = _Builder(m)
    return GrammarText(b.text(_reply(b, "@client", reasoning_open)), ["</think>"], {"client": lark})


def tool_call_grammar(m: Markup, build: Callable[[Markup, list[ToolSpec], str | None, bool], GrammarText],
                      tools: Sequence[Mapping[str, Any]] | None, forced: str | None,
                      parallel: bool) -> GrammarText:
    """The calls after a family's opener: `build` is the family's grammar (CallSyntax.grammar)."""
    specs = tool_specs(tools)
    if not specs:
        raise ConstraintError("a forced tool call needs at least one tool")
    if forced is not None and forced not in {s.name for s in specs}:
        raise ConstraintError(f"tool_choice names {forced!r}, which is not among the tools")
    return build(m, specs, forced, parallel)
