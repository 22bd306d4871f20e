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
    JSON_SCHEMA_FORMAT_FIELDS,
    MAX_CHOICES,
    NUMBER,
    ChatSpec,
    Kind,
    apply_tool_choice,
    check_fields,
    check_messages,
    check_tools,
    choices_count,
    expect,
    field_of,
    json_format,
    no_schema_member,
    positive_int,
    sampling_params,
    stop_list,
    thinking_switch,
)

# --------------------------------------------------------------------------- chat completions: parse

# Fields the chat route accepts without acting on them: type-checked all the same.
CHAT_UNUSED_FIELDS: dict[str, Kind] = {
    "user": str, "metadata": dict, "store": bool, "service_tier": str, "prompt_cache_key": str,
    "safety_identifier": str, "repetition_penalty": NUMBER, "modalities": list, "verbosity": str}


def parse_openai_chat(body: Any) -> ChatSpec:
    expect(body, dict, "body")
    check_fields(body, CHAT_UNUSED_FIELDS)
    spec = ChatSpec(messages=check_messages(body.get("messages")), model=field_of(body, "model", str, ""))
    spec.tools = check_tools(field_of(body, "tools", list, []))
    apply_tool_choice(spec, body.get("tool_choice"))
    spec.parallel_tool_calls = field_of(body, "parallel_tool_calls", bool, True)  # null means the default
    spec.sampling = sampling_params(body)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    spec.max_tokens = positive_int(body, key, "max_tokens")
    spec.stop = stop_list(body.get("stop"), "stop")
    spec.stream = field_of(body, "stream", bool, False)
    spec.ignore_eos = field_of(body, "ignore_eos", bool, False)
    opts = field_of(body, "stream_options", dict, {})
    spec.include_usage = field_of(opts, "include_usage", bool, False, param="stream_options.include_usage")
    spec.n = choices_count(body)
    spec.reasoning_effort = field_of(body, "reasoning_effort", str)
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
            check_fields(inner, JSON_SCHEMA_FORMAT_FIELDS, "response_format.json_schema.")
            spec.response_format = json_format(inner.get("schema"), "response_format")
        else:
            no_schema_member(fmt, "json_schema", "response_format")
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

# Legacy completions run their prompts one after another in the single slot: prompts x n is bounded.
MAX_COMPLETION_CHOICES = 2 * MAX_CHOICES

COMPLETION_UNUSED_FIELDS: dict[str, Kind] = {"user": str, "suffix": str, "best_of": int,
                                             "repetition_penalty": NUMBER}


@dataclass
class CompletionSpec:
    """A /v1/completions request: the prompts are raw text or token ids, no chat template.
    A list of prompts is served as OpenAI does: prompt i's choice j has index i * n + j."""

    prompts: list[str | list[int]]
    max_tokens: int | None = None  # None: OpenAI's default of 16, clamped to what the context holds
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    response_format: dict | None = None  # an extension constraint (extension_format)
    n: int = 1
    echo: bool = False
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    model: str = ""

    @property
    def prompt(self) -> str | list[int]:
        return self.prompts[0]


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def completion_prompts(prompt: Any) -> list[str | list[int]]:
    """OpenAI's four prompt forms: a string, token ids, a list of strings, a list of token-id lists."""
    if isinstance(prompt, str) or _is_token_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_token_ids(p) for p in prompt):
        return list(prompt)
    raise bad_request("'prompt' must be a string, a list of token ids, or a non-empty list of either", "prompt")


def parse_completion(body: Any) -> CompletionSpec:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    check_fields(body, COMPLETION_UNUSED_FIELDS)
    spec = CompletionSpec(prompts=completion_prompts(body.get("prompt")))
    spec.n = choices_count(body)
    if len(spec.prompts) * spec.n > MAX_COMPLETION_CHOICES:
        raise bad_request(f"prompts x n may be at most {MAX_COMPLETION_CHOICES}: they run one after another",
                          "prompt")
    spec.max_tokens = positive_int(body, "max_tokens")
    spec.sampling = sampling_params({k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")})
    # Legacy logprobs is a count (0..5 at OpenAI; up to 20 here), not a switch.
    logprobs_n = field_of(body, "logprobs", int, 0)
    if logprobs_n < 0:
        raise bad_request("'logprobs' must be at least 0", "logprobs")
    if logprobs_n > 0:
        spec.sampling.logprobs, spec.sampling.top_logprobs = True, min(logprobs_n, 20)
    spec.stop = stop_list(body.get("stop"), "stop")
    spec.response_format = extension_format(body)
    spec.echo = field_of(body, "echo", bool, False)
    spec.stream = field_of(body, "stream", bool, False)
    opts = field_of(body, "stream_options", dict, {})
    spec.include_usage = field_of(opts, "include_usage", bool, False, param="stream_options.include_usage")
    spec.ignore_eos = field_of(body, "ignore_eos", bool, False)
    spec.model = field_of(body, "model", str, "")
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


def add_completion_usage(total: Usage, choice: Usage, index: int, n: int) -> Usage:
    """Usage of a completions reply with choice `index` added: each prompt's tokens count once
    (its first choice), completion tokens add up."""
    if index % n:
        return total.add_choice(choice, index)
    if index == 0:
        return choice
    return Usage(total.prompt_tokens + choice.prompt_tokens, total.completion_tokens + choice.completion_tokens,
                 total.cached_tokens + choice.cached_tokens)


class CompletionStream(StreamWriter):
    """A text_completion stream: per choice the echo, each piece of text, a finish chunk; the
    usage chunk when asked for; `[DONE]`.  `echo_texts` holds one text per prompt, `n` choices
    each."""

    def __init__(self, out: Completions, echo_texts: list[str], n: int, include_usage: bool) -> None:
        self.out, self.echo_texts, self.n, self.include_usage = out, echo_texts, n, include_usage
        self.index = 0
        self.usage = Usage()

    def choice(self, index: int) -> list[Frame]:
        self.index = index
        echo = self.echo_texts[index // self.n]
        return [(None, self.out.chunk([self.out.choice(index, echo, None, [])]))] if echo else []

    def item(self, item: object) -> list[Frame]:
        if isinstance(item, TextEvent) and (item.text or self.out.want_logprobs):
            return [(None, self.out.chunk([self.out.choice(self.index, item.text, None, [item])]))]
        if isinstance(item, GenerationResult):
            self.usage = add_completion_usage(self.usage, Usage.of(item), self.index, self.n)
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
