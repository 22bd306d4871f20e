"""Prefix snapshots (Engine.save_prefix / restore_prefix) and the slot's conversation cache
(gateway.prefix_cache) on all three architectures.

The contract: restoring a snapshot of n tokens and evaluating more gives bitwise the logits the
engine gives after truncate(n) on the same history, whatever the slot held in between (like
truncate, DeepSeek-V4 replays the tokens after the last multiple of its compression period); a
snapshot of another model, of another KV dtype, or a damaged one is refused with the slot
usable.  The slot keeps a long conversation it leaves and resumes it without prefill.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from gateway.engine import Engine, EngineError
from gateway.generate import GenerationRequest, Slot
from gateway.prefix_cache import PrefixCache
from gateway.sampling import SamplingParams
from gateway.tokenizer import Tokenizer

ARCHS = [("qwen3_moe", "bf16"), ("glm4_moe", "fp8"), ("deepseek_v4", "native")]


@pytest.fixture(scope="module", params=ARCHS, ids=[a for a, _ in ARCHS])
def ckpt(request, build_checkpoint) -> Path:
    arch, fmt = request.param
    return build_checkpoint(arch, fmt)


def tokens_for(engine: Engine, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(1, min(engine.vocab_size, 1000), n)]


# DeepSeek-V4's tiny config compresses every 4 / 8 tokens and snapshots its carries every 8:
# cut inside and on those boundaries.
CUTS = [0, 1, 7, 8, 29, 64, 90]


@pytest.mark.parametrize("kv_dtype", ["f32", "bf16"])
def test_restore_equals_truncate_bitwise(ckpt, kv_dtype):
    engine = Engine(str(ckpt), kv_dtype=kv_dtype, max_ctx=256)
    history = tokens_for(engine, 96, 1)
    tail = tokens_for(engine, 12, 2)
    other = tokens_for(engine, 40, 3)
    for n in CUTS:
        engine.reset()
        engine.eval(history)
        snap = engine.save_prefix(n)
        engine.truncate(n)
        want = engine.eval(tail)
        engine.reset()
        engine.eval(other)  # the slot moves on to something else entirely
        assert engine.restore_prefix(snap) == n and engine.n_past == n
        got = engine.eval(tail)
        assert np.array_equal(got, want), f"n={n}: max |diff| {np.abs(got - want).max()}"
    engine.close()


def test_snapshot_moves_between_engines_of_one_checkpoint(ckpt):
    a, b = Engine(str(ckpt), max_ctx=256), Engine(str(ckpt), max_ctx=256)
    history, tail = tokens_for(a, 70, 4), tokens_for(a, 5, 5)
    a.eval(history)
    snap = a.save_prefix()
    a.truncate(70)  # DeepSeek-V4 replays the open compression window, as a restore does
    want = a.eval(tail)
    assert b.restore_prefix(snap) == 70
    assert np.array_equal(b.eval(tail), want)


def test_bad_snapshots_are_refused_and_the_slot_stays_usable(ckpt, build_checkpoint):
    engine = Engine(str(ckpt), max_ctx=256)
    history = tokens_for(engine, 40, 6)
    engine.eval(history)
    snap = engine.save_prefix()
    assert engine.prefix_bytes() == snap.nbytes and engine.prefix_bytes(10) < snap.nbytes
    for bad, why in ((snap[:-1], "truncated"), (np.concatenate([snap, snap[:1]]), "padded"),
                     (np.zeros(4, np.uint8), "too short"), (np.zeros(64, np.uint8), "not a snapshot")):
        with pytest.raises(EngineError, match=why):
            engine.restore_prefix(bad)
        assert engine.n_past == 40  # refused before the slot was touched
    with pytest.raises(EngineError, match="different model or KV dtype"):
        Engine(str(ckpt), max_ctx=256, kv_dtype="bf16").restore_prefix(snap)
    foreign_arch = "glm4_moe" if "qwen3" not in ckpt.name else "deepseek_v4"
    foreign = Engine(str(build_checkpoint(foreign_arch, "bf16" if foreign_arch == "glm4_moe" else "native")),
                     max_ctx=256)
    with pytest.raises(EngineError, match="different model"):
        foreign.restore_prefix(snap)
    with pytest.raises(EngineError, match="exceeds max_ctx"):
        small = Engine(str(ckpt), max_ctx=16)
        small.restore_prefix(snap)
    with pytest.raises(EngineError, match="slot holds"):
        engine.save_prefix(41)
    engine.truncate(10)
    assert engine.eval(history[10:12]).shape == (2, engine.vocab_size)


# ---------------------------------------------------------------------- the slot's cache

def run(slot: Slot, prompt: list[int]) -> tuple[list[int], int]:
    req = GenerationRequest(prompt_ids=prompt, max_tokens=6, sampling=SamplingParams(temperature=0.0))
    res = slot.generate(req, threading.Event(), lambda _event: None)
    return res.token_ids, res.cached_tokens


def test_slot_resumes_a_conversation_it_left(ckpt):
    engine = Engine(str(ckpt), max_ctx=1024)
    tok = Tokenizer.from_dir(ckpt)
    cache = PrefixCache(64 << 20, min_tokens=256)
    slot = Slot(engine, tok, 1024, cache)
    main = tokens_for(engine, 400, 7)
    side = tokens_for(engine, 300, 8)
    first, _ = run(slot, main)
    assert len(cache) == 0
    _, cached = run(slot, side)  # leaving the main conversation: it is kept
    assert cached == 0 and len(cache) == 1
    follow_up = main + first + tokens_for(engine, 20, 9)
    out, cached = run(slot, follow_up)  # back: restored, only the new tokens are evaluated
    assert cache.restores == 1 and cached >= len(main) + len(first) - 1, (cached, cache.stats())
    assert len(cache) == 2  # the side conversation was kept in turn (the main one stays too)
    fresh = Slot(Engine(str(ckpt), max_ctx=1024), tok, 1024)
    run(fresh, main)  # same history as the resumed slot (prefill chunks included), then the turn
    want, _ = run(fresh, follow_up)
    assert out == want
    _, cached = run(slot, side + [5])  # and the side conversation comes back the same way
    assert cache.restores == 2 and cached >= len(side) - 1
    # The main conversation, grown since, was kept again: its longer snapshot replaced the old one.
    assert len(cache) == 2 and not cache.worth_saving(follow_up)


def test_short_or_edited_conversations_are_not_snapshotted(ckpt):
    engine = Engine(str(ckpt), max_ctx=1024)
    cache = PrefixCache(64 << 20, min_tokens=256)
    slot = Slot(engine, Tokenizer.from_dir(ckpt), 1024, cache)
    convo = tokens_for(engine, 300, 10)
    run(slot, convo)
    run(slot, convo[:290] + tokens_for(engine, 30, 11))  # an edited tail: same conversation
    run(slot, tokens_for(engine, 100, 12))  # leaves a long one: kept
    assert len(cache) == 1
    run(slot, tokens_for(engine, 50, 13))  # leaves a short one: not worth a snapshot
    assert len(cache) == 1


def test_cache_budget_evicts_the_least_recently_used():
    cache = PrefixCache(1000, min_tokens=2)
    assert cache.add([1, 2, 3], np.zeros(400, np.uint8))
    assert cache.add([4, 5, 6], np.zeros(400, np.uint8))
    key, shared = cache.best_match([1, 2, 3, 9])
    assert shared == 3
    cache.take(key)  # [1, 2, 3] is now the most recent
    assert cache.add([7, 8], np.zeros(400, np.uint8))
    assert cache.best_match([4, 5, 6])[1] == 0 and cache.evictions == 1
    assert not cache.add([9, 9], np.zeros(2000, np.uint8))  # alone over the budget
    assert not cache.make_room(2000) and len(cache) == 2
    assert cache.make_room(900) and len(cache) == 0 and cache.evictions == 3
    assert cache.add([1, 2, 3], np.zeros(100, np.uint8))
    assert cache.add([1, 2, 3, 4], np.zeros(100, np.uint8))  # extends [1, 2, 3]: replaces it
    assert len(cache) == 1 and not cache.worth_saving([1, 2, 3])


# ---------------------------------------------------------------------- on disk

def test_disk_snapshots_outlive_the_slot(ckpt, tmp_path):
    """What a restart looks like: a conversation kept on disk by one slot is resumed by a new
    engine and slot (a new process), with the same greedy tokens as a slot that never left."""
    from gateway.prefix_disk import DiskSnapshots

    tok = Tokenizer.from_dir(ckpt)
    first = Slot(Engine(str(ckpt), max_ctx=1024), tok, 1024, None, DiskSnapshots(tmp_path, 1 << 30, 256))
    system = tokens_for(first.engine, 350, 20)  # the long prefix every session starts with
    reply, _ = run(first, system)
    first.persist()  # what the server does when it stops
    assert len(first.prefix_disk) == 1
    first.engine.close()

    disk = DiskSnapshots(tmp_path, 1 << 30, 256)  # a new process indexes the folder
    assert len(disk) == 1
    second = Slot(Engine(str(ckpt), max_ctx=1024), tok, 1024, None, disk)
    new_session = system + tokens_for(second.engine, 15, 21)
    out, cached = run(second, new_session)
    assert second.snapshot_restores == 1 and cached >= len(system) - 1, (cached, disk.stats())
    fresh = Slot(Engine(str(ckpt), max_ctx=1024), tok, 1024)
    run(fresh, system)
    fresh.engine.truncate(len(system))  # the same history as the restored slot: the system prompt
    fresh.tokens = list(system)
    want, _ = run(fresh, new_session)
    assert out == want


def test_damaged_disk_snapshots_are_dropped_not_used(ckpt, tmp_path, caplog):
    from gateway.prefix_disk import DiskSnapshots

    tok = Tokenizer.from_dir(ckpt)
    slot = Slot(Engine(str(ckpt), max_ctx=1024), tok, 1024, None, DiskSnapshots(tmp_path, 1 << 30, 256))
    convo = tokens_for(slot.engine, 300, 22)
    run(slot, convo)
    slot.persist()
    (path,) = tmp_path.glob("*.snap")
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x40  # one flipped bit in the state
    path.write_bytes(bytes(data))
    disk = DiskSnapshots(tmp_path, 1 << 30, 256)
    assert len(disk) == 1  # the header is fine: only reading finds the damage
    slot = Slot(Engine(str(ckpt), max_ctx=1024), tok, 1024, None, disk)
    _, cached = run(slot, convo + [3, 4])
    assert cached == 0 and slot.snapshot_restores == 0 and len(disk) == 0 and not path.exists()
    assert "checksum" in caplog.text
    # a truncated file is dropped when the folder is indexed
    run(slot, tokens_for(slot.engine, 300, 23))  # leaves convo: kept again
    (path,) = tmp_path.glob("*.snap")
    path.write_bytes(path.read_bytes()[:-1])
    assert len(DiskSnapshots(tmp_path, 1 << 30, 256)) == 0 and not path.exists()


def test_disk_budget_drops_the_least_recently_used(tmp_path):
    from gateway.prefix_disk import DiskSnapshots

    disk = DiskSnapshots(tmp_path, 3000, 2)
    assert disk.save([1, 2], np.ones(1000, np.uint8)) and disk.save([3, 4], np.ones(1000, np.uint8))
    entry, shared = disk.best_match([1, 2, 9])
    assert shared == 2 and disk.read(entry).sum() == 1000
    import os
    import time
    os.utime(entry.path, (time.time() + 5, time.time() + 5))  # [1, 2] was used last
    assert disk.save([5, 6], np.ones(1000, np.uint8))
    assert disk.best_match([3, 4])[1] == 0 and disk.best_match([1, 2])[1] == 2 and len(disk) == 2
    assert not disk.save([7, 8], np.ones(5000, np.uint8))  # alone over the budget
    assert disk.save([1, 2, 3], np.ones(10, np.uint8)) and len(disk) == 2  # extends [1, 2]: replaces it
    names = {p.name for p in tmp_path.iterdir()}
    assert all(len(n) == 37 and n.endswith(".snap") for n in names), names  # hashes, never request text


def test_server_restart_resumes_from_the_snapshot_folder(build_checkpoint, tmp_path):
    """--prefix-cache-dir end to end: the server keeps its slot on disk when it stops, and the
    next server starts a conversation with the same long system prompt without prefilling it."""
    import openai

    from server_fixtures import start_server, stop_server

    model = build_checkpoint("qwen3_moe", "bf16")
    folder = tmp_path / "snapshots"
    system = "You are a coding agent. " + " ".join(f"Tool rule {i}: check twice." for i in range(70))
    turn = [{"role": "system", "content": system}, {"role": "user", "content": "Session one."}]

    server = start_server(model, "--prefix-cache-dir", str(folder))
    try:
        client = openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0, timeout=60)
        first = client.chat.completions.create(model="m", messages=turn, max_tokens=3, seed=1)
        assert first.usage.prompt_tokens > 300
    finally:
        stop_server(server)
    assert len(list(folder.rglob("*.snap"))) == 1

    server = start_server(model, "--prefix-cache-dir", str(folder))
    try:
        assert "1 on disk" in server.log()
        client = openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0, timeout=60)
        turn[1]["content"] = "Session two, another question."
        second = client.chat.completions.create(model="m", messages=turn, max_tokens=3, seed=1)
        # everything up to the user message came from disk
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 12
        metrics = server.metrics()
        assert metrics["moegate_prefix_snapshot_restores_total"] == 1
    finally:
        stop_server(server)
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files and all(p.stat().st_mode & 0o077 == 0 for p in files)  # private to the user


def test_under_a_budget_snapshot_buffers_fit_the_ram_share(build_checkpoint, tmp_path):
    """With --ram every snapshot buffer, even one only passing to disk, must fit the RAM tier's
    share; without a RAM tier the disk tier is off."""
    from gateway.prefix_disk import DiskSnapshots

    ckpt = build_checkpoint("qwen3_moe", "bf16")
    tok = Tokenizer.from_dir(ckpt)
    engine = Engine(str(ckpt), max_ctx=1024)
    convo, other = tokens_for(engine, 400, 30), tokens_for(engine, 300, 31)
    need = None
    for budgeted, ram_bytes, folder in ((True, 0, "a"), (True, 100_000, "b"), (False, 100_000, "c")):
        disk = DiskSnapshots(tmp_path / folder, 1 << 30, 256)
        slot = Slot(engine, tok, 1024, PrefixCache(ram_bytes), disk, budgeted=budgeted)
        run(slot, convo)
        need = need or engine.prefix_bytes()
        run(slot, other)  # leaves convo
        written = len(list((tmp_path / folder).glob("*.snap")))
        if budgeted and ram_bytes == 0:
            assert slot.prefix_disk is None and written == 0
        elif budgeted:
            assert need > ram_bytes and written == 0  # the buffer would not fit the RAM share
        else:
            assert written == 1  # no budget: the disk tier takes what RAM cannot hold
