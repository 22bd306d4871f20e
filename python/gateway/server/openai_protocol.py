"""The OpenAI API's protocol: request bodies into specs, and the exact wire payloads.

Parsing: /v1/chat/completions bodies become a `ChatSpec` (spec.py); /v1/completions bodies a
`CompletionSpec`.  Other servers' constraint parameters (vLLM's guided_* and structured_outputs,
llama.cpp's grammar / json_schema) are normalised here into the response_format form.

Writing: chunks follow docs/reference/gateway-wire.md §2.1: every chunk carries `object`, the
same `id`, `created`, `model` and `choices[].index`; a tool call's id/type/name come once, in
its first fragment.  The builders are plain dicts (no I/O), so tests feed them to the SDKs' own
stream accumulators; `ChatStream` and `CompletionStream` are what serving.stream writes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..generate import GenerationResult, TextEvent
from ..sampling import SamplingParams
from .errors import ApiError, bad_request
from .pipeline import Delta, Finish, Usage
from .serving import Frame, StreamWriter
from .spec import (
    ChatSpec,
    apply_tool_choice,
    check_messages,
    check_tools,
    choices_count,
    expect,
    int_field,
    json_format,
    positive_int,
    sampling_params,
    stop_list,
    thinking_switch,
)

# --------------------------------------------------------------------------- chat completions: parse

def parse_openai_chat(body: Any) -> ChatSpec:
    expect(body, dict, "body")
    spec = ChatSpec(messages=check_messages(body.get("messages")), model=str(body.get("model") or ""))
    spec.tools = check_tools(expect([] if body.get("tools") is None else body["tools"], list, "tools"))
    apply_tool_choice(spec, body.get("tool_choice"))
    spec.parallel_tool_calls = body.get("parallel_tool_calls") is not False  # null means the default
    spec.sampling = sampling_params(body)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    spec.max_tokens = positive_int(body, key, "max_tokens")
    spec.stop = stop_list(body.get("stop"), "stop")
    spec.stream = bool(body.get("stream", False))
    spec.ignore_eos = bool(body.get("ignore_eos", False))
    opts = body.get("stream_options")
    opts = {} if opts is None else expect(opts, dict, "stream_options")
    spec.include_usage = bool(opts.get("include_usage", False))
    spec.n = choices_count(body)
    effort = body.get("reasoning_effort")
    if effort is not None:
        spec.reasoning_effort = expect(effort, str, "reasoning_effort")
    spec.thinking = thinking_switch(body)
    fmt = body.get("response_format")
    if fmt is not None:
        expect(fmt, dict, "response_format")
        if fmt.get("type") not in ("text", "json_object", "json_schema"):
            raise bad_request("'response_format.type' must be text, json_object or json_schema", "response_format")
        if fmt.get("type") == "json_schema":
            inner = fmt.get("json_schema")
            if not isinstance(inner, dict):
                raise bad_request("'response_format.json_schema' must be an object with a 'schema'",
                                  "response_format")
            spec.response_format = json_format(inner.get("schema"), "response_format")
        else:
            spec.response_format = json_format(None, "response_format") if fmt["type"] == "json_object" else None
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
        expect(outputs, dict, "structured_outputs")
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
        return dict(json_format(value, param), param=param)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request(f"'{param}' must be a non-empty list of non-empty strings", param)
        return {"type": "choice", "choices": value, "param": param}
    if not isinstance(value, str) or not value.strip():
        raise bad_request(f"'{param}' must be a non-empty string", param)
    key = "pattern" if kind == "regex" else "grammar"
    return {"type": kind, key: value, "param": param}


# --------------------------------------------------------------------------- completions: parse

@dataclass
class CompletionSpec:
    """A /v1/completions request: the prompt is raw text or token ids, no chat template."""

    prompt: str | list[int]
    max_tokens: int = 16
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    response_format: dict | None = None  # an extension constraint (extension_format)
    n: int = 1
    echo: bool = False
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    model: str = ""


def parse_completion(body: Any) -> CompletionSpec:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) and not (
            isinstance(prompt, list) and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
        raise bad_request("'prompt' must be a string or a list of token ids", "prompt")
    spec = CompletionSpec(prompt=prompt if isinstance(prompt, str) else list(prompt))
    spec.n = choices_count(body)
    max_tokens = int_field(body, "max_tokens", 16)
    if max_tokens is None or max_tokens < 1:
        raise bad_request("'max_tokens' must be at least 1", "max_tokens")
    spec.max_tokens = max_tokens
    spec.sampling = sampling_params({k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")})
    logprobs_n = body.get("logprobs")
    if isinstance(logprobs_n, int) and not isinstance(logprobs_n, bool) and logprobs_n > 0:
        spec.sampling.logprobs, spec.sampling.top_logprobs = True, min(logprobs_n, 20)
    spec.stop = stop_list(body.get("stop"), "stop")
    spec.response_format = extension_format(body)
    spec.echo = bool(body.get("echo"))
    spec.stream = bool(body.get("stream"))
    opts = body.get("stream_options") or {}
    spec.include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    spec.ignore_eos = bool(body.get("ignore_eos", False))
    spec.model = str(body.get("model") or "")
    return spec


# --------------------------------------------------------------------------- write

def openai_usage(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


class OpenAIChunks:
    """Builds `chat.completion.chunk` objects for one response."""

    def __init__(self, ident: str, created: int, model: str, mirror_reasoning: bool = False) -> None:
        self.ident, self.created, self.model = ident, created, model
        self.mirror_reasoning = mirror_reasoning
        self.index = 0  # the choice being streamed (n > 1 streams the choices one after another)

    def _base(self, choices: list[dict]) -> dict:
        return {"id": self.ident, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": choices}

    def role(self) -> dict:
        return self.delta({"role": "assistant", "content": None})

    def delta(self, delta: dict, logprobs: list[dict] | None = None) -> dict:
        if self.mirror_reasoning and "reasoning_content" in delta:
            delta = dict(delta, reasoning=delta["reasoning_content"])
        return self._base([{"index": self.index, "delta": delta,
                            "logprobs": {"content": logprobs} if logprobs else None, "finish_reason": None}])

    def finish(self, finish_reason: str) -> dict:
        return self._base([{"index": self.index, "delta": {}, "logprobs": None, "finish_reason": finish_reason}])

    def usage(self, usage: dict) -> dict:
        return dict(self._base([]), usage=usage)


def openai_message(message: dict, mirror_reasoning: bool = False) -> dict:
    """The non-streaming `choices[0].message` from the parser's final message."""
    out = {"role": "assistant", "content": message.get("content")}
    if message.get("reasoning_content") is not None:
        out["reasoning_content"] = message["reasoning_content"]
        if mirror_reasoning:
            out["reasoning"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


def chat_completion(ident: str, created: int, model: str, choices: list[dict], usage: Usage) -> dict:
    return {"id": ident, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": openai_usage(usage)}


def chat_choice(index: int, finish: Finish, logprobs: list[dict] | None, mirror_reasoning: bool) -> dict:
    """One non-streaming choice; `logprobs` None when the request asked for none."""
    return {"index": index, "message": openai_message(finish.message, mirror_reasoning),
            "finish_reason": finish.finish_reason,
            "logprobs": {"content": logprobs} if logprobs is not None else None}


def error_frames(exc: ApiError) -> list[Frame]:
    """The status line is gone: the error travels in the stream (docs/reference/gateway-wire.md §2.3)."""
    return [(None, exc.openai_body())]


class ChatStream(StreamWriter):
    """A chat.completion.chunk stream: per choice a role chunk, the deltas and a finish chunk;
    the usage chunk when asked for; `[DONE]`."""

    def __init__(self, chunks: OpenAIChunks, include_usage: bool) -> None:
        self.chunks, self.include_usage = chunks, include_usage
        self.usage = Usage()

    def choice(self, index: int) -> list[Frame]:
        self.chunks.index = index
        return [(None, self.chunks.role())]

    def item(self, item: object) -> list[Frame]:
        if isinstance(item, Delta):
            return [(None, self.chunks.delta(item.delta, item.logprobs))] if item.delta or item.logprobs else []
        if isinstance(item, Finish):
            self.usage = self.usage.add_choice(item.usage, self.chunks.index)
            return [(None, self.chunks.finish(item.finish_reason))]
        return []

    def end(self) -> list[Frame]:
        return [(None, self.chunks.usage(openai_usage(self.usage)))] if self.include_usage else []

    error = staticmethod(error_frames)

    def done(self) -> list[Frame]:
        return [(None, "[DONE]")]


# --------------------------------------------------------------------------- completions: write

def completion_logprobs(tokenizer: Any, events: list[TextEvent] | None) -> dict:
    """Legacy completions logprobs: parallel lists per sampled token."""
    tokens, lps, tops, offsets = [], [], [], []
    offset = 0
    for ev in events or []:
        tok = ev.token
        if tok is None or tok.logprob is None:
            continue
        text = tokenizer.decode([tok.token_id])
        tokens.append(text)
        lps.append(tok.logprob)
        tops.append({tokenizer.decode([t]): lp for t, lp in tok.top} if tok.top else None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def completion_finish(result: GenerationResult) -> str:
    return "length" if result.finish_reason == "length" else "stop"


class Completions:
    """`text_completion` objects of one response (streamed chunks and the whole reply alike)."""

    def __init__(self, ident: str, created: int, model: str, tokenizer: Any, want_logprobs: bool) -> None:
        self.base = {"id": ident, "object": "text_completion", "created": created, "model": model}
        self.tokenizer, self.want_logprobs = tokenizer, want_logprobs

    def choice(self, index: int, text: str, finish: str | None, events: list[TextEvent] | None = None) -> dict:
        return {"index": index, "text": text,
                "logprobs": completion_logprobs(self.tokenizer, events) if self.want_logprobs else None,
                "finish_reason": finish}

    def chunk(self, choices: list[dict], **extra: Any) -> dict:
        return dict(self.base, choices=choices, **extra)


class CompletionStream(StreamWriter):
    """A text_completion stream: per choice the echo, each piece of text, a finish chunk; the
    usage chunk when asked for; `[DONE]`."""

    def __init__(self, out: Completions, echo_text: str, include_usage: bool) -> None:
        self.out, self.echo_text, self.include_usage = out, echo_text, include_usage
        self.index = 0
        self.usage = Usage()

    def choice(self, index: int) -> list[Frame]:
        self.index = index
        return [(None, self.out.chunk([self.out.choice(index, self.echo_text, None, [])]))] if self.echo_text else []

    def item(self, item: object) -> list[Frame]:
        if isinstance(item, TextEvent) and (item.text or self.out.want_logprobs):
            return [(None, self.out.chunk([self.out.choice(self.index, item.text, None, [item])]))]
        if isinstance(item, GenerationResult):
            self.usage = self.usage.add_choice(Usage.of(item), self.index)
            return [(None, self.out.chunk([self.out.choice(self.index, "", completion_finish(item), [])]))]
        return []

    def end(self) -> list[Frame]:
        return [(None, self.out.chunk([], usage=openai_usage(self.usage)))] if self.include_usage else []

    error = staticmethod(error_frames)

    def done(self) -> list[Frame]:
        return [(None, "[DONE]")]


# --------------------------------------------------------------------------- models

def model_card(model_id: str, created: float, max_ctx: int) -> dict:
    return {"id": model_id, "object": "model", "created": int(created), "owned_by": "moegate",
            "max_model_len": max_ctx}
