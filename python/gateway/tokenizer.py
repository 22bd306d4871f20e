"""Checkpoint tokenizers: tokenizer.json through the `tokenizers` library, as real checkpoints ship.

Also the incremental detokenizer used while streaming: byte-level BPE tokens can split a UTF-8
character, so text is released only once it decodes without a trailing replacement character.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

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
        """Prompt text to ids.  Special tokens written in the text (from the chat encoder) map
        to their single ids; no BOS is added here: the encoders write it themselves."""
        if len(text) > _RELEASE_GIL_ABOVE:
            batch = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
            return batch([text], add_special_tokens=False)[0].ids
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        if len(ids) > _RELEASE_GIL_ABOVE:
            return self.backend.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_id(self, text: str) -> int | None:
        return self.backend.token_to_id(text)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)


class IncrementalDecoder:
    """Turns a growing list of ids into text pieces that never split a UTF-8 character.

    Decoding each token alone loses the spaces and merges that depend on neighbours, so the
    piece is the difference between decoding a short window before and after the new token.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window
        self._read = 0  # ids before this are already released as text

    def push(self, token_id: int) -> str:
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
