"""--model given a folder that holds a GGUF model, as downloading one quant of a GGUF repository
leaves it: the folder stands for its one model (a split set by its first part, one folder down
too), vision projectors beside it are not models, several quants are refused by name, and a
checkpoint folder (config.json) stays a checkpoint folder."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.model_path import ModelPathError, gguf_models_in, resolve_model_path

REPO_ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["server_fixtures"]


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    return path


def test_one_file_in_the_folder(tmp_path: Path) -> None:
    model = touch(tmp_path / "Qwen3-30B-A3B-Q4_K_M.gguf")
    touch(tmp_path / "mmproj-F16.gguf")  # a vision projector, not a model we serve
    (tmp_path / "README.md").write_text("card")
    assert resolve_model_path(tmp_path) == model


def test_split_set_one_folder_down(tmp_path: Path) -> None:
    parts = [touch(tmp_path / "Q4_K_M" / f"GLM-4.5-Air-Q4_K_M-{k:05d}-of-00003.gguf") for k in (1, 2, 3)]
    touch(tmp_path / ".cache" / "huggingface" / "x.gguf")  # a download tool's own files
    assert gguf_models_in(tmp_path) == [parts[0]]
    assert resolve_model_path(tmp_path) == parts[0]


def test_several_models_are_named(tmp_path: Path) -> None:
    touch(tmp_path / "m-Q4_K_M.gguf")
    touch(tmp_path / "Q8_0" / "m-Q8_0-00001-of-00002.gguf")
    touch(tmp_path / "Q8_0" / "m-Q8_0-00002-of-00002.gguf")
    with pytest.raises(ModelPathError, match=r"holds 2 GGUF models.*: Q8_0/m-Q8_0-00001-of-00002\.gguf, m-Q4_K_M\.gguf$"):
        resolve_model_path(tmp_path)
    from gateway.engine import Engine, EngineError
    with pytest.raises(EngineError, match="holds 2 GGUF models"):
        Engine(str(tmp_path))


def test_paths_that_stay_as_given(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    touch(tmp_path / "ckpt" / "model.gguf")  # a checkpoint folder wins over a stray file
    assert resolve_model_path(tmp_path / "ckpt") == tmp_path / "ckpt"
    (tmp_path / "empty").mkdir()
    assert resolve_model_path(tmp_path / "empty") == tmp_path / "empty"
    file = touch(tmp_path / "a.gguf")
    assert resolve_model_path(file) == file
    assert resolve_model_path(tmp_path / "missing") == tmp_path / "missing"


def test_cli_refuses_a_folder_of_several_models(tmp_path: Path) -> None:
    touch(tmp_path / "a-Q4_K_M.gguf")
    touch(tmp_path / "a-Q8_0.gguf")
    proc = subprocess.run([sys.executable, "-m", "gateway", "--model", str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO_ROOT, env={"PYTHONPATH": str(REPO_ROOT / "python"), "PATH": "/usr/bin:/bin"},
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "holds 2 GGUF models, so --model has to name one of them: a-Q4_K_M.gguf, a-Q8_0.gguf" in proc.stderr


def test_serves_the_one_model_of_a_downloaded_folder(build_checkpoint, tmp_path: Path) -> None:
    """The layout of a GGUF repository with one quant downloaded: the split set in a subfolder,
    a projector and a model card beside it; the server loads the set and names it."""
    openai = pytest.importorskip("openai")
    gguf_file = pytest.importorskip("tools.ckpt.gguf_file")
    from server_fixtures import start_server, stop_server

    repo = tmp_path / "tiny-qwen3-GGUF"
    first = gguf_file.write_gguf(build_checkpoint("qwen3_moe", "bf16"), repo / "Q8_0" / "tiny-qwen3-Q8_0.gguf",
                                 default="Q8_0", split_max_tensors=12)
    assert "-00001-of-" in first.name and len(list(first.parent.glob("*.gguf"))) > 1
    touch(repo / "mmproj-tiny-F16.gguf")
    (repo / "README.md").write_text("card")
    server = start_server(repo)
    try:
        assert f"the one GGUF model in {repo}" in server.log(), server.log()
        client = openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list()] == ["tiny-qwen3-Q8_0"]
        reply = client.chat.completions.create(model="tiny-qwen3-Q8_0", messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=2, seed=1)
        assert 1 <= reply.usage.completion_tokens <= 2
    finally:
        stop_server(server)
