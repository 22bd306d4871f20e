"""llama.cpp's ``deepseek4`` GGUF files: our tiny DeepSeek-V4 checkpoint converted by llama.cpp's
own converter (conversion/deepseek.py), served by Engine(FILE.gguf).

The converter keeps BF16/F32 tensors as they are, repacks the FP4 experts into MXFP4 (the same
codes and scales: lossless), requantises the FP8 weights to Q8_0 and stores the hash-routing
tables as I32.  Two oracles:

* the native FP8/FP4 checkpoint: transformers' DeepseekV4 class holding the GGUF's own weights
  dequantised by the gguf package (Q8_0 is not the FP8 values, so the folder is no oracle here);
  max |err| / max |logit| <= 1e-4 over a prefill and greedy steps;
* a BF16 variant of it (the FP8 weights dequantised to BF16, which holds them exactly; FP4
  experts kept): the converter changes no value, so Engine(file) must compute what
  Engine(folder) computes, to float rounding (1e-5).

llama-quantize's files (tools/llamacpp_ggufs.py): a tiny checkpoint widened so every row is
whole 256-blocks, converted, then requantised to Q8_0, Q4_K_M and a mixed per-tensor file
(MXFP4 / IQ4_XS / Q5_K experts, Q8_0 shared expert, F32 mHC, BF16 indexer, Q6_K / Q5_0 /
IQ4_NL / Q4_0 / Q5_K attention): each against transformers on the file's dequantised weights
(1e-4), each holding the types it names (no silent fallback), and the mixed one's budgeted run
bitwise the resident one.

Errors: a missing deepseek4 key or a tensor of the wrong shape is a ConfigError/EngineError
naming it; and a budgeted run reading MXFP4 expert slices from the file is bitwise the resident
run.  Skipped, saying why, where llama.cpp's sources (or, for the requantised files,
llama-quantize) are not in the cache.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tools"))
import llamacpp  # noqa: E402
import llamacpp_ggufs  # noqa: E402
from tools.ckpt import deepseek_v4 as writer  # noqa: E402

import oracle_dsv4 as oracle  # noqa: E402
from engine_budget import stated_minimum_gb  # noqa: E402

TOL = 1e-4
SAME_TOL = 1e-5
PROMPT = 29     # crosses the window (8) and closes compressed blocks of both ratios (4, 8)
STEPS = 6


@pytest.fixture(scope="module")
def src() -> Path:
    try:
        return llamacpp.fetch_source(llamacpp.cache_dir(), no_fetch=True)
    except llamacpp.Unavailable as why:
        pytest.skip(f"llama.cpp's sources are not in the cache ({why}); fetch them with: "
                    "python tools/llamacpp_ggufs.py --arch qwen3_moe --out DIR")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dsv4-gguf")


@pytest.fixture(scope="module")
def native(root: Path) -> Path:
    return writer.write_checkpoint("deepseek_v4", "tiny", "native", root / "native", progress=False)


@pytest.fixture(scope="module")
def native_gguf(src: Path, native: Path, root: Path) -> Path:
    return llamacpp.convert(src, native, "deepseek_v4", "bf16", root / "native.gguf")


def bf16_variant(native: Path, out: Path) -> Path:
    """The checkpoint with every FP8 weight dequantised to BF16 (exact: 4 significant bits
    times a power of two) and its scale dropped; FP4 experts, BF16 and F32 tensors as they are."""
    raw = oracle.read_raw(native)
    entries: dict[str, tuple[str, np.ndarray]] = {}
    for name, (dtype, bits) in raw.items():
        stem = name.rsplit(".", 1)[0]
        if dtype == "F8_E4M3":
            value = oracle.dequantised({name: raw[name], f"{stem}.scale": raw[f"{stem}.scale"]})[name]
            as_bf16 = (value.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            assert np.array_equal((as_bf16.astype(np.uint32) << 16).view(np.float32), value), name
            entries[name] = ("BF16", as_bf16)
        elif not (name.endswith(".scale") and raw.get(f"{stem}.weight", ("",))[0] == "F8_E4M3"):
            entries[name] = (dtype, bits)
    out.mkdir()
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, bits) in entries.items():
        header[name] = {"dtype": dtype, "shape": list(bits.shape), "data_offsets": [offset, offset + bits.nbytes]}
        offset += bits.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for _, bits in entries.values():
            f.write(np.ascontiguousarray(bits).tobytes())
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model.safetensors" for k in entries}}))
    config = json.loads((native / "config.json").read_text())
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(native / extra, out / extra)
    return out


@pytest.fixture(scope="module")
def bf16(native: Path, root: Path) -> Path:
    return bf16_variant(native, root / "bf16")


@pytest.fixture(scope="module")
def bf16_gguf(src: Path, bf16: Path, root: Path) -> Path:
    return llamacpp.convert(src, bf16, "deepseek_v4", "bf16", root / "bf16.gguf")


def tokens() -> list[int]:
    rng = np.random.default_rng(7)
    return [0] + rng.integers(2, writer.TINY.vocab_size, PROMPT - 1).tolist()


def run(engine, prompt: list[int], steps: int) -> tuple[np.ndarray, list[int]]:
    """Prefill logits then `steps` greedy decode steps: (logits of every position, new ids)."""
    engine.reset()
    rows = [engine.eval(prompt)]
    ids: list[int] = []
    for _ in range(steps):
        ids.append(int(np.argmax(rows[-1][-1])))
        rows.append(engine.eval([ids[-1]]))
    return np.concatenate(rows), ids


def assert_matches_transformers(path: Path, folder: Path) -> None:
    """Engine(file) over a prefill and greedy steps vs transformers' DeepseekV4 of the folder's
    config holding the file's weights dequantised by the gguf package."""
    from gateway.engine import Engine

    model = oracle.hf_model_from_values(folder, oracle.gguf_values(path))
    engine = Engine(str(path), threads=2)
    try:
        got, ids = run(engine, tokens(), STEPS)
    finally:
        engine.close()
    want = oracle.full_logits(model, tokens() + ids)[: PROMPT + STEPS]
    err = oracle.rel_error(got, want)
    assert err <= TOL, f"{path.name}: max|diff|/max|logit| = {err:.3g}"


def assert_cached_run_is_resident(path: Path) -> None:
    """A budget that keeps experts in a cache: expert slices read from the file give the
    resident run's logits bit for bit."""
    from gateway.engine import Engine

    resident = Engine(str(path), threads=1)
    try:
        want = resident.eval(tokens())
    finally:
        resident.close()
    engine = Engine(str(path), ram_gb=stated_minimum_gb(path), threads=1, expert_history=False,
                    expert_prefetch=False)
    try:
        got = engine.eval(tokens())
        stats = engine.stats()["experts"]
        assert stats["slots"] > 0 and stats["misses"] > 0 and stats["bytes_read"] > 0, stats
        assert np.array_equal(got, want), f"{path.name}: cached run differs from the resident one"
    finally:
        engine.close()


# ---- the converter's file -------------------------------------------------------------------


def test_file_layout(native_gguf: Path) -> None:
    """What the converter wrote is what the name table and the config expect."""
    from gateway import _core

    info = _core.gguf_inspect(str(native_gguf), arrays=False, small_arrays=64)
    assert info["metadata"]["general.architecture"] == "deepseek4"
    assert info["metadata"]["deepseek4.attention.compress_ratios"] == [0, 0, 4, 8, 4, 8]
    types = {t["name"]: t["type"] for t in info["tensors"]}
    assert types["blk.0.ffn_gate_exps.weight"] == "MXFP4"
    assert types["blk.0.attn_q_a.weight"] == "Q8_0"
    assert types["blk.0.ffn_gate_tid2eid.weight"] == "I32"
    assert "blk.3.ffn_gate_tid2eid.weight" not in types and "blk.3.exp_probs_b.bias" in types


def test_config_from_metadata_matches_folder(native_gguf: Path, native: Path) -> None:
    from gateway.model_config import load_config

    want = load_config(native)
    got = load_config(native_gguf)
    want.pop("expert_dtype")  # a label the file does not carry
    got.pop("expert_dtype")
    assert got == want


@pytest.mark.parametrize("change, expected", [
    ({"deepseek4.expert_gating_func": 2}, r"expert_gating_func 'sigmoid'.*sqrtsoftplus only"),
    ({"deepseek4.swiglu_clamp_shexp": [7.0] * 6}, r"swiglu_clamp_exp/_shexp: one limit"),
    ({"deepseek4.expert_feed_forward_length": [64, 64, 32, 64, 64, 64]}, r"expert_feed_forward_length: one value"),
    ({"deepseek4.attention.compress_ratios": [0, 0, 4]}, r"compress_ratios needs 6 entries"),
    ({"deepseek4.rope.scaling.type": "linear", "deepseek4.rope.scaling.factor": 4.0}, r"rope\.scaling\.type 'linear'"),
])
def test_metadata_refused_by_name(native_gguf: Path, change: dict[str, Any], expected: str) -> None:
    from gateway.model_config import ConfigError
    from gateway.model_config.gguf import raw_config, read_gguf

    metadata, tensors = read_gguf(native_gguf)
    with pytest.raises(ConfigError, match=expected):
        raw_config({**metadata, **change}, tensors)


def test_metadata_defaults(native_gguf: Path) -> None:
    """Keys llama.cpp defaults: no rope scaling (none, factor 1), no shared-expert clamp."""
    from gateway.model_config import normalise
    from gateway.model_config.gguf import raw_config, read_gguf

    metadata, tensors = read_gguf(native_gguf)
    optional = ("rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
                "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow", "swiglu_clamp_shexp", "rope.freq_base")
    trimmed = {k: v for k, v in metadata.items() if k.removeprefix("deepseek4.") not in optional}
    cfg = normalise(raw_config(trimmed, tensors))
    assert cfg["yarn_factor"] == 1.0 and cfg["rope_theta"] == 10000.0 and cfg["swiglu_limit"] == 10.0


def test_native_file_matches_transformers(native_gguf: Path, native: Path) -> None:
    """FP4 experts lossless, FP8 -> Q8_0: transformers holding the file's dequantised weights."""
    assert_matches_transformers(native_gguf, native)


def test_bf16_file_matches_the_folder(bf16_gguf: Path, bf16: Path) -> None:
    """No value changes on conversion: Engine(file) computes what Engine(folder) computes."""
    from gateway.engine import Engine

    results = []
    for path in (bf16, bf16_gguf):
        engine = Engine(str(path), threads=2)
        try:
            results.append(run(engine, tokens(), STEPS))
        finally:
            engine.close()
    (folder, folder_ids), (file, file_ids) = results
    assert file_ids == folder_ids
    err = oracle.rel_error(file, folder)
    assert err <= SAME_TOL, f"max|diff|/max|logit| = {err:.3g}"


def test_cached_experts_read_from_disk_are_bitwise_resident(native_gguf: Path) -> None:
    """MXFP4 expert slices read from the file under a budget: the resident run, bit for bit."""
    assert_cached_run_is_resident(native_gguf)


def test_server_inputs_match_the_folder(native_gguf: Path, native: Path) -> None:
    """`python -m gateway --model FILE.gguf`: the DSML family and the DeepSeek-V4 tokenizer
    (`joyai-llm` pre-tokenizer rebuilt from the file) give the folder's ids and end tokens."""
    from gateway.server.serve import load_tokenizer_and_chat

    file_tok, file_chat, file_eot = load_tokenizer_and_chat(native_gguf)
    tok, chat, eot = load_tokenizer_and_chat(native)
    assert file_chat.family.name == chat.family.name == "dsml"
    assert file_eot == eot
    text = "Hello world, 12345 héllo\n  code()  <｜User｜>x <｜end▁of▁sentence｜>"
    assert file_tok.encode(text) == tok.encode(text)


# ---- llama-quantize's files (tools/llamacpp_ggufs.py) ---------------------------------------


@pytest.fixture(scope="module")
def quantized(src: Path, root: Path) -> tuple[Path, dict[str, Path]]:
    """(the widened tiny checkpoint, {variant: file}): the converter's file of it requantised by
    llama-quantize to Q8_0, Q4_K_M and the mixed per-tensor variant."""
    try:
        llamacpp.find_tool("llama-quantize", build_missing=False)
    except llamacpp.Unavailable as why:
        pytest.skip(f"llama-quantize is not built here ({why}); make it with: "
                    "python tools/llamacpp_ggufs.py --arch deepseek_v4 --out DIR --build")
    arch = "deepseek_v4"
    ckpt = llamacpp_ggufs.write_tiny_checkpoint(arch, root / llamacpp_ggufs.checkpoint_name(arch))
    return ckpt, llamacpp_ggufs.make_ggufs(ckpt, arch)


@pytest.mark.parametrize("variant", llamacpp_ggufs.DEFAULT_VARIANTS)
def test_quantized_file_matches_transformers(quantized: tuple[Path, dict[str, Path]], variant: str) -> None:
    ckpt, files = quantized
    assert_matches_transformers(files[variant], ckpt)


def tensor_types(path: Path) -> dict[str, str]:
    """name -> ggml type name, of the tensors of 2 or more dims (the ones llama-quantize may change)."""
    from gateway import _core

    return {t["name"]: t["type"] for t in _core.gguf_inspect(str(path), arrays=False)["tensors"] if len(t["shape"]) >= 2}


def test_quantized_files_hold_the_types_they_name(quantized: tuple[Path, dict[str, Path]]) -> None:
    """The variants would test nothing if llama-quantize fell back to other types or skipped
    tensors: every matrix but the router (BF16) and the hash table (I32) takes the variant's
    types, the mHC mixers and position biases included (llama.cpp has no deepseek4 rule)."""
    _, files = quantized
    untouched = {"ffn_gate_inp.weight": "BF16", "ffn_gate_tid2eid.weight": "I32"}

    def kept(name: str) -> bool:
        return name.split(".", 2)[-1] in untouched

    q8 = tensor_types(files["Q8_0"])
    assert {t for n, t in q8.items() if not kept(n)} == {"Q8_0"}
    assert all(t == untouched[n.split(".", 2)[-1]] for n, t in q8.items() if kept(n))
    # Q4_K_M: Q4_K, with Q6_K for the output and the ffn_down tensors of the use_more_bits layers
    # (the last of three here); no Q5_0 / Q8_0 fallback anywhere
    q4 = tensor_types(files["Q4_K_M"])
    assert {t for n, t in q4.items() if not kept(n)} == {"Q4_K", "Q6_K"}
    assert q4["output.weight"] == q4["blk.2.ffn_down_exps.weight"] == q4["blk.2.ffn_down_shexp.weight"] == "Q6_K"
    assert q4["blk.0.ffn_down_exps.weight"] == q4["blk.2.ffn_up_exps.weight"] == q4["blk.1.hc_attn_fn.weight"] == "Q4_K"
    # mixed: each matrix has the type of the first override that names it
    overrides = llamacpp_ggufs.overrides("deepseek_v4", "mixed")
    mixed = tensor_types(files["mixed"])
    for name, kind in mixed.items():
        first = next((t for pattern, t in overrides.items() if re.search(pattern, name)), None)
        assert kind == (first.upper() if first else untouched[name.split(".", 2)[-1]]), name
    assert {t.upper() for t in overrides.values()} <= set(mixed.values())


def test_quantized_cached_run_is_bitwise_resident(quantized: tuple[Path, dict[str, Path]]) -> None:
    """The mixed file's experts (MXFP4 gate, IQ4_XS up, Q5_K down) read as slices under a budget."""
    assert_cached_run_is_resident(quantized[1]["mixed"])


# The codebook types of unsloth's UD-IQ1 / IQ2 / IQ3 DeepSeek-V4-Flash files, every one of them
# somewhere: (GGUF name pattern, type); the first pattern that matches a matrix names its type.
IQ_TYPES = [
    (r"ffn_gate_exps", "IQ2_XXS"), (r"ffn_up_exps", "IQ2_XS"), (r"ffn_down_exps", "IQ3_XXS"),
    (r"_shexp", "IQ2_S"), (r"attn_q", "IQ3_S"), (r"attn_kv|attn_output", "IQ1_M"), (r"indexer", "IQ1_S"),
]


@pytest.fixture(scope="module")
def iq_gguf(quantized: tuple[Path, dict[str, Path]], root: Path) -> Path:
    """llama-quantize's Q8_0 file of the widened checkpoint with its matrices rewritten in the
    seven codebook types (random blocks, tools/ckpt/gguf_file.random_blocks): llama.cpp's own
    IQ quantisers need an importance matrix, which llama-imatrix cannot make here (the pinned
    llama.cpp loads DeepSeek-V4 compression ratios 0, 4 and 128 only; the tiny model uses 8)."""
    import gguf
    from tools.ckpt.gguf_file import random_blocks

    rng = np.random.default_rng(11)
    blocks: dict[str, tuple[np.ndarray, Any]] = {}
    for t in gguf.GGUFReader(str(quantized[1]["Q8_0"])).tensors:
        kind = next((k for pattern, k in IQ_TYPES if re.search(pattern, t.name)), None)
        if kind is None or t.tensor_type != gguf.GGMLQuantizationType.Q8_0:
            continue
        shape = tuple(int(n) for n in reversed(t.shape))
        blocks[t.name] = (random_blocks(kind, shape, rng), gguf.GGMLQuantizationType[kind])
    assert {kind.name for _, kind in blocks.values()} == {k for _, k in IQ_TYPES}, "a codebook type matched nothing"
    return rewrite(quantized[1]["Q8_0"], root / "iq.gguf", blocks=blocks)


def test_iq_file_matches_transformers(quantized: tuple[Path, dict[str, Path]], iq_gguf: Path) -> None:
    assert_matches_transformers(iq_gguf, quantized[0])


def test_iq_cached_run_is_bitwise_resident(iq_gguf: Path) -> None:
    """IQ2_XXS / IQ2_XS / IQ3_XXS routed experts read as slices of the stacked tensors under a budget."""
    assert_cached_run_is_resident(iq_gguf)


# ---- errors ---------------------------------------------------------------------------------


def rewrite(source: Path, out: Path, *, drop_keys: tuple[str, ...] = (), drop_tensors: tuple[str, ...] = (),
            tensors: dict[str, np.ndarray] | None = None, blocks: dict[str, tuple[np.ndarray, Any]] | None = None) -> Path:
    """A copy of a GGUF file without some keys and with some tensors replaced: `tensors` by F32
    values, `blocks` by raw block bytes of a ggml type ((bytes [..., row bytes], type)).
    The tokenizer keys are left out: the engine reads none, and copying a 129k-token
    vocabulary through the gguf package's reader takes most of ten seconds."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = str(reader.fields["general.architecture"].contents())
    out_writer = gguf.GGUFWriter(str(out), arch)
    for key, field in reader.fields.items():
        if key.startswith(("GGUF.", "tokenizer.")) or key == "general.architecture" or key in drop_keys:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        out_writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    for t in reader.tensors:
        if t.name in drop_tensors:
            continue
        if tensors and t.name in tensors:
            out_writer.add_tensor(t.name, tensors[t.name].astype(np.float32))
            continue
        if blocks and t.name in blocks:
            raw, kind = blocks[t.name]
            out_writer.add_tensor(t.name, raw, raw_dtype=kind)
            continue
        shape = [int(n) for n in reversed(t.shape)]
        data = np.array(t.data)
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.I32):
            out_writer.add_tensor(t.name, data.reshape(shape))
        else:
            out_writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    out_writer.write_header_to_file()
    out_writer.write_kv_data_to_file()
    out_writer.write_tensors_to_file()
    out_writer.close()
    return out


@pytest.fixture(scope="module")
def plain_gguf(native_gguf: Path, root: Path) -> Path:
    """The converter's file without its tokenizer: the base the error tests edit (the gguf
    package's reader parses a 129k-token vocabulary slowly, so that is done once)."""
    return rewrite(native_gguf, root / "plain.gguf")


def test_rewrite_is_faithful(native_gguf: Path, plain_gguf: Path) -> None:
    """The error tests' rewriter itself changes nothing it is not asked to."""
    from gateway.engine import Engine

    a, b = Engine(str(native_gguf), threads=2), Engine(str(plain_gguf), threads=2)
    try:
        assert np.array_equal(a.eval(tokens()[:9]), b.eval(tokens()[:9]))
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("key", ["deepseek4.hyper_connection.count", "deepseek4.attention.compress_ratios",
                                 "deepseek4.attention.output_group_count", "deepseek4.hash_layer_count"])
def test_missing_key_is_named(plain_gguf: Path, tmp_path: Path, key: str) -> None:
    from gateway.engine import ConfigError, Engine

    path = rewrite(plain_gguf, tmp_path / "nokey.gguf", drop_keys=(key,))
    with pytest.raises(ConfigError, match=re.escape(key)):
        Engine(str(path))


@pytest.mark.parametrize("dropped, expected", [
    ("blk.2.attn_compressor_kv.weight", r"'blk\.2\.attn_compressor_kv\.weight' not found in the file"),
    ("blk.4.indexer.proj.weight", r"'blk\.4\.indexer\.proj\.weight' not found in the file"),
    ("blk.3.ffn_up_exps.weight", r"'blk\.3\.ffn_up_exps\.weight \(expert 0\)' not found in the file"),
    ("output_hc_fn.weight", r"'output_hc_fn\.weight' not found in the file"),
    ("blk.1.ffn_gate_tid2eid.weight", r"GGUF 'blk\.1\.ffn_gate_tid2eid\.weight'.*is missing"),
])
def test_missing_tensor_is_named_as_stored(plain_gguf: Path, tmp_path: Path, dropped: str, expected: str) -> None:
    from gateway.engine import Engine, EngineError

    path = rewrite(plain_gguf, tmp_path / "drop.gguf", drop_tensors=(dropped,))
    with pytest.raises(EngineError, match=expected):
        Engine(str(path))


@pytest.mark.parametrize("name, value, expected", [
    ("blk.1.attn_sinks.weight", np.zeros(3), r"blk\.1\.attn_sinks\.weight.*expected \[4\]"),
    ("blk.2.hc_ffn_fn.weight", np.zeros((24, 256)), r"blk\.2\.hc_ffn_fn\.weight.*expected \[24, 512\]"),
    ("blk.0.ffn_gate_tid2eid.weight", np.zeros((writer.TINY.vocab_size, 3)),
     r"blk\.0\.ffn_gate_tid2eid\.weight.*expected I64 or I32 \[129280, 4\]"),
])
def test_wrong_shape_is_named(plain_gguf: Path, tmp_path: Path, name: str, value: np.ndarray, expected: str) -> None:
    from gateway.engine import Engine, EngineError

    path = rewrite(plain_gguf, tmp_path / "shape.gguf", tensors={name: value})
    with pytest.raises(EngineError, match=expected):
        Engine(str(path))
