"""tools/try_tool_calling.py against a live server.

Random weights never write a well-formed call, so against the tiny checkpoint the probe must run
all four cases through both SDKs and report FAIL honestly (exit 1), never crash.  The turn-2
requests it would send are built from a real parsed response (recorded call text through the real
parser and wire builders, then the SDK's own types) and must be accepted by the gateway.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletionMessage

from gateway.server.anthropic_protocol import anthropic_content
from gateway.server.openai_protocol import openai_message
from gateway.server.pipeline import ChatOutput

pytest.register_assert_rewrite("server_fixtures")
from server_fixtures import REPO_ROOT  # noqa: E402

pytest_plugins = ["server_fixtures"]

sys.path.insert(0, str(REPO_ROOT / "tools"))
import try_tool_calling as probe  # noqa: E402

RECORDED = ('<think>Need the weather.</think>\n\nChecking.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')


def parsed_turn1() -> dict:
    out = ChatOutput("hermes", probe.OPENAI_TOOLS, in_reasoning=False)
    for i in range(0, len(RECORDED), 4):
        out.feed(RECORDED[i:i + 4])
    out.finish("stop")
    return out.message()


def test_probe_reports_failures_on_noise(qwen_server):
    # tool_choice auto: random weights write no call, and the probe must say so (exit 1), not crash.
    # (With --force the grammar makes even noise call the tool: tests/test_server_structured.py.)
    cmd = [sys.executable, str(REPO_ROOT / "tools" / "try_tool_calling.py"), "--base-url", qwen_server.base_url,
           "--max-tokens", "12"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    table = [ln for ln in lines if ln.startswith(("openai ", "anthropic "))]
    assert len(table) == 4 and all(" FAIL " in ln for ln in table), done.stdout
    assert all("turn 1:" in ln for ln in table), done.stdout  # a protocol-level reason, not a crash
    assert lines[-1] == "0/4 passed"
    assert "Traceback" not in done.stderr


def test_probe_unreachable_server_exits_2():
    done = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "try_tool_calling.py"),
                           "--base-url", "http://127.0.0.1:9", "--timeout", "5"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot reach" in done.stderr


def test_turn2_requests_are_accepted(qwen_server):
    message = parsed_turn1()
    result = probe.get_weather("Rome")
    first = [{"role": "user", "content": probe.QUESTION}]

    oa_message = ChatCompletionMessage.model_validate(openai_message(message))
    body = {"model": "m", "messages": probe.openai_turn2(first, oa_message, result), "tools": probe.OPENAI_TOOLS,
            "max_tokens": 3}
    status, out, _ = qwen_server.post_json("/v1/chat/completions", body)
    assert status == 200, out
    assert body["messages"][1]["reasoning_content"] == "Need the weather."
    assert body["messages"][2]["tool_call_id"] == message["tool_calls"][0]["id"]

    an_message = Message.model_validate({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                                         "content": anthropic_content(message), "stop_reason": "tool_use",
                                         "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}})
    body = {"model": "m", "messages": probe.anthropic_turn2(first, an_message, result),
            "tools": probe.ANTHROPIC_TOOLS, "max_tokens": 3}
    assert [b["type"] for b in body["messages"][1]["content"]] == ["thinking", "text", "tool_use"]
    status, out, _ = qwen_server.post_json("/v1/messages", body)
    assert status == 200, out
    # The replayed call reached the prompt: the rendered turn-2 prompt holds the call and the result.
    status, tok, _ = qwen_server.post_json("/tokenize", {"messages": probe.openai_turn2(first, oa_message, result),
                                                         "tools": probe.OPENAI_TOOLS, "with_pieces": True})
    text = "".join(tok["pieces"])
    assert '"city": "Rome"' in text and "sunny" in text
