#!/usr/bin/env python3
"""Per-token cost of grammar-constrained decoding next to the decode step time, measured side by
side on the demo checkpoint (tiny random-weight DeepSeek-V4 with the real 129k-token tokenizer).

    python tools/bench_structured.py [--tokens 96] [--threads N]

Requests are prepared by the server's own pipeline (prompt, forced-call prefix, constraint with
the server's stop tokens and the engine's vocabulary) and run through the real generation loop
(gateway.generate.Slot), once unconstrained (ignore_eos: the same number of tokens) and once
constrained.  "mask" is the grammar mask (llguidance) plus closing plans for max_tokens steering,
per generated token; "step" is one decode step of the engine (eval of one token + sampling).
The demo's layers are tiny, so its decode step is far cheaper than a real checkpoint's: the
ratio printed here is an upper bound of the masking overhead on real models.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

from gateway.demo import ensure_demo_checkpoint  # noqa: E402
from gateway.generate import GenerationRequest, GenerationResult  # noqa: E402
from gateway.sampling import SamplingParams  # noqa: E402
from gateway.server.openai_protocol import parse_openai_chat  # noqa: E402
from gateway.server.pipeline import generation_request, prepare_chat  # noqa: E402
from gateway.server.serve import ServeOptions, build_state  # noqa: E402

ORDER_TOOL = {"type": "function", "function": {"name": "place_order", "parameters": {
    "type": "object", "properties": {
        "customer": {"type": "string"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
            "required": ["sku", "qty"], "additionalProperties": False}},
        "express": {"type": "boolean"}, "note": {"type": "string"}},
    "required": ["customer", "items", "express"]}}}
SIMPLE_TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}} for i in range(6)]
MOVIE = {"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer"},
                                          "genres": {"type": "array", "items": {"type": "string"}}},
         "required": ["title", "year", "genres"], "additionalProperties": False}
HI = [{"role": "user", "content": "Please help."}]
CASES = [
    ("forced call, nested schema", {"tools": [ORDER_TOOL], "tool_choice": {
        "type": "function", "function": {"name": "place_order"}}}),
    ("required, any of 6 tools", {"tools": SIMPLE_TOOLS, "tool_choice": "required"}),
    ("response_format json_schema", {"response_format": {"type": "json_schema",
                                                         "json_schema": {"name": "movie", "schema": MOVIE}}}),
]


def run(state, request: GenerationRequest) -> GenerationResult:
    return state.slot.generate(request, threading.Event(), lambda _event: None)


def bench_case(state, body: dict, tokens: int) -> dict:
    spec = parse_openai_chat({"messages": HI, "max_tokens": tokens, "temperature": 1.0, "seed": 1, **body})
    prep = prepare_chat(state, spec, constrain=True)
    constraint = prep.constraint
    # Unconstrained reference: the same prompt, exactly `tokens` tokens (end-of-turn ignored).
    plain = generation_request(state, prep.prompt_ids, tokens, SamplingParams(temperature=1.0, seed=1), [],
                               ignore_eos=True)
    run(state, plain)  # warm: the prompt is in the slot afterwards, both runs decode only
    base = run(state, plain)
    req = generation_request(state, prep.prompt_ids, tokens, SamplingParams(temperature=1.0, seed=1), [])
    req.stop_strings = ()
    req.token_mask = constraint.token_mask_hook(tokens)
    constrained = run(state, req)
    stats = constraint.stats
    n = max(constrained.completion_tokens, 1)
    return {"tokens": constrained.completion_tokens, "finish": constrained.finish_reason,
            "step_ms": 1e3 * base.decode_seconds / max(base.completion_tokens, 1),
            "constrained_step_ms": 1e3 * constrained.decode_seconds / n,
            "mask_us": 1e6 * stats.mask_seconds / max(stats.masks, 1),
            "cost_us": 1e6 * (stats.mask_seconds + stats.plan_seconds) / n,
            "plans": stats.plans}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=96, help="max_tokens of each request")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)

    path = ensure_demo_checkpoint(progress=False)
    t0 = time.perf_counter()
    state = build_state(ServeOptions(model=str(path), threads=args.threads))  # includes the trie warm-up
    startup = time.perf_counter() - t0
    vocab = state.engine.info.get("vocab_size")
    print(f"structured output: mask cost vs decode step (demo DeepSeek-V4, vocab {vocab}, "
          f"threads {state.engine.info.get('threads')}; startup incl. token trie {startup:.1f} s)")
    header = f"  {'case':30} {'tokens':>6} {'finish':>6} {'step ms':>8} {'mask us':>8} " \
             f"{'mask+plan us/token':>18} {'% of step':>9} {'constrained step ms':>19}"
    print(header)
    for name, body in CASES:
        r = bench_case(state, body, args.tokens)
        share = 100.0 * r["cost_us"] / 1e3 / r["step_ms"] if r["step_ms"] else float("nan")
        print(f"  {name:30} {r['tokens']:6d} {r['finish']:>6} {r['step_ms']:8.2f} {r['mask_us']:8.0f} "
              f"{r['cost_us']:18.0f} {share:8.1f}% {r['constrained_step_ms']:19.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
