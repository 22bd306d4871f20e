"""tools/routing_trace.py: the trace format (as the C store writes it), the replay of LRU /
ours / Belady, and the CLI."""

from __future__ import annotations

import importlib.util
import json
import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("routing_trace", ROOT / "tools" / "routing_trace.py")
rt = importlib.util.module_from_spec(_spec)
sys.modules["routing_trace"] = rt
_spec.loader.exec_module(rt)


def _bytes_like_the_store(records: list[tuple[int, list[int]]], n_layers: int, n_experts: int,
                          version: int = 3, scores: dict[int, list[float]] | None = None,
                          hints: dict[int, tuple[int, list[int]]] | None = None) -> bytes:
    # the layout documented in c/model/experts.c, written independently of the tool; version 2
    # adds the router's scores (n_experts floats, or none) to each record, version 3 the
    # look-ahead hint (count, then its layer and ids when there is one)
    out = b"MGRTRACE" + struct.pack("<IIII", version, n_layers, n_experts, 0)
    for i, (layer, ids) in enumerate(records):
        out += struct.pack("<HH", layer, len(ids)) + struct.pack(f"<{len(ids)}H", *ids)
        if version >= 2:
            sc = (scores or {}).get(i, [])
            out += struct.pack("<H", len(sc)) + struct.pack(f"<{len(sc)}f", *sc)
        if version >= 3:
            h = (hints or {}).get(i)
            out += struct.pack("<H", 0) if h is None else struct.pack(f"<HH{len(h[1])}H", len(h[1]), h[0], *h[1])
    return out


def _trace(batches: list[list[int]], n_experts: int = 4, n_layers: int = 1) -> rt.Trace:
    tr = rt.Trace(n_layers, n_experts)
    for b in batches:
        tr.layers.append(0)
        tr.batches.append(np.array(b, dtype=np.int32))
    return tr


def test_reads_the_store_format(tmp_path: Path) -> None:
    p = tmp_path / "t.trace"
    scores = [0.5, -1.0, 2.25, 0.0, 1.0, -3.5, 0.125, 4.0]
    p.write_bytes(_bytes_like_the_store([(2, [4, 1, 7]), (0, [4])], 3, 8, scores={0: scores},
                                        hints={1: (1, [6, 2, 5])}))
    tr = rt.read_trace(p)
    assert (tr.n_layers, tr.n_experts, len(tr)) == (3, 8, 2)
    assert tr.layers == [2, 0]
    assert tr.batches[0].tolist() == [4, 1, 7]
    assert tr.keys(0).tolist() == [20, 17, 23]
    assert tr.score(0).tolist() == scores and tr.score(1) is None
    assert tr.hint(0) is None and tr.hint(1)[0] == 1 and tr.hint(1)[1].tolist() == [6, 2, 5]
    q = tmp_path / "u.trace"
    rt.write_trace(q, tr)
    assert q.read_bytes() == p.read_bytes()


def test_reads_the_first_format(tmp_path: Path) -> None:
    # version 1 (no scores) is still read; written again it becomes version 3 without scores
    p = tmp_path / "v1.trace"
    p.write_bytes(_bytes_like_the_store([(2, [4, 1, 7]), (0, [4])], 3, 8, version=1))
    tr = rt.read_trace(p)
    assert tr.layers == [2, 0] and tr.batches[1].tolist() == [4]
    assert tr.score(0) is None and tr.score(1) is None
    q = tmp_path / "v3.trace"
    rt.write_trace(q, tr)
    assert q.read_bytes() == _bytes_like_the_store([(2, [4, 1, 7]), (0, [4])], 3, 8)
    # and version 2 (scores, no hints)
    p.write_bytes(_bytes_like_the_store([(2, [4, 1, 7])], 3, 8, version=2, scores={0: [1.0] * 8}))
    tr = rt.read_trace(p)
    assert tr.score(0).tolist() == [1.0] * 8 and tr.hint(0) is None


@pytest.mark.parametrize(
    "data, msg",
    [
        (b"MGRT", "too short"),
        (b"XXXXXXXX" + struct.pack("<IIII", 1, 1, 1, 0), "bad magic"),
        (b"MGRTRACE" + struct.pack("<IIII", 4, 1, 1, 0), "version 4"),
        (_bytes_like_the_store([(0, [1, 2])], 1, 4, version=1)[:-2], "truncated"),
        (_bytes_like_the_store([(0, [9])], 1, 4, version=1), "out of range"),
        (_bytes_like_the_store([(0, [1, 2])], 1, 4)[:-2], "truncated"),
        (_bytes_like_the_store([(0, [1, 2])], 1, 4, scores={0: [1, 2, 3, 4]})[:-1], "truncated"),
        (_bytes_like_the_store([(0, [1, 2])], 1, 4, scores={0: [1, 2, 3]}), "damaged"),
        (_bytes_like_the_store([(0, [9])], 1, 4), "out of range"),
        (_bytes_like_the_store([(0, [1])], 2, 4, hints={0: (1, [2, 3])})[:-1], "truncated"),
        (_bytes_like_the_store([(0, [1])], 2, 4, hints={0: (2, [2])}), "out of range"),
        (_bytes_like_the_store([(0, [1])], 2, 4, hints={0: (1, [4])}), "out of range"),
    ],
)
def test_rejects_damaged_traces(tmp_path: Path, data: bytes, msg: str) -> None:
    p = tmp_path / "bad.trace"
    p.write_bytes(data)
    with pytest.raises(ValueError, match=msg):
        rt.read_trace(p)


def test_hand_checked_replay() -> None:
    # 0,1,2 cycling through 2 slots: LRU always misses; Belady keeps what comes back soonest
    tr = _trace([[0], [1], [2], [0], [1], [2]])
    assert rt.simulate(tr, "lru", 2).hits == 0
    belady = rt.simulate(tr, "belady", 2)
    assert (belady.hits, belady.misses) == (2, 4)
    # a batch's own experts are never evicted for each other
    tr = _trace([[0, 1], [2, 0], [1, 2]])
    r = rt.simulate(tr, "lru", 2)  # 0 stays for fetch 2 (it is in it), so 1 goes
    assert (r.hits, r.misses) == (2, 4)
    with pytest.raises(ValueError, match="do not fit"):
        rt.simulate(_trace([[0, 1, 2]]), "ours", 2)


def test_policies_against_each_other() -> None:
    tr = rt.synthesize(n_layers=6, n_experts=32, k=4, n_tokens=120, seed=7)
    total = sum(len(tr.keys(i)) for i in range(len(tr)))
    distinct = int((rt.usage_counts(tr) > 0).sum())
    for policy in ("lru", "ours", "belady"):  # a cache of the whole pool misses each expert once
        r = rt.simulate(tr, policy, tr.n_keys)
        assert (r.hits, r.misses) == (total - distinct, distinct)
    rows = rt.replay_table(tr, [0.15, 0.3, 0.5])
    for row in rows:
        assert row["belady"] >= row["lru"] and row["belady"] >= row["ours"]
    # predicted next use: never worse than LRU here, better at the larger budgets
    assert all(row["ours"] >= row["lru"] - 1e-9 for row in rows)
    assert rows[1]["ours"] > rows[1]["lru"]


def test_next_use_beats_lru_at_one_layer_of_slots() -> None:
    # With one layer's worth of slots LRU keeps exactly the last token's routing; predicting the
    # next use (layer cycle + frequency) keeps the experts each layer is likely to ask for.
    tr = rt.synthesize(n_layers=6, n_experts=32, k=4, n_tokens=150, seed=5, skew=1.2, reuse=0.1)
    lru, ours, belady = (rt.simulate(tr, p, tr.n_experts).hit_rate for p in ("lru", "ours", "belady"))
    assert ours > lru + 0.08 and belady >= ours


def test_the_bank_follows_how_fast_routing_drifts() -> None:
    # Steady popularity: the bank ranks with long half-lives (less noise) and beats the single
    # 16-token model; popularity that wanders quickly moves it to shorter ones.
    def run(**kw: float) -> tuple[float, float, float]:
        tr = rt.synthesize(n_layers=6, n_experts=32, k=4, n_tokens=300, seed=11, **kw)
        model = rt._NextUse(tr.n_layers, tr.n_experts, None)
        slots = tr.n_keys // 4
        bank = rt.simulate(tr, "ours", slots, model=model).hit_rate
        fixed = rt.simulate(tr, "ours", slots, half_life=16 * tr.n_layers).hit_rate
        later = model.chosen[len(model.chosen) // 2 :]
        return bank, fixed, float(np.mean([rt.BANK_TOKENS[c] for c in later]))

    bank, fixed, steady_life = run()
    assert bank > fixed and steady_life >= 40
    _, _, drifting_life = run(drift=0.3, drift_tokens=20)
    assert drifting_life < 0.75 * steady_life


def test_replay_matches_the_c_policy_to_the_bit() -> None:
    # tests/c/test_expert_store.c (test_policy_bank) drives mg_policy with the same requests
    # (same LCG) and checks the same two numbers: the sum of the final scores (hex) and a
    # weighted trail of the half-life the bank ranked with after every request
    state = [777]

    def lcg() -> int:
        state[0] = (state[0] * 1103515245 + 12345) % 2**32
        return (state[0] & 0x7FFFFFFF) >> 8

    model = rt._NextUse(3, 16, None)

    def visits(phase: int, n: int) -> None:
        hot = 0
        for t in range(n):
            if t % phase == 0:
                hot = lcg() % 16
            for layer in range(3):
                keys: list[int] = []
                while len(keys) < 4:
                    e = (hot + 5 * layer + lcg() % 3) % 16 if lcg() % 4 < 3 else lcg() % 16
                    if 16 * layer + e not in keys:
                        keys.append(16 * layer + e)
                model.request(layer, np.array(keys))

    visits(1 << 30, 120)
    visits(15, 180)
    total = 0.0
    for v in model.score(np.arange(48), 2):
        if np.isfinite(v):
            total += float(v)
    trail = sum((i % 97 + 1) * rt.BANK_TOKENS[c] for i, c in enumerate(model.chosen))
    assert f"{total.hex()} {trail:.0f}" == "-0x1.2be67c0ecea78p+11 930240"
    assert len(set(model.chosen)) >= 3


def test_drift_keeps_the_stream_without_it() -> None:
    a = rt.synthesize(n_layers=3, n_experts=16, k=2, n_tokens=30, seed=2)
    b = rt.synthesize(n_layers=3, n_experts=16, k=2, n_tokens=30, seed=2, drift=0.0, drift_tokens=5)
    c = rt.synthesize(n_layers=3, n_experts=16, k=2, n_tokens=30, seed=2, drift=0.5, drift_tokens=5)
    assert all((x == y).all() for x, y in zip(a.batches, b.batches))
    assert any((x != y).any() for x, y in zip(a.batches, c.batches))


def test_history_warms_a_cold_cache() -> None:
    old = rt.synthesize(n_layers=4, n_experts=32, k=4, n_tokens=150, seed=3, reuse=0.0)
    new = rt.synthesize(n_layers=4, n_experts=32, k=4, n_tokens=150, seed=3, reuse=0.0)
    new.batches = new.batches[::-1]  # same popularity, different order
    new.layers = new.layers[::-1]
    slots = 32
    cold = rt.simulate(new, "ours", slots)
    warm = rt.simulate(new, "ours", slots, history=rt.usage_counts(old))
    assert warm.hit_rate > cold.hit_rate
    # with the visits the counts came from (what the store's history keeps), f starts at rates
    rates = rt.simulate(new, "ours", slots, history=rt.usage_counts(old), history_visits=rt.usage_visits(old))
    assert rates.hit_rate > cold.hit_rate


def test_seeding_matches_the_c_policy() -> None:
    # the numbers tests/c/test_expert_store.c checks for mg_policy_seed: 10 and 5 requests in
    # 20 visits -> f 0.5 and 0.25; without visits, relative to the top count
    counts = np.array([10, 5, 0, 0, 0, 0, 0, 0], dtype=np.float64)
    model = rt._NextUse(1, 8, None)
    model.seed(counts, np.array([20.0]))
    assert model.score(np.array([0, 1]), 0).tolist() == [-2.0, -4.0]
    model = rt._NextUse(1, 8, None)
    model.seed(counts)
    assert model.score(np.array([0, 1]), 0).tolist() == [-1.0, -2.0]


def test_score_signal_finds_reuse_the_ids_do_not_show() -> None:
    # Each token requests 2 random experts of 16 (other than the last token's).  When the scores rank the NEXT token's
    # choices right below this token's (near misses that come true), the diagnostic shows them
    # requested far more often than the policy predicts; with uninformative scores it does not.
    rng = np.random.default_rng(3)
    n_tokens, E = 300, 16
    choices = [rng.choice(E, 2, replace=False)]
    for _ in range(n_tokens):  # never the previous token's: the near misses are the next two
        choices.append(rng.choice(np.setdiff1d(np.arange(E), choices[-1]), 2, replace=False))

    def trace(informative: bool) -> rt.Trace:
        tr = rt.Trace(1, E)
        for t in range(n_tokens):
            sc = rng.random(E).astype(np.float32)
            if informative:
                sc[choices[t + 1]] = 2.0
            sc[choices[t]] = 3.0
            tr.layers.append(0)
            tr.batches.append(np.sort(choices[t]).astype(np.int32))
            tr.scores.append(sc)
        return tr

    rows = {r["group"]: r for r in rt.score_signal(trace(True))}
    assert rows["next n"]["observed"] > 0.95 and rows["next n"]["predicted"] < 0.3
    assert rows["selected"]["pairs"] == 2 * (n_tokens - 2) and rows["rest"]["observed"] < 0.05
    rows = {r["group"]: r for r in rt.score_signal(trace(False))}
    assert abs(rows["next n"]["observed"] - rows["next n"]["predicted"]) < 0.06
    assert rt.score_signal(_trace([[0], [1], [2]]))[0]["pairs"] == 0  # no scores: nothing to say


def test_cli_scores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "s.trace"
    tr = _trace([[0, 1], [1, 2], [2, 3], [0, 3]])
    tr.scores = [np.array([3, 2, 1, 0], np.float32), np.array([0, 3, 2, 1], np.float32),
                 np.array([1, 0, 3, 2], np.float32), np.array([3, 0, 1, 2], np.float32)]
    rt.write_trace(p, tr)
    assert rt.main(["scores", str(p)]) == 0
    out = capsys.readouterr().out
    assert "next n" in out and "excess" in out
    rt.write_trace(p, _trace([[0, 1], [1, 2]]))
    assert rt.main(["scores", str(p)]) == 0
    assert "no router scores" in capsys.readouterr().out


def test_reads_the_store_history(tmp_path: Path) -> None:
    p = tmp_path / "usage"
    p.write_bytes(b"MGUSAGE2" + struct.pack("<II", 2, 3) + struct.pack("<8f", 1, 0, 4, 2, float("nan"), 0, 5, 6))
    counts, visits, n_layers, n_experts = rt.read_history(p)
    assert (n_layers, n_experts) == (2, 3)
    assert counts.tolist() == [1, 0, 4, 2, 0, 0] and visits.tolist() == [5, 6]
    p.write_bytes(b"MGUSAGE1" + struct.pack("<II", 1, 2) + struct.pack("<2f", 3, 1))
    with pytest.raises(ValueError, match="not a routing history"):  # no release wrote that format
        rt.read_history(p)
    p.write_bytes(b"MGUSAGE2" + struct.pack("<II", 1, 2) + struct.pack("<2f", 3, 1))
    with pytest.raises(ValueError, match="expected 3"):
        rt.read_history(p)


def test_cli_synth_and_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "s.trace"
    assert rt.main(["synth", "--out", str(p), "--layers", "3", "--experts", "16", "--k", "2", "--tokens", "40"]) == 0
    assert len(rt.read_trace(p)) == 120
    assert rt.main(["replay", str(p), "--budgets", "0.2,0.5", "--history", str(p)]) == 0
    out = capsys.readouterr().out
    assert "lru" in out and "ours" in out and "belady" in out
    assert len([line for line in out.splitlines() if line.strip().startswith("0.")]) == 2


# ---- recording from the engine ----------------------------------------------------------------

QWEN_SMALL = {
    "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64, "num_experts": 16,
    "num_experts_per_tok": 4, "num_hidden_layers": 3, "vocab_size": 512, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
}


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tools.ckpt import write_checkpoint

    return write_checkpoint("qwen3_moe", "bench", "bf16", tmp_path_factory.mktemp("rt") / "q", seed=4,
                            overrides=QWEN_SMALL)


def test_record_from_the_resident_engine(small_model: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.trace"
    assert rt.main(["record", "--model", str(small_model), "--out", str(out), "--tokens", "6",
                    "--prompt-ids", "5,17,42,99"]) == 0
    # one fetch per layer per eval: the prompt, then 6 decode steps -> 7 evals x 3 layers
    assert "21 fetches" in capsys.readouterr().out
    tr = rt.read_trace(out)
    assert (tr.n_layers, tr.n_experts, len(tr)) == (3, 16, 21)
    assert tr.layers == [0, 1, 2] * 7
    prefill = tr.batches[:3]
    assert all(4 <= len(b) <= 16 for b in prefill)  # the union over 4 tokens of 4 choices each
    assert all(len(b) == 4 for b in tr.batches[3:])  # one token: exactly k experts
    assert all(tr.score(i) is not None and tr.score(i).shape == (16,) for i in range(len(tr)))


GLM_SMALL = {
    "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64, "n_routed_experts": 16,
    "num_experts_per_tok": 4, "num_hidden_layers": 3, "vocab_size": 512, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256, "use_qk_norm": True,
}


def _deepseek_tiny(root: Path) -> Path:
    import dataclasses

    from tools.ckpt import write_checkpoint
    from tools.ckpt.deepseek_v4 import TINY

    dims = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(TINY).items()}
    return write_checkpoint("deepseek_v4", "bench", "native", root / "d", seed=4, overrides=dims)


@pytest.mark.parametrize("arch", ["qwen3_moe", "glm4_moe", "deepseek_v4"])
def test_trace_carries_the_router_scores_and_hints(arch: str, small_model: Path, tmp_path: Path) -> None:
    """Each fetch carries what the router's top-k ranked for the batch's last token (softmax
    logits, sigmoid + bias, sqrt-softplus + bias): a decode fetch's experts are exactly the top k
    of its scores.  Hash-routed layers (DeepSeek-V4's first ones) rank nothing: no scores.
    Each decode fetch but the last layer's also carries the look-ahead hint for the next layer:
    k experts, exactly that layer's pick when it is hash-routed, and far more often right than
    chance otherwise (the next layer's router on this layer's MoE input)."""
    from tools.ckpt import write_checkpoint

    if arch == "qwen3_moe":
        model, hashed = small_model, 0
    elif arch == "glm4_moe":
        model, hashed = write_checkpoint("glm4_moe", "bench", "bf16", tmp_path / "g", seed=4,
                                         overrides=GLM_SMALL), 0
    else:
        from tools.ckpt.deepseek_v4 import TINY

        model, hashed = _deepseek_tiny(tmp_path), TINY.num_hash_layers
    tr, _ = rt.record(str(model), str(tmp_path / "run.trace"), 8, [5, 17, 42, 99, 3], None)
    prompt_fetches = len(set(tr.layers))
    ranked = 0
    for i in range(len(tr)):
        sc = tr.score(i)
        if tr.layers[i] < hashed:
            assert sc is None
            continue
        assert sc is not None and sc.shape == (tr.n_experts,) and np.isfinite(sc).all()
        if i >= prompt_fetches:
            k = len(tr.batches[i])
            assert set(np.argsort(-sc, kind="stable")[:k].tolist()) == set(tr.batches[i].tolist())
            ranked += 1
    assert ranked >= 8
    right = given = 0
    for i in range(len(tr)):
        hint = tr.hint(i)
        last_layer = tr.layers[i] == max(tr.layers)
        if i < prompt_fetches or last_layer:  # a prompt of several tokens, or no next layer
            assert hint is None, (i, hint)
            continue
        layer, ids = hint
        k = len(tr.batches[i + 1])
        assert layer == tr.layers[i + 1] == tr.layers[i] + 1 and len(ids) == k
        if layer < hashed:
            assert sorted(ids.tolist()) == sorted(tr.batches[i + 1].tolist())  # the fetch lists them by id
        else:
            right += len(set(ids.tolist()) & set(tr.batches[i + 1].tolist()))
            given += k
    assert given and right / given > 2 * k / tr.n_experts, (right, given)


def test_replay_of_the_engine_trace_reproduces_its_cache(small_model: Path, tmp_path: Path) -> None:
    """The tool's 'ours' replay is the store's own policy: replaying the trace of a budgeted run
    at the engine's slot count gives the engine's hit and miss counts exactly."""
    from gateway.engine import Engine, EngineError

    with pytest.raises(EngineError) as info:
        Engine(str(small_model), ram_gb=0.001)
    minimum = float(re.search(r"minimum is ([0-9.]+) GB", str(info.value)).group(1))
    out = tmp_path / "budget.trace"
    tr, st = rt.record(str(small_model), str(out), 12, [5, 17, 42, 99, 3, 250], minimum,
                       expert_history=False, expert_prefetch=False)
    assert st["slots"] >= 16 and st["misses"] > 0
    assert st["fetches"] == len(tr)
    replay = rt.simulate(tr, "ours", int(st["slots"]))
    assert (replay.hits, replay.misses) == (st["hits"], st["misses"])
    assert rt.simulate(tr, "belady", int(st["slots"])).hits >= replay.hits


CACHED = {**QWEN_SMALL, "moe_intermediate_size": 512, "num_experts": 32, "num_hidden_layers": 4}


def test_replay_reproduces_the_cache_under_pressure(tmp_path: Path) -> None:
    """As above with experts large enough that the smallest budget holds about half of them,
    over a run long enough that the bank hands the ranking from model to model: every eviction
    the store makes, the replay makes too."""
    from tools.ckpt import write_checkpoint

    from gateway.engine import Engine, EngineError

    model = write_checkpoint("qwen3_moe", "bench", "bf16", tmp_path / "q", seed=4, overrides=CACHED)
    with pytest.raises(EngineError) as info:
        Engine(str(model), ram_gb=0.001)
    # The stated minimum carries headroom for RSS drift (a larger cache); this test wants the
    # tightest budget: the resident part plus the smallest cache, each rounded to 0.01 GB.
    message = str(info.value)
    minimum = (float(re.search(r"resident part needs ([0-9.]+) GB", message).group(1))
               + float(re.search(r"expert cache at least ([0-9.]+) GB", message).group(1)) + 0.01)
    # This process's RSS drifts by tens of MB (torch is loaded), so the slot count a budget
    # gives is found by steps: aim at half of the 128 experts, step up when "too small".
    want_slots, budget = 56, minimum
    for _ in range(8):
        try:
            tr, st = rt.record(str(model), str(tmp_path / "run.trace"), 200, [5, 17, 42, 99, 3, 250], budget,
                               expert_history=False, expert_prefetch=False)
        except EngineError as exc:
            assert "too small" in str(exc)
            budget += 0.01
            continue
        if abs(int(st["slots"]) - want_slots) <= 12 or budget <= minimum and st["slots"] < want_slots:
            break
        budget += (want_slots - int(st["slots"])) * int(st["slot_bytes"]) / 1e9
    minimum = budget
    distinct = int((rt.usage_counts(tr) > 0).sum())
    assert st["slots"] < distinct and st["evictions"] > 0 and st["misses"] > distinct
    bank = rt._NextUse(tr.n_layers, tr.n_experts, None)
    replay = rt.simulate(tr, "ours", int(st["slots"]), model=bank)
    assert (replay.hits, replay.misses) == (st["hits"], st["misses"])
    switches = sum(a != b for a, b in zip(bank.chosen, bank.chosen[1:]))
    assert switches >= 3 and len(set(bank.chosen)) >= 3

    # a second run with the routing history the first one wrote: seeded, a hot set, preloaded
    history = tmp_path / "usage"
    rt.record(str(model), str(tmp_path / "first.trace"), 40, [5, 17, 42, 99, 3, 250], minimum,
              expert_history=str(history), expert_prefetch=False)
    counts, visits, n_layers, n_experts = rt.read_history(history)
    assert (n_layers, n_experts) == (tr.n_layers, tr.n_experts) and visits is not None
    assert visits.tolist() == [41.0] * n_layers  # the prompt and 40 tokens
    tr2, st2 = rt.record(str(model), str(tmp_path / "second.trace"), 60, [7, 8, 9, 200, 301], minimum,
                         expert_history=str(history), expert_prefetch=False)
    assert st2["hot_set"] > 0 and st2["preloaded"] == st2["hot_set"]
    replay = rt.simulate(tr2, "ours", int(st2["slots"]), history=counts, history_visits=visits)
    assert (replay.hits, replay.misses) == (st2["hits"], st2["misses"])
    cold = rt.simulate(tr2, "ours", int(st2["slots"]))
    assert (cold.hits, cold.misses) != (replay.hits, replay.misses)


def test_record_follows_a_text(small_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "held.txt"
    text.write_text("def parse(line):\n    return [int(x) for x in line.split(',') if x.strip()]\n" * 4)
    out = tmp_path / "text.trace"
    assert rt.main(["record", "--model", str(small_model), "--out", str(out), "--text", str(text),
                    "--prompt-tokens", "8", "--tokens", "5", "--ids-only"]) == 0
    assert "18 fetches" in capsys.readouterr().out  # the prompt, then 5 decode steps, x 3 layers
    followed = rt.read_trace(out)
    assert all(followed.score(i) is None for i in range(len(followed)))  # --ids-only
    ids = rt.text_ids(str(small_model), str(text), 13)
    again, _ = rt.record(str(small_model), str(tmp_path / "again.trace"), 5, ids[:8], None, follow=ids[8:])
    greedy, _ = rt.record(str(small_model), str(tmp_path / "greedy.trace"), 5, ids[:8], None)
    same = [np.array_equal(a, b) for a, b in zip(followed.batches, again.batches)]
    assert all(same) and len(followed) == len(again) == len(greedy) == 18
    # the decode steps were fed the text, not the model's own choices
    assert not all(np.array_equal(a, b) for a, b in zip(followed.batches[3:], greedy.batches[3:]))


TRAINED_TRACES = sorted((ROOT / "tools" / "traces").glob("*.trace"))


@pytest.mark.parametrize("path", TRAINED_TRACES, ids=lambda p: p.name)
def test_trained_routing_within_ten_points_of_belady(path: Path) -> None:
    # Routing recorded from models trained on real text (tools/traces/README.md); the issue's
    # target, within 10 points of Belady's optimum.  The store as it runs by default (ahead:
    # demand caching plus read-ahead, replaying the look-ahead hints the engine recorded) meets
    # it at every budget down to a tenth of the pool, with its extra disk reads bounded (at most
    # 1.3x what demand caching reads).  Demand caching alone (ours, Engine(expert_prefetch=False))
    # meets it from a quarter of the pool up, where LRU is far below, so the test can fail.
    trace = rt.read_trace(path)
    assert sum(h is not None for h in trace.hints) > len(trace) // 2  # hints from every layer but the last
    for row in rt.replay_table(trace, [0.1, 0.125, 0.25, 0.375]):
        if row["budget"] >= 0.25:
            assert row["belady"] - row["ours"] <= 0.10, row
            assert row["ours"] - row["lru"] >= 0.05, row
        assert row["belady"] - row["ahead"] <= 0.10, row
        assert row["ahead"] - row["ours"] >= 0.05, row
        assert row["ahead_reads"] <= 1.3 * (1 - row["ours"]), row


def test_read_ahead_replay_by_hand() -> None:
    # 2 layers x 4 experts, 2 slots.  Layer 0 always asks for expert 0, layer 1 alternates
    # 1 and 2; each layer-0 fetch carries a hint for layer 1: right for 6 tokens, then expert
    # 3, which layer 1 never asks for.
    tr = rt.Trace(2, 4)
    n = 20
    for t in range(n):
        want = 1 + t % 2
        tr.layers += [0, 1]
        tr.batches += [np.array([0], dtype=np.int32), np.array([want], dtype=np.int32)]
        tr.hints += [(1, np.array([want if t < 6 else 3], dtype=np.int32)), None]
    ours = rt.simulate(tr, "ours", 2)
    ahead = rt.simulate(tr, "ahead", 2)
    # ours: expert 0 stays; layer 1 misses every time (1 and 2 alternate in one slot)
    assert (ours.hits, ours.misses, ours.read_ahead) == (n - 1, n + 1, 0)
    # ahead: right hints are read after layer 0's fetch (never over it), so layer 1 hits at
    # most of tokens 0-5 (not at token 0: a rank of hint is read once it has been right at
    # least 70 % of the time; nor at 1: the policy, having seen layer 0 repeat itself, still
    # values the expert layer 1 just used more than the hint); the wrong hint is read until its
    # accuracy falls under 70 %, then no more
    assert ahead.hits + ahead.misses == 2 * n and ahead.hits >= ours.hits + 3
    early = rt.simulate(rt.Trace(2, 4, tr.layers[:n], tr.batches[:n], [], tr.hints[:n]), "ahead", 2)
    assert early.read_ahead > 4 and ahead.read_ahead == early.read_ahead
    assert ahead.reads_per_request == pytest.approx((ahead.misses + ahead.read_ahead) / (2 * n))


def test_train_moe_writes_a_checkpoint_the_engine_serves(tmp_path: Path) -> None:
    # a few steps of a very small model: the tool's plumbing (held-out split, tokenizer, weights
    # written in the real layout), not the training itself
    pytest.importorskip("torch")
    from tools import train_moe  # the repo root is on sys.path (conftest)

    out = tmp_path / "m"
    small = '{"num_hidden_layers": 2, "hidden_size": 32, "head_dim": 16, "num_experts": 8, "moe_intermediate_size": 16}'
    assert train_moe.main(["--out", str(out), "--steps", "2", "--batch", "2", "--seq", "32",
                           "--tokenizer-text-mb", "0.3", "--config-overrides", small]) == 0
    held = (out / "heldout.txt").read_text(encoding="utf-8")
    heldout = [p for p in train_moe.source_files() if train_moe.is_heldout(p)]
    assert heldout and 0 < len(heldout) < len(train_moe.source_files()) / 20
    assert train_moe.read_text(heldout[0]) in held
    trace = tmp_path / "t.trace"
    assert rt.main(["record", "--model", str(out), "--out", str(trace), "--text", str(out / "heldout.txt"),
                    "--prompt-tokens", "16", "--tokens", "4"]) == 0
    tr = rt.read_trace(trace)
    assert (tr.n_layers, tr.n_experts, len(tr)) == (2, 8, 10)


def test_demand_bounds_split_the_gap_to_belady() -> None:
    # tools/demand_bounds.py gives the demand policy pieces of the future; each stays a demand
    # cache, so none passes Belady, and knowing the next token's requests closes part of the gap.
    from tools import demand_bounds as db

    trace = rt.synthesize(4, 16, 2, 600, seed=3, reuse=0.4, drift=0.3)
    row = db.bounds(trace, 12, window=16)
    assert row["ours"] == rt.simulate(trace, "ours", 12).hit_rate
    for name in ("oracle-token", "oracle-this-token", "oracle-next-token", "future-popularity"):
        assert row[name] <= row["belady"] + 1e-12, row
    assert row["oracle-token"] - row["ours"] >= 0.25 * (row["belady"] - row["ours"]) > 0, row
    assert row["oracle-token"] >= max(row["oracle-this-token"], row["oracle-next-token"]), row


def test_widened_experts_route_and_compute_as_before(small_model: Path, tmp_path: Path) -> None:
    # tools/widen_experts.py pads each expert with zeros: each expert's bytes grow, and the model's
    # routing and outputs stay those of the original (what makes it a disk-bound stand-in for a
    # trained model in tools/traces/README.md).
    from tools import widen_experts

    from gateway.engine import Engine

    config = json.loads((small_model / "config.json").read_text())
    wide = tmp_path / "wide"
    assert widen_experts.main([str(small_model), str(wide), "--width", str(4 * config["moe_intermediate_size"])]) == 0
    narrow_size = sum(f.stat().st_size for f in small_model.glob("*.safetensors"))
    wide_size = sum(f.stat().st_size for f in wide.glob("*.safetensors"))
    assert wide_size > 2 * narrow_size
    prompt = [5, 17, 42, 99, 3, 250, 7]
    a, _ = rt.record(str(small_model), str(tmp_path / "a.trace"), 4, prompt, None)
    b, _ = rt.record(str(wide), str(tmp_path / "b.trace"), 4, prompt, None)
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a.batches, b.batches))
    la, lb = Engine(str(small_model)).eval(prompt), Engine(str(wide)).eval(prompt)
    assert np.array_equal(la, lb)  # zeros add nothing, in any summation order
    with pytest.raises(SystemExit):
        widen_experts.main([str(small_model), str(tmp_path / "same"), "--width", str(config["moe_intermediate_size"])])
