"""The request body, bytes to JSON, checked before any API reads a field: valid UTF-8 JSON, no
NaN/Infinity, nesting at most `MAX_JSON_DEPTH` deep, no lone UTF-16 surrogate in any string (the
tokenizer and the encoders need real Unicode).  Every route reads its body through `read_json`,
which parses off the event loop (a large body takes seconds).  docs/reference/gateway-wire.md §2.4.
"""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .errors import ApiError
from .offload import off_loop

MAX_JSON_DEPTH = 100


async def read_json(request: web.Request) -> Any:
    """The request's JSON body (400 when it is not JSON), parsed off the event loop."""
    return await off_loop(parse_json_body, await request.read())


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json_body(raw: bytes) -> Any:
    """The body as JSON, checked as the module docstring says (a 400 otherwise)."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4300 digits
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    check_json_tree(body)
    return body


def check_json_tree(value: Any) -> None:
    """Nesting depth and lone surrogates, without recursion (the bound is what is checked)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _check_unicode(node)
            continue
        if isinstance(node, dict):
            children: Any = node.values()
            for key in node:
                _check_unicode(key)
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth >= MAX_JSON_DEPTH:
            raise ApiError(400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (str, dict, list)))


def _check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise ApiError(400, f"the request body holds a lone UTF-16 surrogate (\\u{ord(bad):04x}) in a string; "
                            "strings must be valid Unicode") from None
