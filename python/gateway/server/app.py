"""The aiohttp application factory: routes, error shapes, auth, CORS, limits."""
from __future__ import annotations

import asyncio
import hmac
import logging

from aiohttp import web

from . import admin_routes, anthropic_routes, offload, openai_routes, responses_routes
from . import openapi as oas
from .errors import ApiError
from .openapi import Route, build_document
from .pipeline import shutting_down
from .serving import CLIENT_GONE
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
    try:
        # aiohttp keeps bytes that are no UTF-8 as surrogate escapes: such a key is simply wrong.
        key = supplied.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(key, state.api_key.encode())


@web.middleware
async def gateway_middleware(request: web.Request, handler):
    state: ServerState = request.app[STATE_KEY]
    cors = _cors_headers(state, request.headers.get("Origin"))
    endpoint = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    status = 500
    try:
        if request.method == "OPTIONS":
            if isinstance(getattr(request.match_info, "http_exception", None), web.HTTPNotFound):
                status = 404  # a preflight for a path that does not exist
                return ApiError(404, f"no route {request.path}").response(_api_of(request.path))
            status = 204
            return web.Response(status=204, headers=cors)
        if request.path not in PUBLIC_PATHS and not _authorized(state, request):
            raise ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY or x-api-key)",
                           code="invalid_api_key")
        if state.scheduler.draining and request.path not in PUBLIC_PATHS:
            # a request on a connection that was open before the shutdown began
            raise shutting_down(state, RuntimeError("the server is shutting down"))
        resp = await handler(request)
        status = 499 if request.get(CLIENT_GONE) else resp.status
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


async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI_KEY])


# Every route, with its documentation: registered from here and described from here
# (/openapi.json), so the two cannot drift apart.
ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/chat/completions", openai_routes.chat_completions, "OpenAI chat completion", "openai",
          body=oas.CHAT_BODY, ok=oas.CHAT_COMPLETION, streams=True, generates=True),
    Route("POST", "/v1/completions", openai_routes.completions, "OpenAI legacy text completion (no chat template)",
          "openai", body=oas.COMPLETION_BODY, ok=oas.TEXT_COMPLETION, streams=True, generates=True),
    Route("POST", "/v1/responses", responses_routes.create_response, "OpenAI Responses (stateless)", "openai",
          body=oas.RESPONSES_BODY, ok=oas.RESPONSE, streams=True, generates=True),
    Route("GET", "/v1/models", openai_routes.list_models, "The served model", "openai", ok=oas.MODEL_LIST),
    Route("GET", "/v1/models/{model_id:.+}", openai_routes.get_model, "One model by id", "openai", ok=oas.MODEL),
    Route("POST", "/v1/messages", anthropic_routes.messages, "Anthropic Messages", "anthropic",
          body=oas.MESSAGES_BODY, ok=oas.MESSAGE, streams=True, generates=True),
    Route("POST", "/v1/messages/count_tokens", anthropic_routes.count_tokens, "Anthropic token count", "anthropic",
          body=oas.COUNT_TOKENS_BODY, ok=oas.COUNT),
    Route("GET", "/health", admin_routes.health, "Liveness and load (never waits for the engine)", "ops",
          ok=oas.HEALTH, public=True),
    Route("GET", "/v1/health", admin_routes.health, "Same as /health", "ops", ok=oas.HEALTH, public=True),
    Route("GET", "/metrics", admin_routes.metrics, "Prometheus metrics", "ops", text_reply=True),
    Route("GET", "/props", admin_routes.props, "Model, context and engine properties", "ops", ok=oas.PROPS),
    Route("POST", "/tokenize", admin_routes.tokenize, "Token ids of a text or of rendered chat messages", "ops",
          body=oas.TOKENIZE_BODY, ok=oas.TOKENS),
    Route("POST", "/detokenize", admin_routes.detokenize, "Text of token ids", "ops", body=oas.DETOKENIZE_BODY,
          ok=oas.TEXT),
    Route("GET", "/openapi.json", openapi_json, "This document (OpenAPI 3.1)", "ops", ok={"type": "object"}),
)

OPENAPI_KEY = web.AppKey("openapi", dict)


def register_routes(app: web.Application, routes: tuple[Route, ...] = ROUTES) -> None:
    """Adds every route of the table (a GET also answers HEAD) and the document describing them."""
    for route in routes:
        app.router.add_route(route.method, route.path, route.handler)
        if route.method == "GET":
            app.router.add_route("HEAD", route.path, route.handler)
    app[OPENAPI_KEY] = build_document(routes)


def create_app(state: ServerState) -> web.Application:
    app = web.Application(middlewares=[gateway_middleware], client_max_size=MAX_BODY_BYTES)
    app[STATE_KEY] = state
    register_routes(app)

    async def on_startup(app: web.Application) -> None:
        app[STATE_KEY].scheduler.start()

    async def on_shutdown(app: web.Application) -> None:
        # SIGTERM: the listening socket is closed already; the running generation ends at its
        # next token with a final event, queued requests get 503, then the handlers finish
        # (serve.SHUTDOWN_GRACE_SECONDS at most) before on_cleanup.
        state = app[STATE_KEY]
        state.scheduler.drain()
        # handlers still parsing or tokenizing (a large body) answer 503 now too
        offload.abandon(lambda: shutting_down(state, RuntimeError("the server is shutting down")))

    async def on_cleanup(app: web.Application) -> None:
        await app[STATE_KEY].scheduler.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app
