"""The aiohttp application factory: routes, error shapes, auth, CORS, limits."""
from __future__ import annotations

import asyncio
import hmac
import logging

from aiohttp import web

from . import admin_routes, anthropic_routes, openai_routes, responses_routes
from .errors import ApiError
from .pipeline import shutting_down
from .state import STATE_KEY, ServerState

log = logging.getLogger("moegate.server")

MAX_BODY_BYTES = 16 * 1024 * 1024
PUBLIC_PATHS = {"/health", "/v1/health"}


def _api_of(path: str) -> str:
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def _cors_headers(state: ServerState, origin: str | None) -> dict[str, str]:
    if not origin or not state.cors_origins:
        return {}
    if "*" not in state.cors_origins and origin not in state.cors_origins:
        return {}
    return {"Access-Control-Allow-Origin": origin if "*" not in state.cors_origins else "*",
            "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
            "Access-Control-Allow-Headers": "Authorization, Content-Type, x-api-key, anthropic-version, "
                                            "anthropic-beta, x-stainless-retry-count",
            "Access-Control-Max-Age": "600", "Vary": "Origin"}


def _authorized(state: ServerState, request: web.Request) -> bool:
    if not state.api_key:
        return True
    supplied = request.headers.get("x-api-key", "")
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        supplied = auth[7:].strip()
    return hmac.compare_digest(supplied.encode(), state.api_key.encode())


@web.middleware
async def gateway_middleware(request: web.Request, handler):
    state: ServerState = request.app[STATE_KEY]
    cors = _cors_headers(state, request.headers.get("Origin"))
    endpoint = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    status = 500
    try:
        if request.method == "OPTIONS":
            status = 204
            return web.Response(status=204, headers=cors)
        if request.path not in PUBLIC_PATHS and not _authorized(state, request):
            raise ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY or x-api-key)",
                           code="invalid_api_key")
        if state.scheduler.draining and request.path not in PUBLIC_PATHS:
            # a request on a connection that was open before the shutdown began
            raise shutting_down(state, RuntimeError("the server is shutting down"))
        resp = await handler(request)
        status = resp.status
        if cors and not resp.prepared:
            resp.headers.update(cors)
        return resp
    except ApiError as exc:
        status = exc.status
        resp = exc.response(_api_of(request.path))
        resp.headers.update(cors)
        return resp
    except web.HTTPRequestEntityTooLarge:
        status = 413
        return ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes").response(_api_of(request.path))
    except web.HTTPException as exc:
        status = exc.status
        if exc.status == 404:
            return ApiError(404, f"no route {request.method} {request.path}").response(_api_of(request.path))
        if exc.status == 405:
            return ApiError(405, f"method {request.method} not allowed on {request.path}").response(
                _api_of(request.path))
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        status = 499  # client closed the connection
        raise
    except Exception as exc:  # a bug: report it in the API's shape, keep serving
        log.exception("internal error on %s", request.path)
        status = 500
        return ApiError(500, f"internal error: {type(exc).__name__}").response(_api_of(request.path))
    finally:
        state.metrics.requests[(endpoint, str(status))] += 1


def create_app(state: ServerState) -> web.Application:
    app = web.Application(middlewares=[gateway_middleware], client_max_size=MAX_BODY_BYTES)
    app[STATE_KEY] = state
    r = app.router
    r.add_post("/v1/chat/completions", openai_routes.chat_completions)
    r.add_post("/v1/completions", openai_routes.completions)
    r.add_post("/v1/responses", responses_routes.create_response)
    r.add_get("/v1/models", openai_routes.list_models)
    r.add_get("/v1/models/{model_id:.+}", openai_routes.get_model)
    r.add_post("/v1/messages", anthropic_routes.messages)
    r.add_post("/v1/messages/count_tokens", anthropic_routes.count_tokens)
    r.add_get("/health", admin_routes.health)
    r.add_get("/v1/health", admin_routes.health)
    r.add_get("/metrics", admin_routes.metrics)
    r.add_get("/props", admin_routes.props)
    r.add_post("/tokenize", admin_routes.tokenize)
    r.add_post("/detokenize", admin_routes.detokenize)

    async def on_startup(app: web.Application) -> None:
        app[STATE_KEY].scheduler.start()

    async def on_shutdown(app: web.Application) -> None:
        # SIGTERM: the listening socket is closed already; the running generation ends at its
        # next token with a final event, queued requests get 503, then the handlers finish
        # (serve.SHUTDOWN_GRACE_SECONDS at most) before on_cleanup.
        app[STATE_KEY].scheduler.drain()

    async def on_cleanup(app: web.Application) -> None:
        await app[STATE_KEY].scheduler.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app
