"""Incremental re-writer for a JSON object typed by the model (hermes arguments).

It reads raw JSON text as it arrives and writes the same value in json.dumps' layout (`, ` and
`: ` separators, no other whitespace).  Everything it has written is always a prefix that
`close_text()` turns into valid JSON: keys, separators and scalars are held until the value after
them starts or ends, and a partial escape inside a string is held until complete.  String
characters are copied as typed (escapes included), so long strings stream character by character.
"""

from __future__ import annotations

import json
import re

_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]+')
_SCALAR_CHARS = frozenset("0123456789+-.eEtrufalsn")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_HEX = frozenset("0123456789abcdefABCDEF")


class JsonError(ValueError):
    """The text is not valid JSON.  `written`: what feed() wrote from its text before the error
    (the error is found at a character, whatever the chunking: what came before it is output)."""

    written = ""


class JsonStreamer:
    def __init__(self) -> None:
        self._stack: list[list] = []  # [closer, members so far]
        self._state = "value"  # value | key | colon | after | string | keystring | scalar
        self._pending = ""  # text held until the next value starts
        self._key = ""
        self._scalar = ""
        self._escape = ""
        self._scalar_lead = ""
        self.done = False
        self.string_started = False  # a string value has begun (used as the commit signal)

    def feed(self, text: str, at_end: bool = False) -> tuple[str, int]:
        """Consume text; returns (output, characters consumed).  Stops right after the
        outermost value closes.  Raises JsonError on invalid JSON."""
        out: list[str] = []
        try:
            used = self._feed(text, at_end, out)
        except JsonError as exc:
            exc.written = "".join(out)
            raise
        return "".join(out), used

    def _feed(self, text: str, at_end: bool, out: list[str]) -> int:
        i, n = 0, len(text)
        while i < n and not self.done:
            c = text[i]
            state = self._state
            if state == "string" or state == "keystring":
                if self._escape:
                    self._escape += c
                    i += 1
                    self._check_escape()
                    if self._escape and self._complete_escape():
                        if state == "string":
                            out.append(self._escape)
                        else:
                            self._key += self._escape
                        self._escape = ""
                    continue
                run = _STRING_RUN.match(text, i)
                if run:
                    if state == "string":
                        out.append(run.group())
                    else:
                        self._key += run.group()
                    i = run.end()
                    continue
                i += 1
                if c == "\\":
                    self._escape = c
                elif c == '"':
                    if state == "string":
                        out.append('"')
                        self._value_done()
                    else:
                        self._state = "colon"
                else:
                    raise JsonError("control character in string")
                continue
            if state == "scalar":
                if c in _SCALAR_CHARS:
                    self._scalar += c
                    i += 1
                    continue
                out.append(self._finish_scalar())
                continue
            i += 1
            if c.isspace():
                continue
            if state == "value":
                out.append(self._start_value(c))
            elif state == "key":
                if c == '"':
                    self._state, self._key = "keystring", ""
                elif c == "}" and self._stack[-1][1] == 0 and not self._pending:
                    out.append(self._close("}"))
                else:
                    raise JsonError("expected a key")
            elif state == "colon":
                if c != ":":
                    raise JsonError("expected ':'")
                sep = ", " if self._stack[-1][1] else ""
                self._pending = f'{sep}"{self._key}": '
                self._state = "value"
            elif state == "after":
                closer = self._stack[-1][0]
                if c == ",":
                    self._state = "key" if closer == "}" else "value"
                    self._pending = "" if closer == "}" else ", "
                elif c == closer:
                    out.append(self._close(c))
                else:
                    raise JsonError("expected ',' or a closing bracket")
        if at_end and self._state == "scalar" and not self.done:
            out.append(self._finish_scalar())
        return i

    # ------------------------------------------------------------------ helpers
    def _check_escape(self) -> None:
        esc = self._escape
        if len(esc) == 2 and esc[1] not in _SIMPLE_ESCAPES and esc[1] != "u":
            raise JsonError("bad escape")
        if len(esc) > 2 and esc[-1] not in _HEX:
            raise JsonError("bad unicode escape")

    def _complete_escape(self) -> bool:
        esc = self._escape
        return (len(esc) == 2 and esc[1] != "u") or len(esc) == 6

    def _start_value(self, c: str) -> str:
        # A `]` may close an empty array where a value was expected.
        if c == "]" and self._stack and self._stack[-1][0] == "]" and self._stack[-1][1] == 0 \
                and not self._pending:
            return self._close("]")
        lead = self._pending
        self._pending = ""
        if self._stack:
            self._stack[-1][1] += 1
        if c == "{":
            self._stack.append(["}", 0])
            self._state = "key"
            return lead + "{"
        if c == "[":
            self._stack.append(["]", 0])
            self._state = "value"
            return lead + "["
        if c == '"':
            self._state = "string"
            self.string_started = True
            return lead + '"'
        if c in _SCALAR_CHARS:
            self._state, self._scalar = "scalar", c
            self._scalar_lead = lead
            return ""
        raise JsonError("expected a value")

    def _finish_scalar(self) -> str:
        try:
            value = json.loads(self._scalar)
        except ValueError as exc:
            raise JsonError("bad scalar") from exc
        if isinstance(value, (dict, list, str)):
            raise JsonError("bad scalar")
        text = self._scalar_lead + self._scalar
        self._scalar = ""
        self._value_done()
        return text

    def _value_done(self) -> None:
        if not self._stack:
            self.done = True
        self._state = "after"

    def _close(self, closer: str) -> str:
        self._stack.pop()
        self._value_done()
        return closer

    def close_text(self) -> str:
        """Text that closes everything written so far into valid JSON."""
        text = '"' if self._state == "string" else ""
        return text + "".join(entry[0] for entry in reversed(self._stack))
