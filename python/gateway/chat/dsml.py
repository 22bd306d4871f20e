"""DeepSeek-V4 prompt encoder (DSML tool calls), written from docs/reference/dsml.md.

Pipeline (docs/reference/dsml.md §4):
1. tool results become `<tool_result>` blocks of user turns; consecutive user-side messages
   merge into one `<｜User｜>` turn;
2. tool results inside a turn are re-ordered to the order of the preceding assistant's calls;
3. in thinking mode without tools, reasoning of assistant turns before the last user turn is
   dropped (and that turn's opener becomes `</think>`);
then every message is rendered and the turn openers (`<｜Assistant｜><think>` / `</think>`)
are placed before assistant turns and at the end.

The texts below (special tokens, the tools instruction, the reasoning-effort prefixes) are
the prompt text the model was trained on and must stay byte-exact.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .types import ChatEncodingError, ContentPart, Message, ToolCall

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
LATEST_REMINDER = "<｜latest_reminder｜>"

TOOL_CALLS_TAG = "<｜DSML｜tool_calls>"
TOOL_CALLS_END_TAG = "</｜DSML｜tool_calls>"
INVOKE_END_TAG = "</｜DSML｜invoke>"
PARAMETER_END_TAG = "</｜DSML｜parameter>"
# What separates visible content from a call block; the parser's trigger (docs/reference/dsml.md §8.2).
TOOL_CALLS_START = "\n\n" + TOOL_CALLS_TAG

TOOLS_BLOCK_TEMPLATE = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    'writing a "<｜DSML｜tool_calls>" block like the following:\n\n<｜DSML｜tool_calls>\n'
    '<｜DSML｜invoke name="$TOOL_NAME">\n'
    '<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>\n'
    "...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, '
    'arrays, objects), pass the value in JSON format and set `string="false"`.\n\n'
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n{SCHEMAS}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
)
RESPONSE_FORMAT_INTRO = "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"

EFFORT_HIGH_TEXT = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)
EFFORT_MAX_TEXT = (
    "Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\nDo not stop reasoning until you have "
    "independently verified the solution from multiple angles and are certain that no assumption remains "
    "unchecked and no error remains undiscovered.\n\n"
)
# Which prefix each requested level gets, per weights release (docs/reference/dsml.md §4.4).
EFFORT_TABLES: dict[str, dict[str, str]] = {
    "preview": {"none": "", "high": "", "max": EFFORT_HIGH_TEXT},
    "0731": {"none": "", "high": EFFORT_HIGH_TEXT, "max": EFFORT_MAX_TEXT},
}
# API effort names -> the encoder's three levels (vLLM maps xhigh to max).
_EFFORT_LEVELS = {"none": "none", "minimal": "none", "low": "none", "medium": "none",
                  "high": "high", "xhigh": "max", "max": "max"}

TASK_MARKERS = {name: f"<｜{name}｜>" for name in ("action", "query", "authority", "domain", "title", "read_url")}


def effort_prefix(reasoning_effort: str | None, table: str = "preview") -> str:
    """The text prepended after BOS in thinking mode for a requested reasoning effort."""
    if table not in EFFORT_TABLES:
        raise ChatEncodingError(f"unknown DSML effort table {table!r} (expected one of {sorted(EFFORT_TABLES)})")
    if reasoning_effort is None:
        return ""
    level = _EFFORT_LEVELS.get(reasoning_effort)
    if level is None:
        raise ChatEncodingError(f"reasoning_effort: unsupported value {reasoning_effort!r}")
    return EFFORT_TABLES[table][level]


def tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools instruction with one JSON line per function object (docs/reference/dsml.md §5)."""
    schemas = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return TOOLS_BLOCK_TEMPLATE.replace("{SCHEMAS}", schemas)


def render_parameter(key: str, value: Any) -> str:
    if isinstance(value, str):
        return f'<｜DSML｜parameter name="{key}" string="true">{value}{PARAMETER_END_TAG}'
    return f'<｜DSML｜parameter name="{key}" string="false">{json.dumps(value, ensure_ascii=False)}{PARAMETER_END_TAG}'


def render_invoke(name: str, arguments: Mapping[str, Any]) -> str:
    params = "\n".join(render_parameter(k, v) for k, v in arguments.items())
    return f'<｜DSML｜invoke name="{name}">\n{params}\n{INVOKE_END_TAG}'


def render_tool_calls(calls: Sequence[ToolCall]) -> str:
    """TOOL_CALLS_PART of an assistant turn (docs/reference/dsml.md §6); empty without calls."""
    if not calls:
        return ""
    invokes = "\n".join(render_invoke(c.name, c.arguments) for c in calls)
    return f"{TOOL_CALLS_START}\n{invokes}\n{TOOL_CALLS_END_TAG}"


# --------------------------------------------------------------------------- preprocessing

@dataclass
class _Turn:
    """One rendered unit after tool results were folded into user turns."""

    role: str  # system | user | developer | assistant | latest_reminder
    content: str = ""
    blocks: list[tuple[str, str | None, str]] = field(default_factory=list)  # (kind, tool_use_id, text)
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tools: list[Mapping[str, Any]] | None = None
    response_format: Any = None
    task: str | None = None
    wo_eos: bool = False


def _parts_text(parts: tuple[ContentPart, ...] | None, content: str) -> str:
    if parts is None:
        return content
    return "\n\n".join(p.text if p.kind == "text" else f"[Unsupported {p.kind}]" for p in parts)


def _fold_messages(messages: Sequence[Message]) -> list[_Turn]:
    turns: list[_Turn] = []
    for m in messages:
        task = m.extras.get("task")
        if task is not None and task not in TASK_MARKERS:
            raise ChatEncodingError(f"unknown DSML task {task!r}")
        prev = turns[-1] if turns else None
        mergeable = prev is not None and prev.role == "user" and prev.task is None
        if m.role == "tool":
            block = ("tool_result", m.tool_call_id, _parts_text(m.parts, m.content))
            if mergeable:
                prev.blocks.append(block)
            else:
                turns.append(_Turn("user", blocks=[block]))
        elif m.role == "user":
            block = ("text", None, _parts_text(m.parts, m.content))
            if mergeable and task is None:
                prev.blocks.append(block)
            else:
                turns.append(_Turn("user", blocks=[block], task=task))
        else:
            turns.append(
                _Turn(
                    m.role,
                    content=_parts_text(m.parts, m.content),
                    reasoning=m.reasoning,
                    tool_calls=m.tool_calls,
                    tools=m.extras.get("tools"),
                    response_format=m.extras.get("response_format"),
                    task=task,
                    wo_eos=bool(m.extras.get("wo_eos", False)),
                )
            )
    return turns


def _order_tool_results(turns: list[_Turn]) -> None:
    """Sort each user turn's tool results into the order of the latest assistant's calls;
    text blocks keep their slots, unknown ids sort first (position 0)."""
    call_order: dict[str, int] = {}
    for turn in turns:
        if turn.role == "assistant" and turn.tool_calls:
            call_order = {c.id: k for k, c in enumerate(turn.tool_calls) if c.id is not None}
        elif turn.role == "user":
            slots = [k for k, b in enumerate(turn.blocks) if b[0] == "tool_result"]
            ordered = sorted((turn.blocks[k] for k in slots), key=lambda b: call_order.get(b[1] or "", 0))
            for k, block in zip(slots, ordered):
                turn.blocks[k] = block


# --------------------------------------------------------------------------- rendering

def _system_like_text(turn: _Turn) -> str:
    text = turn.content
    if turn.tools:
        text += "\n\n" + tools_block(turn.tools)
    if turn.response_format is not None:
        text += RESPONSE_FORMAT_INTRO + json.dumps(turn.response_format, ensure_ascii=False)
    return text


def _user_text(turn: _Turn) -> str:
    rendered = [text if kind == "text" else f"<tool_result>{text}</tool_result>" for kind, _, text in turn.blocks]
    return USER + "\n\n".join(rendered)


def encode_dsml_messages(
    messages: Sequence[Message],
    *,
    thinking: bool,
    drop_thinking: bool = True,
    reasoning_effort: str | None = None,
    effort_table: str = "preview",
    add_bos: bool = True,
    add_generation_prompt: bool = True,
) -> str:
    """Render messages (tools already attached to a system/developer message via
    `extras["tools"]`) into a DeepSeek-V4 prompt."""
    turns = _fold_messages(messages)
    _order_tool_results(turns)
    has_tools = any(t.tools for t in turns)
    dropping = thinking and drop_thinking and not has_tools
    last_user = max((k for k, t in enumerate(turns) if t.role in ("user", "developer")), default=-1)
    if dropping:
        kept: list[_Turn] = []
        for k, t in enumerate(turns):
            if k < last_user and t.role == "developer":
                continue
            if k < last_user and t.role == "assistant":
                t.reasoning = None
            kept.append(t)
        turns = kept
        last_user = max((k for k, t in enumerate(turns) if t.role in ("user", "developer")), default=-1)

    prefix = effort_prefix(reasoning_effort, effort_table)  # validates even in chat mode
    out: list[str] = [BOS] if add_bos else []
    if thinking:
        out.append(prefix)
    n = len(turns)
    for k, turn in enumerate(turns):
        prev = turns[k - 1] if k > 0 else None
        if turn.role == "system":
            out.append(_system_like_text(turn))
        elif turn.role == "developer":
            out.append(USER + _system_like_text(turn))
        elif turn.role == "user":
            out.append(_user_text(turn))
        elif turn.role == "latest_reminder":
            out.append(LATEST_REMINDER + turn.content)
        elif turn.role == "assistant":
            think_part = ""
            reasoning_kept = not dropping or k > last_user
            if thinking and reasoning_kept and not (prev is not None and prev.task is not None):
                think_part = (turn.reasoning or "") + THINK_CLOSE
            out.append(think_part + turn.content + render_tool_calls(turn.tool_calls))
            if not turn.wo_eos:
                out.append(EOS)
        else:  # pragma: no cover - normalisation only lets the roles above through
            raise ChatEncodingError(f"DSML cannot render role {turn.role!r}")
        # Opener: only before an assistant/reminder turn or at the very end.
        nxt = turns[k + 1] if k + 1 < n else None
        if nxt is not None and nxt.role not in ("assistant", "latest_reminder"):
            continue
        if nxt is None and not add_generation_prompt:
            continue
        if turn.task is not None:
            if turn.task == "action":
                out.append(ASSISTANT + (THINK_OPEN if thinking else THINK_CLOSE) + TASK_MARKERS["action"])
            else:
                out.append(TASK_MARKERS[turn.task])
        elif turn.role in ("user", "developer"):
            opens = thinking and (not dropping or k >= last_user)
            out.append(ASSISTANT + (THINK_OPEN if opens else THINK_CLOSE))
    return "".join(out)


def attach_tools(messages: Sequence[Message], tools: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Put the request's tools on the first system message (the reference placement), or on a
    new empty system message at position 0 when there is none."""
    msgs = list(messages)
    if not tools:
        return msgs
    if msgs and msgs[0].role == "system":
        first = msgs[0]
        msgs[0] = Message(role="system", content=first.content, parts=first.parts,
                          extras={**first.extras, "tools": list(tools)})
    else:
        msgs.insert(0, Message(role="system", content="", extras={"tools": list(tools)}))
    return msgs
