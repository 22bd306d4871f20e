"""API errors in each API's own shape (OpenAI and Anthropic), with the right status codes."""
from __future__ import annotations

import json
import uuid

from aiohttp import web

# OpenAI error `type` and Anthropic error `type` for each status we send.
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
                 500: "server_error", 503: "server_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


class ApiError(Exception):
    """An error to send to the client.  `param` names the offending request field (OpenAI)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def openai_body(self) -> dict:
        return {"error": {"message": self.message, "type": _OPENAI_TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        return {"type": "error",
                "error": {"type": _ANTHROPIC_TYPES.get(self.status, "api_error"), "message": self.message},
                "request_id": f"req_{uuid.uuid4().hex[:24]}"}

    def headers(self) -> dict[str, str]:
        h: dict[str, str] = {}
        if self.retry_after is not None:
            h["Retry-After"] = str(self.retry_after)
        elif self.status in (400, 401, 403, 404, 413):
            h["x-should-retry"] = "false"  # retrying cannot help; stop the SDKs' automatic retries
        return h

    def response(self, api: str) -> web.Response:
        body = self.anthropic_body() if api == "anthropic" else self.openai_body()
        return web.Response(status=self.status, text=json.dumps(body), content_type="application/json",
                            headers=self.headers())


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)
