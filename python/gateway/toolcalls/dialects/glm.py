"""GLM-4.5/4.6/4.7 and Ling 3 calls: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`.

Both layouts are read: 4.5/4.6 put newlines between the parts, 4.7/5 put none; the name ends at
the first `<` (so `NAME\\n<arg_key>`, `NAME <arg_key>` and `NAME</tool_call>` all work).  Values
are the text between the tags verbatim, then converted by the schema (docs/reference/toolcall-contract.md §4).
Every value must be closed before the next key: an `<arg_key>` inside a value (a forgotten
`</arg_value>`) makes the block malformed instead of swallowing the next pair.
"""

from __future__ import annotations

from ..blocks import BlockError, BlockParser, Wait
from ..schema_coerce import coerce, is_verbatim

MARKER = "<tool_call>"
CLOSE = "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"


class GlmBlock(BlockParser):
    marker = MARKER

    def _parse(self) -> Wait:
        self.pos += len(MARKER)
        name = yield from self.name_until("<")
        self.mark = self.pos
        if (yield from self.lit(CLOSE)):
            self.call_begin(name)
            self.call_end()
            return
        yield from self.expect(KEY_OPEN)
        self.call_begin(name)
        while True:
            key = (yield from self.until(KEY_CLOSE, forbid="<")).strip()
            if not key:
                raise BlockError("empty key")
            yield from self.ws()
            yield from self.expect(VALUE_OPEN)
            types = self.catalog.types(name, key)
            if is_verbatim(types):
                self.string_begin(key)
                yield from self.stream_until(VALUE_CLOSE, stop=KEY_OPEN)
                self.string_end()
            else:
                raw = yield from self.until(VALUE_CLOSE, stop=KEY_OPEN)
                self.arg_value(key, coerce(raw, types))
            yield from self.ws()
            self.mark = self.pos
            if (yield from self.lit(CLOSE)):
                self.call_end()
                return
            yield from self.expect(KEY_OPEN)
