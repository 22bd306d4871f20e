"""Resumable block parsers: the part of a dialect that reads one tool-call block.

A block parser starts at an opener the core found in the buffer and reads the rest of the block
as text arrives.  It is written as a generator: every helper either decides from the text it can
see or *waits* (yields) until more text comes, so what it decides never depends on how the text
was split into chunks.  When the core says the output has ended (`final`), a helper that would
wait fails instead, which makes a truncated block malformed.

The parser reports what it read as events, consumed by the core:

* ``("call", name)``   a call's header is complete and its name is valid;
* ``("args", text)``   the next piece of that call's JSON arguments (all pieces concatenate to
  the final arguments string);
* ``("commit",)``      the parser is about to stream a raw string value piece by piece; the core
  may start streaming the block from here (see the core's module docstring);
* ``("end_call",)``    the call's arguments are closed;
* ``("reset",)``       forget the events so far (only before a commit: hermes switching from
  its streaming path to decoding the whole object).

A parser ends in ``status == "done"`` (``end`` is the offset just past the block) or
``status == "bad"`` (malformed; ``mark`` is where the element that failed began and
``truncated`` tells whether it failed because the text ran out).
"""

from __future__ import annotations

import json
import re
from typing import Any, Generator

from .schema_coerce import ToolCatalog

Event = tuple
Wait = Generator[None, None, Any]

# docs/reference/toolcall-contract.md §3.2: a function name is non-empty and holds no whitespace or <>{}"'.
_BAD_NAME_CHARS = re.compile(r"[\s<>{}\"']")
MAX_NAME = 256  # longer "names" are prose; the cap also keeps re-checks cheap


def valid_name(name: str) -> bool:
    return bool(name) and not _BAD_NAME_CHARS.search(name)


def partial_suffix_len(buf: str, marker: str, lo: int = 0) -> int:
    """Length of the longest suffix of buf[lo:] that is a proper prefix of marker."""
    longest = min(len(marker) - 1, len(buf) - lo)
    for size in range(longest, 0, -1):
        if buf.endswith(marker[:size]):
            return size
    return 0


def json_text(value: Any) -> str:
    """JSON as Python's json.dumps writes it with ensure_ascii=False (the encoders' format)."""
    return json.dumps(value, ensure_ascii=False)


def json_string_body(raw: str) -> str:
    """The escaped characters of a JSON string without its quotes; escaping is per character,
    so escaping pieces and joining them equals escaping the whole."""
    return json.dumps(raw, ensure_ascii=False)[1:-1]


class BlockError(Exception):
    """The block is malformed at the parser's current element."""


def _stop_at(buf: str, stop: str, lo: int, found: int) -> int:
    """Where `stop` begins in buf[lo:] before `found` (the terminator; -1 while unseen), or -1.
    `lo` is where the text not yet searched begins, less a partial `stop` that the previous
    search saw cut at the end of the buffer."""
    return buf.find(stop, lo, found if found >= 0 else len(buf)) if stop else -1


def _check_stop(buf: str, stop: str, lo: int, found: int) -> None:
    if _stop_at(buf, stop, lo, found) >= 0:
        raise BlockError(f"{stop!r} before the value was closed")


class BlockParser:
    """Base class: generator plumbing, text helpers and the JSON arguments writer."""

    marker: str = ""  # the block opener, set by each dialect

    def __init__(self, catalog: ToolCatalog, start: int) -> None:
        self.catalog = catalog
        self.start = start
        self.pos = start
        self.mark = start
        self.buf = ""
        self.final = False
        self.status = "open"
        self.end = -1
        self.truncated = False
        self.events: list[Event] = []
        self._hit_end = False
        self._call_open = False
        self._string_open = False
        self._arg_count = 0
        self._gen = self._parse()

    # ----------------------------------------------------------------- driving
    def advance(self, buf: str, final: bool) -> None:
        """Read as far as `buf` allows; with final=True the block must resolve now."""
        if self.status != "open":
            return
        self.buf, self.final = buf, final
        try:
            next(self._gen)
        except StopIteration:
            self.status, self.end = "done", self.pos
            return
        except BlockError:
            self.status, self.truncated = "bad", self._hit_end
            return
        if final:  # a helper waited although the text had ended: treat as truncated
            self.status, self.truncated = "bad", True

    def take_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    def final_events(self) -> list[Event]:
        """All events of a finished block, minus those a ("reset",) withdrew."""
        events = self.take_events()
        resets = [i for i, e in enumerate(events) if e[0] == "reset"]
        return events[resets[-1] + 1:] if resets else events

    def call_names(self) -> list[str]:
        """Names of the calls of a finished block (keeps its events for final_events)."""
        events = self.final_events()
        self.events = events
        return [e[1] for e in events if e[0] == "call"]

    def _parse(self) -> Wait:  # pragma: no cover - every dialect overrides it
        raise NotImplementedError
        yield

    # ----------------------------------------------------------------- text helpers
    def _wait(self) -> Wait:
        """Wait for more text; at the end of the output this is a truncation."""
        if self.final:
            self._hit_end = True
            raise BlockError("truncated")
        yield

    def ws(self) -> Wait:
        """Skip whitespace; returns once a non-space character (or the end) is visible."""
        while True:
            buf, p = self.buf, self.pos
            n = len(buf)
            while p < n and buf[p].isspace():
                p += 1
            self.pos = p
            if p < n or self.final:
                return
            yield

    def lit(self, s: str) -> Wait:
        """Consume `s` if the text continues with it; False if it cannot."""
        while True:
            chunk = self.buf[self.pos:self.pos + len(s)]
            if chunk == s:
                self.pos += len(s)
                return True
            if len(chunk) < len(s) and s.startswith(chunk):
                if self.final:
                    self._hit_end = True
                    return False
                yield
                continue
            return False

    def expect(self, s: str) -> Wait:
        if not (yield from self.lit(s)):
            raise BlockError(f"expected {s!r}")

    def until(self, term: str, forbid: str = "", stop: str = "") -> Wait:
        """Text up to `term` (consumed).  A character of `forbid`, or the string `stop`, before it
        fails early (`stop`: a tag that may only come after `term`, e.g. the next key's opener)."""
        scan = checked = self.pos
        while True:
            buf = self.buf
            found = buf.find(term, scan)
            limit = found if found >= 0 else len(buf) - partial_suffix_len(buf, term, self.pos)
            if forbid and any(c in forbid for c in buf[checked:limit]):
                raise BlockError("forbidden character")
            _check_stop(buf, stop, max(self.pos, checked - len(stop) + 1), found)
            checked = max(checked, limit)
            if found >= 0:
                text = buf[self.pos:found]
                self.pos = found + len(term)
                return text
            scan = max(self.pos, len(buf) - len(term) + 1)
            yield from self._wait()

    def name_until(self, stop: str) -> Wait:
        """A function/parameter name ending before the character `stop` (not consumed).

        Fails as soon as the text seen so far cannot be a valid name, so prose after an opener
        (`<tool_call> is the tag ...`) is released as text without waiting for `stop`.
        """
        while True:
            buf = self.buf
            found = buf.find(stop, self.pos, self.pos + MAX_NAME + 1)
            segment = buf[self.pos:found if found >= 0 else self.pos + MAX_NAME + 1].strip()
            if len(segment) > MAX_NAME or (segment and not valid_name(segment)):
                raise BlockError("invalid name")
            if found >= 0:
                if not segment:
                    raise BlockError("empty name")
                self.pos = found
                return segment
            yield from self._wait()

    def stream_until(self, term: str, stop: str = "") -> Wait:
        """Stream a raw string value up to `term` as JSON string pieces (term consumed).  The
        string `stop` before `term` fails the block (see `until`); text that may still turn into
        `term` or `stop` is held back, so the pieces never depend on the chunking."""
        emitted = self.pos
        while True:
            buf = self.buf
            found = buf.find(term, max(emitted, self.pos))
            stopped = _stop_at(buf, stop, emitted, found)
            if stopped >= 0:
                # Stream up to the stray tag first: what was streamed before the block failed
                # must not depend on whether the tag arrived in the same chunk.
                self.string_piece(buf[emitted:stopped])
                raise BlockError(f"{stop!r} before the value was closed")
            if found >= 0:
                safe = found
            else:
                held = partial_suffix_len(buf, term, emitted)
                if stop:
                    held = max(held, partial_suffix_len(buf, stop, emitted))
                safe = len(buf) - held
            self.string_piece(buf[emitted:safe])
            emitted = safe
            if found >= 0:
                self.pos = found + len(term)
                return
            yield from self._wait()

    # ----------------------------------------------------------------- JSON arguments writer
    # XML-style dialects build the arguments text themselves, in json.dumps' format, so each
    # event is already a piece of the final string: `{`, `"key": value`, `, `, `}`.
    def call_begin(self, name: str) -> None:
        self.events.append(("call", name))
        self.events.append(("args", "{"))
        self._call_open, self._arg_count = True, 0

    def _separator(self) -> str:
        return ", " if self._arg_count else ""

    def arg_value(self, key: str, value: Any) -> None:
        self.events.append(("args", f"{self._separator()}{json_text(key)}: {json_text(value)}"))
        self._arg_count += 1

    def string_begin(self, key: str) -> None:
        self.events.append(("commit",))
        self.events.append(("args", f'{self._separator()}{json_text(key)}: "'))
        self._string_open = True

    def string_piece(self, raw: str) -> None:
        if raw:
            self.events.append(("args", json_string_body(raw)))

    def string_end(self) -> None:
        self.events.append(("args", '"'))
        self._string_open = False
        self._arg_count += 1

    def call_end(self) -> None:
        self.events.append(("args", "}"))
        self.events.append(("end_call",))
        self._call_open = False

    def close_text(self) -> str:
        """JSON that closes the open call after a failure once streaming has started."""
        if not self._call_open:
            return ""
        text = ('"' if self._string_open else "") + "}"
        self._call_open = self._string_open = False
        return text
