#!/usr/bin/env python3
"""Two-turn tool-calling probe against a running gateway (or any compatible server).

    python tools/try_tool_calling.py --base-url http://127.0.0.1:8000 [--force] [--api-key KEY]

For each of four clients -- OpenAI chat completions and Anthropic messages, each non-streaming
and streaming (the official SDKs' stream helpers) -- it runs:

  turn 1  the user asks for the weather; the model must call get_weather with a string `city`;
  tool    the script runs get_weather locally;
  turn 2  the call and its result go back; the model must answer in text without calling again.

It prints a PASS/FAIL table and exits 1 if any case failed (2 if the server is unreachable).
--force sends tool_choice required (OpenAI) / any (Anthropic) on the first turn, which the gateway
honours by prefilling the model's own call opener and sampling the call under its grammar, so even
a random-weight model must produce a complete call whose arguments fit the schema.  Greedy
decoding (temperature 0) throughout.

Turn 2 is free text from the model.  --protocol-only (implied when the server reports itself as
the random-weight demo in /props) checks it for protocol only: the server accepts the replayed
call and result and the SDK reads a well-formed reply; answering at length, empty or with another
call are then notes, not failures.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

QUESTION = "What is the weather in Rome right now? Use the get_weather tool."
TOOL_NAME = "get_weather"
TOOL_DESCRIPTION = "Get the current weather for a city."
TOOL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1,
                                                     "description": "City name, e.g. Paris"}},
               "required": ["city"]}
OPENAI_TOOLS = [{"type": "function", "function": {"name": TOOL_NAME, "description": TOOL_DESCRIPTION,
                                                   "parameters": TOOL_SCHEMA}}]
ANTHROPIC_TOOLS = [{"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": TOOL_SCHEMA}]


def get_weather(city: str) -> dict[str, Any]:
    """The local tool: a fixed, recognisable answer so turn 2 can be checked for using it."""
    return {"city": city, "condition": "sunny", "temperature_c": 31}


class CaseFailed(Exception):
    pass


@dataclass
class Outcome:
    api: str
    mode: str
    ok: bool = False
    turn1: str = "-"
    turn2: str = "-"
    detail: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def _call_args(raw: Any) -> dict[str, Any]:
    """Arguments as a dict: OpenAI sends a JSON string, Anthropic an object."""
    if isinstance(raw, dict):
        args = raw
    else:
        try:
            args = json.loads(raw or "{}")
        except json.JSONDecodeError as exc:
            raise CaseFailed(f"turn 1: arguments are not JSON ({exc}): {raw!r}") from None
    if not isinstance(args, dict):
        raise CaseFailed(f"turn 1: arguments are not an object: {raw!r}")
    city = args.get("city")
    if not isinstance(city, str) or not city:
        raise CaseFailed(f"turn 1: get_weather called without a non-empty string 'city': {args!r}")
    return args


def _model_check(out: Outcome, protocol_only: bool, message: str) -> None:
    """A turn-2 expectation about the model's behaviour (not the protocol)."""
    if protocol_only:
        out.notes.append(message)
    else:
        raise CaseFailed(message)


def _short(text: str | None, n: int = 60) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[:n - 1] + "…"


# ------------------------------------------------------------------------------------ OpenAI

def openai_turn2(messages: list[dict], message: Any, result: dict) -> list[dict]:
    """Turn 1's messages + the assistant's first call (content may be null) + the tool's result."""
    call = message.tool_calls[0]
    assistant: dict[str, Any] = {"role": "assistant", "content": message.content,
                                 "tool_calls": [call.model_dump(exclude_none=True)]}
    extra = message.model_extra or {}
    if extra.get("reasoning_content"):  # keep interleaved thinking for templates that render it
        assistant["reasoning_content"] = extra["reasoning_content"]
    return messages + [assistant, {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}]


def run_openai(client, model: str, stream: bool, force: bool, max_tokens: int, out: Outcome,
               protocol_only: bool = False) -> None:
    import openai

    def complete(messages: list[dict], tool_choice: str):
        kwargs = dict(model=model, messages=messages, tools=OPENAI_TOOLS, tool_choice=tool_choice,
                      max_tokens=max_tokens, temperature=0)
        if not stream:
            return client.chat.completions.create(**kwargs)
        try:
            with client.chat.completions.stream(**kwargs) as s:
                return s.get_final_completion()
        except openai.LengthFinishReasonError as err:  # the helper refuses cut responses
            return err.completion

    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    first = complete(messages, "required" if force else "auto")
    choice = first.choices[0]
    calls = choice.message.tool_calls or []
    if not calls:
        raise CaseFailed(f"turn 1: no tool call (finish_reason={choice.finish_reason}, "
                         f"content={_short(choice.message.content)!r})")
    call = calls[0]
    if call.function.name != TOOL_NAME:
        raise CaseFailed(f"turn 1: called {call.function.name!r}, expected {TOOL_NAME!r}")
    if choice.finish_reason == "length":
        raise CaseFailed("turn 1: the call was cut by max_tokens (finish_reason=length)")
    if choice.finish_reason != "tool_calls":
        out.notes.append(f"turn 1 finish_reason={choice.finish_reason}")
    if not call.id:
        raise CaseFailed("turn 1: the tool call has no id (turn 2 could not refer to it)")
    args = _call_args(call.function.arguments)
    out.turn1 = f"{TOOL_NAME}({json.dumps(args, ensure_ascii=False)})"
    result = get_weather(args["city"])

    messages = openai_turn2(messages, choice.message, result)
    second = complete(messages, "auto")
    choice2 = second.choices[0]
    if choice2.finish_reason not in ("stop", "length", "tool_calls"):
        raise CaseFailed(f"turn 2: unknown finish_reason {choice2.finish_reason!r}")
    for call in choice2.message.tool_calls or []:
        json.loads(call.function.arguments or "{}")  # a malformed call is a protocol failure
    answer = choice2.message.content or ""
    if choice2.message.tool_calls:
        _model_check(out, protocol_only, f"turn 2: called a tool again ({choice2.message.tool_calls[0].function.name})")
    elif not answer.strip():
        _model_check(out, protocol_only, f"turn 2: empty answer (finish_reason={choice2.finish_reason})")
    elif choice2.finish_reason != "stop":
        _model_check(out, protocol_only, f"turn 2: finish_reason={choice2.finish_reason}: {_short(answer)!r}")
    out.turn2 = _short(answer) or f"({choice2.finish_reason})"
    _note_uses_result(answer, out)


# --------------------------------------------------------------------------------- Anthropic

def anthropic_turn2(messages: list[dict], first: Any, result: dict) -> list[dict]:
    """Replays the assistant turn as it came (thinking with its signature, text, the first
    tool_use) and answers that tool_use with a tool_result."""
    use = next(b for b in first.content if b.type == "tool_use")
    replay = [block.model_dump(exclude_none=True, exclude={"citations", "caller"}) for block in first.content
              if block.type != "tool_use" or block.id == use.id]
    return messages + [{"role": "assistant", "content": replay},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                     "content": json.dumps(result)}]}]


def run_anthropic(client, model: str, stream: bool, force: bool, max_tokens: int, out: Outcome,
                  protocol_only: bool = False) -> None:
    def complete(messages: list[dict], tool_choice: dict):
        kwargs = dict(model=model, messages=messages, tools=ANTHROPIC_TOOLS, tool_choice=tool_choice,
                      max_tokens=max_tokens, extra_body={"temperature": 0})
        if not stream:
            return client.messages.create(**kwargs)
        with client.messages.stream(**kwargs) as s:
            return s.get_final_message()

    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    first = complete(messages, {"type": "any"} if force else {"type": "auto"})
    uses = [b for b in first.content if b.type == "tool_use"]
    if not uses:
        text = "".join(b.text for b in first.content if b.type == "text")
        raise CaseFailed(f"turn 1: no tool_use block (stop_reason={first.stop_reason}, text={_short(text)!r})")
    use = uses[0]
    if use.name != TOOL_NAME:
        raise CaseFailed(f"turn 1: called {use.name!r}, expected {TOOL_NAME!r}")
    if first.stop_reason == "max_tokens":
        raise CaseFailed("turn 1: the call was cut by max_tokens (stop_reason=max_tokens)")
    if first.stop_reason != "tool_use":
        out.notes.append(f"turn 1 stop_reason={first.stop_reason}")
    args = _call_args(use.input)
    out.turn1 = f"{TOOL_NAME}({json.dumps(args, ensure_ascii=False)})"
    result = get_weather(args["city"])

    messages = anthropic_turn2(messages, first, result)
    second = complete(messages, {"type": "auto"})
    if second.stop_reason not in ("end_turn", "max_tokens", "tool_use", "stop_sequence"):
        raise CaseFailed(f"turn 2: unknown stop_reason {second.stop_reason!r}")
    answer = "".join(b.text for b in second.content if b.type == "text")
    if any(b.type == "tool_use" for b in second.content):
        _model_check(out, protocol_only, "turn 2: called a tool again")
    elif not answer.strip():
        _model_check(out, protocol_only, f"turn 2: empty answer (stop_reason={second.stop_reason})")
    elif second.stop_reason != "end_turn":
        _model_check(out, protocol_only, f"turn 2: stop_reason={second.stop_reason}: {_short(answer)!r}")
    out.turn2 = _short(answer) or f"({second.stop_reason})"
    _note_uses_result(answer, out)


def _note_uses_result(answer: str, out: Outcome) -> None:
    # Informational only: wording is the model's business, the protocol is ours.
    if "31" not in answer and "sunny" not in answer.lower():
        out.notes.append("answer does not mention the tool result")


# ------------------------------------------------------------------------------------- main

def print_table(outcomes: list[Outcome], file=sys.stdout) -> None:
    rows = [("API", "mode", "result", "turn 1", "turn 2 / failure", "s")]
    for o in outcomes:
        rows.append((o.api, o.mode, "PASS" if o.ok else "FAIL", o.turn1,
                     o.turn2 if o.ok else o.detail, f"{o.seconds:.1f}"))
    widths = [min(max(len(r[i]) for r in rows), 90) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(cell[:widths[i]].ljust(widths[i]) for i, cell in enumerate(row)).rstrip(), file=file)
        if n == 0:
            print("  ".join("-" * w for w in widths), file=file)
    for o in outcomes:
        for note in o.notes:
            print(f"  note: {o.api} {o.mode}: {note}", file=file)
    passed = sum(o.ok for o in outcomes)
    print(f"{passed}/{len(outcomes)} passed", file=file)


def _serves_demo(base: str, api_key: str, timeout: float) -> bool:
    """The gateway's /props says whether it serves the random-weight demo (other servers: no)."""
    import urllib.request

    req = urllib.request.Request(base + "/props", headers={"Authorization": f"Bearer {api_key}"})
    try:
        with urllib.request.urlopen(req, timeout=min(timeout, 30.0)) as resp:
            return json.loads(resp.read()).get("demo") is True
    except Exception:  # noqa: BLE001 - not our gateway, or no /props: assume a real model
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root, without /v1")
    p.add_argument("--api-key", default="none")
    p.add_argument("--model", default=None, help="model name (default: the first one /v1/models lists)")
    p.add_argument("--force", action="store_true", help="tool_choice required/any on the first turn")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per request (CPU prefill is slow)")
    p.add_argument("--only", choices=["openai", "anthropic"], default=None)
    p.add_argument("--protocol-only", action="store_true",
                   help="check turn 2 for protocol only (implied by the random-weight demo)")
    args = p.parse_args(argv)

    import anthropic
    import openai

    base = args.base_url.rstrip("/").removesuffix("/v1")
    # No automatic retries: a timed-out request would be re-submitted and queue behind itself.
    oa = openai.OpenAI(base_url=base + "/v1", api_key=args.api_key, max_retries=0, timeout=args.timeout)
    an = anthropic.Anthropic(base_url=base, api_key=args.api_key, max_retries=0, timeout=args.timeout)
    try:
        model = args.model or oa.models.list().data[0].id
    except (openai.APIConnectionError, openai.APITimeoutError) as exc:
        print(f"cannot reach {base}: {exc}", file=sys.stderr)
        return 2
    except (openai.APIError, IndexError) as exc:
        print(f"cannot list models at {base}/v1/models: {exc}", file=sys.stderr)
        return 2
    protocol_only = args.protocol_only or _serves_demo(base, args.api_key, args.timeout)
    print(f"server {base}  model {model}  tool_choice on turn 1: "
          f"{'required/any (--force)' if args.force else 'auto'}"
          + ("  turn 2: protocol only" + (" (random-weight demo)" if not args.protocol_only else "")
             if protocol_only else ""))

    cases: list[tuple[str, str, Callable[..., None], Any, bool]] = []
    if args.only in (None, "openai"):
        cases += [("openai", "non-stream", run_openai, oa, False), ("openai", "stream", run_openai, oa, True)]
    if args.only in (None, "anthropic"):
        cases += [("anthropic", "non-stream", run_anthropic, an, False),
                  ("anthropic", "stream", run_anthropic, an, True)]
    outcomes = []
    for api, mode, runner, client, stream in cases:
        out = Outcome(api, mode)
        t0 = time.monotonic()
        try:
            runner(client, model, stream, args.force, args.max_tokens, out, protocol_only)
            out.ok = True
        except CaseFailed as exc:
            out.detail = str(exc)
        except (openai.APIError, anthropic.APIError) as exc:
            out.detail = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # an SDK helper choking on the stream is a failure to report, not a crash
            out.detail = f"{type(exc).__name__}: {exc}"
        out.seconds = time.monotonic() - t0
        outcomes.append(out)
        print(f"  {api:9} {mode:10} {'PASS' if out.ok else 'FAIL'}  ({out.seconds:.1f} s)", flush=True)
    print()
    print_table(outcomes)
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
