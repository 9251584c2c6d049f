"""``create_app(settings)``: the FastAPI application, its lifespan (:func:`serving`) and the
OpenAPI document it serves."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from fastapi import FastAPI
from fastapi.routing import APIRoute

from context_assembly import __version__, tracing
from context_assembly.api.auth import Authenticator
from context_assembly.api.bodies import body_schemas
from context_assembly.api.docs_ui import install_docs_ui
from context_assembly.api.middleware import BodyLimit, RequestContext
from context_assembly.api.problems import PROBLEM_JSON, install_problem_handlers
from context_assembly.api.reload import file_tables, reload_settings
from context_assembly.api.routes import ROUTERS
from context_assembly.api.routes.dependencies import BODY_MODELS, get_tenant
from context_assembly.api.webhooks import TAG as WEBHOOKS_TAG
from context_assembly.api.webhooks import router as webhooks
from context_assembly.config import Settings
from context_assembly.contributors.client import ContributorClient, create_client
from context_assembly.contributors.ssrf import Resolver
from context_assembly.errors import StoreUnavailableError
from context_assembly.metrics import Metrics
from context_assembly.preparations import Clock, Preparations
from context_assembly.storage import Store, open_store
from context_assembly.tokens.counter import get_counter
from context_assembly.tokens.prices import ModelPrices
from context_assembly.tokens.registry import ModelRegistry

CACHE_KEY_SECRET = "prompt-cache-key"
"""The store's name of the secret that keys automatic ``prompt_cache_key``s."""

log = structlog.get_logger("context_assembly.app")


PURGE_INTERVAL_SECONDS = 60.0


async def _purge_expired(store: Store, clock: Clock) -> None:
    """Delete expired records once a minute (SQLite keeps them until purged; Redis expires keys
    itself and answers 0). A failure is logged and retried next time, never fatal."""
    while True:
        await asyncio.sleep(PURGE_INTERVAL_SECONDS)
        try:
            removed = await store.purge_expired(clock.wall())
        except StoreUnavailableError:
            log.warning("purge_failed")
            continue
        if removed:
            log.info("purged", records=removed)


def _operation_id(route: APIRoute) -> str:
    # Stable operation ids (clients are generated from them): the route's name.
    return route.name


@asynccontextmanager
async def serving(
    app: FastAPI,
    *,
    settings: Settings,
    metrics: Metrics,
    store: Store | None,
    client: ContributorClient | None,
    resolver: Resolver | None,
    clock: Clock | None,
    config_path: str | None,
) -> AsyncIterator[None]:
    """The app's lifespan: the store, the contributor client and the lifecycle service opened
    (an injected ``store`` or ``client`` is used as given and not closed), the tokenizers
    warmed, ``SIGHUP`` bound to a reload, the purge of expired records started; and all of it
    closed again in the reverse order at shutdown."""
    the_store = store or await open_store(
        settings.store.backend,
        path=settings.store.path,
        redis_url=settings.store.redis_url,
        key_prefix=settings.store.key_prefix,
        sqlite_synchronous=settings.store.sqlite_synchronous,
    )
    the_client = client or create_client(
        max_connections=settings.limits.max_contributor_connections
    )
    for name in ("o200k_base", "cl100k_base"):
        get_counter(name).count("warm up")  # build encodings now, not on the first request
    app.state.preparations = Preparations(
        settings,
        the_store,
        the_client,
        app.state.registry,
        resolver=resolver,
        clock=clock,
        cache_key_secret=await _cache_key_secret(settings, the_store),
        prices=app.state.prices,
    )
    metrics.watch_mcp_sessions(app.state.preparations.contributors.mcp.open_sessions)
    reloads = config_path is not None and threading.current_thread() is threading.main_thread()
    loop = asyncio.get_running_loop()
    if reloads:
        loop.add_signal_handler(signal.SIGHUP, reload_settings, app, config_path)
    purge = asyncio.create_task(_purge_expired(the_store, clock or Clock()))
    log.info(
        "started",
        version=__version__,
        host=settings.server.host,
        port=settings.server.port,
        workers=settings.server.workers,
        store=settings.store.backend,
        auth=settings.auth.mode,
        contributors=len(settings.contributors),
    )
    try:
        yield
    finally:
        purge.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await purge
        if reloads:
            loop.remove_signal_handler(signal.SIGHUP)
        await app.state.preparations.aclose()  # MCP sessions, before their client closes
        if client is None:
            await the_client.aclose()
        if store is None:
            await the_store.aclose()
        await tracing.flush()  # spans still in a batch: no exit hook runs after a signal
        log.info("stopped")


async def _cache_key_secret(settings: Settings, store: Store) -> bytes:
    """The HMAC key of automatic ``prompt_cache_key``s: the configured one, else the one the
    store keeps (made on first use, so that every replica and restart keys alike)."""
    configured = settings.cache.key_secret
    if configured is not None:
        return configured.get_secret_value().encode()
    return await store.secret(CACHE_KEY_SECRET, os.urandom(32))


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    client: ContributorClient | None = None,
    resolver: Resolver | None = None,
    clock: Clock | None = None,
    config_path: str | None = None,
) -> FastAPI:
    """Build the app. Injected ``store``/``client`` are used as given and not closed by the app.

    With ``config_path`` (the TOML file the settings came from), ``SIGHUP`` and the admin call
    reload that file (``api/reload.py``).
    """
    metrics = Metrics()
    # The shipped registry with the configuration's [models."name"] entries, and the shipped prices
    # with its [prices."name"] entries (a reload rebuilds both).
    registry = ModelRegistry.load().with_configured(settings.models)
    prices = ModelPrices.load(registry).with_configured(settings.prices)
    lifespan = functools.partial(
        serving,
        settings=settings,
        metrics=metrics,
        store=store,
        client=client,
        resolver=resolver,
        clock=clock,
        config_path=config_path,
    )
    app = FastAPI(
        title="context-assembly",
        version=__version__,
        summary="Which source data enters each model call, under a token budget, explained.",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        # FastAPI's built-in OpenTelemetry: server spans when tracing is configured, else off.
        telemetry=tracing.fastapi_telemetry(),
        # A path with a trailing slash is unknown (404 problem+json), not a 307 with an empty
        # body to a Location built from the Host header: a client that does not follow a POST's
        # redirect would get an answer that is not problem+json.
        redirect_slashes=False,
        # /docs and /redoc serve their assets from the service itself (api/docs_ui.py).
        docs_url=None,
        redoc_url=None,
        openapi_tags=OPENAPI_TAGS,
    )
    app.state.auth = Authenticator(settings.auth)
    app.state.metrics = metrics
    app.state.registry = registry
    app.state.prices = prices
    app.state.settings = settings
    app.state.config_path = config_path
    app.state.config_tables = file_tables(config_path)
    install_problem_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    app.webhooks.include_router(webhooks)  # described in the document, never served
    install_docs_ui(app)
    app.add_middleware(BodyLimit, max_bytes=lambda: app.state.settings.limits.max_body_bytes)
    app.add_middleware(RequestContext, metrics=metrics)
    _complete_openapi(app)
    return app


# The groups of the routes in /docs and /redoc, in this order (each route names its tag).
OPENAPI_TAGS: list[dict[str, Any]] = [
    {
        "name": "Prepare",
        "description": "Prepare a model call: the service calls the contributors, selects the "
        "blocks that fit the token budget, lays the frame out and explains every decision. "
        "Budget does the same with what is already at hand, calling no one.",
    },
    {
        "name": "Lifecycle",
        "description": "Before and after the model call: validate right before dispatch, "
        "refresh after the host's hooks edited the turn, repair an answer into JSON, report the "
        "provider's usage.",
    },
    {
        "name": "Views",
        "description": "What was decided, for programs and people: the stored record, the "
        "breakdown page and the timeline of a conversation. Never block texts.",
    },
    {
        "name": "Models",
        "description": "The model registry: windows, output limits, tokenizers and cacheable "
        "prefixes.",
    },
    {
        "name": "Operations",
        "description": "Liveness, readiness, Prometheus metrics and the configuration reload.",
    },
    {
        "name": WEBHOOKS_TAG,
        "description": "What the service posts to a contributor or a summarizer, and the answer "
        'it takes back (docs/contract.md, "Webhook protocol").',
    },
]

SECURITY_SCHEMES: dict[str, Any] = {
    "ApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
    "Bearer": {"type": "http", "scheme": "bearer"},
    "AdminKey": {"type": "apiKey", "in": "header", "name": "X-Admin-Key"},
}
_PROBLEM = {"schema": {"$ref": "#/components/schemas/Problem"}}
_REQUEST_ID = {
    "name": "X-Request-Id",
    "in": "header",
    "required": False,
    "description": "Echoed in the answer's X-Request-Id when 1-128 visible ASCII characters; "
    "otherwise the answer names the new id. Every log line of the request carries it.",
    "schema": {"type": "string"},  # any value is accepted: one that is not usable is replaced
}


def _complete_openapi(app: FastAPI) -> None:
    """Say in the OpenAPI document what FastAPI cannot see: the API keys (read in a dependency
    of our own, not one of FastAPI's security classes, which would run on the hot routes), the
    schemas of the request bodies (read by ``api/bodies.py``, not by FastAPI), that every error
    is ``application/problem+json`` (also a 422 FastAPI would describe as its
    ``HTTPValidationError``, which the service never sends), and the request id header.

    The keys are required when ``[auth] mode`` is ``api_key``; with ``none`` they are optional
    (``{}`` is an alternative: no lock), so the document is built per mode in force, which a
    reload may change."""
    generate = app.openapi
    keyed = {
        route.path_format
        for router in ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute)
        and any(dep.call is get_tenant for dep in route.dependant.dependencies)
    }
    documents: dict[str, dict[str, Any]] = {}

    def document() -> dict[str, Any]:
        auth: Authenticator = app.state.auth
        if auth.mode in documents:
            return documents[auth.mode]
        keys: list[dict[str, list[str]]] = [{"ApiKey": []}, {"Bearer": []}]
        if auth.mode == "none":
            keys.append({})  # no key needed: any tenant is `default`
        app.openapi_schema = None  # FastAPI's cache: this mode's document is built afresh
        doc = generate()
        components = doc.setdefault("components", {})
        components["securitySchemes"] = SECURITY_SCHEMES
        schemas = components.setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        for name, schema in body_schemas(BODY_MODELS).items():
            if schemas.setdefault(name, schema) != schema:
                raise RuntimeError(f"two schemas named {name} in the OpenAPI document")
        for path, operations in doc.get("paths", {}).items():
            for operation in operations.values():
                if path in keyed:
                    operation["security"] = keys
                elif path == "/v1/admin/reload":
                    operation["security"] = [{"AdminKey": []}]
                operation.setdefault("parameters", []).append(_REQUEST_ID)
                for status, response in operation.get("responses", {}).items():
                    if status.isdigit() and int(status) >= 400:
                        response["content"] = {PROBLEM_JSON: _PROBLEM}
        app.openapi_schema = doc
        documents[auth.mode] = doc
        return doc

    app.openapi = document  # type: ignore[method-assign]


def openapi_document(settings: Settings | None = None) -> dict[str, Any]:
    """The OpenAPI document of the app (what ``make openapi`` writes)."""
    app = create_app(settings or Settings())
    document: dict[str, Any] = app.openapi()
    return document
