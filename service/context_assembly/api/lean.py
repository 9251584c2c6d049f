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
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, get_type_hints

from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from context_assembly.api.auth import Authenticator
from context_assembly.errors import InvalidError
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
    """The request body parsed into ``model``; any problem is an InvalidError naming the field."""
    raw = await request.body()
    if not raw:
        raise invalid_from_errors([{"loc": (), "msg": "Field required", "type": "missing"}])
    if not _is_json(request.headers.get("content-type")):
        raise InvalidError(
            "invalid request: (body): the body must be JSON (content-type: application/json)",
            field="(body)",
        )
    try:
        return model.model_validate_json(raw)
    except ValidationError as err:
        raise invalid_from_errors(err.errors(include_url=False, include_input=False)) from err


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
