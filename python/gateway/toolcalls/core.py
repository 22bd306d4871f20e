"""The streaming core: one state machine for every dialect.

`StreamParser` turns raw model output, fed in chunks of any size, into OpenAI stream deltas and a
final assistant message, following docs/reference/toolcall-contract.md.  Dialects only
describe their markers and how to read one block (blocks.py, dialects/*.py); think-splitting,
marker hold-back, block detection, code-fence tracking and the reasoning gates live here.

How chunking invariance is kept: the parser keeps the whole output in one buffer and only moves
its position forward when the text seen so far decides the question; otherwise it waits.  Every
decision is therefore a function of the text, not of where the chunks were cut.  Whatever may
still turn into a marker (a suffix like `<tool_` or `</thi`) is held back and never streamed.

Calls in the answer, and the "malformed block degrades to text" rule
--------------------------------------------------------------------
A block's text is held (nothing streamed) while the parser reads it.  By default (whole
responses, and streams of short values) it becomes a call only once it is complete and well
formed; a block that fails, at any length, is the contract's raw text in `content`
(docs/reference/toolcall-contract.md §3).  That is all a non-streamed response ever sees.

Streamed responses (`stream_long_values=True`) have one more rule, because two rules meet there:
"arguments stream as fragments as they are generated" and "a malformed or truncated block stays
visible text".  Once a fragment has left, the call cannot be taken back, so they cannot both
hold for a block that fails after streaming began.  The zone where they conflict is kept small:
a block *commits* (starts streaming) early only when a raw string value (a schema-`string` value
of glm/qwen_xml, a `string="true"` value of DSML, a string inside hermes arguments) has grown past
STREAM_AFTER_CHARS characters after a well-formed opener, name and parameter header.  From there
the call streams character by character as JSON-escaped text: a long value (a `write_file` body)
grows on the client's screen instead of arriving minutes later in one piece.

When a committed block then fails (it turns malformed, or the output ends inside it), the stream
shows exactly this, in order:

1. the fragments streamed so far, then one last fragment (`"` and `}` as needed) that makes the
   call's arguments valid JSON: the *failed call* keeps its index and id, and `failed_calls`
   lists it (every call of the block is failed: a DSML block may hold several);
2. the block's raw text as `content`, read again from just after its opener exactly as if nothing
   had streamed (so a well-formed block inside it is still found).

So the stream's `content` is always the whole response's `content`, and its calls are the whole
response's calls plus the failed ones (later calls' indices count the failed ones too).  A
failed call does not make the finish reason "tool_calls" (`tool_calls_emitted` leaves it out);
`message()` keeps it, as the client's accumulated stream does.

Calls inside the reasoning (docs/reference/toolcall-contract.md §5) are never streamed: from a candidate opener on, the
reasoning is held until the turn ends, then delivered (finish "stop" and every gate passed) or
released as reasoning text.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

from .blocks import BlockParser, Event, partial_suffix_len
from .codetrack import CodeTracker
from .schema_coerce import ToolCatalog

THINK_OPEN = "<think>"
# In a streamed response (stream_long_values), a raw string value longer than this streams as
# it is generated; shorter ones wait for the block to be checked (see the module docstring).
# ~30-40 tokens: under 5 s of decode here.
STREAM_AFTER_CHARS = 128
THINK_CLOSE = "</think>"

BlockFactory = Callable[[ToolCatalog, int], BlockParser]


class TrimWriter:
    """Streams one text channel so that the pieces join to the *trimmed* text: leading
    whitespace is dropped, trailing whitespace is held until more text follows it."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._held_space = ""

    def write(self, text: str) -> str:
        body = text.rstrip()
        if not body:
            if self._parts:
                self._held_space += text
            return ""
        out = (self._held_space + body) if self._parts else body.lstrip()
        self._held_space = text[len(body):]
        self._parts.append(out)
        return out

    def text(self) -> str | None:
        joined = "".join(self._parts)
        return joined or None


class _Call:
    __slots__ = ("index", "id", "name", "arguments")

    def __init__(self, index: int, call_id: str, name: str) -> None:
        self.index, self.id, self.name, self.arguments = index, call_id, name, ""


class _Tail:
    """Held reasoning from the first candidate block opener to the end (docs/reference/toolcall-contract.md §5)."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.blocks: list[BlockParser] = []
        self.current: BlockParser | None = None


class StreamParser:
    """Streaming parser for one completion.  See the module docstring for the rules."""

    def __init__(self, marker: str | None, block_factory: BlockFactory | None, tools: Any,
                 in_reasoning: bool = False, start_in_call: str | None = None,
                 id_salt: str = "", stream_long_values: bool = False) -> None:
        self._catalog = ToolCatalog(tools)
        self._marker = marker or ""
        self._factory = block_factory
        self._parsing = bool(marker) and block_factory is not None and not self._catalog.empty
        self._id_salt = id_salt
        self._buf = ""
        self._pos = 0
        self._hidden = 0  # text before this offset was prefilled by the server: never shown
        self._region = "reasoning" if in_reasoning else "start"
        self._reasoning_span = [0, -1]  # [start, end); end -1 while reasoning is open
        self._reasoning_started = in_reasoning and not start_in_call
        self._content = TrimWriter()
        self._reasoning = TrimWriter()
        self._tracker = CodeTracker()
        self._block: BlockParser | None = None
        self._committed = False
        self._queued: list[Event] = []
        self._armed = -1  # argument characters queued since a raw string value began (-1: none)
        # Streamed responses only: a raw string value longer than this commits its block early.
        self._stream_after = STREAM_AFTER_CHARS if stream_long_values else None
        self._block_calls = 0  # index of the current block's first call
        self._failed: list[int] = []  # calls that streamed, then their block failed
        self._skip_space = False
        self._tail: _Tail | None = None
        self._calls: list[_Call] = []
        self._out: list[dict] = []
        self._finished = False
        self.finish_reason: str | None = None
        self.counters: dict[str, int] = {
            "answer_calls": 0,
            "reasoning_calls_delivered": 0,
            "reasoning_calls_kept_as_text": 0,
        }
        if start_in_call:
            # The prompt ends inside a call: read the prefill as if the model had written it,
            # but never show its text.  Deltas it produces (a call header) go out with the
            # first feed.
            self._region = "answer"
            self._buf = start_in_call
            self._hidden = len(start_in_call)
            self._pump(final=False)

    # ------------------------------------------------------------------ public API
    def feed(self, text: str) -> list[dict]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += text
        self._pump(final=False)
        return self._drain()

    def finish(self, finish_reason: str | None = "stop") -> list[dict]:
        if self._finished:
            return []
        self._finished = True
        self.finish_reason = finish_reason
        self._pump(final=True)
        if self._tail is not None:
            self._settle_tail(finish_reason == "stop")
        self._count_quoted_calls()
        return self._drain()

    def message(self) -> dict:
        msg: dict[str, Any] = {"role": "assistant", "content": self._content.text()}
        reasoning = self._reasoning.text()
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        if self._calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in self._calls]
        return msg

    @property
    def tool_calls_emitted(self) -> int:
        """Calls that were well formed (what makes the finish reason "tool_calls")."""
        return len(self._calls) - len(self._failed)

    @property
    def failed_calls(self) -> list[int]:
        """Indices of calls that began streaming, then whose block turned out malformed or cut
        (only with stream_long_values; see the module docstring).  message() keeps them, as the
        stream showed them."""
        return list(self._failed)

    # ------------------------------------------------------------------ machinery
    def _pump(self, final: bool) -> None:
        while self._step(final):
            pass

    def _step(self, final: bool) -> bool:
        """Advance one decision; False when nothing more can be decided yet."""
        if self._region == "start":
            return self._step_start(final)
        if self._region == "reasoning":
            return self._step_tail(final) if self._tail else self._step_reasoning(final)
        return self._step_block(final) if self._block else self._step_answer(final)

    def _drain(self) -> list[dict]:
        merged: list[dict] = []
        for delta in self._out:
            last = merged[-1] if merged else None
            if last is not None and last.keys() == delta.keys():
                key = next(iter(delta))
                if key != "tool_calls":
                    last[key] += delta[key]
                    continue
                if last[key][0]["index"] == delta[key][0]["index"]:
                    fn = last[key][0]["function"]
                    fn["arguments"] += delta[key][0]["function"]["arguments"]
                    continue
            merged.append(delta)
        self._out = []
        return merged

    def _emit_text(self, channel: str, start: int, end: int) -> None:
        if end <= start:
            return
        self._tracker.feed(self._buf[start:end])
        start = max(start, self._hidden)
        if end <= start:
            return
        writer = self._reasoning if channel == "reasoning_content" else self._content
        delta = writer.write(self._buf[start:end])
        if delta:
            self._out.append({channel: delta})

    def _new_block(self, start: int) -> BlockParser:
        assert self._factory is not None
        return self._factory(self._catalog, start)

    # ------------------------------------------------------------------ regions
    def _step_start(self, final: bool) -> bool:
        buf = self._buf
        first = len(buf) - len(buf.lstrip())
        rest = buf[first:]
        if rest.startswith(THINK_OPEN):
            self._pos = first + len(THINK_OPEN)
            self._region = "reasoning"
            self._reasoning_span[0] = self._pos
            self._reasoning_started = True
            return True
        if not final and THINK_OPEN.startswith(rest):
            return False  # "" or a prefix of <think>: wait
        self._region = "answer"
        return True

    def _step_reasoning(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        close = buf.find(THINK_CLOSE, pos)
        opener = buf.find(self._marker, pos) if self._parsing else -1
        if opener >= 0 and (close < 0 or opener < close):
            self._emit_text("reasoning_content", pos, opener)
            if self._tracker.at_line_start() and not self._tracker.in_code():
                self._tail = _Tail(opener)
                self._tail.current = self._new_block(opener)
                self._pos = opener
            else:
                self._emit_text("reasoning_content", opener, opener + len(self._marker))
                self._pos = opener + len(self._marker)
            return True
        if close >= 0:
            self._emit_text("reasoning_content", pos, close)
            self._pos = close + len(THINK_CLOSE)
            self._reasoning_span[1] = close
            self._enter_answer()
            return True
        keep = 0
        if not final:
            keep = partial_suffix_len(buf, THINK_CLOSE, pos)
            if self._parsing:
                keep = max(keep, partial_suffix_len(buf, self._marker, pos))
        self._emit_text("reasoning_content", pos, len(buf) - keep)
        self._pos = len(buf) - keep
        return False

    def _enter_answer(self) -> None:
        self._region = "answer"
        self._tracker = CodeTracker()  # the answer starts on a fresh line

    def _step_answer(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        if self._skip_space:  # a delivered block takes the whitespace after it along
            while pos < len(buf) and buf[pos].isspace():
                pos += 1
            self._pos = pos
            if pos == len(buf):
                return False
            self._skip_space = False
        if not self._parsing:
            self._emit_text("content", pos, len(buf))
            self._pos = len(buf)
            return False
        opener = buf.find(self._marker, pos)
        if opener < 0:
            keep = 0 if final else partial_suffix_len(buf, self._marker, pos)
            self._emit_text("content", pos, len(buf) - keep)
            self._pos = len(buf) - keep
            return False
        self._emit_text("content", pos, opener)
        if self._tracker.in_code():
            self._emit_text("content", opener, opener + len(self._marker))
            self._pos = opener + len(self._marker)
        else:
            self._block = self._new_block(opener)
            self._committed, self._queued, self._armed = False, [], -1
            self._block_calls = len(self._calls)
            self._pos = opener
        return True

    def _step_block(self, final: bool) -> bool:
        block = self._block
        assert block is not None
        block.advance(self._buf, final)
        for event in block.take_events():
            if event[0] == "reset":
                self._queued, self._armed = [], -1
            elif self._committed:
                self._apply(event, block.start)
            else:
                self._queued.append(event)
                if event[0] == "commit" and self._armed < 0:
                    self._armed = 0
                elif event[0] == "args" and self._armed >= 0:
                    self._armed += len(event[1])
                    if self._stream_after is not None and self._armed > self._stream_after:
                        self._commit(block.start)
        if block.status == "open":
            return False
        self._block = None
        if block.status == "done":
            if not self._committed:
                self._commit(block.start)
            self._pos = block.end
            self._skip_space = True
            return True
        if self._committed:
            # Streamed, then malformed: the fragments already left.  Close their JSON and mark
            # the block's calls failed; the text is then read exactly as if nothing had streamed.
            closing = block.close_text()
            if closing:
                self._apply(("args", closing), block.start)
            failed = range(self._block_calls, len(self._calls))
            self._failed.extend(failed)
            self.counters["answer_calls"] -= len(failed)  # counts well-formed calls only
            self._committed = False
        end = block.start + len(self._marker)  # malformed: its text is plain text
        self._emit_text("content", block.start, end)
        self._pos = end
        return True

    def _commit(self, start: int) -> None:
        self._committed = True
        for event in self._queued:
            self._apply(event, start)
        self._queued = []

    def _apply(self, event: Event, block_start: int, from_reasoning: bool = False) -> None:
        kind = event[0]
        if kind == "call":
            index = len(self._calls)
            call = _Call(index, self._call_id(index, event[1], block_start), event[1])
            self._calls.append(call)
            self.counters["reasoning_calls_delivered" if from_reasoning else "answer_calls"] += 1
            self._out.append({"tool_calls": [{
                "index": index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}]})
        elif kind == "args" and self._calls:
            call = self._calls[-1]
            call.arguments += event[1]
            self._out.append({"tool_calls": [
                {"index": call.index, "function": {"arguments": event[1]}}]})

    def _call_id(self, index: int, name: str, block_start: int) -> str:
        # Deterministic (the same output gives the same ids however it was chunked); the
        # server passes a per-request salt so ids differ between requests.
        seed = f"{self._id_salt}\x00{index}\x00{name}\x00{self._buf[:block_start]}"
        return "call_" + hashlib.sha256(seed.encode("utf-8", "surrogatepass")).hexdigest()[:24]

    # ------------------------------------------------------------------ reasoning tail
    def _step_tail(self, final: bool) -> bool:
        tail = self._tail
        assert tail is not None
        buf = self._buf
        close = buf.find(THINK_CLOSE, tail.start)
        if tail.current is not None:
            block = tail.current
            # Reasoning ends at the first </think>: a block may not reach past it.
            if close >= 0 and block.pos > close:
                self._release_tail(block.start + len(self._marker))
                return True
            block.advance(buf[:close] if close >= 0 else buf, final or close >= 0)
            if block.status == "open":
                return False
            if block.status == "bad":
                self._release_tail(block.start + len(self._marker))
                return True
            tail.blocks.append(block)
            tail.current = None
            self._pos = block.end
            return True
        pos = self._pos
        nxt = pos
        while nxt < len(buf) and buf[nxt].isspace():
            nxt += 1
        if nxt == len(buf):
            return False  # only whitespace so far: the tail still qualifies
        rest = buf[nxt:]
        if rest.startswith(self._marker):
            gap = buf[pos:nxt]
            line_start = "\n" in gap and not gap[gap.rfind("\n") + 1:].strip(" \t")
            if line_start:
                tail.current = self._new_block(nxt)
                return True
        elif not final and (self._marker.startswith(rest) or THINK_CLOSE.startswith(rest)):
            return False
        self._release_tail(nxt)  # prose, </think> or a mid-line block: every block is a quote
        return True

    def _release_tail(self, upto: int) -> None:
        tail = self._tail
        assert tail is not None
        self._tail = None
        self._emit_text("reasoning_content", tail.start, upto)
        self._pos = upto

    def _settle_tail(self, natural_stop: bool) -> None:
        """End of output with a qualifying tail: deliver declared blocks on a natural stop."""
        tail = self._tail
        assert tail is not None and tail.current is None
        self._tail = None
        buf = self._buf
        delivered: list[BlockParser] = []
        if natural_stop:
            for block in tail.blocks:
                names = block.call_names()
                if names and all(self._catalog.declared(n) for n in names):
                    delivered.append(block)
        text_from = tail.start
        for block in delivered:
            self._emit_text("reasoning_content", text_from, block.start)
            text_from = block.end
            while text_from < len(buf) and buf[text_from].isspace():
                text_from += 1
        self._emit_text("reasoning_content", text_from, len(buf))
        for block in delivered:
            for event in block.final_events():
                self._apply(event, block.start, from_reasoning=True)
        self._pos = len(buf)

    def _count_quoted_calls(self) -> None:
        """reasoning_calls_kept_as_text: complete calls to declared tools left in the reasoning."""
        if not self._parsing:
            return
        if not self._reasoning_started:
            return
        start, end = self._reasoning_span
        view = self._buf[:end] if end >= 0 else self._buf
        found, at = 0, view.find(self._marker, start)
        while at >= 0:
            block = self._new_block(at)
            block.advance(view, True)
            names = block.call_names()
            if block.status == "done" and names and all(self._catalog.declared(n) for n in names):
                found += len(names)
                at = view.find(self._marker, block.end)
            else:
                at = view.find(self._marker, at + 1)
        self.counters["reasoning_calls_kept_as_text"] = max(
            0, found - self.counters["reasoning_calls_delivered"])

