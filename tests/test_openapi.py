"""/openapi.json: an OpenAPI 3.1 document of every route, in step with what the app registers
(both ways), with valid JSON Schemas, served by the live server, and whose documented routes
all exist there (a body-less POST is a 400 in the route's own error shape, never a 404/405)."""
from __future__ import annotations

import http.client
import json
from typing import cast

import pytest
from jsonschema import Draft202012Validator

pytest.register_assert_rewrite("server_fixtures")

pytest_plugins = ["server_fixtures"]

METHODS = ("get", "post", "put", "patch", "delete")


def _document() -> dict:
    from gateway.server.app import OPENAPI_KEY, create_app
    from gateway.server.state import ServerState

    # The app's router and document only; nothing here touches the state.
    return create_app(cast(ServerState, None))[OPENAPI_KEY]


def _registered() -> set[tuple[str, str]]:
    from gateway.server.app import create_app
    from gateway.server.openapi import openapi_path
    from gateway.server.state import ServerState

    app = create_app(cast(ServerState, None))
    return {(r.method.lower(), openapi_path(r.resource.canonical)) for r in app.router.routes()
            if r.method != "HEAD" and r.resource is not None}


def _documented(doc: dict) -> set[tuple[str, str]]:
    return {(method, path) for path, item in doc["paths"].items() for method in item if method in METHODS}


def test_every_registered_route_is_documented_and_back():
    doc = _document()
    assert doc["openapi"].startswith("3.1")
    assert _registered() == _documented(doc)


def test_schemas_are_valid_and_name_the_main_fields():
    doc = _document()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            for status, resp in op["responses"].items():
                for media in resp.get("content", {}).values():
                    Draft202012Validator.check_schema(media["schema"])
                if status.startswith(("4", "5")):
                    ref = resp["content"]["application/json"]["schema"]["$ref"]
                    want = "AnthropicError" if path.startswith("/v1/messages") else "OpenAIError"
                    assert ref.endswith(want), (path, status)
            body = op.get("requestBody")
            if body is not None:
                Draft202012Validator.check_schema(body["content"]["application/json"]["schema"])
            assert method != "post" or body is not None, f"{path} documents no body"
            if method == "post":
                assert {"400", "413", "500"} <= set(op["responses"]), path
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    props = chat["requestBody"]["content"]["application/json"]["schema"]["properties"]
    for name in ("messages", "model", "tools", "tool_choice", "max_tokens", "temperature", "stream",
                 "response_format", "stop", "seed", "n"):
        assert name in props, name
    assert {"429", "503"} <= set(chat["responses"])
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    messages = doc["paths"]["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"model", "messages", "max_tokens"} <= set(messages["required"])
    for component in ("OpenAIError", "AnthropicError"):
        Draft202012Validator.check_schema(doc["components"]["schemas"][component])


def test_the_live_document_and_its_routes(qwen_server):
    served = qwen_server.get_json("/openapi.json")
    assert served == json.loads(json.dumps(_document()))
    model_id = qwen_server.get_json("/v1/models")["data"][0]["id"]
    for method, path in sorted(_documented(served)):
        if method == "get":
            conn = http.client.HTTPConnection("127.0.0.1", qwen_server.port, timeout=30)
            conn.request("GET", path.replace("{model_id}", model_id), headers=qwen_server.headers())
            resp = conn.getresponse()
            resp.read()
            conn.close()
            assert resp.status == 200, (path, resp.status)
        else:
            status, body = qwen_server.post_raw(path, b"[]", timeout=30)  # not an object: every route refuses it
            assert status == 400, (path, status, body)
            if path.startswith("/v1/messages"):
                assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", path
            else:
                assert body["error"]["type"] == "invalid_request_error", path
