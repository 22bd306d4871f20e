"""Anthropic's thinking.budget_tokens, enforced: the reasoning is closed when its budget is spent.

The generation loop asks a token-mask hook before each token (generate.GenerationRequest
.token_mask).  `ThinkingBudget` is such a hook: it follows the generated text (the reasoning is
open from the start when the prompt opened it, or once the reply starts with the family's opening
marker), counts the tokens sampled inside the reasoning, and when `budget` of them were sampled it
forces the family's closing marker, token by token.  The answer is sampled freely after it, and
the tool-call parser sees the marker as if the model had written it.

A grammar constraint (a JSON reply after the reasoning) keeps its own hook: the two masks are
combined, and where the grammar would not allow the marker's next token the grammar wins (the
reply stays valid; the reasoning then ends where the grammar lets it).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..tokenizer import IncrementalDecoder, Tokenizer

MaskHook = Callable[[list[int]], "np.ndarray | None"]


def marker_ids(tokenizer: Tokenizer, marker: str) -> list[int]:
    """The ids of a chat marker: its single special token when the vocabulary has one."""
    single = tokenizer.token_id(marker)
    return [single] if single is not None else tokenizer.encode(marker)


class ThinkingBudget:
    """A token-mask hook that closes the reasoning after `budget` reasoning tokens."""

    def __init__(self, tokenizer: Tokenizer, budget: int, markers: tuple[str, str], *, in_reasoning: bool,
                 n_vocab: int, inner: MaskHook | None = None) -> None:
        self.budget = budget
        self.open_marker, self.close_marker = markers
        self.close_ids = marker_ids(tokenizer, self.close_marker)
        self.n_vocab = n_vocab
        self.inner = inner
        self.region = "reasoning" if in_reasoning else "start"  # start | reasoning | answer
        self.reasoning_tokens = 0
        self.forced = 0  # how many of close_ids were written
        self._decoder = IncrementalDecoder(tokenizer)
        self._text = ""  # the start of the reply (region start), or the reasoning's tail
        self._seen = 0

    def _observe(self, token_id: int) -> None:
        piece = self._decoder.push(token_id)
        if self.region == "start":
            self._text += piece
            head = self._text.lstrip()
            if head.startswith(self.open_marker):
                self.region, self._text = "reasoning", head[len(self.open_marker):]
            elif not self.open_marker.startswith(head):
                self.region = "answer"  # the reply did not open a reasoning block: no budget applies
            return
        if self.region != "reasoning":
            return
        if self.forced:
            self.forced += 1
            if self.forced > len(self.close_ids):
                self.region = "answer"
            return
        self.reasoning_tokens += 1
        # Only a tail as long as the marker is needed to see the model close the reasoning itself.
        self._text = (self._text + piece)[-(len(self.close_marker) + len(piece)):]
        if self.close_marker in self._text:
            self.region = "answer"

    def __call__(self, generated: list[int]) -> np.ndarray | None:
        for token_id in generated[self._seen:]:
            self._observe(token_id)
        self._seen = len(generated)
        inner = self.inner(generated) if self.inner is not None else None
        if self.region != "reasoning" or (not self.forced and self.reasoning_tokens < self.budget):
            return inner
        if not self.forced:
            self.forced = 1  # the next token is the marker's first; _observe counts from there
        forced = np.zeros(self.n_vocab, dtype=bool)
        forced[self.close_ids[self.forced - 1]] = True
        if inner is not None:
            both = forced & inner
            if not both.any():
                self.forced = 0  # the grammar refuses the marker here: try again at the next token
                return inner
            return both
        return forced
