"""A small byte-level BPE tokenizer per model family, trained on built-in text.

Byte-level means every string can be encoded (unknown characters fall back to bytes). The
family's special tokens are appended as added tokens after the learned vocabulary, in the same
order as the real tokenizer, so their relative layout (and which ones are "special") matches
the real checkpoints even though the absolute ids are small. Training is deterministic: the
same inputs give byte-identical tokenizer.json files.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from .common import write_json

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
MIN_LEARNED_TOKENS = 256 + 16  # the byte alphabet plus a few merges

# The split regex of the Qwen2/Qwen3 and GLM-4.5 tokenizers (contractions, letters, digits,
# punctuation runs, newlines, spaces); GLM groups digits in threes.
QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
GLM_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


@dataclass(frozen=True)
class AddedSpec:
    content: str
    special: bool  # special tokens are dropped by decode(skip_special_tokens=True); markup tags are not


def _added(names: str, special: bool) -> list[AddedSpec]:
    return [AddedSpec(name, special) for name in names.split()]


# Order follows the real added-token lists (Qwen: 151643 + index; GLM-4.5: 151329 + index).
QWEN_ADDED: list[AddedSpec] = (
    _added(
        "<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> <|box_start|> "
        "<|box_end|> <|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> <|vision_pad|> "
        "<|image_pad|> <|video_pad|>",
        True,
    )
    + _added("<tool_call> </tool_call> <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> <|file_sep|>", False)
    + _added("<tool_response> </tool_response> <think> </think>", False)
)
GLM_ADDED: list[AddedSpec] = _added(
    "<|endoftext|> [MASK] [gMASK] [sMASK] <sop> <eop> <|system|> <|user|> <|assistant|> <|observation|> "
    "<|begin_of_image|> <|end_of_image|> <|begin_of_video|> <|end_of_video|> <|begin_of_audio|> "
    "<|end_of_audio|> <|begin_of_transcription|> <|end_of_transcription|> <|code_prefix|> "
    "<|code_middle|> <|code_suffix|>",
    True,
) + _added(
    "<think> </think> <tool_call> </tool_call> <tool_response> </tool_response> <arg_key> </arg_key> "
    "<arg_value> </arg_value> /nothink",
    False,
)


@dataclass(frozen=True)
class Family:
    name: str
    split_regex: str
    added: list[AddedSpec]
    template_file: str
    tokenizer_class: str
    eos_token: str
    pad_token: str
    stop_tokens: tuple[str, ...]  # generation_config eos_token_id list, in the real order
    model_max_length: int


FAMILIES = {
    "qwen3": Family("qwen3", QWEN_SPLIT, QWEN_ADDED, "Qwen3.jinja", "Qwen2Tokenizer", "<|im_end|>", "<|endoftext|>",
                    ("<|im_end|>", "<|endoftext|>"), 131072),
    "glm4": Family("glm4", GLM_SPLIT, GLM_ADDED, "GLM-4.5.jinja", "PreTrainedTokenizerFast", "<|endoftext|>",
                   "<|endoftext|>", ("<|endoftext|>", "<|user|>", "<|observation|>"), 128000),
}

TRAINING_TEXT = r'''
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
It was a bright cold day in April, and the clocks were striking thirteen. Call me Ishmael.
The weather in Zurich is sunny today, with a high of 21 degrees and a light wind from the west.
Please summarise the following document in three sentences and list the key decisions.
You are a helpful assistant. Answer the user's question truthfully and concisely.
Here is what I found: the function returns None when the list is empty, so the caller must check it.
Mixture-of-experts models route each token to a few experts; the router picks the top-k scores.
Hello! How can I help you today? Sure, here is an example. Thanks, that works perfectly.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2048 65536 3.14159 2.71828 -17 1e-5 0x7f.
Dates and times: 2025-09-29T12:30:00Z, Monday, 14:05, 9 am, 31/12/2024.
Questions, answers; lists: apples, pears, plums. "Quoted text" and 'single quotes' (parentheses) [brackets] {braces}.
Über, café, naïve, Zürich, São Paulo, Kraków, 東京, 北京, Москва, Αθήνα, emoji 🙂 and symbols ± × ÷ → ≤ ≥ €.

def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Cache:
    def __init__(self, capacity: int = 128) -> None:
        self.capacity = capacity
        self.items: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.items.get(key)

    def put(self, key: str, value: bytes) -> None:
        if len(self.items) >= self.capacity:
            self.items.pop(next(iter(self.items)))
        self.items[key] = value


import json, os, sys
from pathlib import Path

if __name__ == "__main__":
    data = json.loads(Path(sys.argv[1]).read_text())
    print(f"{len(data)} records, first: {data[0]!r}")

static inline float dot(const float *a, const float *b, size_t n) {
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s FILE\n", argv[0]); return 1; }
    return 0;
}

function greet(name) { return `Hello, ${name}!`; }
const result = await fetch("/v1/chat/completions", { method: "POST", body: JSON.stringify(payload) });

SELECT id, name, created_at FROM users WHERE active = 1 ORDER BY created_at DESC LIMIT 10;

$ ls -la /tmp && cat README.md | grep -i error
git commit -m "Fix the off-by-one error in the tokenizer"

{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3, "unit": "celsius"}}
{"type": "function", "function": {"name": "search", "description": "Search the web", "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["query"]}}}
[{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]
{"id": "chatcmpl-123", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": null, "tool_calls": []}}], "usage": {"prompt_tokens": 12, "completion_tokens": 7}}
{"ok": true, "value": null, "items": [1, 2.5, "three", false], "nested": {"a": {"b": {"c": []}}}}
'''


def training_corpus() -> list[str]:
    """Built-in text plus both chat templates (so markup they produce gets compact tokens)."""
    paragraphs = [block for block in TRAINING_TEXT.split("\n\n") if block.strip()]
    templates = [(TEMPLATE_DIR / family.template_file).read_text(encoding="utf-8") for family in FAMILIES.values()]
    # Repeat the prose a few times so frequent words become single tokens before rare byte pairs.
    return paragraphs * 4 + templates


def build_tokenizer(family: Family, total_size: int, corpus: Iterable[str] | None = None) -> Tokenizer:
    """Train a byte-level BPE of `total_size - len(added)` entries (on `corpus`, by default the
    built-in text) and append the added tokens."""
    learned_size = total_size - len(family.added)
    if learned_size < MIN_LEARNED_TOKENS:
        raise ValueError(f"tokenizer size {total_size} too small: {len(family.added)} added tokens + 256 bytes + merges")
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(family.split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=learned_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(training_corpus() if corpus is None else corpus, trainer=trainer)
    tokenizer.add_tokens(
        [AddedToken(spec.content, special=spec.special, normalized=False, single_word=False, lstrip=False, rstrip=False)
         for spec in family.added]
    )
    return tokenizer


@dataclass(frozen=True)
class TokenizerFiles:
    size: int  # number of ids the tokenizer can produce (config vocab_size is this, padded)
    ids: dict[str, int]  # id of every added token


def write_tokenizer(out_dir: Path, family: Family, total_size: int,
                    corpus: Iterable[str] | None = None) -> TokenizerFiles:
    """Write tokenizer.json and tokenizer_config.json (with the family's chat template)."""
    tokenizer = build_tokenizer(family, total_size, corpus)
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=True)
    ids = {spec.content: tokenizer.token_to_id(spec.content) for spec in family.added}
    chat_template = (TEMPLATE_DIR / family.template_file).read_text(encoding="utf-8")
    added_decoder = {
        str(ids[spec.content]): {
            "content": spec.content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": spec.special,
        }
        for spec in family.added
    }
    config: dict[str, object] = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_decoder,
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": family.eos_token,
        "errors": "replace",
        "model_max_length": family.model_max_length,
        "pad_token": family.pad_token,
        "split_special_tokens": False,
        "tokenizer_class": family.tokenizer_class,
        "unk_token": None,
    }
    if family.name == "qwen3":
        config["additional_special_tokens"] = [spec.content for spec in family.added if spec.special][1:]
    write_json(out_dir / "tokenizer_config.json", config)
    return TokenizerFiles(size=tokenizer.get_vocab_size(with_added_tokens=True), ids=ids)


def load_added_ids(out_dir: Path) -> dict[str, int]:
    """Ids of the added tokens of a written tokenizer.json (used by tests)."""
    data = json.loads((out_dir / "tokenizer.json").read_text(encoding="utf-8"))
    return {entry["content"]: entry["id"] for entry in data["added_tokens"]}
