"""Where text stands relative to Markdown code (docs/reference/toolcall-contract.md §3.3, Strata 0.1.40.1's rule).

A fence is a line starting (after spaces/tabs) with ``` or ~~~ and lasts until a line starting
with the same three characters.  Inline code means an odd number of backticks (outside fences)
since the last blank line.  The tracker reads text one character at a time, so its state never
depends on how the text was split.
"""

from __future__ import annotations


class CodeTracker:
    def __init__(self) -> None:
        self.fence: str | None = None  # "`" or "~" while inside a fenced block
        self.ticks = 0  # backticks since the last blank line, outside fences
        self._head = ""  # the start of the current line while its kind is undecided
        self._kind: str | None = None  # None (undecided), "fence" or "text"
        self._blank = True  # the current line is whitespace so far
        self._indent_only = True  # only spaces/tabs so far on the current line

    def feed(self, text: str) -> None:
        for c in text:
            if c == "\n":
                self._end_line()
                continue
            if c not in " \t":
                self._indent_only = False
                if not c.isspace():
                    self._blank = False
            if self._kind is None:
                self._head += c
                self._decide()
            elif c == "`" and self._kind == "text" and self.fence is None:
                self.ticks += 1

    def _decide(self) -> None:
        head = self._head.lstrip(" \t")
        if not head:
            return
        if head[0] not in "`~" or any(ch != head[0] for ch in head[:3]):
            self._as_text()
        elif len(head) >= 3:
            self._kind = "fence"
            if self.fence is None:
                self.fence = head[0]
            elif self.fence == head[0]:
                self.fence = None

    def _as_text(self) -> None:
        self._kind = "text"
        if self.fence is None:
            self.ticks += self._head.count("`")

    def _end_line(self) -> None:
        if self._kind is None:
            self._as_text()
        if self._blank:
            self.ticks = 0
        self._head, self._kind = "", None
        self._blank = self._indent_only = True

    def in_code(self) -> bool:
        """Is the next character inside a fence, on a fence line, or inside inline code?"""
        if self.fence is not None or self._kind == "fence":
            return True
        pending = self._head.count("`") if self._kind is None else 0
        return (self.ticks + pending) % 2 == 1

    def at_line_start(self) -> bool:
        """Only spaces or tabs stand before the next character on its line."""
        return self._indent_only
