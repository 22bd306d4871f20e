"""The tokenizer and chat inputs of a GGUF file, rebuilt from its `tokenizer.ggml.*` metadata.

A GGUF carries no tokenizer.json: llama.cpp's converter stores the vocabulary (tokens in id
order, a type per token), the BPE merges as "a b" strings, special ids, the chat template and
`tokenizer.ggml.pre`, a *name* for the pre-tokenizer whose regexes live in llama.cpp's source.
This module turns that back into a `tokenizers.Tokenizer`, so the rest of the gateway (prompt
encoding, control tokens, structured output's token trie) sees the same object as for a folder:

- byte-level BPE from the NORMAL tokens and the merges;
- the pre-tokenizer from our own table `PRE_TOKENIZERS` (pre name -> normalizer + Split regexes,
  then ByteLevel); an unknown name is an error naming it, since a wrong split silently changes
  every prompt's ids;
- CONTROL tokens as special added tokens, USER_DEFINED ones as (non-special) added tokens, both
  stored by the converter already normalised, so matched on the raw text;
- UNUSED `[PAD{i}]` fillers kept in the vocabulary so every later id stays where it was.

Metadata is read with the strict C reader (`gateway._core.gguf_inspect`); the `gguf` package is
a test-only dependency.  docs/reference/gguf.md §5 lists the keys.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from .tokenizer import Tokenizer

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# general.architecture -> the config.json model_type the chat families recognise, so a file and
# the folder it was converted from pick the same family (families.detect_format).
ARCH_MODEL_TYPES: dict[str, str] = {
    "qwen3moe": "qwen3_moe",
    "qwen3": "qwen3",
    "qwen35moe": "qwen3_5_moe",
    "qwen35": "qwen3_5",
    "glm4moe": "glm4_moe",
    "deepseek4": "deepseek_v4",
    "deepseek2": "deepseek_v3",
}


class GGUFTokenizerError(ValueError):
    """A GGUF whose tokenizer metadata cannot be rebuilt (missing keys, unknown pre-tokenizer)."""


@dataclass(frozen=True)
class PreTokenizer:
    """How one `tokenizer.ggml.pre` name splits text before BPE: an optional Unicode normaliser
    and Split regexes applied in order (each pass splits the pieces of the previous one, as
    llama.cpp runs its regex list), then ByteLevel without its own regex."""

    splits: tuple[str, ...]
    normalizer: str | None = None  # "NFC" or None
    drop_bos: bool = False  # llama.cpp ignores the file's BOS id for this name (GLM)


# The Qwen2 split (contractions, letters with one leading non-letter, single digits, punctuation
# runs with their newlines, newline runs, spaces); as the HF tokenizer.json spells it, which the
# tokenizers library's regex engine takes as is (llama.cpp rewrites the (?i:...) for its own).
_QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# Qwen3.5: letters take their combining marks (\p{M}) along.
_QWEN35 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# GLM-4.x: the same with digits grouped by up to three.
_GLM4 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# DeepSeek-V3/V4: three passes.  Digits by up to three, then runs of CJK ideographs and kana, then
# the general rule (an ASCII punctuation mark glued to the Latin word after it, letters with marks,
# punctuation/symbol runs, newlines, spaces).  Separate passes, not one alternation: in one
# alternation the optional leading character of the letter rule could swallow the space before
# a CJK run.
_DEEPSEEK3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+""",
)

# Names as llama.cpp's converter writes them (its llama-vocab.cpp maps each to a regex list).
# NFC where the Hugging Face tokenizer.json of the family normalises (Qwen, GLM); DeepSeek's has
# an empty normaliser.  llama.cpp normalises nothing, so text that is not already NFC is the one
# place the two runtimes may differ; we follow the checkpoint's own tokenizer.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "qwen2": PreTokenizer((_QWEN2,), "NFC"),
    "qwen35": PreTokenizer((_QWEN35,), "NFC"),
    "glm4": PreTokenizer((_GLM4,), "NFC", drop_bos=True),
    "deepseek-v3": PreTokenizer(_DEEPSEEK3),
    "joyai-llm": PreTokenizer(_DEEPSEEK3),  # DeepSeek-V4's converter names its split this way
}


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer and chat metadata of one GGUF file."""

    path: Path
    architecture: str
    name: str  # general.name ("" when absent)
    model: str  # tokenizer.ggml.model
    pre: str
    tokens: Sequence[str]
    token_types: Sequence[int]
    merges: Sequence[str]
    special_ids: Mapping[str, int] = field(default_factory=dict)  # bos, eos, eot, eom, padding, unknown
    add_bos: bool = False
    add_eos: bool = False
    chat_template: str | None = None

    def token_text(self, kind: str) -> str | None:
        """The spelling of a special token (`kind`: bos, eos, padding, ...), None if unset."""
        tid = self.special_ids.get(kind)
        if tid is None or not 0 <= tid < len(self.tokens):
            return None
        return self.tokens[tid]

    @property
    def model_type(self) -> str:
        """The config.json model_type this architecture corresponds to (the name itself when
        unknown, so detection falls back to the template)."""
        return ARCH_MODEL_TYPES.get(self.architecture, self.architecture)


_SPECIAL_KEYS = ("bos", "eos", "eot", "eom", "padding", "unknown")


def _string_list(meta: Mapping[str, Any], key: str, path: Path) -> list[str]:
    value = meta.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise GGUFTokenizerError(f"{path}: {key} is missing or not an array of UTF-8 strings")
    return value


def read_vocab(path: str | os.PathLike[str]) -> GGUFVocab:
    """Read the tokenizer metadata of `path` with the C reader (ValueError for a file it refuses)."""
    from . import _core

    file = Path(path)
    meta = _core.gguf_inspect(str(file))["metadata"]
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFTokenizerError(f"{file}: tokenizer.ggml.model is {model!r}; only byte-level BPE ('gpt2') "
                                 "vocabularies are supported")
    tokens = _string_list(meta, "tokenizer.ggml.tokens", file)
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        types = [NORMAL] * len(tokens)
    if not isinstance(types, list) or len(types) != len(tokens):
        raise GGUFTokenizerError(f"{file}: tokenizer.ggml.token_type does not give one type per token")
    special = {k: int(meta[f"tokenizer.ggml.{k}_token_id"]) for k in _SPECIAL_KEYS
               if isinstance(meta.get(f"tokenizer.ggml.{k}_token_id"), int)}
    template = meta.get("tokenizer.chat_template")
    return GGUFVocab(
        path=file, architecture=str(meta.get("general.architecture", "")), name=str(meta.get("general.name", "")),
        model=model, pre=str(meta.get("tokenizer.ggml.pre", "")), tokens=tokens, token_types=types,
        merges=_string_list(meta, "tokenizer.ggml.merges", file),
        special_ids=special, add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=template if isinstance(template, str) else None)


def pre_tokenizer(name: str, where: str = "") -> PreTokenizer:
    """The table entry for a `tokenizer.ggml.pre` name; `where` (the file) prefixes the error."""
    try:
        return PRE_TOKENIZERS[name]
    except KeyError:
        shown = repr(name) if name else "missing"
        prefix = f"{where}: " if where else ""
        raise GGUFTokenizerError(f"{prefix}tokenizer.ggml.pre {shown}: no pre-tokenizer known for it "
                                 f"(known: {', '.join(sorted(PRE_TOKENIZERS))})") from None


_BYTE_LEVEL = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def tokenizer_json(vocab: GGUFVocab) -> dict[str, Any]:
    """The tokenizer.json document equivalent to the file's metadata."""
    pre = pre_tokenizer(vocab.pre, str(vocab.path))
    model_vocab: dict[str, int] = {}
    added: list[dict[str, Any]] = []
    for tid, (text, kind) in enumerate(zip(vocab.tokens, vocab.token_types, strict=True)):
        if kind in (CONTROL, USER_DEFINED):
            added.append({"id": tid, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": kind == CONTROL})
        # Added tokens go in the model's vocabulary too: the tokenizers library ignores their
        # "id" and numbers any it cannot find there after the vocabulary, which shifts them (a
        # control token at id 0 would land at the end).  BPE never produces them, no merge leads
        # there.  A spelling seen twice keeps its first id (a map cannot hold both); the later id
        # then decodes to nothing, as in llama.cpp's own token-to-id map.
        model_vocab.setdefault(text, tid)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": pre.normalizer} if pre.normalizer else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            *({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
              for regex in pre.splits),
            {"type": "ByteLevel", **_BYTE_LEVEL},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **_BYTE_LEVEL},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": model_vocab, "merges": list(vocab.merges)},
    }


def build_tokenizer(vocab: GGUFVocab) -> Tokenizer:
    """The gateway Tokenizer for a read vocabulary."""
    pre = pre_tokenizer(vocab.pre, str(vocab.path))
    try:
        backend = _HFTokenizer.from_str(json.dumps(tokenizer_json(vocab), ensure_ascii=False))
    except Exception as exc:  # the tokenizers library raises its own exception type
        raise GGUFTokenizerError(f"{vocab.path}: the tokenizer metadata does not form a BPE tokenizer ({exc})") from None
    bos = None if pre.drop_bos else vocab.token_text("bos")
    eos = vocab.token_text("eos")
    # The folder path keeps tokenizer_config.json here; the same keys, so code reading them
    # (special-token template variables) treats both alike.
    config: dict[str, Any] = {"add_bos_token": vocab.add_bos and bos is not None, "add_eos_token": vocab.add_eos,
                              "bos_token": bos, "eos_token": eos, "pad_token": vocab.token_text("padding"),
                              "unk_token": vocab.token_text("unknown")}
    if vocab.chat_template is not None:
        config["chat_template"] = vocab.chat_template
    return Tokenizer(backend=backend, bos_token=bos, eos_token=eos, chat_template=vocab.chat_template, config=config)


def tokenizer_from_gguf(path: str | os.PathLike[str]) -> Tokenizer:
    return build_tokenizer(read_vocab(path))


def stop_token_ids(vocab: GGUFVocab) -> list[int]:
    """The ids that end a turn by the file's own account: EOS, and the end-of-turn /
    end-of-message ids the converter sets for some families (GLM's <|user|>, <|observation|>),
    the role a folder's generation_config.json eos_token_id list plays."""
    return [vocab.special_ids[k] for k in ("eos", "eot", "eom") if k in vocab.special_ids]


def chat_inputs(vocab: GGUFVocab) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(config, tokenizer_config, chat_template) as families.load_chat_setup reads them from a
    folder: the model_type from the architecture, the special tokens' spellings, the template."""
    config = {"model_type": vocab.model_type, "_name_or_path": vocab.name}
    pre = PRE_TOKENIZERS.get(vocab.pre)
    tokenizer_config = {key: text for key, kind in (("bos_token", "bos"), ("eos_token", "eos"),
                                                    ("pad_token", "padding"), ("unk_token", "unknown"))
                        if (text := vocab.token_text(kind)) is not None
                        and not (kind == "bos" and pre is not None and pre.drop_bos)}
    return config, tokenizer_config, vocab.chat_template
