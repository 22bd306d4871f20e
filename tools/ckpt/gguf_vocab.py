"""The `tokenizer.ggml.*` metadata of a GGUF file, written from a checkpoint's tokenizer files the
way llama.cpp's converter writes it (test side: needs the `gguf` package of the test extra).

    add_tokenizer_metadata(writer, tokenizer_dir, pre=None, vocab_size=None)  # pre: from config.json
    write_tokenizer_gguf(path, tokenizer_dir, pre=..., arch=...)   # tokenizer-only test file

What the converter does, and so what this does:
- tokens in id order over the whole embedding (config.json vocab_size), holes filled with
  `[PAD{i}]` UNUSED tokens; added tokens in place, CONTROL when special or spelled like a
  special token (`<|...|>`, `<｜...｜>`), USER_DEFINED otherwise, both stored normalised (the
  text they encode from, not their byte-level spelling);
- merges as "a b" strings; bos/eos/pad/unk ids from tokenizer_config.json's spellings (falling
  back to config.json's ids); add_bos/add_eos; the chat template;
- `tokenizer.ggml.pre`: the converter finds it by hashing the encoding of a probe text; here it
  is the caller's, or `PRE_NAMES` of config.json's model_type (the family is known).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


def _special_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def looks_special(text: str) -> bool:
    # The converter's rule for added tokens a checkpoint forgot to mark special.
    return (text in ("<pad>", "<mask>") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>")))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def vocab_lists(tokenizer_dir: Path, vocab_size: int | None = None) -> tuple[list[str], list[int]]:
    """(tokens, token types) in id order, as the converter lists them."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
    if vocab_size is None:
        vocab_size = _read_json(tokenizer_dir / "config.json").get("vocab_size") or max(vocab.values()) + 1
    reverse = {i: t for t, i in vocab.items()}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        text = reverse.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        if i in added:
            entry = added[i]
            if not entry.normalized:  # store what the text encodes from
                text = tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)
            if entry.special or looks_special(text):
                types.append(CONTROL)
            else:
                types.append(USER_DEFINED)
                text = text.replace("\u2581", " ")
        else:
            types.append(NORMAL)
        tokens.append(text)
    return tokens, types


def _merges(tokenizer_dir: Path) -> list[str]:
    merges = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]["merges"]
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def _chat_template(tokenizer_dir: Path, tokenizer_config: dict[str, Any]) -> str | None:
    jinja = tokenizer_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    value = tokenizer_config.get("chat_template")
    return value if isinstance(value, str) else None


_FROM_FOLDER: Any = object()

# config.json model_type -> the tokenizer.ggml.pre llama.cpp's converter finds for the family.
PRE_NAMES = {"qwen3_moe": "qwen2", "qwen3": "qwen2", "qwen3_5_moe": "qwen35", "glm4_moe": "glm4",
             "glm4_moe_lite": "glm4", "deepseek_v3": "deepseek-v3", "deepseek_v4": "joyai-llm"}


def pre_name(tokenizer_dir: str | Path) -> str:
    """The pre-tokenizer name for the checkpoint in `tokenizer_dir`, from its config.json."""
    model_type = _read_json(Path(tokenizer_dir) / "config.json").get("model_type")
    if model_type not in PRE_NAMES:
        raise ValueError(f"{tokenizer_dir}: no tokenizer.ggml.pre known for model_type {model_type!r}")
    return PRE_NAMES[model_type]


def add_tokenizer_metadata(writer: Any, tokenizer_dir: str | Path, pre: str | None = None,
                           vocab_size: int | None = None,
                           chat_template: str | None = _FROM_FOLDER) -> None:
    """Add the `tokenizer.*` keys of the checkpoint in `tokenizer_dir` (tokenizer.json,
    tokenizer_config.json, optional config.json / chat_template.jinja) to a gguf.GGUFWriter.
    `pre`: the pre-tokenizer name (default: `pre_name`, from config.json's model_type);
    `vocab_size`: the embedding's rows (default: config.json's, else the tokenizer's size);
    `chat_template`: written instead of the folder's (None: no template key)."""
    folder = Path(tokenizer_dir)
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    config = _read_json(folder / "config.json")
    pre = pre or pre_name(folder)
    tokens, types = vocab_lists(folder, vocab_size)
    ids = {t: i for i, t in reversed(list(enumerate(tokens)))}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(_merges(folder))
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("pad", writer.add_pad_token_id), ("unk", writer.add_unk_token_id)):
        text = _special_text(tokenizer_config.get(f"{key}_token"))
        tid = ids.get(text) if text is not None else None
        if tid is None:
            fallback = config.get(f"{key}_token_id")
            tid = fallback[0] if isinstance(fallback, list) and fallback else fallback
        if isinstance(tid, int):
            add(tid)
    if pre == "glm4":  # the GLM converter's extra ids: [gMASK] as BOS, end of turn / of message
        for key, text in (("bos", "[gMASK]"), ("eot", "<|user|>"), ("eom", "<|observation|>")):
            if text in ids:
                writer.add_uint32(f"tokenizer.ggml.{key}_token_id", ids[text])
    for key in ("add_bos_token", "add_eos_token"):
        if isinstance(tokenizer_config.get(key), bool):
            writer.add_bool(f"tokenizer.ggml.{key}", tokenizer_config[key])
    template = _chat_template(folder, tokenizer_config) if chat_template is _FROM_FOLDER else chat_template
    if template is not None:
        writer.add_chat_template(template)


def write_tokenizer_gguf(path: str | Path, tokenizer_dir: str | Path, pre: str, arch: str = "qwen3moe",
                         vocab_size: int | None = None, name: str | None = None,
                         chat_template: str | None = _FROM_FOLDER) -> Path:
    """A GGUF holding the tokenizer of `tokenizer_dir` and one tiny dummy tensor (no model): enough
    for tokenizer and chat-format tests."""
    import gguf

    out = Path(path)
    writer = gguf.GGUFWriter(str(out), arch)
    if name:
        writer.add_name(name)
    add_tokenizer_metadata(writer, tokenizer_dir, pre, vocab_size, chat_template)
    writer.add_tensor("dummy", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
