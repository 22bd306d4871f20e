"""Grammar-constrained decoding: forced tool calls and JSON replies that always hold.

    from gateway.structured import build_constraint, ConstraintError
    c = build_constraint(tokenizer, kind="tool_call", calls=family.calls, tools=tools,
                         forced_name=None, parallel=True, stop_token_ids=[...], n_vocab=V)
    c.prefix                      # the family's opener: what the server prefills
    mask = c.allowed(remaining)   # bool[V]: tokens that keep the output valid (and closable)
    c.advance(token_id)           # after sampling
    c.is_complete()               # the grammar accepts (the stop token is allowed)

`kind`: "tool_call" (needs calls, a gateway.families CallSyntax, and tools), "json_schema" (json_schema),
"json_object".  Masks come from llguidance (Earley parser + token trie over the real
tokenizer.json); a ConstraintError (-> HTTP 400) says why a schema cannot be satisfied.

Budget steering: `allowed(remaining)` knows how many tokens may still be produced.  A greedy
planner (see `Constraint.closing_plan`) finds a short token sequence that finishes the structure
and the stop token (closing brackets before opening strings, then respelled in the tokenizer's
own tokens, so the count is what a model would need); when `remaining` comes within that need plus the cost of opening a fresh
structure (another call or item), only "inert" tokens (which cannot open new structure) and the
plan's next token stay allowed, and at the end the plan itself is followed.  So a
reply is cut with finish_reason "length" only when even the shortest completion cannot fit.

"Inert" is judged by characters, which is only true of free text (a string's or a number's body,
where many tokens are allowed).  Where few tokens are allowed the output is at a branch of the
markup or a value's alternatives, and a token made of plain letters may still commit to new
structure (after DSML's "<", "｜" opens another invoke or parameter where "/" closes): there
each candidate is checked by planning from the state it leads to.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llguidance as llg
import numpy as np

from ..schema_check import size_problem
from .grammars import (
    ConstraintError,
    GrammarText,
    Markup,
    choice_grammar,
    json_grammar,
    regex_grammar,
    tool_call_grammar,
    user_grammar,
)

__all__ = ["Constraint", "ConstraintError", "TokenizerContext", "build_constraint",
           "tokenizer_context"]

# Characters whose presence makes a token able to open or close structure (JSON punctuation,
# tags, escapes, number parts).  In the closing zone only tokens without them are sampled.
_STRUCTURAL = set('{}[]",:<>\\-.')
STEER_WINDOW = 8      # tokens of slack before the plan is followed strictly
REPLAN_EVERY = 16     # replan at least this often, wherever the budget stands
MAX_PLAN = 2048       # tokens; a plan longer than this is not found (treated as unsatisfiable)
REOPEN_PAD = 16       # tokens of opener text a new call / item adds beyond its body
VERIFY_MAX = 32       # calm candidates at most to check one by one (more: free text)
FALLBACK_TRIES = 256  # shortest allowed tokens the planner tries when no closer makes progress


@dataclass
class TokenizerContext:
    """Everything derived once per (tokenizer, vocab size, stop tokens): llguidance's tokenizer,
    special-token texts, per-token byte lengths and the inert-token mask."""

    lltok: llg.LLTokenizer
    n_vocab: int
    stop_ids: tuple[int, ...]
    markup: Markup
    inert: np.ndarray
    by_length: np.ndarray  # token ids, shortest byte text first (specials last)

    def ids(self, text: str) -> list[int]:
        out: list[int] = []
        for kind, value in self.markup.parts(text):
            if kind == "special":
                out.append(int(value))
            else:
                out.extend(self.lltok.tokenize_str(str(value)))
        return out


_CACHE: dict[tuple[str, int, tuple[int, ...]], TokenizerContext] = {}
_CACHE_LOCK = threading.Lock()


def _tokenizer_json(tokenizer: Any) -> str:
    if isinstance(tokenizer, (str, Path)):
        return Path(tokenizer).read_text(encoding="utf-8")
    backend = getattr(tokenizer, "backend", tokenizer)  # gateway.tokenizer.Tokenizer or tokenizers'
    return backend.to_str()


def tokenizer_context(tokenizer: Any, *, n_vocab: int | None = None,
                      stop_token_ids: Sequence[int] | None = None) -> TokenizerContext:
    """Cached: building llguidance's token trie takes seconds on a 129k vocabulary, so the server
    should call this once at startup."""
    text = _tokenizer_json(tokenizer)
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()
    key = (digest, n_vocab or 0, tuple(stop_token_ids or ()))
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    kwargs: dict[str, Any] = {}
    if n_vocab:
        kwargs["n_vocab"] = n_vocab
    if stop_token_ids:
        kwargs["eos_token"] = list(stop_token_ids)
    lltok = llg.LLTokenizer(text, **kwargs)
    size = lltok.vocab_size
    specials: dict[str, int] = {}
    for added in json.loads(text).get("added_tokens", []):
        tid, content = added.get("id"), added.get("content")
        if isinstance(tid, int) and isinstance(content, str) and tid < size and lltok.is_special_token(tid):
            specials[content] = tid
    lengths = np.zeros(size, dtype=np.int64)
    inert = np.zeros(size, dtype=bool)
    for tid in range(size):
        if lltok.is_special_token(tid):
            lengths[tid] = 1 << 20
            continue
        raw = lltok.decode_bytes([tid])
        lengths[tid] = len(raw) or (1 << 20)
        try:
            piece = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        inert[tid] = bool(piece) and not (_STRUCTURAL & set(piece))
    ctx = TokenizerContext(lltok, size, tuple(lltok.eos_tokens), Markup(specials), inert,
                           np.argsort(lengths, kind="stable"))
    with _CACHE_LOCK:
        _CACHE[key] = ctx
    return ctx


@dataclass
class ConstraintStats:
    masks: int = 0
    mask_seconds: float = 0.0
    plans: int = 0
    plan_seconds: float = 0.0
    steered: int = 0  # tokens chosen under budget steering


class Constraint:
    """One request's grammar state over the generated tokens."""

    def __init__(self, ctx: TokenizerContext, grammar: GrammarText, *, kind: str,
                 prefix: str | None) -> None:
        self.ctx = ctx
        self.kind = kind
        self.prefix = prefix
        self.grammar = grammar.lark
        if grammar.subgrammars:
            compiled = json.dumps({"grammars": [{"lark_grammar": grammar.lark}] + [
                {"name": name, "lark_grammar": text} for name, text in grammar.subgrammars.items()]})
        else:
            compiled = llg.LLMatcher.grammar_from_lark(grammar.lark)
        error = llg.LLMatcher.validate_grammar(compiled, ctx.lltok)
        if error:
            raise ConstraintError(_clean_error(error))
        self.matcher = llg.LLMatcher(ctx.lltok, compiled, log_level=0)
        if self.matcher.is_error():
            raise ConstraintError(_clean_error(self.matcher.get_error()))
        candidates = [*grammar.closers, '"', "}", "]", ",", "0", "false"]
        self._closers = [ids for ids in (ctx.ids(t) for t in dict.fromkeys(candidates)) if ids]
        # Between structure tokens closing beats opening: "[]" and "{}" where '"' first would
        # write '[""]' and '{"": ...}'.  In free text '"' comes first: it ends a string.
        brackets = [ctx.ids(t) for t in ("}", "]")]
        self._structure_closers = brackets + [ids for ids in self._closers if ids not in brackets]
        self._inert_bits = np.packbits(ctx.inert, bitorder="little")
        self.stats = ConstraintStats()
        self._plan: list[int] | None = None
        self._plan_at = -1          # len(tokens) when the plan was made
        self._following = False
        self._fresh = False
        self.tokens: list[int] = []
        plan = self.closing_plan()
        self.initial_need = None if plan is None else len(plan)
        # What opening a fresh structure may add to the need: about one more whole call / value
        # (plus an opener), estimated by the shortest completion from the start.
        self._reopen_cost = (self.initial_need or 0) + REOPEN_PAD
        if plan is None:
            raise ConstraintError("the schema admits no value that can be generated "
                                  "(no valid completion was found)")

    # ----------------------------------------------------------------- grammar
    def _grammar_mask(self) -> np.ndarray:
        t0 = time.perf_counter()
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little", count=self.ctx.n_vocab).astype(bool)
        self.stats.masks += 1
        self.stats.mask_seconds += time.perf_counter() - t0
        return mask

    def is_complete(self) -> bool:
        """The output so far is a complete structure (the stop token is allowed)."""
        return self.matcher.is_accepting()

    def advance(self, token_id: int) -> None:
        """Feed the sampled token.  Stop tokens end the output and are not fed."""
        if token_id in self.ctx.stop_ids and self.matcher.is_accepting():
            self.tokens.append(token_id)
            return
        if not self.matcher.consume_token(int(token_id)):
            raise ConstraintError(f"token {token_id} is not allowed here: "
                                  f"{_clean_error(self.matcher.get_error())}")
        self.tokens.append(int(token_id))
        if self._plan:
            if self._plan[0] == token_id:
                self._plan.pop(0)
                self._plan_at = len(self.tokens)
            else:
                self._fresh = False  # keep the length as an estimate until the next replan
                self._following = False
        else:
            # No plan was found from an earlier state: try again from this one (a failed plan
            # must not switch budget steering off for the rest of the reply).
            self._fresh = False

    # ----------------------------------------------------------------- budget
    def closing_plan(self) -> list[int] | None:
        """A short token sequence (stop token included) that completes the output from here."""
        t0 = time.perf_counter()
        plan = self._plan_from(self.matcher.deep_copy(), MAX_PLAN)
        self.stats.plans += 1
        self.stats.plan_seconds += time.perf_counter() - t0
        self._plan = plan
        self._plan_at = len(self.tokens)
        self._fresh = True
        return self._plan

    def _plan_from(self, m: llg.LLMatcher, limit: int) -> list[int] | None:
        """Completes `m` (consumed) greedily: forced tokens first, then the grammar's closers ('"',
        '}', closing tags...) in order, else the shortest allowed token that makes progress.
        None when no completion of at most `limit` tokens was found.

        A step makes progress when it changes the allowed set.  Closers are only taken then, and
        the fallback prefers a token leading to an allowed set not seen yet in this plan: a
        negative JSON number admits no "-0", "-0.0", "-0.00"..., so the "0" closer and the
        shortest digit would extend the fraction for ever, where "1" ends it."""
        start = m.deep_copy()
        plan: list[int] = []
        seen: set[bytes] = set()
        while len(plan) < limit:
            if m.is_accepting():
                return self._retokenized(start, plan) + [self.ctx.stop_ids[0]]
            if m.is_error() or m.is_stopped():
                return None
            ff = m.compute_ff_tokens()
            if ff:
                m.consume_tokens(ff)
                plan.extend(ff)
                continue
            before = m.compute_bitmask()
            seen.add(before)
            in_text = self._allows_text(before)
            for ids in self._closers if in_text else self._structure_closers:
                if m.validate_tokens(ids) == len(ids):
                    m.consume_tokens(ids)
                    # In free text (where letters are allowed) a closer that leaves the allowed
                    # set as it was is mere text (a tag inside a JSON string): undo it.  Between
                    # structure tokens an unchanged set is real progress: "}" at depth 6 allows
                    # what "}" at depth 5 did (the longest brace run is one token of four).
                    if in_text and m.compute_bitmask() == before and not m.is_accepting():
                        m.rollback(len(ids))
                        continue
                    plan.extend(ids)
                    break
            else:
                tid = self._progress_token(m, before, seen)
                if tid is None:
                    return None
                m.consume_token(tid)
                plan.append(tid)
        return None

    def _retokenized(self, start: llg.LLMatcher, plan: list[int]) -> list[int]:
        """`plan` respelled in the tokenizer's own (far fewer) tokens when the grammar takes that
        spelling from `start`: the planner writes one character at a time (the closers), but a
        model writes `" [],"` as one token, and the budget must count what fits, not how the
        planner happens to spell it."""
        try:
            text = self.ctx.lltok.decode_bytes(plan).decode("utf-8")
        except UnicodeDecodeError:  # the plan starts inside a character: keep its own tokens
            return plan
        ids = self.ctx.ids(text)
        if len(ids) >= len(plan) or start.validate_tokens(ids) != len(ids):
            return plan
        start.consume_tokens(ids)
        return ids if start.is_accepting() else plan

    def _allows_text(self, bits: bytes) -> bool:
        """Some inert token (letters, digits, spaces) is in the allowed set `bits`."""
        words = np.frombuffer(bits, dtype=np.uint8)[:len(self._inert_bits)]
        return bool(np.bitwise_and(words, self._inert_bits[:len(words)]).any())

    def _unpack(self, bits: bytes) -> np.ndarray:
        return np.unpackbits(np.frombuffer(bits, dtype=np.uint8), bitorder="little",
                             count=self.ctx.n_vocab).astype(bool)

    def _progress_token(self, m: llg.LLMatcher, before: bytes, seen: set[bytes]) -> int | None:
        """The shortest allowed token leading to an allowed set not seen yet, else the shortest
        one that changes it, else the shortest (None: nothing but the stop is allowed)."""
        allowed = self._unpack(before)
        allowed[list(self.ctx.stop_ids)] = False
        candidates = self.ctx.by_length[allowed[self.ctx.by_length]]
        if not len(candidates):
            return None
        changing: int | None = None
        for tid in candidates[:FALLBACK_TRIES]:
            tid = int(tid)
            m.consume_token(tid)
            after = m.compute_bitmask()
            done = m.is_accepting()
            m.rollback(1)
            if done or after not in seen:
                return tid
            if changing is None and after != before:
                changing = tid
        return changing if changing is not None else int(candidates[0])

    def _need_after(self, token_id: int, limit: int) -> int | None:
        """Tokens the shortest known completion takes after `token_id` (None: more than limit)."""
        t0 = time.perf_counter()
        m = self.matcher.deep_copy()
        plan = self._plan_from(m, limit) if m.consume_token(token_id) else None
        self.stats.plans += 1
        self.stats.plan_seconds += time.perf_counter() - t0
        return None if plan is None else len(plan)

    def _calm(self, mask: np.ndarray, remaining: int) -> np.ndarray:
        """The inert allowed tokens that keep the shortest completion within the budget left
        after them.  Many of them: free text, where inert tokens are content.  Few: a branch
        point, where each is checked (the plan's own next token needs no check)."""
        calm = mask & self.ctx.inert
        calm[list(self.ctx.stop_ids)] = False
        ids = np.flatnonzero(calm)
        if len(ids) > VERIFY_MAX:
            return calm
        assert self._plan
        for tid in ids:
            if int(tid) == self._plan[0]:
                continue
            need = self._need_after(int(tid), remaining - 1)
            if need is None or need > remaining - 1:
                calm[tid] = False
        return calm

    def need(self) -> int | None:
        """Tokens the current shortest known completion takes (stop token included)."""
        return None if self._plan is None else len(self._plan)

    def allowed(self, remaining: int | None = None) -> np.ndarray:
        """Bool mask over the vocabulary for the next token; `remaining` is how many tokens may
        still be produced including this one (None: no budget steering)."""
        if remaining is not None and self._following and self._plan:
            return self._one_hot(self._plan[0])
        mask = self._grammar_mask()
        if remaining is None:
            return mask
        # A failed plan (longer than MAX_PLAN: costly) is retried every REPLAN_EVERY tokens too.
        due = (len(self.tokens) - self._plan_at >= REPLAN_EVERY
               or (self._plan is not None
                   and remaining <= len(self._plan) + self._reopen_cost + STEER_WINDOW + REPLAN_EVERY))
        if due and not self._fresh:
            self.closing_plan()
        if not self._fresh:
            return mask  # far from the budget: the estimate is enough
        need = self.need()
        if need is None:
            return mask
        if remaining <= need + 1:
            self._following = True
            self.stats.steered += 1
            return self._one_hot(self._plan[0])  # type: ignore[index]
        if remaining <= need + self._reopen_cost + STEER_WINDOW and self.matcher.is_accepting():
            # Complete: any token but the stop opens a new call, and even an inert one ("\n")
            # may commit to it.  With the budget this tight, end here.
            self.stats.steered += 1
            return self._one_hot(self._plan[0])  # type: ignore[index]
        if remaining <= need + STEER_WINDOW:
            calm = self._calm(mask, remaining)
            if not calm.any():
                self._following = True
                self.stats.steered += 1
                return self._one_hot(self._plan[0])  # type: ignore[index]
            self.stats.steered += 1
            return calm
        if remaining <= need + self._reopen_cost + STEER_WINDOW:
            # Opening new structure here (another parallel call, another array item) could need
            # more than the budget holds: only inert tokens, or the plan's next step (which
            # brings the end closer), may be sampled.
            calm = self._calm(mask, remaining)
            calm[self._plan[0]] = True  # type: ignore[index]
            self.stats.steered += 1
            return calm
        return mask

    def _one_hot(self, token_id: int) -> np.ndarray:
        mask = np.zeros(self.ctx.n_vocab, dtype=bool)
        mask[token_id] = True
        return mask

    def token_mask_hook(self, max_tokens: int) -> Callable[[list[int]], np.ndarray]:
        """Adapter for GenerationRequest.token_mask: called with the ids generated so far."""
        def hook(generated: list[int]) -> np.ndarray:
            for tid in generated[len(self.tokens):]:
                self.advance(tid)
            return self.allowed(max_tokens - len(generated))
        return hook


def _clean_error(text: str) -> str:
    text = text.split("\n<state>")[0].split("\n<grammar>")[0].strip()
    return text[:500] or "the grammar is invalid"


def _check_sizes(kind: str, tools: Sequence[Mapping[str, Any]] | None, json_schema: Any) -> None:
    """A schema past gateway.schema_check's size bounds is an error before any grammar work: the
    builder and llguidance recurse through it (a RecursionError, a slow compile otherwise)."""
    if kind == "json_schema":
        named = [("the schema", json_schema)]
    elif kind == "tool_call":
        named = []
        for tool in tools or []:
            fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
            if isinstance(fn, Mapping):
                named.append((f"tool {fn.get('name')!r}", fn.get("parameters")))
    else:
        return
    for what, schema in named:
        problem = size_problem(schema)
        if problem is not None:
            raise ConstraintError(f"{what}: {problem}")


def build_constraint(tokenizer: Any, *, kind: str, calls: Any = None,
                     tools: Sequence[Mapping[str, Any]] | None = None,
                     forced_name: str | None = None, parallel: bool = True, json_schema: Any = None,
                     reasoning_open: bool = False, stop_token_ids: Sequence[int] | None = None,
                     n_vocab: int | None = None, pattern: str | None = None,
                     choices: Sequence[str] | None = None, grammar: str | None = None) -> Constraint:
    """A Constraint for one request.

    tokenizer        path to tokenizer.json, a tokenizers.Tokenizer or gateway.tokenizer.Tokenizer
    kind             "tool_call" | "json_schema" | "json_object" | "regex" | "choice" | "grammar"
    calls            kind "tool_call": the chat family's CallSyntax (gateway.families): its opener
                     is the constraint's prefix, its grammar what may follow
    forced_name      tool_choice's function (None: any declared tool)
    parallel         False: exactly one call
    reasoning_open   reply kinds (all but tool_call): the prompt opened <think>, reasoning first
    pattern          kind "regex": the whole reply matches it (Rust regex syntax)
    choices          kind "choice": the reply is exactly one of these strings
    grammar          kind "grammar": GBNF or llguidance Lark text
    stop_token_ids   tokens that end the reply (what the server stops on)
    n_vocab          the model's vocabulary size (the logits row length)
    """
    _check_sizes(kind, tools, json_schema)
    ctx = tokenizer_context(tokenizer, n_vocab=n_vocab, stop_token_ids=stop_token_ids)
    if kind == "tool_call":
        if calls is None:
            raise ConstraintError("this chat format has no tool-call syntax to force")
        text = tool_call_grammar(ctx.markup, calls.grammar, tools, forced_name, parallel)
        return Constraint(ctx, text, kind=kind, prefix=calls.opener(forced_name))
    if kind == "json_schema":
        if not isinstance(json_schema, (Mapping, bool)):
            raise ConstraintError("response_format json_schema needs a `schema` object")
        schema = json_schema if isinstance(json_schema, Mapping) else ({} if json_schema else False)
        return Constraint(ctx, json_grammar(ctx.markup, schema, reasoning_open), kind=kind, prefix=None)
    if kind == "json_object":
        return Constraint(ctx, json_grammar(ctx.markup, {"type": "object"}, reasoning_open),
                          kind=kind, prefix=None)
    if kind == "regex":
        return Constraint(ctx, regex_grammar(ctx.markup, pattern, reasoning_open), kind=kind, prefix=None)
    if kind == "choice":
        return Constraint(ctx, choice_grammar(ctx.markup, choices or [], reasoning_open), kind=kind, prefix=None)
    if kind == "grammar":
        return Constraint(ctx, user_grammar(ctx.markup, grammar, reasoning_open), kind=kind, prefix=None)
    raise ValueError(f"unknown constraint kind {kind!r}")
