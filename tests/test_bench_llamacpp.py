"""tools/bench_llamacpp.py without llama.cpp: the --quick path must print an n/a row (no network,
no build), and a llama-bench stand-in must turn into a ratio.  Neither builds llama.cpp."""
from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tools"))
import bench_llamacpp  # noqa: E402


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory, build_checkpoint) -> Path:
    """A bench folder holding the session's tiny qwen3_moe checkpoint where the bench looks for it
    (written in-process and shared with the other tests, instead of by a make_checkpoint run)."""
    folder = tmp_path_factory.mktemp("bench")
    (folder / "qwen3_moe-tiny-bf16").symlink_to(build_checkpoint("qwen3_moe", "bf16"), target_is_directory=True)
    return folder


@pytest.fixture
def no_llama(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An environment where no llama-bench can be found: empty cache, PATH without it."""
    monkeypatch.delenv("MOEGATE_LLAMA_BENCH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    cache = tmp_path / "llama-cache"
    monkeypatch.setenv("MOEGATE_LLAMA_DIR", str(cache))
    return cache


def quick_args(bench_dir: Path) -> list[str]:
    return ["--quick", "--models", "qwen3_moe", "--bench-dir", str(bench_dir), "--prompt-tokens", "8", "--threads", "2"]


def run_with_stand_in(bench_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> list:
    """The --quick bench against a shell-script llama-bench; a cached GGUF stand-in makes the
    conversion unnecessary."""
    fake = tmp_path / "llama-bench"
    fake.write_text("#!/bin/sh\n" + script + "\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("MOEGATE_LLAMA_BENCH", str(fake))
    opts = bench_llamacpp.parse_args(quick_args(bench_dir))
    ckpt = bench_llamacpp.bench_models.ensure_checkpoint("qwen3_moe", bench_llamacpp.bench_models.model_options(opts))
    gguf = bench_llamacpp.gguf_path(ckpt)
    gguf.write_bytes(b"GGUF")
    try:
        return bench_llamacpp.run_llamacpp_benches(opts)
    finally:
        gguf.unlink()


def test_quick_without_llamacpp_prints_na_row(bench_dir: Path, no_llama: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rows = bench_llamacpp.run_llamacpp_benches(bench_llamacpp.parse_args(quick_args(bench_dir)))
    out = capsys.readouterr().out
    assert len(rows) == 1 and rows[0].name == "qwen3_moe"
    assert len(rows[0].ours) == 1 and rows[0].ours[0] > 0, "our side is measured even without llama.cpp"
    assert rows[0].llama == [] and "llama-bench not found" in rows[0].note
    cells = rows[0].cells()
    assert cells[4] == "n/a" and cells[5] == "n/a"
    table_row = next(ln for ln in out.splitlines() if ln.lstrip().startswith("qwen3_moe  "))
    assert "n/a" in table_row
    assert not no_llama.exists(), "--quick must neither download nor build"


def test_llama_bench_result_becomes_a_ratio(bench_dir: Path, no_llama: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in llama-bench printing a fixed tg result.
    rows = run_with_stand_in(bench_dir, tmp_path, monkeypatch, "echo '" + json.dumps([
        {"n_prompt": 0, "n_gen": 4, "avg_ts": 1000.0, "build_commit": "fake"}]) + "'")
    row = rows[0]
    assert row.note == "" and row.llama == [1000.0] and row.commit == "fake"
    assert float(row.cells()[5]) == pytest.approx(row.ours[0] / 1000.0, abs=0.01)


def test_failing_llama_bench_gives_na_with_its_error(bench_dir: Path, no_llama: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rows = run_with_stand_in(bench_dir, tmp_path, monkeypatch,
                             "echo 'llama_model_load: error loading model: unknown architecture' >&2\nexit 1")
    assert rows[0].llama == [] and "unknown architecture" in rows[0].note
    assert rows[0].cells()[5] == "n/a"


def test_crashing_llama_bench_is_rerun_without_repacking(bench_dir: Path, no_llama: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # The pinned llama-bench segfaults on quantized files with its repacked (AMX) buffers on an
    # Intel CPU with AMX as soon as it runs a batch: the decode is repeated without its context
    # (-d 0) and, where that crashes too, with --repack 0; the table says which.
    result = json.dumps([{"n_prompt": 0, "n_gen": 4, "avg_ts": 500.0, "build_commit": "fake"}])
    crash = "echo 'ggml-backend.cpp:1294: GGML_ASSERT(*cur_backend_id != -1) failed' >&2; kill -SEGV $$"
    for works, flags in (('*"-d 0"*', ["-d", "0"]), ('*"--repack 0"*', ["--repack", "0"])):
        rows = run_with_stand_in(bench_dir, tmp_path, monkeypatch, f"""case "$*" in
  {works}) echo '{result}' ;;
  *) {crash} ;;
esac""")
        row = rows[0]
        assert row.note == "" and row.llama == [500.0] and row.llama_flags == flags
        assert "killed by SIGSEGV" in row.llama_flags_why and "cur_backend_id" in row.llama_flags_why
        bench_llamacpp.print_table(rows)
        assert f"llama.cpp ran its decode with {' '.join(flags)}" in capsys.readouterr().out


def test_missing_cmake_is_a_clear_unavailable(no_llama: Path) -> None:
    # Sources already in the cache (no download), but no cmake on PATH: the build is refused
    # with a message, not a crash, and nothing is fetched.
    src = no_llama / f"llama_cpp_python-{bench_llamacpp.LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    src.mkdir(parents=True)
    (src / "convert_hf_to_gguf.py").write_text("")
    (src / "CMakeLists.txt").write_text("")
    opts = bench_llamacpp.parse_args(["--models", "qwen3_moe"])
    with pytest.raises(bench_llamacpp.Unavailable, match="cmake not found"):
        bench_llamacpp.find_llama_bench(opts)
    assert not (no_llama / "download").exists() and not (no_llama / "build").exists()


def test_rows_of_each_model() -> None:
    # deepseek_v4's file users run is the converter's own (Q8_0 + MXFP4): its same-file row needs
    # no llama-quantize; --quick (tiny checkpoints, no quantising) and --no-converted leave it out.
    variants = bench_llamacpp.row_variants
    opts = bench_llamacpp.parse_args([])
    assert variants("deepseek_v4", opts) == ["", "Q8_0+MXFP4"]
    assert variants("qwen3_moe", opts) == ["", "Q8_0", "Q4_K_M"]
    only = bench_llamacpp.parse_args(["--same-file-only"])
    assert variants("deepseek_v4", only) == ["Q8_0+MXFP4"] and variants("glm4_moe", only) == ["Q8_0", "Q4_K_M"]
    assert variants("deepseek_v4", bench_llamacpp.parse_args(["--quick"])) == [""]
    assert variants("deepseek_v4", bench_llamacpp.parse_args(["--no-converted"])) == [""]


def test_quants_are_llama_quantize_type_names(capsys: pytest.CaptureFixture[str]) -> None:
    # the low-bit mixes are rows like the default ones; names are checked before anything is
    # converted (a typo would otherwise surface only after the checkpoint's conversion)
    opts = bench_llamacpp.parse_args(["--quants", "Q2_K,q3_k_m, Q5_K_M"])
    assert bench_llamacpp.row_variants("qwen3_moe", opts) == ["", "Q2_K", "Q3_K_M", "Q5_K_M"]
    assert bench_llamacpp.row_variants("glm4_moe", bench_llamacpp.parse_args(["--quants", ""])) == [""]
    with pytest.raises(SystemExit):
        bench_llamacpp.parse_args(["--quants", "Q4_K_M,Q3_KM"])
    assert "Q3_KM" in capsys.readouterr().err


def test_converted_row_reads_one_file_in_both_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The Q8_0+MXFP4 row: our engine is given the very .gguf llama-bench reads, made by the
    # converter (ensure_gguf), never by llama-quantize.
    ckpt = tmp_path / "deepseek_v4-bench-native"
    ckpt.mkdir()
    gguf = tmp_path / "deepseek_v4-bench-native.gguf"
    gguf.write_bytes(b"GGUF")
    bm = bench_llamacpp.bench_models
    seen: dict[str, list] = {"ours": [], "llama": []}
    monkeypatch.setattr(bm, "ensure_checkpoint", lambda name, opts: ckpt)
    monkeypatch.setattr(bench_llamacpp, "find_llama_bench", lambda opts: Path("/bin/true"))
    monkeypatch.setattr(bench_llamacpp, "ensure_gguf", lambda arch, c, fmt, opts: gguf)

    def no_quantize(*args, **kwargs):
        raise AssertionError("the converted row must not call llama-quantize")

    def ours(name, opts, yardstick, path=None):
        seen["ours"].append(path)
        return bm.DecodeResult(name, 1, [0.5, 0.5], [1e10, 1e10], 1e9, 6.0)

    def theirs(binary, model, threads, **kw):
        seen["llama"].append(model)
        return bench_llamacpp.LlamaRun(1.0, "fake")

    monkeypatch.setattr(bench_llamacpp, "ensure_quantized", no_quantize)
    monkeypatch.setattr(bm, "bench_decode_model", ours)
    monkeypatch.setattr(bench_llamacpp, "llama_bench", theirs)
    opts = bm.model_options(bench_llamacpp.parse_args(["--models", "deepseek_v4", "--repeats", "2",
                                                       "--prefill-tokens", "0", "--threads", "1"]))
    row = bench_llamacpp.bench_model("deepseek_v4", opts, None, "Q8_0+MXFP4")
    assert seen["ours"] == [gguf, gguf] and seen["llama"] == [gguf, gguf]
    assert row.fmt == "Q8_0+MXFP4" and row.note == "" and row.cells()[5] == "2.00"
