"""`python -m gateway --model FILE.gguf` end to end: a tiny Qwen3-MoE checkpoint converted to one
Q8_0 GGUF file (tools/ckpt/gguf_file.py, tokenizer metadata by tools/ckpt/gguf_vocab.py) is served,
and the official openai SDK gets a chat answer whose prompt the file's own tokenizer and
template produced exactly as the folder's would."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.families import load_chat_setup
from gateway.tokenizer import Tokenizer

pytest_plugins = ["server_fixtures"]

HI = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi! 東京 🙂 12345"}]


def test_serves_a_tiny_gguf_with_the_openai_sdk(build_checkpoint, tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    gguf_file = pytest.importorskip("tools.ckpt.gguf_file")  # the full-model writer
    from server_fixtures import start_server, stop_server

    ckpt = build_checkpoint("qwen3_moe", "bf16")
    path = gguf_file.write_gguf(ckpt, tmp_path / "tiny-qwen3.gguf", default="Q8_0")  # a quantised file
    folder_prompt = load_chat_setup(ckpt).encode(HI)
    expected_tokens = len(Tokenizer.from_dir(ckpt).encode_prompt(folder_prompt.prompt))

    server = start_server(path)
    try:
        log = server.log()
        assert str(path) in log and "chat format qwen3" in log, log
        assert re.search(r"file +GGUF v3, .*Q8_0 x\d+", log), log  # the file's weight types
        client = openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list()] == ["tiny-qwen3"]
        reply = client.chat.completions.create(model="tiny-qwen3", messages=HI, max_tokens=4, seed=1)
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.prompt_tokens == expected_tokens
        assert 1 <= reply.usage.completion_tokens <= 4
    finally:
        stop_server(server)


def test_split_set_is_read_from_its_first_part(build_checkpoint, tmp_path: Path) -> None:
    """A split set: tokenizer and template come from the first part (the only one holding the
    metadata), the summary counts every part's tensors, the id drops -00001-of-0000N."""
    gguf_file = pytest.importorskip("tools.ckpt.gguf_file")
    from gateway.server.serve import _gguf_summary, default_model_id, load_tokenizer_and_chat

    ckpt = build_checkpoint("glm4_moe", "bf16")
    first = gguf_file.write_gguf(ckpt, tmp_path / "tiny-glm.gguf", split_max_tensors=40)
    parts = sorted(tmp_path.glob("tiny-glm-*-of-*.gguf"))
    assert len(parts) > 1 and first == parts[0]
    tokenizer, chat, stops = load_tokenizer_and_chat(first)
    assert chat.format == "glm45" and stops
    assert tokenizer.encode(HI[1]["content"]) == Tokenizer.from_dir(ckpt).encode(HI[1]["content"])
    n_tensors = sum(int(n) for n in re.findall(r" x(\d+)", _gguf_summary(str(first))))
    assert f"in {len(parts)} parts" in _gguf_summary(str(first)) and n_tensors > 40
    assert default_model_id(first) == "tiny-glm"
