"""A lean request path for the ``/v1`` routes: FastAPI documents them, we serve them.

FastAPI's per-request machinery (dependency solving, ``json.loads`` then validating Python
objects, validating the returned model against ``response_model`` again, a thread hop for every
sync dependency) cost ~0.9 ms per ``prepare`` on the project machine, as much as the assembly of
128 blocks. :class:`LeanRoute` keeps each route's typed signature, so the OpenAPI document is
generated exactly as before, but answers requests with a handler built once per route:

* the tenant is resolved first (a missing key is 401 before any body problem, as before);
* a JSON body is parsed straight from the bytes with ``model_validate_json`` (pydantic-core's
  fastest path) and any problem is the same ``CONTEXT_ASSEMBLY_INVALID`` problem+json;
* a returned model is serialised once, by alias, as FastAPI would have.

Only endpoints whose every parameter is of a kind this module knows take the lean path (see
``_KINDS``); any other endpoint is served by FastAPI as usual.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, get_type_hints

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from context_assembly.api.auth import Authenticator
from context_assembly.api.middleware import BODY
from context_assembly.errors import InvalidError
from context_assembly.offload import parse_body
from context_assembly.validation import invalid_from_errors

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
Getter = Callable[[Request], Awaitable[Any]]


def _is_json(content_type: str | None) -> bool:
    """``application/json`` or ``application/*+json`` (parameters ignored), as FastAPI accepts."""
    if not content_type:
        return False
    media = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


async def read_body(request: Request, model: type[BaseModel]) -> BaseModel:
    """The request body parsed into ``model``; any problem is an InvalidError naming the field.
    The body ``BodyLimit`` has read is taken from the scope, not replayed through a stream."""
    raw = request.scope.get(BODY)
    if raw is None:
        raw = await request.body()
    if not raw:
        raise invalid_from_errors([{"loc": (), "msg": "Field required", "type": "missing"}])
    if not _is_json(request.headers.get("content-type")):
        raise InvalidError(
            "invalid request: (body): the body must be JSON (content-type: application/json)",
            field="(body)",
        )
    return parse_body(model, raw)


async def _tenant(request: Request) -> str:
    auth: Authenticator = request.app.state.auth
    return auth.tenant(request)


async def _request(request: Request) -> Request:
    return request


def _state(name: str) -> Getter:
    async def get(request: Request) -> Any:
        return getattr(request.app.state, name)

    return get


# Parameter names the lean path resolves itself, with how. Order of resolution is the order of
# the endpoint's parameters, except that the tenant always comes first (401 before 422).
_KINDS: dict[str, Getter] = {
    "tenant": _tenant,
    "service": _state("preparations"),
    "metrics": _state("metrics"),
    "request": _request,
}


def _path_getter(name: str) -> Getter:
    async def get(request: Request) -> Any:
        return request.path_params[name]

    return get


def _body_getter(model: type[BaseModel]) -> Getter:
    async def get(request: Request) -> Any:
        return await read_body(request, model)

    return get


def lean_handler(route: APIRoute) -> Handler | None:
    """The lean handler of ``route``, or None when one of its parameters is of an unknown kind."""
    endpoint = route.endpoint
    hints = get_type_hints(endpoint)
    getters: list[tuple[str, Getter]] = []
    for name in inspect.signature(endpoint).parameters:
        hint = hints.get(name)
        if name in _KINDS:
            getters.append((name, _KINDS[name]))
        elif name in route.param_convertors and hint is str:
            getters.append((name, _path_getter(name)))
        elif name == "body" and isinstance(hint, type) and issubclass(hint, BaseModel):
            getters.append((name, _body_getter(hint)))
        else:
            return None
    getters.sort(key=lambda item: item[0] != "tenant")
    by_alias = route.response_model_by_alias

    async def handle(request: Request) -> Response:
        kwargs = {name: await get(request) for name, get in getters}
        result = await endpoint(**kwargs)
        if isinstance(result, Response):
            return result
        assert isinstance(result, BaseModel)
        return Response(result.model_dump_json(by_alias=by_alias), media_type="application/json")

    return handle


class LeanRoute(APIRoute):
    """An APIRoute documented by FastAPI from its signature and served by :func:`lean_handler`."""

    def get_route_handler(self) -> Handler:
        handler = lean_handler(self) if inspect.iscoroutinefunction(self.endpoint) else None
        return handler if handler is not None else super().get_route_handler()


class LeanDispatch:
    """Serves the hottest lean routes by exact method and path, past FastAPI's router.

    A prepare spends ~0.1 ms in the layers between the app's own middlewares and its handler
    (exception middleware, exit stack, route matching, the request/response wrapper). This
    middleware sits innermost among the app's own (request context, body limit: those still
    apply) and sends ``routes`` straight to their lean handlers; their errors are mapped by an
    ``ExceptionMiddleware`` built from the app's handlers, the same class and handlers FastAPI's
    stack uses, so an error answers byte for byte as through the router. Any other request, and
    any request under a ``root_path``, goes on to FastAPI.
    """

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI, routes: Sequence[APIRoute]) -> None:
        self.app = app
        self._fastapi_app = fastapi_app
        self._routes = routes
        self._table: dict[tuple[str, str], tuple[APIRoute, ASGIApp]] | None = None

    def _build(self) -> dict[tuple[str, str], tuple[APIRoute, ASGIApp]]:
        # As FastAPI's build_middleware_stack: 500/Exception belong to ServerErrorMiddleware.
        handlers = {
            key: handler
            for key, handler in self._fastapi_app.exception_handlers.items()
            if key not in (500, Exception)
        }
        table: dict[tuple[str, str], tuple[APIRoute, ASGIApp]] = {}
        for route in self._routes:
            handler = lean_handler(route)
            if handler is None or "{" in route.path:
                raise ValueError(f"{route.path} is not a lean route without path parameters")

            async def serve(
                scope: Scope, receive: Receive, send: Send, handler: Any = handler
            ) -> None:
                response = await handler(Request(scope, receive, send))
                await response(scope, receive, send)

            for method in route.methods or ():
                table[(method, route.path)] = (route, ExceptionMiddleware(serve, handlers=handlers))
        return table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            table = self._table
            if table is None:
                table = self._table = self._build()
            entry = table.get((scope["method"], scope["path"]))
            if entry is not None:
                route, app = entry
                scope["route"] = route
                scope["endpoint"] = route.endpoint
                await app(scope, receive, send)
                return
        await self.app(scope, receive, send)
