"""gateway.schema_check: clients' JSON Schemas are checked against their dialect's meta-schema,
their $refs must resolve inside them, and their size is bounded (no recursion on the way)."""
from __future__ import annotations

import time

import pytest

from gateway.schema_check import MAX_SCHEMA_DEPTH, schema_problem, size_problem


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for level in range(depth):
        schema = {"type": "object", "properties": {f"k{level}": schema}, "required": [f"k{level}"]}
    return schema


@pytest.mark.parametrize("schema, path, words", [
    ({"$ref": "#/$defs/nope"}, "$['$ref']", "'#/$defs/nope' points to nothing"),
    ({"type": "object", "properties": [{"a": {"type": "string"}}]}, "$.properties", "not of type 'object'"),
    ({"type": "object", "required": "a"}, "$.required", "'a' is not of type 'array'"),
    ({"properties": {"a": {"type": "strin"}}}, "$.properties.a.type", "'strin'"),
    ({"properties": {"a": {"items": {"$ref": "#/$defs/b"}}}, "$defs": {"c": {}}}, "$.properties.a.items['$ref']",
     "points to nothing"),
    ({"anyOf": [{"type": "null"}, {"$ref": "https://example.com/x.json"}]}, "$.anyOf[1]['$ref']", "nothing is fetched"),
    ({"minLength": -1}, "$.minLength", "minimum of 0"),
    ({"$schema": 7}, "$['$schema']", "must be a string"),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "enum": []}, "$.enum", "non-empty"),
    ([], "$", "not of type"),
])
def test_invalid_schemas_name_the_path(schema, path, words):
    problem = schema_problem(schema)
    assert problem is not None, schema
    assert problem.path == path, problem
    assert words in problem.message, problem
    assert str(problem).startswith(f"at {path}: ")


@pytest.mark.parametrize("schema", [
    True, False, {}, {"enum": []},  # valid, if unsatisfiable: the grammar builder says so later
    {"type": "object", "properties": {"$ref": {"type": "string"}}},  # a property named $ref
    {"$defs": {"p": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/p"}}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"x": {}},
     "items": {"$ref": "#/definitions/x"}},
    {"$defs": {"a": {"$anchor": "here", "type": "integer"}}, "$ref": "#here"},
    {"$id": "https://example.com/root", "$defs": {"a": {"$id": "sub", "$defs": {"b": {}}, "$ref": "#/$defs/b"}}},
    {"type": "object", "properties": {"next": {"$ref": "#"}}},  # recursive: resolves to the root
    _nested(10), _nested((MAX_SCHEMA_DEPTH - 1) // 2),
])
def test_valid_schemas_pass(schema):
    assert schema_problem(schema) is None


@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH // 2 + 1, 300, 20_000])
def test_depth_is_bounded_without_recursion(depth):
    schema = _nested(depth)
    t0 = time.perf_counter()
    problem = schema_problem(schema)
    assert problem is not None and "nests more than" in problem.message
    assert problem.path.startswith("$.properties.k") and problem.path.endswith("...")
    assert time.perf_counter() - t0 < 0.5


def test_size_is_bounded():
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(60_000)}}
    problem = size_problem(wide)
    assert problem is not None and "more than" in problem.message


META_CASES = [{"dependencies": {"a": 5}}, {"dependencies": {"a": ["b"]}}, {"$defs": {"x": {"type": 3}}}, {"$id": 5},
              {"required": ["a", 1]}, {"prefixItems": []}, {"contentSchema": {"type": "x"}},
              {"unevaluatedProperties": {"minimum": "a"}}, {"$recursiveAnchor": "1bad"},
              {"properties": {"a": {"items": {"not": {"allOf": [{"type": "nope"}]}}}}},
              {"if": {"const": 1}, "then": {"maxLength": 2}, "else": {"maxLength": -2}},
              {"patternProperties": {"^a": {"type": "string"}}, "dependentRequired": {"a": ["b"]}},
              {"anyOf": [], "type": "string"}, {"examples": "x"}, {"deprecated": "yes"}]


@pytest.mark.parametrize("schema", META_CASES)
def test_the_flat_meta_schema_agrees_with_the_official_one(schema):
    """schema_check validates Draft 2020-12 against a one-document copy of its meta-schema (no
    dynamic scope: several times faster); it must accept and refuse exactly what the official
    one does, at the same place."""
    import jsonschema
    official = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(jsonschema.Draft202012Validator.META_SCHEMA).iter_errors(schema))
    problem = schema_problem(schema)
    if official is None:
        assert problem is None, problem
    else:
        assert problem is not None and problem.message == official.message, (problem, official)
        assert problem.path == official.json_path
