"""Qwen3 / Ling 2 hermes calls: `<tool_call>{"name": N, "arguments": {...}}</tool_call>`.

The JSON object is decoded first, then `</tool_call>` must follow, so a `</tool_call>` inside a
JSON string is harmless.  `arguments` may be absent (`{}`), spelled `parameters`, or be a JSON
string holding an object; anything else is malformed.  The arguments are used as the model typed
them (no schema coercion).

Streaming: when the object starts the usual way, `{"name": "N", "arguments": {`, the arguments
object is re-written piece by piece as it arrives (see jsonstream.py).  Any other layout (name
after the arguments, stringified arguments, no arguments) is decoded once the object is complete.
"""

from __future__ import annotations

import json

from ..blocks import BlockError, BlockParser, Wait, json_text, valid_name
from ..jsonstream import JsonError, JsonStreamer

MARKER = "<tool_call>"
CLOSE = "</tool_call>"


class HermesBlock(BlockParser):
    marker = MARKER

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._streamer: JsonStreamer | None = None

    def _json_string(self) -> Wait:
        """A JSON string token at pos (after whitespace); None if the text is not a string."""
        yield from self.ws()
        if not (yield from self.lit('"')):
            return None
        begin = self.pos - 1
        scan = self.pos
        while True:
            buf = self.buf
            quote = buf.find('"', scan)
            while quote > 0 and _escaped(buf, quote):
                quote = buf.find('"', quote + 1)
            if quote >= 0:
                self.pos = quote + 1
                try:
                    return json.loads(buf[begin:self.pos])
                except ValueError:
                    raise BlockError("bad JSON string") from None
            scan = len(buf)
            yield from self._wait()

    def _object_end(self, begin: int) -> Wait:
        """Offset just past the JSON object starting at `begin` (a `{`), by bracket matching."""
        depth, in_string, i = 0, False, begin
        while True:
            buf = self.buf
            while i < len(buf):
                c = buf[i]
                if in_string:
                    if c == "\\":
                        if i + 1 >= len(buf):
                            break
                        i += 1
                    elif c == '"':
                        in_string = False
                elif c == '"':
                    in_string = True
                elif c in "{[":
                    depth += 1
                elif c in "}]":
                    depth -= 1
                    if depth == 0:
                        return i + 1
                i += 1
            yield from self._wait()

    def _stream_arguments(self, name: str) -> Wait:
        """Fast path: the arguments object streams through a JsonStreamer."""
        streamer = self._streamer = JsonStreamer()
        self.events.append(("call", name))
        self._call_open = True
        while True:
            was_string = streamer.string_started
            try:
                out, used = streamer.feed(self.buf[self.pos:], at_end=self.final)
            except JsonError as exc:
                # What came before the error is reported first, as it would have been had the
                # error arrived in a later chunk.
                self._arguments_piece(was_string, exc.written)
                raise BlockError("bad arguments JSON") from None
            self._arguments_piece(was_string, out)
            self.pos += used
            if streamer.done:
                break
            yield from self._wait()
        self.events.append(("end_call",))
        self._call_open = False
        yield from self.ws()
        self.mark = self.pos
        if (yield from self.lit("}")):
            return True
        if streamer.string_started:
            raise BlockError("unexpected text after the arguments")
        # More members after the arguments and nothing streamed yet: decode the whole object.
        self.events.append(("reset",))
        return False

    def _arguments_piece(self, was_string: bool, out: str) -> None:
        assert self._streamer is not None
        if self._streamer.string_started and not was_string:
            self.events.append(("commit",))
        if out:
            self.events.append(("args", out))

    def _decode_whole(self, begin: int) -> Wait:
        """Slow path: decode the complete object and check its shape."""
        self.pos = begin
        self._streamer = None
        end = yield from self._object_end(begin)
        try:
            obj = json.loads(self.buf[begin:end])
        except ValueError:
            raise BlockError("bad JSON") from None
        self.pos = end
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise BlockError("no name")
        name = obj["name"].strip()
        if not valid_name(name):
            raise BlockError("invalid name")
        args = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise BlockError("stringified arguments are not JSON") from None
        if not isinstance(args, dict):
            raise BlockError("arguments are not an object")
        self.events.extend([("call", name), ("args", json_text(args)), ("end_call",)])

    def _parse(self) -> Wait:
        self.pos += len(MARKER)
        yield from self.ws()
        self.mark = begin = self.pos
        yield from self.expect("{")
        streamed = False
        if (yield from self._json_string()) == "name":
            yield from self.ws()
            if (yield from self.lit(":")):
                name = yield from self._json_string()
                yield from self.ws()
                if isinstance(name, str) and (yield from self.lit(",")):
                    key = yield from self._json_string()
                    yield from self.ws()
                    if key in ("arguments", "parameters") and (yield from self.lit(":")):
                        yield from self.ws()
                        if self.buf.startswith("{", self.pos):
                            if not valid_name(name.strip()):
                                raise BlockError("invalid name")
                            streamed = yield from self._stream_arguments(name.strip())
        if not streamed:
            yield from self._decode_whole(begin)
        yield from self.ws()
        self.mark = self.pos
        yield from self.expect(CLOSE)

    def close_text(self) -> str:
        if not self._call_open or self._streamer is None:
            return ""
        self._call_open = False
        return self._streamer.close_text()


def _escaped(buf: str, quote: int) -> bool:
    """True when the quote at `quote` is preceded by an odd number of backslashes."""
    count, i = 0, quote - 1
    while i >= 0 and buf[i] == "\\":
        count += 1
        i -= 1
    return count % 2 == 1
