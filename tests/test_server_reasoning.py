"""Reasoning and DSML against a live server on a tiny random-weight DeepSeek-V4 checkpoint (the
real DSML chat format and tokenizer).  The server runs with `--reasoning-field both`, so every
`reasoning_content` is mirrored as `reasoning`.

With thinking on, the prompt opens the reasoning block, so the (noise) output is reasoning: that
exercises reasoning_content deltas, the mirror, Anthropic thinking blocks with signatures and
display "omitted", all through the SDKs.
"""
from __future__ import annotations

import anthropic
import openai
import pytest

pytest.register_assert_rewrite("server_fixtures")
from server_fixtures import check_anthropic_events, check_openai_chunks, open_stream  # noqa: E402

pytest_plugins = ["server_fixtures"]

BAR = "\uff5c"
HI = [{"role": "user", "content": "Think first."}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def dsv4_server(live_server):
    return live_server("deepseek_v4", "--reasoning-field", "both", fmt="native")


@pytest.fixture(scope="module")
def oa(dsv4_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=dsv4_server.url("/v1"), api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def an(dsv4_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=dsv4_server.base_url, api_key="x", max_retries=0, timeout=60)


def test_reasoning_content_and_its_mirror(oa, dsv4_server):
    kwargs = dict(model="m", messages=HI, max_tokens=8, seed=3, reasoning_effort="high")
    r = oa.chat.completions.create(**kwargs)
    extra = r.choices[0].message.model_extra
    assert isinstance(extra.get("reasoning_content"), str) and extra["reasoning_content"]
    assert extra["reasoning"] == extra["reasoning_content"]

    stream = open_stream(dsv4_server.base_url, "/v1/chat/completions", dict(kwargs, stream=True))
    chunks = check_openai_chunks(stream.read_all())
    deltas = [c["choices"][0]["delta"] for c in chunks[1:] if c["choices"]]
    streamed = "".join(d.get("reasoning_content") or "" for d in deltas)
    assert streamed == extra["reasoning_content"]
    assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)

    with oa.chat.completions.stream(**kwargs) as helper:
        try:
            final = helper.get_final_completion()
        except openai.LengthFinishReasonError as err:
            final = err.completion
    assert final.choices[0].message.model_extra["reasoning_content"] == extra["reasoning_content"]


def test_thinking_off_gives_content(oa):
    r = oa.chat.completions.create(model="m", messages=HI, max_tokens=6, seed=3,
                                   extra_body={"chat_template_kwargs": {"thinking": False}})
    assert r.choices[0].message.content
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})


def test_anthropic_thinking_blocks(an, dsv4_server):
    # "adaptive": an "enabled" budget must be at least 1024 and below max_tokens (issue 16 item 13),
    # which test_thinking_budget_closes_the_reasoning covers; this one is about the block shapes.
    body = dict(model="m", max_tokens=8, messages=HI, thinking={"type": "adaptive"})
    m = an.messages.create(**body)
    assert m.content[0].type == "thinking" and m.content[0].thinking and m.content[0].signature
    with an.messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].signature
    raw = open_stream(dsv4_server.base_url, "/v1/messages", dict(body, stream=True))
    pairs = check_anthropic_events(raw.read_all())
    deltas = [d["delta"]["type"] for n, d in pairs if n == "content_block_delta" and d["index"] == 0]
    assert deltas[0] == "thinking_delta" and deltas[-1] == "signature_delta"


def test_anthropic_thinking_display_omitted(an, dsv4_server):
    body = dict(model="m", max_tokens=6, messages=HI,
                thinking={"type": "adaptive", "display": "omitted"})
    raw = open_stream(dsv4_server.base_url, "/v1/messages", dict(body, stream=True))
    pairs = check_anthropic_events(raw.read_all())
    block = [d for n, d in pairs if n == "content_block_start"][0]["content_block"]
    assert block["type"] == "thinking"
    assert [d["delta"]["type"] for n, d in pairs if n == "content_block_delta"] == ["signature_delta"]
    m = an.messages.create(**body)
    assert m.content[0].type == "thinking" and m.content[0].thinking == "" and m.content[0].signature
    with pytest.raises(anthropic.BadRequestError):
        an.messages.create(model="m", max_tokens=6, messages=HI, thinking={"type": "sometimes"})


def test_forced_dsml_call_prefill(oa, dsv4_server):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    status, tok, _ = dsv4_server.post_json("/tokenize", {"messages": HI, "tools": [WEATHER], "tool_choice": choice,
                                                         "with_pieces": True})
    assert status == 200
    text = "".join(tok["pieces"])
    assert text.endswith(f'<{BAR}DSML{BAR}invoke name="get_weather">\n'), text[-120:]
    r = oa.chat.completions.create(model="m", messages=HI, tools=[WEATHER], tool_choice=choice, max_tokens=10,
                                   seed=2)
    assert r.usage.prompt_tokens == tok["count"]
    msg = r.choices[0].message
    assert not (msg.content or "").lstrip().startswith(f"<{BAR}DSML"), "the prefilled opener is never shown"
    assert "reasoning_content" not in (msg.model_extra or {}), "a forced call starts right after the prompt"
    for call in msg.tool_calls or []:
        assert call.function.name == "get_weather"


def test_second_turn_reuses_the_prefix(oa):
    first = oa.chat.completions.create(model="m", messages=HI, max_tokens=5, seed=1)
    turn2 = HI + [{"role": "assistant", "content": first.choices[0].message.content or "ok"},
                  {"role": "user", "content": "More."}]
    second = oa.chat.completions.create(model="m", messages=turn2, max_tokens=3, seed=1)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 2


# ------------------------------------------------------------------ thinking.budget_tokens (issue 16 item 13)

def test_thinking_budget_closes_the_reasoning(dsv4_server):
    """Greedy, through the end-of-turn tokens: without a budget the first 1024 tokens are all
    reasoning (the noise never writes </think>); with budget_tokens 1024 the reasoning is exactly
    those tokens, then the family's </think> is forced and the answer follows."""
    budget = 1024
    base = dict(model="m", messages=HI, temperature=0, ignore_eos=True)
    status, free, _ = dsv4_server.post_json("/v1/messages", dict(
        base, max_tokens=budget, thinking={"type": "adaptive"}), timeout=120)
    assert status == 200, free
    status, capped, _ = dsv4_server.post_json("/v1/messages", dict(
        base, max_tokens=budget + 24, thinking={"type": "enabled", "budget_tokens": budget}), timeout=120)
    assert status == 200, capped
    free_thinking = "".join(b["thinking"] for b in free["content"] if b["type"] == "thinking")
    thinking = [b["thinking"] for b in capped["content"] if b["type"] == "thinking"]
    text = [b["text"] for b in capped["content"] if b["type"] == "text"]
    assert thinking and thinking[0] == free_thinking, "the reasoning is cut at the budget, not before"
    assert text and text[0], "the answer follows the closed reasoning"
    assert capped["usage"]["output_tokens"] == budget + 24
    assert [b["type"] for b in capped["content"]][:2] == ["thinking", "text"]


def test_thinking_budget_errors_are_400_in_anthropic_shape(dsv4_server):
    for thinking, max_tokens in (({"type": "enabled", "budget_tokens": 512}, 2000),
                                 ({"type": "enabled", "budget_tokens": 1024}, 1024),
                                 ({"type": "enabled"}, 2000)):
        for stream in (False, True):
            status, out, _ = dsv4_server.post_json("/v1/messages", dict(
                model="m", max_tokens=max_tokens, messages=HI, thinking=thinking, stream=stream))
            assert status == 400, out
            assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error"


def test_thinking_budget_hook_forces_the_marker(build_checkpoint):
    """The hook alone, on the real DSML tokenizer: counting starts when the reply opens <think>
    (or at once when the prompt did), the marker is forced after `budget` reasoning tokens, and
    a model that closes the reasoning itself is left alone."""
    import numpy as np

    from gateway.server.thinking_budget import ThinkingBudget
    from gateway.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(build_checkpoint("deepseek_v4", "native"))
    think, close = tok.token_id("<think>"), tok.token_id("</think>")
    word = tok.encode(" word")[0]
    vocab = tok.vocab_size

    def run(hook, first: list[int], steps: int) -> list[int]:
        generated = list(first)
        for _ in range(steps):
            mask = hook(generated)
            generated.append(int(np.flatnonzero(mask)[0]) if mask is not None and mask.sum() == 1 else word)
        return generated

    out = run(ThinkingBudget(tok, 5, ("<think>", "</think>"), in_reasoning=False, n_vocab=vocab), [think], 10)
    assert out[:7] == [think] + [word] * 5 + [close] and close not in out[7:]
    out = run(ThinkingBudget(tok, 3, ("<think>", "</think>"), in_reasoning=True, n_vocab=vocab), [], 8)
    assert out[:4] == [word] * 3 + [close] and out.count(close) == 1
    # The reply opened no reasoning: no budget applies.
    assert close not in run(ThinkingBudget(tok, 2, ("<think>", "</think>"), in_reasoning=False, n_vocab=vocab),
                            [word], 8)
    # The model closed the reasoning itself: nothing is forced afterwards.
    hook = ThinkingBudget(tok, 4, ("<think>", "</think>"), in_reasoning=True, n_vocab=vocab)
    assert close not in run(hook, [word, close], 8)[2:]
    # A grammar's mask is combined: where it refuses the marker, the grammar wins.
    refuse = np.ones(vocab, dtype=bool)
    refuse[close] = False
    hook = ThinkingBudget(tok, 1, ("<think>", "</think>"), in_reasoning=True, n_vocab=vocab,
                          inner=lambda generated: refuse)
    assert hook([word]) is refuse
