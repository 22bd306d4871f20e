"""Grammar-constrained decoding for chat requests: forced tool calls and JSON replies.

With tool_choice required / a named function, or response_format json_object / json_schema
(Anthropic output_config.format), every generated token is sampled under a grammar
(gateway.structured), so the reply is always a complete call in the model's own dialect whose
arguments validate against the tool schema, or a JSON value that validates against the schema.
Other servers' constraint parameters work too (openai_protocol._EXTENSIONS: vLLM's guided_json /
guided_regex / guided_choice / guided_grammar and structured_outputs, llama.cpp's GBNF grammar
and json_schema): the reply then matches the regex, is one of the choices, or follows the grammar.

The constraint and the generation loop must agree on two things, checked here:
* the stop tokens: the grammar allows them exactly when the structure is complete, and the loop
  ends on them, so both get the very same id set (the request's, ignore_eos does not apply);
* the vocabulary: masks are as long as the engine's logits row (engine.info["vocab_size"]),
  which may be larger than the tokenizer's (padded embedding rows are never allowed).

Building llguidance's token trie takes seconds on a 129k vocabulary, so `warm_up` runs at startup.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .errors import bad_request

if TYPE_CHECKING:
    from ..structured import Constraint
    from .spec import ChatSpec
    from .state import ServerState

log = logging.getLogger("moegate.server")


def engine_vocab(state: "ServerState") -> int:
    """The logits row length (what a mask must cover)."""
    info = getattr(state.engine, "info", {}) or {}
    return int(info.get("vocab_size") or state.tokenizer.vocab_size)


def wants_constraint(spec: "ChatSpec") -> bool:
    return spec.forces_call or spec.response_format is not None


def warm_up(state: "ServerState") -> float:
    """Builds the tokenizer context the chat requests will use (cached); returns seconds."""
    from ..structured import tokenizer_context

    t0 = time.perf_counter()
    stops = state.stop_token_ids
    if not stops:
        log.warning("structured output: the checkpoint declares no stop token; constrained replies "
                    "will end at max_tokens")
        return 0.0
    tokenizer_context(state.tokenizer, n_vocab=engine_vocab(state), stop_token_ids=sorted(stops))
    return time.perf_counter() - t0


def build_for_request(state: "ServerState", spec: "ChatSpec", *, in_reasoning: bool) -> "Constraint | None":
    """The request's constraint (None when it needs none); ApiError 400 when the schema cannot
    be satisfied or the format has nothing to force."""
    if not wants_constraint(spec):
        return None
    if not spec.forces_call:
        return build_reply_constraint(state, spec.response_format or {}, state.stop_token_ids,
                                      in_reasoning=in_reasoning)
    from ..structured import ConstraintError, build_constraint

    stop_ids = state.stop_token_ids
    if not stop_ids:
        raise bad_request("structured output needs an end-of-turn token, and this checkpoint declares none",
                          "tool_choice")
    try:
        return build_constraint(state.tokenizer, kind="tool_call", calls=state.chat.family.calls,
                                tools=spec.active_tools, forced_name=spec.forced_name,
                                # naming a function asks for exactly one call of it (OpenAI, vLLM);
                                # `required` may give several
                                parallel=spec.parallel_tool_calls and spec.forced_name is None,
                                stop_token_ids=sorted(stop_ids),
                                n_vocab=engine_vocab(state))
    except ConstraintError as exc:
        raise bad_request(f"this schema cannot be enforced: {exc}", "tools") from None


def build_reply_constraint(state: "ServerState", fmt: dict, stop_ids: frozenset[int], *,
                           in_reasoning: bool = False) -> "Constraint":
    """A constraint on the whole reply from a normalised format (the protocol modules: response_format
    and the other servers' parameters): json_object, json_schema, regex, choice or grammar."""
    from ..structured import ConstraintError, build_constraint

    param = fmt.get("param", "response_format")
    if not stop_ids:
        raise bad_request("structured output needs an end-of-turn token, and this checkpoint declares none "
                          "(or ignore_eos dropped it)", param)
    common = dict(stop_token_ids=sorted(stop_ids), n_vocab=engine_vocab(state), reasoning_open=in_reasoning)
    kind = fmt.get("type")
    try:
        if kind == "json_schema":
            return build_constraint(state.tokenizer, kind="json_schema", json_schema=fmt.get("schema"), **common)
        if kind in ("regex", "choice", "grammar"):
            return build_constraint(state.tokenizer, kind=kind, pattern=fmt.get("pattern"),
                                    choices=fmt.get("choices"), grammar=fmt.get("grammar"), **common)
        return build_constraint(state.tokenizer, kind="json_object", **common)
    except ConstraintError as exc:
        what = "schema" if str(kind).startswith("json") else str(kind)
        raise bad_request(f"this {what} cannot be enforced: {exc}", param) from None
