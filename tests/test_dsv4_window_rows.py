"""DeepSeek-V4 keeps the K=V rows of recent positions only (c/model/dsv4_rows.h): a ring of
max(32 W, W + 128) positions per layer, and a snapshot of the W rows before every multiple of
8 W.  With the tiny config's window of 8 that is a 256-position ring and a snapshot every 64
positions, so a 600-token history exercises every way back:

- a rewind inside the ring replays from the last multiple of the compression period (8);
- a deeper one restores the last snapshot at or before the cut and replays from there;
- a cut before the first snapshot replays from the start.

Each must give transformers' logits (the oracle), and prefix snapshots taken at any of those
points must restore bitwise what truncate gives.
"""
from __future__ import annotations

import numpy as np
import pytest
from tools.ckpt import deepseek_v4 as writer

import oracle_dsv4 as oracle
from gateway.engine import Engine

TOL = 1e-3  # as tests/test_oracle_dsv4.py
HISTORY = 600
RING = max(32 * writer.TINY.sliding_window, writer.TINY.sliding_window + 128)
PERIOD = 8 * writer.TINY.sliding_window
# in the ring | deep: snapshot at 320, 192, 64 | before the first snapshot | on a snapshot point
CUTS = [597, 500, 340, 200, 70, 63, 5, 256, 0]


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return writer.write_checkpoint("deepseek_v4", "tiny", "native", tmp_path_factory.mktemp("dsv4_rows"),
                                   progress=False)


@pytest.fixture(scope="module")
def tokens() -> list[int]:
    rng = np.random.default_rng(42)
    return [0] + rng.integers(2, writer.TINY.vocab_size, HISTORY + 7).tolist()


@pytest.fixture(scope="module")
def ref(ckpt_dir, tokens) -> np.ndarray:
    return oracle.full_logits(oracle.hf_model(ckpt_dir), tokens)


def rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_the_cuts_cover_every_way_back() -> None:
    lo = HISTORY - RING  # the oldest position the ring holds after the history
    in_ring = [n for n in CUTS if n // 8 * 8 - 8 >= lo]
    deep = [n for n in CUTS if n not in in_ring and n >= PERIOD]
    assert in_ring and len(deep) >= 3 and any(n < PERIOD for n in CUTS) and any(n % PERIOD == 0 for n in deep)


@pytest.fixture(scope="module")
def engine(ckpt_dir):
    engine = Engine(str(ckpt_dir), threads=2, max_ctx=1024)
    yield engine
    engine.close()


@pytest.mark.parametrize("cut", CUTS)
def test_rewind_matches_transformers(engine, tokens, ref, cut) -> None:
    """(Bitwise equality holds against a restore, below; a fresh slot cuts its prefill into
    other chunks, and a chunk's matrix products round differently.)"""
    engine.reset()
    engine.eval(tokens[:HISTORY], last_only=True)
    engine.truncate(cut)
    assert engine.n_past == cut
    got = np.concatenate([engine.eval(tokens[cut : cut + 3]), engine.eval([tokens[cut + 3]])])
    assert rel(got, ref[cut : cut + 4]) < TOL, f"truncate({cut}) then replay"


@pytest.mark.parametrize("kv_dtype", ["f32", "bf16"])
def test_prefix_snapshots_at_any_depth_restore_what_truncate_gives(ckpt_dir, tokens, kv_dtype) -> None:
    engine = Engine(str(ckpt_dir), threads=2, max_ctx=1024, kv_dtype=kv_dtype)
    other = Engine(str(ckpt_dir), threads=2, max_ctx=1024, kv_dtype=kv_dtype)
    tail = tokens[HISTORY : HISTORY + 5]
    for n in (597, 340, 256, 63, 0):  # in the ring, deep, on a snapshot, before one, empty
        engine.reset()
        engine.eval(tokens[:HISTORY], last_only=True)
        snap = engine.save_prefix(n)
        engine.truncate(n)
        want = engine.eval(tail)
        other.reset()
        other.eval(tokens[300:420], last_only=True)  # the slot held something else
        assert other.restore_prefix(snap) == n
        got = other.eval(tail)
        assert np.array_equal(got, want), f"n={n}: max |diff| {np.abs(got - want).max()}"
    engine.close()
    other.close()


def test_the_slot_no_longer_grows_with_every_position(ckpt_dir) -> None:
    """Per position the slot pays for the compressed state and its share of the row snapshots,
    not a K=V row per layer: well under the 4 * head_dim * n_layers bytes an f32 row costs."""
    engine = Engine(str(ckpt_dir), max_ctx=1024)
    dims = writer.TINY
    full_row = 4 * dims.head_dim * dims.n_layers
    assert engine.info["kv_bytes_per_token"] < full_row
    assert engine.info["kv_fixed_bytes"] >= 4 * dims.head_dim * dims.n_layers * RING  # + the carries' ring
    engine.close()
