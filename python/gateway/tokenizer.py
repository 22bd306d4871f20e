"""Checkpoint tokenizers: tokenizer.json through the `tokenizers` library, as real checkpoints ship.

Control tokens (`ControlTokens`): the added tokens that are the chat format's vocabulary (turn
markers, think tags, call markup).  A chat prompt is tokenised with `encode_prompt`: markers the
template wrote become their ids, client text between them is tokenised with none recognised, so
`<｜User｜>` inside a tool result stays text (gateway.chat.untrusted says how the two are told
apart).  Generated control tokens are hidden from the text (`hidden_ids`), except the markup the
output parser reads.

Also the incremental detokenizer used while streaming: byte-level BPE tokens can split a UTF-8
character, so text is released only once it decodes without a trailing replacement character.
"""
from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import AddedToken
from tokenizers import Tokenizer as _HFTokenizer

if TYPE_CHECKING:
    from .chat.untrusted import PromptText

# Above this many characters (encode) or ids (decode) the batch entry points are used: they
# release the GIL while the Rust side works, the single-item ones hold it.  Server handlers run
# tokenization in a worker thread, and a held GIL would still stall the event loop (a 15 MB
# prompt took ~17 s during which /health and every stream froze).  Short inputs stay on the
# single-item calls, cheaper per call (streaming decodes a token at a time).  encode_batch_fast
# (tokenizers >= 0.21) skips the offsets nobody here reads, which makes it faster than encode.
_RELEASE_GIL_ABOVE = 16384


def special_token_text(value: object) -> str | None:
    """tokenizer_config.json spells special tokens as a string or as an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


@dataclass(frozen=True)
class _TextTokenizer:
    """A tokenizer that recognises no control token (`Tokenizer._text_backend`)."""

    backend: _HFTokenizer
    moved: dict[int, int]  # its id -> the checkpoint's, for added tokens that are text

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        out = [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]
        if self.moved:
            out = [[self.moved.get(i, i) for i in ids] for ids in out]
        return out


def is_control_token(token: AddedToken) -> bool:
    """Special tokens, and added tokens spelled with markup characters (`<think>`, `<｜User｜>`,
    `｜DSML｜`, `[gMASK]`, `/nothink`): the chat format's vocabulary, non-special ones included
    (DeepSeek's turn markers and Qwen's `<tool_call>` are not "special").  An added token made of
    letters, digits and whitespace only (the runs of spaces some tokenizers add) is text."""
    return bool(token.special) or any(not (c.isalnum() or c.isspace()) for c in token.content)


def _trie_pattern(words: Iterable[str]) -> str:
    """A regex matching the longest of `words` at the leftmost place, as the tokenizers
    library matches added tokens; nested by common prefix so a scan costs about one test per
    character (an alternation of ~1300 literals would try every one at every `<`)."""
    trie: dict = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict) -> str:
        alts = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return build(trie)


class ControlTokens:
    """The control tokens of one tokenizer: where they occur in a text, and their ids."""

    def __init__(self, backend: _HFTokenizer) -> None:
        added = backend.get_added_tokens_decoder()
        self.tokens: dict[str, AddedToken] = {t.content: t for t in added.values() if is_control_token(t)}
        self.ids: dict[str, int] = {t.content: i for i, t in added.items() if t.content in self.tokens}
        self._pattern = re.compile(_trie_pattern(self.tokens)) if self.tokens else None

    def find(self, text: str) -> list[tuple[int, int]]:
        """(start, end) of every control-token spelling in `text`, leftmost-longest."""
        if self._pattern is None:
            return []
        return [m.span() for m in self._pattern.finditer(text)]

    def markers(self, text: str) -> Iterator[tuple[int, int, int]]:
        """(start, end, id) of the tokens the tokenizers library would read in `text`: an
        lstrip/rstrip token takes the whitespace beside it, a single_word one needs word
        boundaries."""
        for start, end in self.find(text):
            token = self.tokens[text[start:end]]
            if token.single_word and ((start > 0 and text[start - 1].isalnum())
                                      or (end < len(text) and text[end].isalnum())):
                continue
            lo, hi = start, end
            if token.lstrip:
                while lo > 0 and text[lo - 1].isspace():
                    lo -= 1
            if token.rstrip:
                while hi < len(text) and text[hi].isspace():
                    hi += 1
            yield lo, hi, self.ids[token.content]


@dataclass
class Tokenizer:
    """A loaded tokenizer plus the bits of tokenizer_config.json the gateway needs."""

    backend: _HFTokenizer
    bos_token: str | None = None
    eos_token: str | None = None
    chat_template: str | None = None
    config: dict = field(default_factory=dict)

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        folder = Path(path)
        tok_file = folder / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{tok_file}: no tokenizer.json in the checkpoint folder")
        backend = _HFTokenizer.from_file(str(tok_file))
        config: dict = {}
        cfg_file = folder / "tokenizer_config.json"
        if cfg_file.is_file():
            config = json.loads(cfg_file.read_text(encoding="utf-8"))
        template = config.get("chat_template")
        template_file = folder / "chat_template.jinja"
        if template_file.is_file():
            template = template_file.read_text(encoding="utf-8")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        return cls(
            backend=backend,
            bos_token=special_token_text(config.get("bos_token")),
            eos_token=special_token_text(config.get("eos_token")),
            chat_template=template if isinstance(template, str) else None,
            config=config,
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Trusted prompt text to ids: every added token written in it maps to its single id
        (a raw completions prompt, whose writer chose its markers).  No BOS is added here: the
        encoders write it themselves.  Chat prompts go through `encode_prompt`."""
        if len(text) > _RELEASE_GIL_ABOVE:
            batch = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
            return batch([text], add_special_tokens=False)[0].ids
        return self.backend.encode(text, add_special_tokens=False).ids

    @cached_property
    def control(self) -> ControlTokens:
        return ControlTokens(self.backend)

    def find_control(self, text: str) -> list[tuple[int, int]]:
        """Where `text` spells a control token (the scanner gateway.chat.untrusted uses)."""
        return self.control.find(text)

    def encode_text(self, text: str) -> list[int]:
        """Untrusted text to ids with no control token recognised: `<｜User｜>` is the
        characters, as the model reads a pasted file that contains them."""
        return self._text_backend.encode_batch([text])[0]

    def encode_prompt(self, prompt: PromptText) -> list[int]:
        """A rendered chat prompt to ids: the markers its template wrote are control tokens,
        the client's text is text.  A prompt whose client text spells no control token (nearly
        all) is exactly `encode(prompt.text)`."""
        if not prompt.placeholders:
            return self.encode(prompt.text)
        return self.encode_marked(prompt.neutral, prompt.restore)

    def encode_marked(self, text: str, restore: Callable[[str], str] = str) -> list[int]:
        """`text` split at its control tokens (ids), each stretch between them turned back into
        client text by `restore` and tokenised with none recognised.  For text without
        placeholders this equals `encode(text)`: the library splits at added tokens first too."""
        layout: list[int | str] = []
        pos = 0
        for start, end, token_id in self.control.markers(text):
            if start > pos:
                layout.append(restore(text[pos:start]))
            layout.append(token_id)
            pos = end
        if pos < len(text):
            layout.append(restore(text[pos:]))
        encoded = iter(self._text_backend.encode_batch([item for item in layout if isinstance(item, str)]))
        ids: list[int] = []
        for item in layout:
            if isinstance(item, str):
                ids.extend(next(encoded))
            else:
                ids.append(item)
        return ids

    @cached_property
    def _text_backend(self) -> _TextTokenizer:
        """The same tokenizer without its control tokens.  `encode(add_special_tokens=False)`
        still matches added tokens, and `encode_special_tokens` only skips the special ones,
        so they are left out of a second tokenizer.  It shares the model, normalizer and
        pre-tokenizer objects (no copy of the vocabulary); an added token that is text and
        lands on another id there (its spelling is also in the vocabulary) is mapped back."""
        with _TEXT_BACKEND_LOCK:
            cached = self.__dict__.get("_text_backend")
            if cached is not None:
                return cached
            control = self.control.tokens
            kept = {i: t for i, t in self.backend.get_added_tokens_decoder().items() if t.content not in control}
            text = _HFTokenizer(self.backend.model)
            for part in ("normalizer", "pre_tokenizer", "decoder"):
                value = getattr(self.backend, part)
                if value is not None:
                    setattr(text, part, value)
            text.add_tokens(list(kept.values()))
            moved = {text.token_to_id(t.content): i for i, t in kept.items() if text.token_to_id(t.content) != i}
            return _TextTokenizer(text, moved)

    def hidden_ids(self, shown_markup: Iterable[str]) -> frozenset[int]:
        """Control tokens to leave out of generated text: all but those spelling part of
        `shown_markup` (the think tags and call markup the output parser reads, and hides)."""
        markup = tuple(shown_markup)
        return frozenset(i for text, i in self.control.ids.items() if not any(text in m for m in markup))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        if len(ids) > _RELEASE_GIL_ABOVE:
            return self.backend.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_id(self, text: str) -> int | None:
        return self.backend.token_to_id(text)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)


_TEXT_BACKEND_LOCK = threading.Lock()


class IncrementalDecoder:
    """Turns a growing list of ids into text pieces that never split a UTF-8 character.

    Decoding each token alone loses the spaces and merges that depend on neighbours, so the
    piece is the difference between decoding a short window before and after the new token.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False,
                 hidden: frozenset[int] = frozenset()) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._hidden = hidden  # ids that give no text (generated control tokens)
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window
        self._read = 0  # ids before this are already released as text

    def push(self, token_id: int) -> str:
        if token_id in self._hidden:
            return ""
        self._ids.append(token_id)
        prefix_text = self._tok.decode(self._ids[self._prefix:self._read], self._skip)
        full_text = self._tok.decode(self._ids[self._prefix:], self._skip)
        if full_text.endswith("\ufffd") or len(full_text) <= len(prefix_text):
            return ""
        self._prefix = self._read
        self._read = len(self._ids)
        return full_text[len(prefix_text):]

    def flush(self) -> str:
        """Releases whatever is held (an incomplete character at the end of generation)."""
        if self._read == len(self._ids):
            return ""
        prefix_text = self._tok.decode(self._ids[self._prefix:self._read], self._skip)
        full_text = self._tok.decode(self._ids[self._prefix:], self._skip)
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text):]
