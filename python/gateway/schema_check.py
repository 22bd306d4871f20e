"""Clients' JSON Schemas (tool parameters, response formats): is this a schema we can work with?

    from gateway.schema_check import schema_problem
    problem = schema_problem(schema)   # None, or a SchemaProblem: where (a JSON path) and what
    str(problem)                       # "at $.properties: [...] is not of type 'object'"

Three checks, cheapest first:
* size: at most MAX_SCHEMA_DEPTH nested JSON containers and MAX_SCHEMA_NODES values, measured
  without recursion.  Everything after this (the meta-schema check, our grammar builder,
  llguidance's own JSON reader, the chat template's tojson) recurses, and a 300-deep schema
  would otherwise end in a RecursionError instead of a 400;
* the meta-schema of the schema's `$schema` dialect (Draft 2020-12 when it names none), with
  jsonschema: `"properties": [...]` or `"required": "a"` is an error here, not silently ignored;
* every `$ref` resolves inside the schema itself.  Nothing is fetched: a remote reference is an
  error like a pointer to nowhere.

Results are cached by a digest of the schema's JSON text: agents send the same tools with every request.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema

__all__ = ["MAX_SCHEMA_DEPTH", "MAX_SCHEMA_NODES", "SchemaProblem", "schema_problem", "size_problem"]

# 64 containers is about 30 levels of objects ("properties" adds one per level); OpenAI allows
# 10.  llguidance's JSON reader stops at 128, Python's recursion limit at about 1000 frames.
MAX_SCHEMA_DEPTH = 64
MAX_SCHEMA_NODES = 100_000
_MESSAGE_CHARS = 240

# Keywords whose value is one subschema, a list of them, or a name -> subschema object.
_ONE = ("additionalProperties", "additionalItems", "items", "contains", "propertyNames", "not", "if",
        "then", "else", "unevaluatedItems", "unevaluatedProperties", "contentSchema")
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")


@dataclass(frozen=True)
class SchemaProblem:
    """What is wrong with a schema, and where: `path` is a JSON path inside it ("$.required")."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"at {self.path}: {self.message}"


_PLAIN_NAME = re.compile(r"[a-zA-Z][a-zA-Z0-9_]*")


def json_path(parts: tuple[str | int, ...] | list[str | int]) -> str:
    """The spelling jsonschema's errors use: $.properties.a.items[0], $['$defs'].x."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_NAME.fullmatch(part):
            out += f".{part}"
        else:
            out += "['" + part.replace("\\", "\\\\").replace("'", "\\'") + "']"
    return out


def _short(text: str) -> str:
    return text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS] + "..."


def size_problem(schema: Any) -> SchemaProblem | None:
    """The schema nests deeper than MAX_SCHEMA_DEPTH or holds more than MAX_SCHEMA_NODES values
    (found without recursion, stopping at the first container past the bound)."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(schema, 1, ())]
    nodes = 0
    while stack:
        value, depth, path = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            return SchemaProblem("$", f"the schema holds more than {MAX_SCHEMA_NODES} values")
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_SCHEMA_DEPTH:
            return SchemaProblem(json_path(path[:8]) + "...", f"the schema nests more than {MAX_SCHEMA_DEPTH} "
                                 "objects and arrays deep")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        # Only the first few steps of a path are kept: a deep path would be a long message.
        stack.extend((child, depth + 1, path + (key,) if len(path) < 8 else path) for key, child in items)
    return None


def schema_problem(schema: Any) -> SchemaProblem | None:
    """None when `schema` is a valid JSON Schema whose $refs all resolve locally, within the
    size bounds; else the first problem found."""
    problem = size_problem(schema)
    if problem is not None:
        return problem
    try:
        text = json.dumps(schema, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON data at all (only in-process callers can do this)
        return SchemaProblem("$", "the schema is not JSON data")
    key = hashlib.sha1(text.encode("utf-8", "surrogatepass")).digest()
    if key in _RESULTS:
        return _RESULTS[key]
    result = _meta_problem(schema) or _ref_problem(schema)
    if len(_RESULTS) >= _CACHED:
        _RESULTS.pop(next(iter(_RESULTS)), None)  # the oldest entry
    _RESULTS[key] = result
    return result


_CACHED = 1024
_RESULTS: dict[bytes, SchemaProblem | None] = {}


def _validator_class(schema: Any) -> type:
    if not isinstance(schema, dict):  # the meta-schema itself says what else is wrong with it
        return jsonschema.Draft202012Validator
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def _meta_problem(schema: Any) -> SchemaProblem | None:
    if isinstance(schema, dict) and "$schema" in schema and not isinstance(schema["$schema"], str):
        return SchemaProblem(json_path(("$schema",)), "must be a string (the URI of a JSON Schema dialect)")
    cls = _validator_class(schema)
    error = jsonschema.exceptions.best_match(_meta_validator(cls).iter_errors(schema))
    if error is None:
        return None
    return SchemaProblem(json_path(tuple(error.absolute_path)), _short(error.message))


@functools.lru_cache(maxsize=None)
def _meta_validator(cls: type) -> Any:
    flat = _flat_meta_schema() if cls is jsonschema.Draft202012Validator else None
    return cls(flat if flat is not None else cls.META_SCHEMA)


_DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/"


def _flat_meta_schema() -> dict | None:
    """Draft 2020-12's meta-schema as one document: its vocabularies' keywords side by side and
    every `$dynamicRef: "#meta"` a plain `$ref: "#"`.  It accepts the same schemas, and checking
    against it is several times faster (the dynamic scope is what costs: 0.5 s for a 50-property
    tool, on the event loop).  None when jsonschema's copy of the vocabularies is not at hand."""
    root = jsonschema.Draft202012Validator.META_SCHEMA
    try:
        vocabularies = {entry["$ref"].split("/")[-1]: jsonschema.validators.SPECIFICATIONS.contents(
            _DRAFT_2020_12 + entry["$ref"]) for entry in root["allOf"]}
    except (AttributeError, KeyError, LookupError, TypeError):
        return None

    def rewrite(value: Any, vocabulary: str) -> Any:
        if isinstance(value, list):
            return [rewrite(v, vocabulary) for v in value]
        if not isinstance(value, dict):
            return value
        out = {}
        for key, item in value.items():
            if key == "$dynamicRef" and item == "#meta":
                out["$ref"] = "#"
            elif key == "$ref" and isinstance(item, str) and "#/$defs/" in item:
                where, name = item.split("#/$defs/")
                out["$ref"] = f"#/$defs/{where.split('/')[-1] or vocabulary}-{name}"
            else:
                out[key] = rewrite(item, vocabulary)
        return out

    properties: dict[str, Any] = {}
    defs: dict[str, Any] = {}
    for name, vocabulary in vocabularies.items():
        properties.update(rewrite(vocabulary.get("properties", {}), name))
        defs.update({f"{name}-{key}": rewrite(value, name) for key, value in vocabulary.get("$defs", {}).items()})
    properties.update(rewrite(root.get("properties", {}), ""))
    return {"$schema": root["$schema"], "type": ["object", "boolean"], "properties": properties, "$defs": defs}


def _subschemas(schema: dict, path: tuple[str | int, ...]):
    """(subschema, its path) for every keyword of `schema` that holds schemas."""
    for key in _ONE:
        if isinstance(schema.get(key), (dict, bool)):
            yield schema[key], path + (key,)
    for key in _MANY:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                yield sub, path + (key, i)
    for key in _NAMED:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                if isinstance(sub, (dict, bool)):
                    yield sub, path + (key, name)


def _ref_problem(schema: Any) -> SchemaProblem | None:
    """The first `$ref` that does not resolve inside the schema (base URIs follow `$id`)."""
    if not isinstance(schema, dict):
        return None
    dialect = schema.get("$schema")
    spec = referencing.jsonschema.specification_with(
        dialect if isinstance(dialect, str) else "", default=referencing.jsonschema.DRAFT202012)
    root = spec.create_resource(schema)
    stack: list[tuple[Any, tuple[str | int, ...], referencing.Resolver]] = [
        (schema, (), referencing.Registry().resolver_with_root(root))]
    while stack:
        node, path, resolver = stack.pop()
        if not isinstance(node, dict):
            continue
        if path and isinstance(node.get("$id"), str):
            resolver = resolver.in_subresource(spec.create_resource(node))
        ref = node.get("$ref")
        if isinstance(ref, str):
            try:
                resolver.lookup(ref)
            except referencing.exceptions.Unresolvable:
                local = ref.startswith("#")
                why = "points to nothing in the schema" if local else \
                    "cannot be resolved (only references inside the schema are followed, nothing is fetched)"
                return SchemaProblem(json_path(path + ("$ref",)), _short(f"$ref {ref!r} {why}"))
        stack.extend((sub, sub_path, resolver) for sub, sub_path in reversed(list(_subschemas(node, path))))
    return None
