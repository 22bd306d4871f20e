"""The OpenAI Responses API's protocol (POST /v1/responses): request bodies into a ChatSpec,
and the exact wire payloads.

Parsing is stateless only: the whole conversation comes in `input`; nothing is stored, so
previous_response_id / conversation / item references are refused with a 400 that says so.
Codex CLI sends hosted tools (web_search, local_shell, custom, image_generation ...) next to its
function tools; those are left out of what the model sees rather than failing the request.

Writing: the pipeline speaks OpenAI chat deltas ({"reasoning_content"}, {"content"},
{"tool_calls"}); this module turns them into Responses output items and stream events:

* output items, in the order the model wrote them: a `reasoning` item (its text in
  `content[{type: reasoning_text}]`), a `message` item (one `output_text` part), and one
  `function_call` item per call (`call_id` is what the client echoes back in
  `function_call_output`);
* a stream is `response.created`, `response.in_progress`, then per item
  `output_item.added` ... (`content_part.added`, text deltas, `.done` events) ...
  `output_item.done`, and one terminal event: `response.completed`, `response.incomplete`
  (max_output_tokens hit) or `response.failed`.  Every event carries `type` and a
  `sequence_number` counting from 0; there is no `[DONE]` sentinel.

The openai SDK's `responses.stream()` accumulator checks that item identities (ids, call ids)
agree between `added`, `done` and the final response, so the final response's `output` is
built from the very items the stream closed.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

from .errors import ApiError, bad_request
from .pipeline import Delta, Finish, Usage
from .serving import Frame, StreamWriter
from .spec import (
    JSON_SCHEMA_FORMAT_FIELDS,
    MAX_MESSAGES,
    ChatSpec,
    Kind,
    apply_tool_choice,
    check_fields,
    check_messages,
    check_tools,
    expect,
    field_of,
    json_format,
    no_schema_member,
    positive_int,
    sampling_params,
    thinking_switch,
)

# --------------------------------------------------------------------------- parse

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
    expect(content, list, where)
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _RESPONSES_TEXT_PARTS:
            raise bad_request(f"{where}: content part type '{kind}' is not supported (text only)", "input")
        texts.append(expect(part.get("text", part.get("refusal", "")), str, where))
    return "".join(texts)


# Members of a Responses tool the OpenAPI document types, whatever the tool's type (a JSON Schema
# is an object or a boolean).
_TOOL_FIELDS: dict[str, Kind] = {"name": str, "description": str, "parameters": (dict, bool)}


def responses_function_tools(tools: Any) -> tuple[list[dict], dict[str, str]]:
    """Responses tools -> chat tools, plus {function name: namespace} for namespaced functions.
    Hosted and custom tools are dropped (nothing here can run them)."""
    expect(tools, list, "tools")
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
        # Typed on every tool, dropped ones too: the document types these members for all.
        check_fields(tool, _TOOL_FIELDS, f"tools[{i}].")
        kind = tool.get("type")
        if kind == "function":
            add(tool, f"tools[{i}]", None)
        elif kind == "namespace":
            for j, inner in enumerate(expect(tool.get("tools") or [], list, "tools")):
                if isinstance(inner, dict) and inner.get("type") == "function":
                    add(inner, f"tools[{i}].tools[{j}]", str(tool.get("name") or ""))
        elif not isinstance(kind, str):
            raise bad_request(f"tools[{i}].type is required", "tools")
    return check_tools(out), namespaces


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
            allowed = {t.get("name") for t in expect(choice.get("tools") or [], list, "tool_choice")
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
    apply_tool_choice(spec, choice)


# Fields accepted without acting on them (or only echoed back): type-checked all the same.
RESPONSES_UNUSED_FIELDS: dict[str, Kind] = {
    "user": str, "metadata": dict, "store": bool, "truncation": str, "include": list, "service_tier": str,
    "prompt_cache_key": str, "safety_identifier": str, "max_tool_calls": int, "top_logprobs": int}


def parse_responses(body: Any) -> ChatSpec:
    """An OpenAI Responses request (POST /v1/responses) as a ChatSpec."""
    expect(body, dict, "body")
    for key, why in _RESPONSES_UNSUPPORTED.items():
        if body.get(key) is not None:
            raise bad_request(why, key)
    check_fields(body, RESPONSES_UNUSED_FIELDS)
    if field_of(body, "background", bool, False):
        raise bad_request("background responses need stored state; this server is stateless", "background")
    messages: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        text = _responses_text(instructions, "instructions") if isinstance(instructions, (str, list)) \
            else expect(instructions, str, "instructions")
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
    spec = ChatSpec(messages=check_messages(messages), model=field_of(body, "model", str, ""),
                    max_tokens_param="max_output_tokens")
    spec.tools, spec.tool_namespaces = responses_function_tools(field_of(body, "tools", list, []))
    _responses_tool_choice(spec, body.get("tool_choice"))
    spec.parallel_tool_calls = field_of(body, "parallel_tool_calls", bool, True)
    spec.sampling = sampling_params({k: body.get(k) for k in ("temperature", "top_p", "seed", "top_k", "min_p")})
    spec.max_tokens = positive_int(body, "max_output_tokens")
    spec.stream = field_of(body, "stream", bool, False)
    spec.ignore_eos = field_of(body, "ignore_eos", bool, False)
    reasoning = body.get("reasoning")
    if reasoning is not None:
        expect(reasoning, dict, "reasoning")
        spec.reasoning_effort = field_of(reasoning, "effort", str, param="reasoning.effort")
        field_of(reasoning, "summary", str, param="reasoning.summary")
    spec.thinking = thinking_switch(body)
    text_config = body.get("text")
    fmt = expect(text_config, dict, "text").get("format") if text_config is not None else None
    if fmt is not None:
        expect(fmt, dict, "text.format")
        kind = fmt.get("type")
        if kind == "json_schema":
            if fmt.get("schema") is None:
                raise bad_request("'text.format' of type json_schema needs a 'schema'", "text.format")
            check_fields(fmt, JSON_SCHEMA_FORMAT_FIELDS, "text.format.")
            spec.response_format = json_format(fmt["schema"], "text.format")
        elif kind in ("text", "json_object"):
            no_schema_member(fmt, "schema", "text.format")
            if kind == "json_object":
                spec.response_format = json_format(None, "text.format")
        else:
            raise bad_request("'text.format.type' must be text, json_object or json_schema", "text.format")
    return spec


# --------------------------------------------------------------------------- write

Event = tuple[str, dict]  # (SSE event name, data); the name equals data["type"]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _call_item_id(call_id: str) -> str:
    # The parser's call ids are "call_<hex>"; the item id reuses the hex so the two read as a pair.
    return "fc_" + call_id.removeprefix("call_")


def responses_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int,
                    reasoning_tokens: int) -> dict:
    # cache_write_tokens: the SDK's type requires it; the prefix cache has no separate write cost.
    return {"input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, completion_tokens)},
            "total_tokens": prompt_tokens + completion_tokens}


class ResponseObject:
    """The `response` object of one request: request settings echoed back, plus the state."""

    def __init__(self, ident: str, model: str, body: dict, *, temperature: float, top_p: float,
                 tool_choice_echo: Any = None) -> None:
        self.ident = ident
        self.model = model
        self.created_at = int(time.time())
        text = body.get("text") if isinstance(body.get("text"), dict) else {}
        reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
        self.echo = {
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "previous_response_id": None,
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "store": False,  # stateless: nothing is kept, whatever the request asked
            "temperature": temperature,
            "text": {"format": text.get("format") or {"type": "text"}},
            "tool_choice": tool_choice_echo if tool_choice_echo is not None else body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [],
            "top_p": top_p,
            "truncation": "disabled",
            "user": body.get("user"),
        }

    def snapshot(self, status: str, output: list[dict], *, usage: dict | None = None,
                 incomplete_reason: str | None = None, error: dict | None = None) -> dict:
        out = {"id": self.ident, "object": "response", "created_at": self.created_at, "status": status,
               "background": False, "error": error,
               "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
               "model": self.model, "output": output, "usage": usage, **self.echo}
        if status in ("completed", "incomplete", "failed"):
            out["completed_at"] = int(time.time())
        return out


def status_of(finish_reason: str) -> tuple[str, str | None]:
    """(response status, incomplete_details.reason) for a pipeline finish reason."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None


def _reasoning_item(ident: str, text: str, status: str) -> dict:
    return {"type": "reasoning", "id": ident, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text else []}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(ident: str, text: str | None, status: str) -> dict:
    return {"type": "message", "id": ident, "status": status, "role": "assistant",
            "content": [] if text is None else [_text_part(text)]}


def _call_item(call_id: str, name: str, arguments: str, status: str, namespaces: dict[str, str]) -> dict:
    item = {"type": "function_call", "id": _call_item_id(call_id), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}
    if name in namespaces:
        item["namespace"] = namespaces[name]
    return item


def output_items(message: dict, status: str, namespaces: dict[str, str] | None = None) -> list[dict]:
    """Non-streaming `output` from the parser's final message.  `status` is the last item's
    (incomplete when max_output_tokens cut it); earlier items are complete."""
    items: list[dict] = []
    if message.get("reasoning_content"):
        items.append(_reasoning_item(_new_id("rs"), message["reasoning_content"], "completed"))
    if message.get("content"):
        items.append(_message_item(_new_id("msg"), message["content"], "completed"))
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        items.append(_call_item(call["id"], fn["name"], fn.get("arguments") or "", "completed", namespaces or {}))
    if items:
        items[-1]["status"] = status
    return items


class ResponseEvents:
    """Maps OpenAI chat deltas of one response onto Responses stream events."""

    def __init__(self, response: ResponseObject, namespaces: dict[str, str] | None = None) -> None:
        self.response = response
        self.namespaces = namespaces or {}
        self.sequence = 0
        self.output: list[dict] = []   # closed items, in output_index order
        self.kind: str | None = None   # reasoning | message | function_call (the open item)
        self.item: dict | None = None
        self.text = ""                 # the open item's text / arguments so far
        self.call_index: int | None = None

    def _event(self, kind: str, **fields: Any) -> Event:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return (kind, data)

    @property
    def _index(self) -> int:
        return len(self.output)

    def start(self) -> list[Event]:
        return [self._event("response.created", response=self.response.snapshot("in_progress", [])),
                self._event("response.in_progress", response=self.response.snapshot("in_progress", []))]

    def _open(self, kind: str, item: dict) -> list[Event]:
        events = self.close("completed")
        self.kind, self.item, self.text = kind, item, ""
        events.append(self._event("response.output_item.added", output_index=self._index, item=item))
        if kind == "reasoning":
            events.append(self._event("response.content_part.added", item_id=item["id"], output_index=self._index,
                                      content_index=0, part={"type": "reasoning_text", "text": ""}))
        elif kind == "message":
            events.append(self._event("response.content_part.added", item_id=item["id"], output_index=self._index,
                                      content_index=0, part=_text_part("")))
        return events

    def close(self, status: str) -> list[Event]:
        """Ends the open item (if any) with `status`: completed, or incomplete when cut."""
        if self.item is None:
            return []
        item_id, index, text = self.item["id"], self._index, self.text
        events: list[Event] = []
        if self.kind == "reasoning":
            events.append(self._event("response.reasoning_text.done", item_id=item_id, output_index=index,
                                      content_index=0, text=text))
            events.append(self._event("response.content_part.done", item_id=item_id, output_index=index,
                                      content_index=0, part={"type": "reasoning_text", "text": text}))
            done = _reasoning_item(item_id, text, status)
        elif self.kind == "message":
            events.append(self._event("response.output_text.done", item_id=item_id, output_index=index,
                                      content_index=0, text=text, logprobs=[]))
            events.append(self._event("response.content_part.done", item_id=item_id, output_index=index,
                                      content_index=0, part=_text_part(text)))
            done = _message_item(item_id, text, status)
        else:
            events.append(self._event("response.function_call_arguments.done", item_id=item_id,
                                      output_index=index, name=self.item["name"], arguments=text))
            done = dict(self.item, arguments=text, status=status)
        events.append(self._event("response.output_item.done", output_index=index, item=done))
        self.output.append(done)
        self.kind, self.item, self.text, self.call_index = None, None, "", None
        return events

    def delta(self, delta: dict) -> list[Event]:
        events: list[Event] = []
        if delta.get("reasoning_content"):
            if self.kind != "reasoning":
                events += self._open("reasoning", _reasoning_item(_new_id("rs"), "", "in_progress"))
            self.text += delta["reasoning_content"]
            events.append(self._event("response.reasoning_text.delta", item_id=self.item["id"],
                                      output_index=self._index, content_index=0, delta=delta["reasoning_content"]))
        if delta.get("content"):
            if self.kind != "message":
                events += self._open("message", _message_item(_new_id("msg"), None, "in_progress"))
            self.text += delta["content"]
            events.append(self._event("response.output_text.delta", item_id=self.item["id"],
                                      output_index=self._index, content_index=0, delta=delta["content"],
                                      logprobs=[]))
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if self.kind != "function_call" or self.call_index != call["index"]:
                call_id = call.get("id") or _new_id("call")
                events += self._open("function_call", _call_item(call_id, fn.get("name") or "", "", "in_progress",
                                                                 self.namespaces))
                self.call_index = call["index"]
            if fn.get("arguments"):
                self.text += fn["arguments"]
                events.append(self._event("response.function_call_arguments.delta", item_id=self.item["id"],
                                          output_index=self._index, delta=fn["arguments"]))
        return events

    def end(self, finish_reason: str, usage: dict) -> list[Event]:
        """Closes the open item and sends the terminal event with the whole response."""
        status, reason = status_of(finish_reason)
        events = self.close(status)
        terminal = "response.incomplete" if status == "incomplete" else "response.completed"
        events.append(self._event(terminal, response=self.response.snapshot(
            status, list(self.output), usage=usage, incomplete_reason=reason)))
        return events

    def fail(self, error: dict) -> list[Event]:
        """An error after the stream opened: an `error` event, then `response.failed`.
        `error` is an OpenAI error body's inner object (message, type, param, code)."""
        events = self.close("incomplete")
        code = error.get("code") or ("server_error" if error.get("type") == "server_error" else error.get("type"))
        events.append(self._event("error", code=code, message=error.get("message", ""), param=error.get("param")))
        events.append(self._event("response.failed", response=self.response.snapshot(
            "failed", list(self.output), error={"code": code, "message": error.get("message", "")})))
        return events


def response_usage(tokenizer: Any, usage: Usage, message: dict) -> dict:
    # The engine counts sampled tokens, not which of them were reasoning: re-tokenising the
    # reasoning text gives that share (capped at the output count in responses_usage).
    reasoning = message.get("reasoning_content") or ""
    reasoning_tokens = len(tokenizer.encode(reasoning)) if reasoning else 0
    return responses_usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, reasoning_tokens)


def response_reply(response: "ResponseObject", finish: Finish, namespaces: dict[str, str], tokenizer: Any) -> dict:
    """The non-streaming reply."""
    status, reason = status_of(finish.finish_reason)
    return response.snapshot(
        status, output_items(finish.message, "incomplete" if status == "incomplete" else "completed", namespaces),
        usage=response_usage(tokenizer, finish.usage, finish.message), incomplete_reason=reason)


class ResponsesStream(StreamWriter):
    """ResponseEvents on a stream: SSE comments while waiting, the error as `response.failed`."""

    def __init__(self, events: "ResponseEvents", tokenizer: Any) -> None:
        self.events, self.tokenizer = events, tokenizer

    def start(self) -> list[Frame]:
        return list(self.events.start())

    def item(self, item: object) -> list[Frame]:
        if isinstance(item, Delta):
            return list(self.events.delta(item.delta))
        if isinstance(item, Finish):
            return list(self.events.end(item.finish_reason, response_usage(self.tokenizer, item.usage, item.message)))
        return []

    def error(self, exc: ApiError) -> list[Frame]:
        return list(self.events.fail(exc.openai_body()["error"]))
