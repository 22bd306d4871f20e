"""Request bodies of both APIs, validated and normalised into one ChatSpec.

Anthropic Messages requests are translated into the OpenAI form (messages, tools, tool_choice)
here, so everything after this point speaks one dialect.  Every field is type-checked: a bad
value is a 400 naming the field, never a 500 from deep inside.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..sampling import SamplingParams
from .errors import ApiError, bad_request

MAX_MESSAGES = 4096
MAX_STOP_STRINGS = 16
MAX_TOOLS = 256


# n > 1 runs the choices one after another: bounded so one request cannot hold the slot forever.
MAX_CHOICES = 8


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

    @property
    def active_tools(self) -> list[dict]:
        """Tools the model sees: none when tool_choice is "none"."""
        return [] if self.tool_choice == "none" else self.tools

    @property
    def forces_call(self) -> bool:
        return self.tool_choice in ("required", "function") and bool(self.tools)


def _expect(value: Any, kind: type | tuple[type, ...], param: str) -> Any:
    if not isinstance(value, kind) or (kind in (int, float, (int, float)) and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise bad_request(f"'{param}' must be of type {names}", param)
    return value


def _number(body: dict, key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    return float(_expect(value, (int, float), key))


def _int(body: dict, key: str, default: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    return _expect(value, int, key)


def _stop_list(value: Any, param: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    _expect(value, list, param)
    if len(value) > MAX_STOP_STRINGS:
        raise bad_request(f"'{param}' may hold at most {MAX_STOP_STRINGS} strings", param)
    for s in value:
        _expect(s, str, param)
    return [s for s in value if s]


def _check_tools(tools: list[dict]) -> list[dict]:
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
        names.add(fn["name"])
    return tools


def _apply_tool_choice(spec: ChatSpec, choice: Any) -> None:
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


def _check_messages(messages: Any) -> list[dict]:
    _expect(messages, list, "messages")
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
        calls = m.get("tool_calls")
        if calls is not None:
            _expect(calls, list, "messages")
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise bad_request(f"messages[{i}].tool_calls entries need function.name", "messages")
                args = fn.get("arguments", "{}")
                if isinstance(args, str):
                    try:
                        json.loads(args or "{}")
                    except json.JSONDecodeError:
                        raise bad_request(f"messages[{i}].tool_calls: arguments must be a JSON string",
                                          "messages") from None
    return messages


def _sampling(body: dict, *, default_temperature: float = 1.0) -> SamplingParams:
    top_logprobs = _int(body, "top_logprobs", 0) or 0
    bias: dict[int, float] = {}
    raw_bias = body.get("logit_bias")
    if raw_bias is not None:
        _expect(raw_bias, dict, "logit_bias")
        for key, value in raw_bias.items():
            try:
                bias[int(key)] = float(_expect(value, (int, float), "logit_bias"))
            except ValueError:
                raise bad_request("'logit_bias' keys must be token ids", "logit_bias") from None
    params = SamplingParams(
        temperature=_number(body, "temperature", default_temperature),
        top_p=_number(body, "top_p", 1.0),
        top_k=_int(body, "top_k", 0) or 0,
        min_p=_number(body, "min_p", 0.0),
        presence_penalty=_number(body, "presence_penalty", 0.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0),
        seed=_int(body, "seed", None),
        logprobs=bool(body.get("logprobs")) or top_logprobs > 0,
        top_logprobs=top_logprobs,
        logit_bias=bias,
    )
    try:
        params.validate()
    except ValueError as exc:
        raise bad_request(str(exc), str(exc).split(":")[0]) from None
    return params


def parse_openai_chat(body: Any) -> ChatSpec:
    _expect(body, dict, "body")
    spec = ChatSpec(messages=_check_messages(body.get("messages")), model=str(body.get("model") or ""))
    spec.tools = _check_tools(_expect([] if body.get("tools") is None else body["tools"], list, "tools"))
    _apply_tool_choice(spec, body.get("tool_choice"))
    spec.parallel_tool_calls = body.get("parallel_tool_calls") is not False  # null means the default
    spec.sampling = _sampling(body)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        _expect(max_tokens, int, "max_tokens")
        if max_tokens < 1:
            raise bad_request("'max_tokens' must be at least 1", "max_tokens")
    spec.max_tokens = max_tokens
    spec.stop = _stop_list(body.get("stop"), "stop")
    spec.stream = bool(body.get("stream", False))
    spec.ignore_eos = bool(body.get("ignore_eos", False))
    opts = body.get("stream_options")
    opts = {} if opts is None else _expect(opts, dict, "stream_options")
    spec.include_usage = bool(opts.get("include_usage", False))
    n = _int(body, "n", 1)
    if n is None or not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"'n' must be between 1 and {MAX_CHOICES}", "n")
    spec.n = n
    effort = body.get("reasoning_effort")
    if effort is not None:
        spec.reasoning_effort = _expect(effort, str, "reasoning_effort")
    spec.thinking = _thinking_switch(body)
    fmt = body.get("response_format")
    if fmt is not None:
        _expect(fmt, dict, "response_format")
        if fmt.get("type") not in ("text", "json_object", "json_schema"):
            raise bad_request("'response_format.type' must be text, json_object or json_schema", "response_format")
        if fmt.get("type") == "json_schema":
            inner = fmt.get("json_schema")
            if not isinstance(inner, dict):
                raise bad_request("'response_format.json_schema' must be an object with a 'schema'",
                                  "response_format")
            spec.response_format = _json_format(inner.get("schema"), "response_format")
        else:
            spec.response_format = _json_format(None, "response_format") if fmt["type"] == "json_object" else None
    extension = extension_format(body)
    if extension is not None:
        if spec.response_format is not None or spec.forces_call:
            raise bad_request(f"'{extension['param']}' cannot be combined with response_format or a forced "
                              "tool_choice: one constraint per request", extension["param"])
        spec.response_format = extension
    return spec


# Constraint parameters that clients of other servers send: vLLM's guided_* and
# structured_outputs, llama.cpp's grammar (GBNF) and json_schema.  (param, kind) in the order
# they are looked for; "json" is a JSON Schema, "regex" a pattern the whole reply matches,
# "choice" a list of strings, "grammar" GBNF or Lark text.
_EXTENSIONS = (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
               ("guided_grammar", "grammar"), ("grammar", "grammar"), ("json_schema", "json"))


def extension_format(body: dict) -> dict | None:
    """The one extension constraint a request carries, normalised like response_format:
    {"type": "json_schema" | "json_object" | "regex" | "choice" | "grammar", ..., "param": name}."""
    found: list[tuple[str, str, Any]] = []
    outputs = body.get("structured_outputs")
    if outputs is not None:
        _expect(outputs, dict, "structured_outputs")
        found += [(f"structured_outputs.{k}", k, outputs[k]) for k in ("json", "regex", "choice", "grammar")
                  if outputs.get(k) is not None]
    found += [(param, kind, body[param]) for param, kind in _EXTENSIONS if body.get(param) is not None]
    if not found:
        return None
    if len(found) > 1:
        raise bad_request(f"'{found[0][0]}' and '{found[1][0]}' both constrain the reply: one constraint "
                          "per request", found[1][0])
    param, kind, value = found[0]
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise bad_request(f"'{param}' is not valid JSON", param) from None
        return dict(_json_format(value, param), param=param)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request(f"'{param}' must be a non-empty list of non-empty strings", param)
        return {"type": "choice", "choices": value, "param": param}
    if not isinstance(value, str) or not value.strip():
        raise bad_request(f"'{param}' must be a non-empty string", param)
    key = "pattern" if kind == "regex" else "grammar"
    return {"type": kind, key: value, "param": param}


def _json_format(schema: Any, param: str) -> dict:
    """The one normalised form both APIs' JSON formats become: {"type": "json_object"} or
    {"type": "json_schema", "schema": {...}} (a missing schema means any JSON object)."""
    if schema is None:
        return {"type": "json_object"}
    if not isinstance(schema, (dict, bool)):
        raise bad_request(f"'{param}' schema must be a JSON Schema object", param)
    return {"type": "json_schema", "schema": schema}


def _thinking_switch(body: dict) -> bool | None:
    """OpenAI-side switches used by local servers: chat_template_kwargs.enable_thinking / thinking."""
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict):
        for key in ("enable_thinking", "thinking"):
            if isinstance(kwargs.get(key), bool):
                return kwargs[key]
    return None


# ---- Anthropic Messages -> OpenAI form ---------------------------------------------------------

# What a text-only model is told in place of a picture or a file a tool returned: an agent's
# tool (Claude Code's Read on a screenshot, say) must not fail the whole loop with a 400.
_OMITTED_BLOCK = "[{kind} omitted: this model reads text only]"


def _text_of_blocks(content: Any, where: str, placeholders: bool = False) -> str:
    """The text of a string or a list of text blocks.  With `placeholders` (tool results),
    image and document blocks become a short note instead of an error."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    _expect(content, list, where)
    parts = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(_expect(block.get("text", ""), str, where))
        elif placeholders and kind in ("image", "document"):
            parts.append(_OMITTED_BLOCK.format(kind=kind))
        else:
            raise bad_request(f"{where}: only text blocks are supported here", where)
    return "".join(parts)


def anthropic_messages_to_openai(body: dict) -> list[dict]:
    out: list[dict] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": _text_of_blocks(system, "system")})
    messages = _expect(body.get("messages"), list, "messages")
    if not messages:
        raise bad_request("'messages' must not be empty", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad_request(f"messages[{i}].role must be 'user' or 'assistant'", "messages")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        _expect(content, list, f"messages[{i}].content")
        if m["role"] == "user":
            text: list[str] = []
            for block in content:
                kind = block.get("type") if isinstance(block, dict) else None
                if kind == "text":
                    text.append(_expect(block.get("text", ""), str, "messages"))
                elif kind == "tool_result":
                    result = block.get("content", "")
                    body_text = _text_of_blocks(result, f"messages[{i}].content.tool_result", placeholders=True)
                    if block.get("is_error"):
                        body_text = f"Error: {body_text}"
                    out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                                "content": body_text})
                else:
                    raise bad_request(f"messages[{i}]: content block type '{kind}' is not supported", "messages")
            if text:
                out.append({"role": "user", "content": "".join(text)})
        else:
            msg: dict = {"role": "assistant", "content": None}
            texts, reasoning, calls = [], [], []
            for block in content:
                kind = block.get("type") if isinstance(block, dict) else None
                if kind == "text":
                    texts.append(_expect(block.get("text", ""), str, "messages"))
                elif kind == "thinking":
                    reasoning.append(_expect(block.get("thinking", ""), str, "messages"))
                elif kind == "redacted_thinking":
                    continue
                elif kind == "tool_use":
                    name = _expect(block.get("name"), str, "messages")
                    calls.append({"id": str(block.get("id", "")), "type": "function",
                                  "function": {"name": name,
                                               "arguments": json.dumps(block.get("input") or {},
                                                                       ensure_ascii=False)}})
                else:
                    raise bad_request(f"messages[{i}]: content block type '{kind}' is not supported", "messages")
            if texts:
                msg["content"] = "".join(texts)
            if reasoning:
                msg["reasoning_content"] = "".join(reasoning)
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def parse_anthropic(body: Any) -> ChatSpec:
    _expect(body, dict, "body")
    spec = ChatSpec(messages=anthropic_messages_to_openai(body), model=str(body.get("model") or ""))
    tools = []
    for i, tool in enumerate(_expect([] if body.get("tools") is None else body["tools"], list, "tools")):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise bad_request(f"tools[{i}].name is required", "tools")
        if tool.get("type") not in (None, "custom"):
            continue  # a server tool (web_search_..., code_execution_...): nothing here runs it
        tools.append({"type": "function", "function": {
            "name": tool["name"], "description": tool.get("description", ""),
            "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}})
    spec.tools = _check_tools(tools)
    choice = body.get("tool_choice")
    if choice is not None:
        _expect(choice, dict, "tool_choice")
        kind = choice.get("type")
        mapped: Any = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
        if kind == "tool":
            mapped = {"type": "function", "function": {"name": choice.get("name")}}
        if mapped is None:
            raise bad_request("'tool_choice.type' must be auto, any, tool or none", "tool_choice")
        _apply_tool_choice(spec, mapped)
        spec.parallel_tool_calls = not bool(choice.get("disable_parallel_tool_use", False))
    max_tokens = body.get("max_tokens")
    _expect(max_tokens, int, "max_tokens")
    if max_tokens < 1:
        raise bad_request("'max_tokens' must be at least 1", "max_tokens")
    spec.max_tokens = max_tokens
    spec.sampling = _sampling({k: body.get(k) for k in ("temperature", "top_p", "top_k")})
    spec.stop = _stop_list(body.get("stop_sequences"), "stop_sequences")
    spec.stream = bool(body.get("stream", False))
    spec.ignore_eos = bool(body.get("ignore_eos", False))
    thinking = body.get("thinking")
    if thinking is not None:
        _expect(thinking, dict, "thinking")
        kind = thinking.get("type")
        if kind not in ("enabled", "adaptive", "disabled"):
            raise bad_request("'thinking.type' must be enabled, adaptive or disabled", "thinking")
        spec.thinking = kind != "disabled"
        spec.omit_thinking = thinking.get("display") == "omitted"
    config = body.get("output_config")
    if isinstance(config, dict):
        if isinstance(config.get("effort"), str):
            spec.reasoning_effort = config["effort"]
        fmt = config.get("format")
        if fmt is not None:
            _expect(fmt, dict, "output_config.format")
            if fmt.get("type") == "json_schema":
                if fmt.get("schema") is None:
                    raise bad_request("'output_config.format' json_schema needs a 'schema'", "output_config.format")
                spec.response_format = _json_format(fmt.get("schema"), "output_config.format")
            elif fmt.get("type") == "json_object":
                spec.response_format = _json_format(None, "output_config.format")
            elif fmt.get("type") != "text":
                raise bad_request("'output_config.format.type' must be json_schema", "output_config.format")
    return spec


# ---- OpenAI Responses -> OpenAI chat form ------------------------------------------------------
#
# Stateless only: the whole conversation comes in `input`; nothing is stored, so
# previous_response_id / conversation / item references are refused with a 400 that says so.
# Codex CLI sends hosted tools (web_search, local_shell, custom, image_generation ...) next to its
# function tools; those are left out of what the model sees rather than failing the request.

_RESPONSES_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text", "refusal")
# Items a stateless translation can pass over: records of hosted tools the model cannot call here.
_RESPONSES_SKIPPED_ITEMS = ("web_search_call", "file_search_call", "image_generation_call", "computer_call",
                            "computer_call_output", "code_interpreter_call", "mcp_list_tools",
                            "mcp_approval_request", "mcp_approval_response", "tool_search_call",
                            "tool_search_output", "additional_tools", "compaction", "compaction_trigger")
_RESPONSES_UNSUPPORTED = {"previous_response_id": "previous_response_id needs stored responses; this server is "
                                                  "stateless: send the whole conversation in 'input'",
                          "conversation": "conversations need stored state; this server is stateless: send "
                                          "the whole conversation in 'input'",
                          "prompt": "stored prompt templates are not supported; send 'instructions' and 'input'"}


def _responses_text(content: Any, where: str) -> str:
    """The text of a Responses content value: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    _expect(content, list, where)
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _RESPONSES_TEXT_PARTS:
            raise bad_request(f"{where}: content part type '{kind}' is not supported (text only)", "input")
        texts.append(_expect(part.get("text", part.get("refusal", "")), str, where))
    return "".join(texts)


def responses_function_tools(tools: Any) -> tuple[list[dict], dict[str, str]]:
    """Responses tools -> chat tools, plus {function name: namespace} for namespaced functions.
    Hosted and custom tools are dropped (nothing here can run them)."""
    _expect(tools, list, "tools")
    out: list[dict] = []
    namespaces: dict[str, str] = {}

    def add(tool: dict, where: str, namespace: str | None) -> None:
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"{where}.name is required for function tools", "tools")
        params = tool.get("parameters")
        out.append({"type": "function", "function": {
            "name": name, "description": tool.get("description") or "",
            "parameters": {"type": "object", "properties": {}} if params is None else params}})
        if namespace is not None:
            namespaces[name] = namespace

    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad_request(f"tools[{i}] must be an object", "tools")
        kind = tool.get("type")
        if kind == "function":
            add(tool, f"tools[{i}]", None)
        elif kind == "namespace":
            for j, inner in enumerate(_expect(tool.get("tools") or [], list, "tools")):
                if isinstance(inner, dict) and inner.get("type") == "function":
                    add(inner, f"tools[{i}].tools[{j}]", str(tool.get("name") or ""))
        elif not isinstance(kind, str):
            raise bad_request(f"tools[{i}].type is required", "tools")
    return _check_tools(out), namespaces


def _responses_items_to_chat(items: list, messages: list[dict]) -> None:
    """Appends chat messages for Responses input items.  An assistant turn arrives as several
    items (reasoning, message, function_call ...) that become one assistant message."""

    def open_assistant(*, for_calls: bool) -> dict:
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and (for_calls or not last.get("tool_calls")) \
                and (for_calls or last.get("content") is None):
            return last
        msg: dict = {"role": "assistant", "content": None}
        messages.append(msg)
        return msg

    def add_call(call_id: Any, name: Any, arguments: str, where: str) -> None:
        if not isinstance(call_id, str) or not call_id:
            raise bad_request(f"{where}.call_id is required", "input")
        if not isinstance(name, str) or not name:
            raise bad_request(f"{where}.name is required", "input")
        msg = open_assistant(for_calls=True)
        msg.setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})

    def add_output(call_id: Any, output: Any, where: str) -> None:
        if not isinstance(call_id, str) or not call_id:
            raise bad_request(f"{where}.call_id is required", "input")
        if isinstance(output, str):
            text = output
        elif isinstance(output, list) and all(isinstance(p, dict) and "type" in p for p in output):
            # content parts (an image among them is refused by name); shell outputs have no "type"
            text = _responses_text(output, f"{where}.output")
        else:
            text = json.dumps(output, ensure_ascii=False)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text})

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", "input")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{where}.role must be user, system, developer or assistant", "input")
            text = _responses_text(item.get("content"), f"{where}.content")
            if role == "assistant":
                msg = open_assistant(for_calls=False)
                msg["content"] = text
            else:
                messages.append({"role": role, "content": text})
        elif kind == "function_call":
            args = item.get("arguments", "")
            args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            add_call(item.get("call_id"), item.get("name"), args or "{}", where)
        elif kind == "function_call_output":
            add_output(item.get("call_id"), item.get("output", ""), where)
        elif kind == "custom_tool_call":
            add_call(item.get("call_id"), item.get("name"),
                     json.dumps({"input": str(item.get("input", ""))}, ensure_ascii=False), where)
        elif kind == "custom_tool_call_output":
            add_output(item.get("call_id"), item.get("output", ""), where)
        elif kind == "local_shell_call":
            add_call(item.get("call_id") or item.get("id"), "local_shell",
                     json.dumps(item.get("action") or {}, ensure_ascii=False), where)
        elif kind == "local_shell_call_output":
            add_output(item.get("call_id") or item.get("id"), item.get("output", ""), where)
        elif kind in ("shell_call", "apply_patch_call"):  # OpenAI's built-in shell / patch tools
            add_call(item.get("call_id"), kind.removesuffix("_call"),
                     json.dumps(item.get("action") or item.get("operation") or {}, ensure_ascii=False), where)
        elif kind in ("shell_call_output", "apply_patch_call_output"):
            add_output(item.get("call_id"), item.get("output", ""), where)
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            text = _responses_text(parts, f"{where}.content")
            if text:  # encrypted_content alone means nothing to this model
                msg = open_assistant(for_calls=False)
                msg["reasoning_content"] = (msg.get("reasoning_content") or "") + text
        elif kind == "item_reference":
            raise bad_request(f"{where}: item_reference needs stored items; this server is stateless: "
                              "send the item itself", "input")
        elif kind in _RESPONSES_SKIPPED_ITEMS:
            continue
        else:
            raise bad_request(f"{where}: input item type '{kind}' is not supported", "input")


def _responses_tool_choice(spec: ChatSpec, choice: Any) -> None:
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "function":
            choice = {"type": "function", "function": {"name": choice.get("name")}}
        elif kind == "allowed_tools":
            allowed = {t.get("name") for t in _expect(choice.get("tools") or [], list, "tool_choice")
                       if isinstance(t, dict) and t.get("type") == "function"}
            spec.tools = [t for t in spec.tools if t["function"]["name"] in allowed]
            choice = {"auto": "auto", "required": "required"}.get(choice.get("mode", "auto"))
            if choice is None:
                raise bad_request("'tool_choice.mode' must be auto or required", "tool_choice")
            if not spec.tools:
                choice = "none"
        else:
            raise bad_request(f"tool_choice type '{kind}' is not supported: only function tools run here",
                              "tool_choice")
    _apply_tool_choice(spec, choice)


def parse_responses(body: Any) -> ChatSpec:
    """An OpenAI Responses request (POST /v1/responses) as a ChatSpec."""
    _expect(body, dict, "body")
    for key, why in _RESPONSES_UNSUPPORTED.items():
        if body.get(key) is not None:
            raise bad_request(why, key)
    if body.get("background"):
        raise bad_request("background responses need stored state; this server is stateless", "background")
    messages: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        text = _responses_text(instructions, "instructions") if isinstance(instructions, (str, list)) \
            else _expect(instructions, str, "instructions")
        if text:
            messages.append({"role": "system", "content": text})
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        messages.append({"role": "user", "content": raw_input})
    elif isinstance(raw_input, list):
        if len(raw_input) > MAX_MESSAGES:
            raise bad_request(f"'input' may hold at most {MAX_MESSAGES} items", "input")
        _responses_items_to_chat(raw_input, messages)
    else:
        raise bad_request("'input' must be a string or a list of input items", "input")
    if not any(m["role"] != "system" for m in messages):
        raise bad_request("'input' holds nothing for the model to answer", "input")
    spec = ChatSpec(messages=_check_messages(messages), model=str(body.get("model") or ""))
    spec.tools, _ = responses_function_tools([] if body.get("tools") is None else body["tools"])
    _responses_tool_choice(spec, body.get("tool_choice"))
    spec.parallel_tool_calls = body.get("parallel_tool_calls") is not False
    spec.sampling = _sampling({k: body.get(k) for k in ("temperature", "top_p", "seed", "top_k", "min_p")})
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None:
        _expect(max_tokens, int, "max_output_tokens")
        if max_tokens < 1:
            raise bad_request("'max_output_tokens' must be at least 1", "max_output_tokens")
    spec.max_tokens = max_tokens
    spec.stream = bool(body.get("stream", False))
    spec.ignore_eos = bool(body.get("ignore_eos", False))
    reasoning = body.get("reasoning")
    if reasoning is not None:
        _expect(reasoning, dict, "reasoning")
        effort = reasoning.get("effort")
        if effort is not None:
            spec.reasoning_effort = _expect(effort, str, "reasoning.effort")
    spec.thinking = _thinking_switch(body)
    text_config = body.get("text")
    fmt = _expect(text_config, dict, "text").get("format") if text_config is not None else None
    if fmt is not None:
        _expect(fmt, dict, "text.format")
        kind = fmt.get("type")
        if kind == "json_schema":
            if fmt.get("schema") is None:
                raise bad_request("'text.format' of type json_schema needs a 'schema'", "text.format")
            spec.response_format = _json_format(fmt["schema"], "text.format")
        elif kind == "json_object":
            spec.response_format = _json_format(None, "text.format")
        elif kind != "text":
            raise bad_request("'text.format.type' must be text, json_object or json_schema", "text.format")
    return spec


def parse_json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
