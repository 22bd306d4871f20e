"""The server's output pipeline without the engine: recorded model text in each dialect goes
through the real streaming parser (ChatOutput) and the real wire builders (server/*_protocol.py), and
the official SDKs' own stream accumulators rebuild the message from the produced chunks/events.

Random-weight checkpoints never write a well-formed call, so this is where tool calls are
checked end to end: text pieces -> parser -> OpenAI chunks / Anthropic events -> SDK objects.
"""
from __future__ import annotations

import json
import random

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from gateway.families import FAMILIES
from gateway.server.anthropic_protocol import (
    AnthropicBlocks,
    anthropic_content,
    anthropic_message_end,
    anthropic_message_start,
    anthropic_stop_reason,
)
from gateway.server.openai_protocol import OpenAIChunks, openai_message
from gateway.server.pipeline import ChatOutput

BAR = "\uff5c"


def tool(name: str, props: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": name,
                                             "parameters": {"type": "object", "properties": props}}}


TOOLS = [tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}),
         tool("get_time", {"tz": {"type": "string"}})]


def hermes(name: str, args: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def glm(name: str, args: dict) -> str:
    pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else json.dumps(v)}</arg_value>\n"
                    for k, v in args.items())
    return f"\n<tool_call>{name}\n{pairs}</tool_call>"


def qwen_xml(name: str, args: dict) -> str:
    params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                     for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def dsml(calls: list[tuple[str, dict]]) -> str:
    invokes = []
    for name, args in calls:
        params = "".join(f'<{BAR}DSML{BAR}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
                         f"{v if isinstance(v, str) else json.dumps(v)}</{BAR}DSML{BAR}parameter>\n"
                         for k, v in args.items())
        invokes.append(f'<{BAR}DSML{BAR}invoke name="{name}">\n{params}</{BAR}DSML{BAR}invoke>')
    return f"\n\n<{BAR}DSML{BAR}tool_calls>\n" + "\n".join(invokes) + f"\n</{BAR}DSML{BAR}tool_calls>"


CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"tz": "CET"})]

RECORDED = {
    "hermes": "Let me check." + "".join("\n" + hermes(n, a) for n, a in CALLS),
    "glm": "Let me check." + "".join(glm(n, a) for n, a in CALLS),
    "qwen_xml": "Let me check.\n" + "\n".join(qwen_xml(n, a) for n, a in CALLS),
    "dsml": "Let me check." + dsml(CALLS),
}


def pieces(text: str, rng: random.Random) -> list[str]:
    """Cuts text the way a tokenizer stream would: arbitrary 1-6 character pieces."""
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        out.append(text[i:i + n])
        i += n
    return out


def run_output(output: ChatOutput, text: str, seed: int, natural: str = "stop") -> tuple[list[dict], dict, str]:
    deltas: list[dict] = []
    for piece in pieces(text, random.Random(seed)):
        deltas += output.feed(piece)
        if output.cut:
            break
    deltas += output.finish(natural)
    return deltas, output.message(), output.finish_reason(natural)


def openai_final(deltas: list[dict], finish_reason: str, tools: list[dict]):
    chunks = OpenAIChunks("chatcmpl-test", 1700000000, "m")
    wire = [chunks.role()] + [chunks.delta(d) for d in deltas] + [chunks.finish(finish_reason)]
    wire.append(chunks.usage({"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                              "prompt_tokens_details": {"cached_tokens": 1}}))
    state = ChatCompletionStreamState(input_tools=tools)
    for chunk in wire:
        # The SDK parses SSE JSON the same way: from the serialised text.
        state.handle_chunk(ChatCompletionChunk.model_validate(json.loads(json.dumps(chunk))))
    # §2.1: a call's id/type/name come once, in its first fragment.
    firsts: dict[int, int] = {}
    for chunk in wire[1:-2]:
        for call in chunk["choices"][0]["delta"].get("tool_calls") or []:
            if call["index"] in firsts:
                assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
            else:
                firsts[call["index"]] = 1
                assert call["type"] == "function" and call["id"] and call["function"]["name"]
    return state.get_final_completion()


def anthropic_final(deltas: list[dict], finish_reason: str, stop_string: str | None = None):
    blocks = AnthropicBlocks()
    events = [anthropic_message_start("msg_test", "m", 3)]
    for d in deltas:
        events += blocks.delta(d)
    events += blocks.close()
    stop_reason, stop_sequence = anthropic_stop_reason(finish_reason, stop_string)
    events += anthropic_message_end(stop_reason, stop_sequence, {"input_tokens": 2, "output_tokens": 5,
                                                                  "cache_read_input_tokens": 1,
                                                                  "cache_creation_input_tokens": 0})
    snapshot, bufs = None, {}
    for name, data in events:
        assert name == data["type"]
        snapshot = accumulate_event(event=json.loads(json.dumps(data)), current_snapshot=snapshot, json_bufs=bufs)
    return snapshot


@pytest.mark.parametrize("dialect", sorted(RECORDED))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recorded_calls_reach_both_sdks(dialect, seed):
    deltas, message, finish = run_output(ChatOutput(dialect, TOOLS), RECORDED[dialect], seed)
    assert finish == "tool_calls"
    assert message["content"] == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == CALLS

    final = openai_final(deltas, finish, TOOLS)
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == CALLS
    assert [c.id for c in choice.message.tool_calls] == [c["id"] for c in message["tool_calls"]]
    assert openai_message(message)["tool_calls"] == message["tool_calls"]

    snap = anthropic_final(deltas, finish)
    assert [b.type for b in snap.content] == ["text", "tool_use", "tool_use"]
    assert snap.content[0].text == "Let me check."
    assert [(b.name, b.input) for b in snap.content[1:]] == CALLS
    assert snap.stop_reason == "tool_use"
    assert [b["type"] for b in anthropic_content(message)] == ["text", "tool_use", "tool_use"]


@pytest.mark.parametrize("fmt, dialect", [("qwen3", "hermes"), ("glm45", "glm"), ("dsml", "dsml")])
def test_forced_call_starts_inside_the_call(fmt, dialect):
    """tool_choice named: the prompt ends with the opener (and name); the model writes the rest."""
    prefix = FAMILIES[fmt].calls.opener("get_weather")
    full = {"hermes": hermes, "glm": glm}.get(dialect, lambda n, a: dsml([(n, a)]))("get_weather", {"city": "Rome"})
    assert full.startswith(prefix.lstrip("\n")) or full.startswith(prefix)
    continuation = full[len(prefix):] if full.startswith(prefix) else full[len(prefix.lstrip("\n")):]
    output = ChatOutput(dialect, TOOLS, start_in_call=prefix)
    deltas, message, finish = run_output(output, continuation, seed=5)
    assert finish == "tool_calls"
    assert message["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_weather", {"city": "Rome"})]
    final = openai_final(deltas, finish, TOOLS)
    assert final.choices[0].message.tool_calls[0].function.name == "get_weather"
    snap = anthropic_final(deltas, finish)
    assert [(b.type, b.input) for b in snap.content] == [("tool_use", {"city": "Rome"})]


def test_forced_call_with_noise_does_not_crash():
    """What random weights do after a forced opener: the parser degrades, the wire stays valid."""
    prefix = FAMILIES["qwen3"].calls.opener(None)
    output = ChatOutput("hermes", TOOLS, start_in_call=prefix)
    deltas, message, finish = run_output(output, "\ufffd.first[{\" la valueksch(Path", seed=3, natural="length")
    assert finish in ("length", "tool_calls")
    assert "<tool_call>" not in (message["content"] or "")
    anthropic_final(deltas, finish)
    if finish != "length":
        openai_final(deltas, finish, TOOLS)


def test_parallel_tool_calls_false_keeps_the_first_call():
    output = ChatOutput("hermes", TOOLS, parallel_tool_calls=False)
    deltas, message, finish = run_output(output, RECORDED["hermes"], seed=1)
    assert output.cut, "the second call's start must stop the generation"
    assert finish == "tool_calls"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert all(c["index"] == 0 for d in deltas for c in d.get("tool_calls", []))
    assert len(openai_final(deltas, finish, TOOLS).choices[0].message.tool_calls) == 1


def test_no_tools_means_no_parsing():
    deltas, message, finish = run_output(ChatOutput(None, []), RECORDED["hermes"], seed=0)
    assert finish == "stop" and "tool_calls" not in message
    assert message["content"] == RECORDED["hermes"]


def test_reasoning_becomes_thinking_and_reasoning_content():
    text = "The user wants weather.</think>\n\nSure." + "\n" + hermes("get_weather", {"city": "Oslo"})
    output = ChatOutput("hermes", TOOLS, in_reasoning=True)
    deltas, message, finish = run_output(output, text, seed=4)
    assert message["reasoning_content"] == "The user wants weather."
    assert message["content"] == "Sure."
    mirrored = OpenAIChunks("c", 1, "m", mirror_reasoning=True).delta({"reasoning_content": "x"})
    assert mirrored["choices"][0]["delta"] == {"reasoning_content": "x", "reasoning": "x"}
    final = openai_final(deltas, finish, TOOLS)
    assert final.choices[0].message.model_extra.get("reasoning_content") == "The user wants weather."
    snap = anthropic_final(deltas, finish)
    assert [b.type for b in snap.content] == ["thinking", "text", "tool_use"]
    assert snap.content[0].thinking == "The user wants weather." and snap.content[0].signature
    assert snap.content[2].input == {"city": "Oslo"}


def test_anthropic_stop_reasons():
    assert anthropic_stop_reason("length", None) == ("max_tokens", None)
    assert anthropic_stop_reason("stop", "END") == ("stop_sequence", "END")
    assert anthropic_stop_reason("stop", None) == ("end_turn", None)
    assert anthropic_stop_reason("tool_calls", None) == ("tool_use", None)


# issue 16.2: a block that started streaming, then failed.  What each reply shows is
# documented in gateway/toolcalls/core.py's module docstring.
LONG_VALUE = "word " * 60  # 300 characters: past the commit point
BROKEN = ("Saving.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n" + LONG_VALUE
          + "\n</function>\n</tool_call>")  # the value's </parameter> is missing
CUT = BROKEN[:BROKEN.index(LONG_VALUE) + 250]  # max_tokens ran out inside the value


@pytest.mark.parametrize("natural", ["stop", "length"])
def test_long_malformed_block_in_a_whole_reply_is_text(natural):
    text = BROKEN if natural == "stop" else CUT
    deltas, message, finish = run_output(ChatOutput("qwen_xml", TOOLS), text, seed=2, natural=natural)
    assert finish == natural
    assert "tool_calls" not in message and message["content"] == text.strip()
    assert not any("tool_calls" in d for d in deltas)


@pytest.mark.parametrize("natural", ["stop", "length"])
def test_long_malformed_block_in_a_stream_is_a_failed_call_then_text(natural):
    text = BROKEN if natural == "stop" else CUT
    output = ChatOutput("qwen_xml", TOOLS, streamed=True)
    deltas, message, finish = run_output(output, text, seed=2, natural=natural)
    assert finish == natural, "a failed call does not make the finish reason tool_calls"
    assert output.parser.failed_calls == [0]
    # The failed call, with valid JSON arguments, then the block's raw text as content: the same
    # content as the whole reply.
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"].startswith(LONG_VALUE[:200])
    assert message["content"] == text.strip()
    kinds = [next(iter(d)) for d in deltas]
    assert kinds.index("tool_calls") < len(kinds) - 1 - kinds[::-1].index("content")
    snap = anthropic_final(deltas, finish)
    assert [b.type for b in snap.content] == ["text", "tool_use", "text"]
    assert snap.stop_reason == ("end_turn" if natural == "stop" else "max_tokens")
    if natural == "stop":  # the openai helper raises on "length"
        final = openai_final(deltas, finish, TOOLS).choices[0]
        assert final.finish_reason == "stop" and final.message.content == text
        assert [c.function.name for c in final.message.tool_calls] == ["get_weather"]
