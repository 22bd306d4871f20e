"""Qwen3-Coder / Qwen3.5 calls: `<tool_call><function=N><parameter=K>V</parameter></function></tool_call>`.

docs/reference/toolcall-contract.md §3/§4 rules for this dialect:

* `<tool_call>` must be followed (after whitespace) by `<function=`; a bare `<function=...>` is
  text (it never starts a block because the core only looks for `<tool_call>`).
* A value drops exactly one newline after `<parameter=K>` and one before its `</parameter>`.
* A `</parameter>` ends the value only when whitespace and then `<parameter=` or `</function>`
  follow it, and only at nesting level 0: a `<parameter=` inside a value opens a literal level
  that its own `</parameter>` closes.  So a value may quote a whole call, and a value not closed
  before the next `<parameter=` leaves the block unclosed (malformed).
* `</function>` must be followed by `</tool_call>`.
"""

from __future__ import annotations

from typing import Callable

from ..blocks import BlockParser, Wait
from ..schema_coerce import coerce, is_verbatim

MARKER = "<tool_call>"
CLOSE = "</tool_call>"
FUNCTION = "<function="
FUNCTION_CLOSE = "</function>"
PARAM = "<parameter="
PARAM_CLOSE = "</parameter>"


class QwenXmlBlock(BlockParser):
    marker = MARKER

    def _value(self, piece: Callable[[str], None] | None) -> Wait:
        """Read one parameter value; stream its pieces to `piece` when given. Returns the text."""
        while self.pos >= len(self.buf):
            yield from self._wait()
        if self.buf[self.pos] == "\n":
            self.pos += 1
        start = emitted = scan = self.pos
        depth = 0

        def flush(upto: int) -> None:
            # Never emit a newline that may turn out to be the one dropped before </parameter>.
            nonlocal emitted
            if upto > start and self.buf[upto - 1] == "\n":
                upto -= 1
            if piece is not None and upto > emitted:
                piece(self.buf[emitted:upto])
                emitted = upto

        while True:
            buf = self.buf
            lt = buf.find("<", scan)
            if lt < 0:
                flush(len(buf))
                scan = len(buf)
                yield from self._wait()
                continue
            rest = buf[lt:lt + len(PARAM_CLOSE)]
            if rest == PARAM_CLOSE:
                after = lt + len(PARAM_CLOSE)
                if depth:
                    depth -= 1
                    scan = after
                    continue
                nxt = after
                while nxt < len(buf) and buf[nxt].isspace():
                    nxt += 1
                follow = buf[nxt:nxt + len(FUNCTION_CLOSE)]
                if follow.startswith(PARAM) or follow.startswith(FUNCTION_CLOSE):
                    end = lt - 1 if lt > start and buf[lt - 1] == "\n" else lt
                    flush(lt)
                    self.pos = after
                    return buf[start:end]
                undecided = nxt == len(buf) or (
                    len(follow) < len(FUNCTION_CLOSE)
                    and (PARAM.startswith(follow) or FUNCTION_CLOSE.startswith(follow)))
                if undecided and not self.final:
                    flush(lt)
                    yield
                    continue
                scan = after  # a literal </parameter> inside the value
                continue
            if buf.startswith(PARAM, lt):
                # A <parameter= inside a value opens a literal level (a quoted call), at the start
                # of a line or not: a value not closed before the next <parameter= never finds
                # its end, so the block is malformed instead of one value swallowing the next.
                depth += 1
                scan = lt + len(PARAM)
                continue
            if len(rest) < len(PARAM_CLOSE) and (
                    PARAM_CLOSE.startswith(rest) or PARAM.startswith(rest[:len(PARAM)])):
                if not self.final:
                    flush(lt)
                    yield
                    continue
            scan = lt + 1

    def _parse(self) -> Wait:
        self.pos += len(MARKER)
        yield from self.ws()
        self.mark = self.pos
        yield from self.expect(FUNCTION)
        name = yield from self.name_until(">")
        self.pos += 1
        self.call_begin(name)
        while True:
            yield from self.ws()
            self.mark = self.pos
            if (yield from self.lit(FUNCTION_CLOSE)):
                yield from self.ws()
                yield from self.expect(CLOSE)
                self.call_end()
                return
            yield from self.expect(PARAM)
            key = yield from self.name_until(">")
            self.pos += 1
            types = self.catalog.types(name, key)
            if is_verbatim(types):
                self.string_begin(key)
                yield from self._value(self.string_piece)
                self.string_end()
            else:
                raw = yield from self._value(None)
                self.arg_value(key, coerce(raw, types))
