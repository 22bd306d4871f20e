"""The OpenAPI 3.1 document served at /openapi.json, built from the route table (app.ROUTES).

Every route is registered from that one table, and each `Route` carries its own documentation
(summary, request body schema, success schema, whether it streams), so the document cannot miss
a route or list one that does not exist (tests/test_openapi.py checks both ways).

The body schemas give the fields the protocol modules read with their types; they are the
contract clients and schemathesis see, not the validator: the protocol modules validate and
answer 400 in the API's shape.  Unknown fields are allowed (the SDKs send extras), so no schema
sets additionalProperties false.
"""
from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

Schema = dict[str, Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # aiohttp syntax: "/v1/models/{model_id:.+}"
    handler: Handler
    summary: str
    api: str  # "openai" | "anthropic" | "ops": the error shape and the tag
    body: Schema | None = None  # JSON Schema of the request body (POST)
    ok: Schema | None = None  # JSON Schema of the 200 JSON reply
    streams: bool = False  # "stream": true answers text/event-stream
    generates: bool = False  # queues a generation: 429 (queue full) and 503 (shutting down)
    public: bool = False  # no API key needed
    text_reply: bool = False  # 200 is text/plain (Prometheus)


# --------------------------------------------------------------------------- building blocks

def _obj(properties: dict[str, Schema], required: Sequence[str] = (), **extra: Any) -> Schema:
    out: Schema = {"type": "object", "properties": properties}
    if required:
        out["required"] = list(required)
    out.update(extra)
    return out


def _arr(items: Schema, **extra: Any) -> Schema:
    return {"type": "array", "items": items, **extra}


STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
ANY_OBJ: Schema = {"type": "object"}
JSON_SCHEMA: Schema = {"type": ["object", "boolean"], "description": "a JSON Schema"}
POSITIVE: Schema = {"type": "integer", "minimum": 1}
STOP: Schema = {"oneOf": [STR, _arr(STR, maxItems=16)]}

SAMPLING: dict[str, Schema] = {
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
    "seed": {"type": "integer", "minimum": 0},
}

TEXT_PART = _obj({"type": {"enum": ["text", "input_text"]}, "text": STR}, ["type", "text"])
OPENAI_TOOL = _obj({"type": {"const": "function"},
                    "function": _obj({"name": {"type": "string", "minLength": 1}, "description": STR,
                                      "parameters": JSON_SCHEMA, "strict": BOOL}, ["name"])},
                   ["function"])
OPENAI_TOOL_CALL = _obj({"id": STR, "type": {"const": "function"},
                         # A JSON text on the wire; an object is accepted too (chat/normalize.py).
                         "function": _obj({"name": STR, "arguments": {"type": ["string", "object"]}}, ["name"])},
                        ["function"])
OPENAI_MESSAGE = _obj({
    "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"oneOf": [STR, _arr(TEXT_PART), {"type": "null"}]},
    "name": STR,
    "tool_calls": _arr(OPENAI_TOOL_CALL),
    "tool_call_id": STR,
    "reasoning_content": {"type": ["string", "null"]},
    "reasoning": {"type": ["string", "null"]},  # aliases of reasoning_content (chat/normalize.py)
    "thinking": {"type": ["string", "null"]},
}, ["role"])
TOOL_CHOICE = {"oneOf": [{"enum": ["auto", "none", "required"]},
                         _obj({"type": {"const": "function"}, "function": _obj({"name": STR}, ["name"])},
                              ["type", "function"])]}
# Only a json_schema format has a schema: one on a text or json_object format is refused
# (spec.no_schema_member), so those variants allow the member as null (= absent) only.
NO_SCHEMA: Schema = {"type": "null"}
RESPONSE_FORMAT = {"oneOf": [
    _obj({"type": {"enum": ["text", "json_object"]}, "json_schema": NO_SCHEMA}, ["type"]),
    _obj({"type": {"const": "json_schema"},
          "json_schema": _obj({"name": STR, "description": STR, "schema": JSON_SCHEMA, "strict": BOOL})},
         ["type", "json_schema"]),
]}
# Other servers' constraint parameters (vLLM, llama.cpp): at most one per request.
EXTENSIONS: dict[str, Schema] = {
    "guided_json": {"type": ["object", "boolean", "string"]}, "guided_regex": STR,
    "guided_choice": _arr(STR, minItems=1), "guided_grammar": STR, "grammar": STR,
    "json_schema": {"type": ["object", "boolean", "string"]},
    "structured_outputs": _obj({"json": {"type": ["object", "boolean", "string"]}, "regex": STR,
                                "choice": _arr(STR, minItems=1), "grammar": STR}),
}
COMMON_OPENAI: dict[str, Schema] = {
    "model": STR,
    **SAMPLING,
    "logit_bias": {"type": "object", "additionalProperties": NUM},
    "stop": STOP,
    "stream": BOOL,
    "stream_options": _obj({"include_usage": BOOL}),
    "n": {"type": "integer", "minimum": 1, "maximum": 8},
    "ignore_eos": BOOL,
    "user": STR,
}

CHAT_BODY = _obj({
    "messages": _arr(OPENAI_MESSAGE, minItems=1, maxItems=4096),
    **COMMON_OPENAI,
    "max_tokens": POSITIVE, "max_completion_tokens": POSITIVE,
    "tools": _arr(OPENAI_TOOL, maxItems=256), "tool_choice": TOOL_CHOICE, "parallel_tool_calls": BOOL,
    "logprobs": BOOL, "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    "response_format": RESPONSE_FORMAT,
    "reasoning_effort": STR,
    "chat_template_kwargs": _obj({"enable_thinking": BOOL, "thinking": BOOL}),
    **EXTENSIONS,
}, ["messages"])

COMPLETION_BODY = _obj({
    "prompt": {"oneOf": [STR, _arr(STR, minItems=1, maxItems=1), _arr({"type": "integer", "minimum": 0}, minItems=1)]},
    **COMMON_OPENAI,
    "max_tokens": POSITIVE,
    "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    "echo": BOOL,
    **EXTENSIONS,
}, ["prompt"])

ANTHROPIC_BLOCK = _obj({"type": {"enum": ["text", "thinking", "redacted_thinking", "tool_use", "tool_result",
                                          "image", "document"]},
                        "text": STR, "thinking": STR, "signature": STR, "id": STR, "name": STR,
                        "input": ANY_OBJ, "tool_use_id": STR,
                        "content": {"oneOf": [STR, _arr(ANY_OBJ)]}, "is_error": BOOL}, ["type"])
ANTHROPIC_CONTENT = {"oneOf": [STR, _arr(ANTHROPIC_BLOCK)]}
ANTHROPIC_TOOL = _obj({"name": {"type": "string", "minLength": 1}, "description": STR, "input_schema": JSON_SCHEMA,
                       "type": STR}, ["name"])
ANTHROPIC_FIELDS: dict[str, Schema] = {
    "model": STR,
    "messages": _arr(_obj({"role": {"enum": ["user", "assistant"]}, "content": ANTHROPIC_CONTENT},
                          ["role", "content"]), minItems=1),
    "system": {"oneOf": [STR, _arr(_obj({"type": {"const": "text"}, "text": STR}, ["type", "text"]))]},
    "tools": _arr(ANTHROPIC_TOOL, maxItems=256),
    "tool_choice": _obj({"type": {"enum": ["auto", "any", "tool", "none"]}, "name": STR,
                         "disable_parallel_tool_use": BOOL}, ["type"]),
    "thinking": _obj({"type": {"enum": ["enabled", "adaptive", "disabled"]}, "budget_tokens": INT,
                      "display": {"enum": ["summarized", "omitted"]}}, ["type"]),
    "output_config": _obj({"effort": STR, "format": {"oneOf": [
        _obj({"type": {"enum": ["text", "json_object"]}, "schema": NO_SCHEMA}, ["type"]),
        _obj({"type": {"const": "json_schema"}, "schema": JSON_SCHEMA}, ["type", "schema"])]}}),
    "metadata": ANY_OBJ,
}
MESSAGES_BODY = _obj({
    **ANTHROPIC_FIELDS,
    "max_tokens": POSITIVE,
    "temperature": {"type": "number", "minimum": 0},
    "top_p": SAMPLING["top_p"], "top_k": SAMPLING["top_k"],
    "stop_sequences": _arr(STR, maxItems=16),
    "stream": BOOL,
    "ignore_eos": BOOL,
}, ["model", "messages", "max_tokens"])
COUNT_TOKENS_BODY = _obj(ANTHROPIC_FIELDS, ["model", "messages"])

RESPONSES_ITEM = _obj({"type": STR, "role": {"enum": ["system", "developer", "user", "assistant"]},
                       "content": {"oneOf": [STR, _arr(ANY_OBJ)]}, "call_id": STR, "name": STR,
                       "arguments": STR, "output": {"oneOf": [STR, _arr(ANY_OBJ)]}})
RESPONSES_BODY = _obj({
    "model": STR,
    "input": {"oneOf": [STR, _arr(RESPONSES_ITEM, maxItems=4096)]},
    "instructions": {"oneOf": [STR, _arr(ANY_OBJ), {"type": "null"}]},
    "tools": _arr(_obj({"type": STR, "name": STR, "description": STR, "parameters": JSON_SCHEMA}, ["type"])),
    "tool_choice": {"oneOf": [{"enum": ["auto", "none", "required"]}, ANY_OBJ]},
    "parallel_tool_calls": BOOL,
    "max_output_tokens": POSITIVE,
    "temperature": SAMPLING["temperature"], "top_p": SAMPLING["top_p"], "seed": SAMPLING["seed"],
    "top_k": SAMPLING["top_k"], "min_p": SAMPLING["min_p"],
    "stream": BOOL,
    "reasoning": _obj({"effort": STR}),
    "text": _obj({"format": {"oneOf": [
        _obj({"type": {"enum": ["text", "json_object"]}, "schema": NO_SCHEMA}, ["type"]),
        _obj({"type": {"const": "json_schema"}, "name": STR, "description": STR, "schema": JSON_SCHEMA,
              "strict": BOOL}, ["type", "schema"])]}}),
    "store": BOOL,
    "ignore_eos": BOOL,
}, ["input"])

TOKENIZE_BODY = _obj({"content": STR, "prompt": STR, "messages": _arr(OPENAI_MESSAGE, minItems=1),
                      "with_pieces": BOOL})
DETOKENIZE_BODY = _obj({"tokens": _arr({"type": "integer", "minimum": 0})}, ["tokens"])

# --------------------------------------------------------------------------- replies

USAGE = _obj({"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT,
              "prompt_tokens_details": _obj({"cached_tokens": INT})})
CHAT_COMPLETION = _obj({"id": STR, "object": {"const": "chat.completion"}, "created": INT, "model": STR,
                        "choices": _arr(_obj({"index": INT, "message": _obj({"role": {"const": "assistant"}}),
                                              "finish_reason": STR}, ["index", "message", "finish_reason"])),
                        "usage": USAGE}, ["id", "object", "created", "model", "choices"])
TEXT_COMPLETION = _obj({"id": STR, "object": {"const": "text_completion"}, "created": INT, "model": STR,
                        "choices": _arr(_obj({"index": INT, "text": STR, "finish_reason": {"type": ["string", "null"]}},
                                             ["index", "text"])),
                        "usage": USAGE}, ["id", "object", "choices"])
MODEL = _obj({"id": STR, "object": {"const": "model"}, "created": INT, "owned_by": STR, "max_model_len": INT},
             ["id", "object"])
MODEL_LIST = _obj({"object": {"const": "list"}, "data": _arr(MODEL)}, ["object", "data"])
MESSAGE = _obj({"id": STR, "type": {"const": "message"}, "role": {"const": "assistant"}, "model": STR,
                "content": _arr(_obj({"type": STR}, ["type"])), "stop_reason": {"type": ["string", "null"]},
                "stop_sequence": {"type": ["string", "null"]},
                "usage": _obj({"input_tokens": INT, "output_tokens": INT})},
               ["id", "type", "role", "content", "stop_reason", "usage"])
RESPONSE = _obj({"id": STR, "object": {"const": "response"}, "status": STR, "model": STR, "output": _arr(ANY_OBJ)},
                ["id", "object", "status", "output"])
COUNT = _obj({"input_tokens": INT}, ["input_tokens"])
HEALTH = _obj({"status": {"enum": ["ok", "loading", "shutting_down"]}, "model": STR, "busy": BOOL,
               "queue_depth": INT}, ["status"])
PROPS = _obj({"model": STR, "n_ctx": INT, "chat_format": STR, "default_max_tokens": INT, "engine": ANY_OBJ},
             ["model", "n_ctx"])
TOKENS = _obj({"tokens": _arr(INT), "count": INT, "pieces": _arr(STR)}, ["tokens", "count"])
TEXT = _obj({"content": STR}, ["content"])

# One server-sent event of a stream (SSE tooling validates each event against this): `data` is a
# JSON text (OpenAI chunks, Anthropic / Responses events) or "[DONE]"; comments carry no data.
SSE_EVENT = _obj({"event": STR, "data": STR, "id": STR}, ["data"])

OPENAI_ERROR = _obj({"error": _obj({"message": STR, "type": STR, "param": {"type": ["string", "null"]},
                                    "code": {"type": ["string", "null"]}}, ["message", "type", "param", "code"])},
                    ["error"])
ANTHROPIC_ERROR = _obj({"type": {"const": "error"}, "error": _obj({"type": STR, "message": STR}, ["type", "message"]),
                        "request_id": STR}, ["type", "error"])

_ERRORS = {400: "Invalid request (the message names the field in `param` / the text)",
           401: "Missing or wrong API key", 404: "Not found", 405: "Method not allowed",
           413: "Body larger than 16 MiB", 429: "The queue is full: retry after Retry-After seconds",
           500: "Internal error (a bug: the server keeps serving)",
           503: "Shutting down (or loading): retry after Retry-After seconds"}


# --------------------------------------------------------------------------- the document

def openapi_path(path: str) -> str:
    """aiohttp's `{name:regex}` placeholders as OpenAPI's `{name}`."""
    return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", path)


def _allows_null(schema: Schema) -> bool:
    kind = schema.get("type")
    return kind == "null" or (isinstance(kind, list) and "null" in kind) or any(
        _allows_null(s) for s in schema.get("oneOf", []) + schema.get("anyOf", []))


def nullable_optionals(schema: Schema) -> Schema:
    """The schema with every optional property also allowing null: the protocol modules read a
    null field as an absent one (the SDKs send nulls for unset options)."""
    out = dict(schema)
    if "properties" in out:
        required = set(out.get("required", ()))
        props = {}
        for name, prop in out["properties"].items():
            prop = nullable_optionals(prop)
            if name not in required and not _allows_null(prop):
                prop = {"anyOf": [prop, {"type": "null"}]}
            props[name] = prop
        out["properties"] = props
    if isinstance(out.get("items"), dict):
        out["items"] = nullable_optionals(out["items"])
    for key in ("oneOf", "anyOf"):
        if key in out:
            out[key] = [nullable_optionals(s) for s in out[key]]
    return out


def _operation(route: Route) -> dict[str, Any]:
    error_ref = {"$ref": "#/components/schemas/" + ("AnthropicError" if route.api == "anthropic" else "OpenAIError")}
    statuses = [400, 404, 405, 500]
    if route.method == "POST":
        statuses.append(413)
    if not route.public:
        statuses.append(401)
    if route.generates:
        statuses.append(429)
    statuses.append(503)
    responses: dict[str, Any] = {}
    if route.text_reply:
        responses["200"] = {"description": "OK", "content": {"text/plain": {"schema": STR}}}
    else:
        content: dict[str, Any] = {"application/json": {"schema": route.ok or ANY_OBJ}}
        if route.streams:
            content["text/event-stream"] = {"schema": SSE_EVENT}
        responses["200"] = {"description": "OK" + (" (an SSE stream when `stream` is true)" if route.streams else ""),
                            "content": content}
    for status in sorted(statuses):
        retry = {"Retry-After": {"schema": INT}} if status in (429, 503) else {}
        responses[str(status)] = {"description": _ERRORS[status],
                                  "content": {"application/json": {"schema": error_ref}}, **({"headers": retry}
                                                                                              if retry else {})}
    slug = re.sub(r"[^a-z0-9]+", "_", openapi_path(route.path).lower()).strip("_")
    op: dict[str, Any] = {"operationId": f"{route.method.lower()}_{slug}", "summary": route.summary,
                          "tags": [route.api], "responses": responses}
    if route.public:
        op["security"] = []
    params = re.findall(r"\{(\w+)(?::[^}]*)?\}", route.path)
    if params:
        op["parameters"] = [{"name": p, "in": "path", "required": True, "schema": STR} for p in params]
    if route.body is not None:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": nullable_optionals(route.body)}}}
    return op


def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("moegate")
    except Exception:  # noqa: BLE001 - running from a checkout without metadata
        return "0+checkout"


def build_document(routes: Sequence[Route], *, version: str | None = None, title: str = "moegate") -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(openapi_path(route.path), {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version or package_version(),
                 "description": "OpenAI- and Anthropic-compatible inference gateway. Errors come in each API's "
                                "own shape; fields not listed are ignored."},
        "paths": paths,
        "components": {
            "schemas": {"OpenAIError": OPENAI_ERROR, "AnthropicError": ANTHROPIC_ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
        },
        "security": [{"bearer": []}, {"x-api-key": []}],
    }
