"""DeepSeek-V4 DSML calls (docs/reference/dsml.md §6): one `<｜DSML｜tool_calls>` block holding invokes.

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="N">
    <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

The bars are U+FF5C.  Any whitespace between tags is accepted (including none).  Every parameter
needs `string="true"` or `string="false"`, names are unique within an invoke, the block needs
at least one invoke, and a value must be closed before any other DSML tag opens (an opening
`<｜DSML｜...` tag inside a value makes the block malformed).  `string="true"` values are the raw text; `string="false"` values follow the
schema (docs/reference/toolcall-contract.md §4, DSML).
"""

from __future__ import annotations

from ..blocks import BlockError, BlockParser, Wait, valid_name
from ..schema_coerce import coerce, is_verbatim

BAR = "\uff5c"
MARKER = f"<{BAR}DSML{BAR}tool_calls>"
CLOSE = f"</{BAR}DSML{BAR}tool_calls>"
INVOKE = f"<{BAR}DSML{BAR}invoke"
INVOKE_CLOSE = f"</{BAR}DSML{BAR}invoke>"
PARAM = f"<{BAR}DSML{BAR}parameter"
PARAM_CLOSE = f"</{BAR}DSML{BAR}parameter>"
# Any opening DSML tag inside a value means its </｜DSML｜parameter> was forgotten.
TAG_OPEN = f"<{BAR}DSML{BAR}"


class DsmlBlock(BlockParser):
    marker = MARKER

    def _attributes(self) -> Wait:
        """`( name="value")* >` after a tag name; returns the attributes as a dict."""
        attrs: dict[str, str] = {}
        while True:
            before = self.pos
            yield from self.ws()
            if (yield from self.lit(">")):
                return attrs
            if self.pos == before:
                raise BlockError("attributes must be separated by whitespace")
            attr = (yield from self.until("=", forbid=" \t\r\n<>\"'")).strip()
            yield from self.expect('"')
            value = yield from self.until('"', forbid="\n<>")
            if not attr or attr in attrs:
                raise BlockError("bad attribute")
            attrs[attr] = value

    def _parse(self) -> Wait:
        self.pos += len(MARKER)
        invokes = 0
        while True:
            yield from self.ws()
            self.mark = self.pos
            if invokes and (yield from self.lit(CLOSE)):
                return
            yield from self.expect(INVOKE)
            attrs = yield from self._attributes()
            name = attrs.get("name", "").strip()
            if set(attrs) != {"name"} or not valid_name(name):
                raise BlockError("bad invoke header")
            self.call_begin(name)
            seen: set[str] = set()
            while True:
                yield from self.ws()
                self.mark = self.pos
                if (yield from self.lit(INVOKE_CLOSE)):
                    self.call_end()
                    break
                yield from self.expect(PARAM)
                attrs = yield from self._attributes()
                key, flag = attrs.get("name", ""), attrs.get("string")
                if set(attrs) != {"name", "string"} or flag not in ("true", "false"):
                    raise BlockError("bad parameter header")
                if not key or key in seen:
                    raise BlockError("empty or duplicate parameter")
                seen.add(key)
                types = self.catalog.types(name, key)
                if flag == "true" or is_verbatim(types):
                    self.string_begin(key)
                    yield from self.stream_until(PARAM_CLOSE, stop=TAG_OPEN)
                    self.string_end()
                else:
                    raw = yield from self.until(PARAM_CLOSE, stop=TAG_OPEN)
                    self.arg_value(key, coerce(raw, types))
            invokes += 1
