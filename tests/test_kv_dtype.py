"""KV cache storage type: Engine(path, kv_dtype="bf16") stores K and V (and DeepSeek-V4's K=V
rows, compressed rows and indexer keys) in bf16, rounded to nearest even, and reads them back
into fp32 for the attention arithmetic.

The oracle is transformers' own model class in fp32 with the same storage emulated: its cache
layers round every key / value (and DeepSeek-V4's compressed and indexer entries) to bf16 as
they are stored, which is exactly what the engine keeps.  Against that the bf16 engine must
meet the fp32 oracle tolerance over prefill, single-token decode and truncate + replay; against
the plain fp32 reference (and the f32 engine) its logits must differ, which shows the option
acts.  (The bf16 distance to its reference is larger than f32's, 1e-5 to 5e-4 here: a value
within an ulp of a bf16 rounding midpoint can round one way in the engine and the other in
torch, a 2^-9 step that the next layers carry.)  Engine.info reports the type and the bytes one position costs, and a --ram budget counts
that smaller size: a budget too small with f32 KV at some max_ctx opens with bf16 KV.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import torch
from tools.ckpt import deepseek_v4 as dsv4_writer
from tools.ckpt import write_checkpoint

import oracle
import oracle_dsv4
from gateway.engine import Engine, EngineError

TOL = 1e-3  # max |diff| / max |logit|, as the oracle tests
PREFILL, DECODE_TO, CUT = 40, 52, 29  # prefill 40, decode one at a time to 52, truncate to 29, replay


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 (torch rounds to nearest even) -> fp32: the value a bf16 cache keeps."""
    return x.to(torch.bfloat16).to(x.dtype)


@contextlib.contextmanager
def bf16_storage(cache: Any) -> Iterator[Any]:
    """The cache with every stored key / value / compressed entry rounded to bf16 (patched on
    its layer objects, so all of transformers' own attention code runs unchanged)."""
    for layer in cache.layers:
        update = layer.update

        def rounded_update(keys, values, *args, _update=update, **kwargs):
            k = to_bf16(keys)
            return _update(k, k if values is keys else to_bf16(values), *args, **kwargs)

        layer.update = rounded_update
        if hasattr(layer, "update_compressor_states"):  # DeepSeek-V4 compressed + indexer rows
            emit = layer.update_compressor_states
            layer.update_compressor_states = lambda name, rows, _emit=emit: _emit(name, to_bf16(rows))
    yield cache


@torch.no_grad()
def bf16_kv_logits(model: torch.nn.Module, tokens: list[int], **call: Any) -> np.ndarray:
    """Logits [n, vocab] of one pass whose attention reads bf16-stored K/V (rounding is per
    value, so one pass equals any chunking of the same tokens)."""
    from transformers import DynamicCache

    with bf16_storage(DynamicCache(config=model.config)) as cache:
        ids = torch.tensor([tokens], dtype=torch.long)
        return model(input_ids=ids, cache=cache, use_cache=True, **call).logits[0].float().numpy()


def rel(got: np.ndarray, want: np.ndarray) -> float:
    return oracle.relative_error(got, want)


def run_schedule(engine: Engine, tokens: list[int]) -> list[tuple[str, np.ndarray, slice]]:
    """(what, logits, rows of the sequence they belong to) for prefill, decode steps and a
    truncate + replay of the rest."""
    engine.reset()
    out = [("prefill", engine.eval(tokens[:PREFILL]), slice(0, PREFILL))]
    for p in range(PREFILL, DECODE_TO):
        out.append((f"decode {p}", engine.eval([tokens[p]]), slice(p, p + 1)))
    engine.truncate(CUT)
    out.append((f"replay after truncate({CUT})", engine.eval(tokens[CUT:]), slice(CUT, len(tokens))))
    return out


# ---- checkpoints and references -------------------------------------------------------------


class Case:
    def __init__(self, arch: str, ckpt: Path, model: torch.nn.Module, tokens: list[int], threads: int = 2) -> None:
        self.arch, self.ckpt, self.tokens = arch, ckpt, tokens
        self.ref_f32 = (oracle_dsv4.full_logits if arch == "deepseek_v4" else oracle.full_logits)(model, tokens)
        self.ref_bf16 = bf16_kv_logits(model, tokens)
        self.engines = {dt: Engine(str(ckpt), threads=threads, kv_dtype=dt) for dt in ("f32", "bf16")}


ARCHS = ("qwen3_moe", "glm4_moe", "deepseek_v4")


@pytest.fixture(scope="module", params=ARCHS)
def case(request: pytest.FixtureRequest, build_checkpoint: Callable[..., Path],
         tmp_path_factory: pytest.TempPathFactory) -> Case:
    arch = request.param
    if arch == "deepseek_v4":
        ckpt = dsv4_writer.write_checkpoint("deepseek_v4", "tiny", "native", tmp_path_factory.mktemp("kv_dsv4"),
                                            progress=False)
        rng = np.random.default_rng(1234)
        tokens = [0] + rng.integers(2, dsv4_writer.TINY.vocab_size, 71).tolist()  # crosses 8-, 4-blocks, window
        return Case(arch, ckpt, oracle_dsv4.hf_model(ckpt), tokens)
    ckpt = build_checkpoint(arch, "f32")
    return Case(arch, ckpt, oracle.load_reference_model(ckpt), oracle.sequence_tokens(ckpt, arch))


# ---- numerics -------------------------------------------------------------------------------


def test_bf16_kv_matches_transformers_with_bf16_storage(case: Case) -> None:
    for what, got, rows in run_schedule(case.engines["bf16"], case.tokens):
        err = rel(got, case.ref_bf16[rows])
        assert err < TOL, f"{case.arch} {what}: max|diff|/max|logit| = {err:.3g}"


def test_f32_kv_still_matches_plain_transformers(case: Case) -> None:
    for what, got, rows in run_schedule(case.engines["f32"], case.tokens):
        err = rel(got, case.ref_f32[rows])
        assert err < TOL, f"{case.arch} {what}: max|diff|/max|logit| = {err:.3g}"


def test_bf16_storage_changes_the_logits(case: Case) -> None:
    """The option acts: bf16 and f32 engines differ, as do the two references (by far more
    than either engine's distance to its own reference)."""
    n = len(case.tokens)
    bf16 = case.engines["bf16"]
    f32 = case.engines["f32"]
    bf16.reset()
    f32.reset()
    got_bf16, got_f32 = bf16.eval(case.tokens), f32.eval(case.tokens)
    apart = rel(got_bf16, got_f32)
    assert apart > 1e-4, f"{case.arch}: bf16 and f32 KV give the same logits ({apart:.3g})"
    refs_apart = rel(case.ref_bf16, case.ref_f32)
    assert refs_apart > 10 * rel(got_bf16, case.ref_bf16[:n]), (refs_apart, rel(got_bf16, case.ref_bf16[:n]))


# ---- reporting ------------------------------------------------------------------------------


def expected_kv_bytes_per_token(case: Case, value_bytes: int) -> int:
    cfg = oracle.read_config(case.ckpt)
    if case.arch != "deepseek_v4":
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        return cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * value_bytes
    dims = dsv4_writer.TINY
    d, di = dims.head_dim, dims.index_head_dim
    ratios = [r for r in dims.compress_ratios if r]
    snap = int(np.lcm.reduce(ratios)) if ratios else 1
    # K=V rows: a ring of recent positions (kv_fixed_bytes) and, per position, its share of the
    # snapshot of W rows taken every 8 W positions (rounded up to the compression period)
    w = dims.sliding_window
    period = -(-8 * w // snap) * snap
    total = -(-dims.n_layers * w * d * value_bytes // period) + 4  # + the token id
    for r in dims.compress_ratios[: dims.n_layers]:
        if not r:
            continue
        total += -(-d * value_bytes // r)  # one compressed row per r positions
        if r == 4:  # CSA (overlapping): A-half snapshots kept every period, indexer keys and theirs
            total += -(-2 * r * d * 4 // period) + -(-di * value_bytes // r) + -(-2 * r * di * 4 // period)
    return total


def expected_kv_fixed_bytes(case: Case, value_bytes: int) -> int:
    """DeepSeek-V4 keeps the K=V rows of the last max(32 W, W + 128) positions per layer, and
    each CSA compressor (and its indexer's) the f32 carry snapshots a rewind inside that ring
    can land on: one per compression period (8 here) of the ring, plus two."""
    if case.arch != "deepseek_v4":
        return 0
    dims = dsv4_writer.TINY
    w = dims.sliding_window
    ring = max(32 * w, w + 128)
    ratios = [r for r in dims.compress_ratios if r]
    snap = int(np.lcm.reduce(ratios)) if ratios else 1
    carries = sum(2 * r * (dims.head_dim + dims.index_head_dim) * 4 for r in dims.compress_ratios[: dims.n_layers]
                  if r == 4)
    return dims.n_layers * ring * dims.head_dim * value_bytes + (ring // snap + 2) * carries


def test_info_reports_kv_dtype_and_bytes_per_token(case: Case) -> None:
    for dt, size in (("f32", 4), ("bf16", 2)):
        info = case.engines[dt].info
        assert info["kv_dtype"] == dt
        assert info["kv_bytes_per_token"] == expected_kv_bytes_per_token(case, size), info
        assert info["kv_fixed_bytes"] == expected_kv_fixed_bytes(case, size), info
    assert case.engines["bf16"].info["kv_bytes_per_token"] < case.engines["f32"].info["kv_bytes_per_token"]


def test_bf16_attention_is_bitwise_the_same_on_any_thread_count(build_checkpoint: Callable[..., Path]) -> None:
    """bf16 attention splits each kv group's heads into slices when there are more workers than
    (token, group) items; every head's arithmetic is the same however they are cut."""
    ckpt = build_checkpoint("glm4_moe", "f32")
    tokens = list(range(3, 43))
    runs = []
    for threads in (1, 3):
        engine = Engine(str(ckpt), threads=threads, kv_dtype="bf16")
        prefill = engine.eval(tokens[:30])
        runs.append(np.concatenate([prefill] + [engine.eval([t]) for t in tokens[30:]]))
    assert np.array_equal(runs[0], runs[1])


def test_unknown_kv_dtype_is_refused(build_checkpoint: Callable[..., Path]) -> None:
    with pytest.raises(ValueError, match="kv_dtype"):
        Engine(str(build_checkpoint("qwen3_moe", "f32")), kv_dtype="fp16")


# ---- the --ram budget counts the real KV size ----------------------------------------------

BUDGET_CTX = 200_000  # KV at this context dominates the tiny model's budget
QWEN_SMALL: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 256, "num_experts": 32,
    "num_experts_per_tok": 4, "num_hidden_layers": 3, "vocab_size": 1024, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 512,
}


def stated_minimum_gb(ckpt: Path, kv_dtype: str) -> float:
    with pytest.raises(EngineError) as info:
        Engine(str(ckpt), ram_gb=0.001, max_ctx=BUDGET_CTX, kv_dtype=kv_dtype, expert_history=False)
    found = re.search(r"minimum is ([0-9.]+) GB", str(info.value))
    assert found, f"too-small budget error does not state the minimum: {info.value}"
    return float(found.group(1))


def test_budget_counts_the_smaller_kv(tmp_path: Path) -> None:
    ckpt = write_checkpoint("qwen3_moe", "bench", "bf16", tmp_path / "qwen", seed=1, overrides=QWEN_SMALL)
    min_f32, min_bf16 = stated_minimum_gb(ckpt, "f32"), stated_minimum_gb(ckpt, "bf16")
    per_token = {dt: 3 * 2 * 2 * 32 * size for dt, size in (("f32", 4), ("bf16", 2))}
    saved_gb = BUDGET_CTX * (per_token["f32"] - per_token["bf16"]) / 1e9
    assert abs((min_f32 - min_bf16) - saved_gb) < 0.03, (min_f32, min_bf16, saved_gb)
    # The budget that bf16 KV needs is too small for f32 KV at the same max_ctx ...
    with pytest.raises(EngineError, match="too small"):
        Engine(str(ckpt), ram_gb=min_bf16, max_ctx=BUDGET_CTX, kv_dtype="f32", expert_history=False)
    # ... and opens with bf16 KV, a real cache that runs.
    engine = Engine(str(ckpt), ram_gb=min_bf16, max_ctx=BUDGET_CTX, kv_dtype="bf16", expert_history=False)
    assert engine.stats()["experts"]["slots"] > 0
    assert engine.info["kv_bytes_per_token"] == per_token["bf16"]
    engine.eval([5, 17, 42, 99, 3])
    engine.eval([7])
