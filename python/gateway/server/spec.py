"""The one request spec every API's protocol module parses into, and the field checks they share.

Each API's protocol module (openai_protocol, anthropic_protocol, responses_protocol) turns its
body into a `ChatSpec` in the OpenAI chat form (messages, tools, tool_choice), so everything
after parsing speaks one dialect.  Every field is type-checked: a bad value is a 400 naming the
field, never a 500 from deep inside (the body itself was checked before: server/body.py).
Fields are read through
`field_of` (one value, its type, its default) and `check_fields` (a table of the fields an API
accepts without using them: type-checked all the same, so a wrong type is never silently taken).
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..sampling import SamplingParams
from ..schema_check import schema_problem
from .errors import bad_request

MAX_MESSAGES = 4096
MAX_STOP_STRINGS = 16
MAX_TOOLS = 256
# n > 1 runs the choices one after another: bounded so one request cannot hold the slot forever.
MAX_CHOICES = 8
# Nesting bound of a request body (objects and arrays): real requests (a tool schema 10 levels
# deep is about 25) stay far below it; a deeper body would only recurse through the encoders and
# the grammar compiler.
# Seeds are 64-bit unsigned, as numpy's generators (and vLLM) take them.
MAX_SEED = 2**64 - 1
# Anthropic's smallest thinking budget.
MIN_THINKING_BUDGET = 1024

Kind = type | tuple[type, ...]
NUMBER: Kind = (int, float)


@dataclass
class ChatSpec:
    messages: list[dict]
    tools: list[dict] = field(default_factory=list)
    tool_choice: str = "auto"            # auto | none | required | function
    forced_name: str | None = None       # set when tool_choice names a function
    parallel_tool_calls: bool = True
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    thinking: bool | None = None
    reasoning_effort: str | None = None
    response_format: dict | None = None
    model: str = ""
    ignore_eos: bool = False  # llama.cpp/vLLM extension: generate through end-of-turn tokens
    omit_thinking: bool = False  # Anthropic thinking.display "omitted": thinking blocks carry no text
    n: int = 1  # OpenAI choices: generated one after another in the single slot (prompt reused)
    tool_namespaces: dict[str, str] = field(default_factory=dict)  # Responses: function -> namespace
    max_tokens_param: str = "max_tokens"  # the API's name of max_tokens, for the errors that name it
    thinking_budget: int | None = None  # Anthropic thinking.budget_tokens: reasoning closed after this many

    @property
    def active_tools(self) -> list[dict]:
        """Tools the model sees: none when tool_choice is "none"."""
        return [] if self.tool_choice == "none" else self.tools

    @property
    def forces_call(self) -> bool:
        return self.tool_choice in ("required", "function") and bool(self.tools)


_JSON_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


def _kinds(kind: Kind) -> tuple[type, ...]:
    return (kind,) if isinstance(kind, type) else kind


def expect(value: Any, kind: Kind, param: str) -> Any:
    """`value` if it has the type `kind`; a 400 naming `param` otherwise.  JSON true/false are
    no numbers here (Python's bool is an int), and a number must be finite (1e400 parses as inf)."""
    kinds = _kinds(kind)
    numeric = any(k in (int, float) for k in kinds)
    if not isinstance(value, kinds) or (numeric and bool not in kinds and isinstance(value, bool)):
        names = "number" if kinds == NUMBER else " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
        raise bad_request(f"'{param}' must be of type {names}", param)
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_request(f"'{param}' must be a finite number", param)
    return value


def field_of(body: Mapping[str, Any], key: str, kind: Kind, default: Any = None, *,
             param: str | None = None) -> Any:
    """body[key] checked against `kind` (`default` when absent or null): the one way a field is read."""
    value = body.get(key)
    if value is None:
        return default
    return expect(value, kind, param or key)


def check_fields(body: Mapping[str, Any], kinds: Mapping[str, Kind], prefix: str = "") -> None:
    """Type-checks every field of `kinds` that the body carries (null means absent)."""
    for key, kind in kinds.items():
        field_of(body, key, kind, param=prefix + key)


def number_field(body: dict, key: str, default: float) -> float:
    return float(field_of(body, key, NUMBER, default))


def int_field(body: dict, key: str, default: int | None) -> int | None:
    return field_of(body, key, int, default)


def stop_list(value: Any, param: str, *, single_string: bool = True) -> list[str]:
    """A list of stop strings; OpenAI's `stop` also takes one string (`single_string`), Anthropic's
    stop_sequences only a list."""
    if value is None:
        return []
    if isinstance(value, str) and single_string:
        value = [value]
    expect(value, list, param)
    if len(value) > MAX_STOP_STRINGS:
        raise bad_request(f"'{param}' may hold at most {MAX_STOP_STRINGS} strings", param)
    for s in value:
        expect(s, str, param)
    return [s for s in value if s]


def check_tools(tools: list[dict]) -> list[dict]:
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"at most {MAX_TOOLS} tools are allowed", "tools")
    names = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise bad_request(f"tools[{i}]: only tools of type 'function' are supported", "tools")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"tools[{i}].function.name is required", "tools")
        params = fn.get("parameters", {})
        if params is not None and not isinstance(params, dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON Schema object", "tools")
        check_fields(fn, {"description": str, "strict": bool}, f"tools[{i}].function.")
        if params is not None:
            valid_schema(params, f"tool '{fn['name']}'", "tools")
        names.add(fn["name"])
    return tools


def apply_tool_choice(spec: ChatSpec, choice: Any) -> None:
    names = {t["function"]["name"] for t in spec.tools}
    if choice is None:
        spec.tool_choice = "auto"
    elif isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad_request("'tool_choice' must be 'auto', 'none', 'required' or a named function", "tool_choice")
        spec.tool_choice = choice
    elif isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise bad_request("'tool_choice' object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                              "tool_choice")
        spec.tool_choice, spec.forced_name = "function", name
    else:
        raise bad_request("'tool_choice' must be a string or an object", "tool_choice")
    if spec.tool_choice in ("required", "function") and not spec.tools:
        raise bad_request(f"tool_choice '{spec.tool_choice}' needs a non-empty 'tools' list", "tool_choice")
    if spec.forced_name is not None and spec.forced_name not in names:
        raise bad_request(f"tool_choice names function '{spec.forced_name}', which is not in 'tools'",
                          "tool_choice")


# Fields of an OpenAI-form message other than role/content/tool_calls, as the OpenAPI document
# types them (null means absent).  `reasoning` and `thinking` are the aliases chat/normalize.py
# reads for `reasoning_content`.
MESSAGE_FIELDS: dict[str, Kind] = {"name": str, "tool_call_id": str, "reasoning_content": str, "reasoning": str,
                                   "thinking": str}


def check_messages(messages: Any) -> list[dict]:
    """The one check of OpenAI-form messages: /v1/chat/completions, /tokenize and /v1/responses
    (after its items became messages) all call it, so they refuse the same fields."""
    expect(messages, list, "messages")
    if not messages:
        raise bad_request("'messages' must not be empty", "messages")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"'messages' may hold at most {MAX_MESSAGES} entries", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object", "messages")
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise bad_request(f"messages[{i}].role must be one of system, developer, user, assistant, tool",
                              "messages")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise bad_request(f"messages[{i}].content must be a string, a list of parts or null", "messages")
        if isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                    raise bad_request(f"messages[{i}].content: only text parts are supported", "messages")
        if role == "tool" and not isinstance(m.get("tool_call_id", ""), str):
            raise bad_request(f"messages[{i}].tool_call_id must be a string", "messages")
        # Checked for every role: the chat encoder reads the reasoning aliases (chat/normalize.py),
        # and a field the document types must not pass on one role and fail on another.
        check_fields(m, MESSAGE_FIELDS, f"messages[{i}].")
        if isinstance(content, list):
            for j, part in enumerate(content):
                expect(part.get("text"), str, f"messages[{i}].content[{j}].text")
        calls = m.get("tool_calls")
        if calls is not None:
            expect(calls, list, "messages")
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise bad_request(f"messages[{i}].tool_calls entries need function.name", "messages")
                field_of(call, "id", str, param=f"messages[{i}].tool_calls[{j}].id")
                if call.get("type") not in (None, "function"):
                    raise bad_request(f"messages[{i}].tool_calls[{j}].type must be 'function'",
                                      f"messages[{i}].tool_calls[{j}].type")
                args = fn.get("arguments", "{}")
                if args is not None and not isinstance(args, (str, dict)):  # on any role's calls
                    raise bad_request(f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON string "
                                      "(or an object)", f"messages[{i}].tool_calls[{j}].function.arguments")
                if isinstance(args, str):
                    try:
                        json.loads(args or "{}")
                    except json.JSONDecodeError:
                        raise bad_request(f"messages[{i}].tool_calls: arguments must be a JSON string",
                                          "messages") from None
    return messages


def sampling_params(body: dict, *, default_temperature: float = 1.0) -> SamplingParams:
    top_logprobs = int_field(body, "top_logprobs", 0) or 0
    bias: dict[int, float] = {}
    raw_bias = body.get("logit_bias")
    if raw_bias is not None:
        expect(raw_bias, dict, "logit_bias")
        for key, value in raw_bias.items():
            try:
                bias[int(key)] = float(expect(value, (int, float), "logit_bias"))
            except ValueError:
                raise bad_request("'logit_bias' keys must be token ids", "logit_bias") from None
    params = SamplingParams(
        temperature=number_field(body, "temperature", default_temperature),
        top_p=number_field(body, "top_p", 1.0),
        top_k=int_field(body, "top_k", 0) or 0,
        min_p=number_field(body, "min_p", 0.0),
        presence_penalty=number_field(body, "presence_penalty", 0.0),
        frequency_penalty=number_field(body, "frequency_penalty", 0.0),
        seed=seed_field(body),
        logprobs=field_of(body, "logprobs", bool, False) or top_logprobs > 0,
        top_logprobs=top_logprobs,
        logit_bias=bias,
    )
    try:
        params.validate()
    except ValueError as exc:
        raise bad_request(str(exc), str(exc).split(":")[0]) from None
    return params


def seed_field(body: dict) -> int | None:
    seed = int_field(body, "seed", None)
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise bad_request(f"'seed' must be between 0 and {MAX_SEED}", "seed")
    return seed


def json_format(schema: Any, param: str) -> dict:
    """The one normalised form both APIs' JSON formats become: {"type": "json_object"} or
    {"type": "json_schema", "schema": {...}} (a missing schema means any JSON object)."""
    if schema is None:
        return {"type": "json_object"}
    if not isinstance(schema, (dict, bool)):
        raise bad_request(f"'{param}' schema must be a JSON Schema object", param)
    return {"type": "json_schema", "schema": valid_schema(schema, f"'{param}'", param)}


# The members of a json_schema format besides the schema itself (OpenAI's response_format.json_schema
# and text.format): not acted on, typed all the same.
JSON_SCHEMA_FORMAT_FIELDS: dict[str, Kind] = {"name": str, "description": str, "strict": bool}


def no_schema_member(fmt: Mapping[str, Any], key: str, param: str) -> None:
    """A format of type text or json_object has no schema member (OpenAI's response_format and
    text.format, Anthropic's output_config.format): one there would be silently ignored, and the
    client would believe its reply is constrained.  Null counts as absent, as everywhere."""
    if fmt.get(key) is not None:
        raise bad_request(f"'{param}' of type {fmt.get('type')} takes no '{key}': use type json_schema", param)


def valid_schema(schema: Any, what: str, param: str) -> Any:
    """`schema` when it is a JSON Schema we can work with (gateway.schema_check: its dialect's
    meta-schema, $refs resolving inside it, bounded size); else a 400 naming `what` (the tool or
    the format parameter) and the JSON path inside the schema."""
    problem = schema_problem(schema)
    if problem is not None:
        raise bad_request(f"{what}: the schema is not valid JSON Schema {problem}", param,
                          code="invalid_json_schema")
    return schema


def thinking_switch(body: dict) -> bool | None:
    """OpenAI-side switches used by local servers: chat_template_kwargs.enable_thinking / thinking."""
    kwargs = field_of(body, "chat_template_kwargs", dict, {})
    for key in ("enable_thinking", "thinking"):
        value = field_of(kwargs, key, bool, param=f"chat_template_kwargs.{key}")
        if value is not None:
            return value
    return None


def positive_int(body: dict, key: str, param: str | None = None) -> int | None:
    """An optional count that must be at least 1 (max_tokens and friends).  No upper bound here:
    what cannot fit in the context is refused once the prompt is counted
    (pipeline.generation_request)."""
    name = param or key
    value = field_of(body, key, int, param=name)
    if value is None:
        return None
    if value < 1:
        raise bad_request(f"'{name}' must be at least 1", name)
    return value


def choices_count(body: dict) -> int:
    n = int_field(body, "n", 1)
    if n is None or not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"'n' must be between 1 and {MAX_CHOICES}", "n")
    return n


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    """Client-sent token ids (completions prompt, /detokenize) must lie inside the vocabulary."""
    if any(t < 0 or t >= vocab_size for t in ids):
        raise bad_request(f"'{param}' holds a token id outside the vocabulary", param)
