"""OpenAI Responses API wire shapes (POST /v1/responses), as plain dicts.

The pipeline speaks OpenAI chat deltas ({"reasoning_content"}, {"content"}, {"tool_calls"});
this module turns them into Responses output items and stream events:

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

import time
import uuid
from typing import Any

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
