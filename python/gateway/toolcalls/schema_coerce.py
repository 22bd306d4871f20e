"""Tool schemas and argument-value conversion (docs/reference/toolcall-contract.md §4).

`ToolCatalog` answers the two questions the block parsers ask: is a function declared, and which
JSON types does a parameter allow.  `coerce` turns the raw text of an XML-style argument value into
the JSON value the schema asks for; it never raises, a failed conversion keeps the raw text.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable, Mapping

# Type spellings seen in the wild (Qwen3-Coder schemas, hand-written tools) mapped to JSON types.
_TYPE_ALIASES: dict[str, str] = {
    "string": "string", "str": "string", "text": "string", "varchar": "string", "char": "string",
    "enum": "string",
    "integer": "integer", "int": "integer", "long": "integer", "short": "integer",
    "number": "number", "float": "number", "double": "number", "decimal": "number",
    "boolean": "boolean", "bool": "boolean",
    "object": "object", "dict": "object", "map": "object",
    "array": "array", "list": "array", "tuple": "array",
    "null": "null", "none": "null",
}

_INT_RE = re.compile(r"-?\d+")
_NUMBER_RE = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")

STRING_ONLY: frozenset[str] = frozenset({"string"})


def _normalise_type(name: str) -> str | None:
    lowered = name.strip().lower()
    if lowered in _TYPE_ALIASES:
        return _TYPE_ALIASES[lowered]
    if lowered.startswith(("int", "uint")):
        return "integer"
    if lowered.startswith("float"):
        return "number"
    return None


def schema_types(schema: Any) -> frozenset[str] | None:
    """The set of JSON types a parameter schema allows, or None when it declares no type.

    `type` may be a string or a list; `anyOf`/`oneOf` branches are merged; OpenAPI's
    `nullable: true` adds null.
    """
    if not isinstance(schema, Mapping):
        return None
    found: set[str] = set()
    declared = schema.get("type")
    names: Iterable[Any] = declared if isinstance(declared, list) else [declared] if declared else []
    for name in names:
        if isinstance(name, str) and (norm := _normalise_type(name)):
            found.add(norm)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                found |= schema_types(branch) or set()
    if found and schema.get("nullable") is True:
        found.add("null")
    return frozenset(found) if found else None


class ToolCatalog:
    """Declared functions and their parameter types, built from an OpenAI `tools` list."""

    def __init__(self, tools: Iterable[Any] | None) -> None:
        self._params: dict[str, Mapping[str, Any]] = {}
        for tool in tools or []:
            if not isinstance(tool, Mapping):
                continue
            # Accept both {"type": "function", "function": {...}} and a bare function object.
            fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                continue
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, Mapping) else None
            self._params[name] = props if isinstance(props, Mapping) else {}

    @property
    def empty(self) -> bool:
        return not self._params

    def declared(self, name: str) -> bool:
        return name in self._params

    def types(self, function: str, parameter: str) -> frozenset[str] | None:
        """Allowed JSON types of `parameter`; None when the tool or parameter is undeclared."""
        props = self._params.get(function)
        if props is None or parameter not in props:
            return None
        return schema_types(props[parameter])


def is_verbatim(types: frozenset[str] | None) -> bool:
    """True when the value is the raw text whatever it says (schema type `string` only)."""
    return types == STRING_ONLY


def _json_or_none(text: str) -> tuple[bool, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False, None
    if isinstance(value, float) and not math.isfinite(value):
        return False, None  # NaN/Infinity are not JSON; keep the text
    return True, value


def _convert(text: str, json_type: str) -> tuple[bool, Any]:
    trimmed = text.strip()
    if json_type == "null":
        return (True, None) if trimmed == "null" else (False, None)
    if json_type == "boolean":
        lowered = trimmed.lower()
        return (True, lowered == "true") if lowered in ("true", "false") else (False, None)
    if json_type == "integer":
        return (True, int(trimmed)) if _INT_RE.fullmatch(trimmed) else (False, None)
    if json_type == "number":
        if _INT_RE.fullmatch(trimmed):
            return True, int(trimmed)
        if _NUMBER_RE.fullmatch(trimmed):
            value = float(trimmed)
            return (True, value) if math.isfinite(value) else (False, None)
        return False, None
    if json_type in ("object", "array"):
        ok, value = _json_or_none(trimmed)
        wanted = dict if json_type == "object" else list
        return (True, value) if ok and isinstance(value, wanted) else (False, None)
    return False, None


# Order in which non-string conversions are tried when a parameter allows several types.
_TRY_ORDER = ("null", "boolean", "integer", "number", "object", "array")


def coerce(raw: str, types: frozenset[str] | None) -> Any:
    """Convert raw argument text by its declared types (docs/reference/toolcall-contract.md §4). Never raises."""
    if types is None:
        ok, value = _json_or_none(raw.strip())
        return value if ok else raw
    if is_verbatim(types):
        return raw
    for json_type in _TRY_ORDER:
        if json_type in types:
            ok, value = _convert(raw, json_type)
            if ok:
                return value
    return raw
