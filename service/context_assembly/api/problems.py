"""The one place where errors become RFC 9457 ``application/problem+json`` responses, and
where the OpenAPI document names their codes (``ProblemCode``)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import WithJsonSchema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from typing_extensions import TypeAliasType

from context_assembly.errors import (
    PROBLEM_KINDS,
    InvalidError,
    MethodNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
    ServiceError,
    UnauthenticatedError,
)
from context_assembly.logs import frames
from context_assembly.validation import invalid_from_errors

PROBLEM_JSON = "application/problem+json"
log = structlog.get_logger("context_assembly.api")


def problem_code_schema() -> dict[str, Any]:
    """The JSON schema of ``ProblemCode``: the code of each error class
    (``errors.PROBLEM_KINDS``), in the order of the hierarchy, each with its status and title."""
    listed = "\n".join(f"- `{kind.code}` ({kind.status}): {kind.title}." for kind in PROBLEM_KINDS)
    return {
        "type": "string",
        "enum": [kind.code for kind in PROBLEM_KINDS],
        "description": "What kind of problem it is: one code per error of the service. The "
        "clients raise one error class per code (a code they do not know, from a newer "
        "service, by the HTTP status).\n\n" + listed,
    }


ProblemCode = TypeAliasType("ProblemCode", Annotated[str, WithJsonSchema(problem_code_schema())])
"""A problem's ``code``: a string, which the OpenAPI document enumerates under this name, from
the service's error classes; the clients' error classes are generated from it or checked
against it (tests/clients)."""


class InternalError(ServiceError):
    """An unexpected failure: reported without internals (the log has the request id)."""


def problem_response(
    err: ServiceError, instance: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    """The problem+json response of ``err`` (with ``headers``, e.g. ``Allow`` on a 405)."""
    if err.status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": 'Bearer realm="context-assembly"'}
    return Response(
        orjson.dumps(err.to_problem(instance)),
        status_code=err.status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def _from_http(exc: StarletteHTTPException) -> ServiceError:
    if exc.status_code == 404:
        return NotFoundError("no such resource")
    if exc.status_code == 405:
        return MethodNotAllowedError("this method is not allowed on this path")
    if exc.status_code == 413:
        return PayloadTooLargeError(str(exc.detail))
    if exc.status_code == 401:
        return UnauthenticatedError(str(exc.detail))
    error = InvalidError(str(exc.detail))
    return error


def install_problem_handlers(app: FastAPI) -> None:
    """Map every error (ours, FastAPI's validation, Starlette's 404/405, the unexpected) once."""

    async def service_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceError)
        return problem_response(exc, request.url.path)

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors: list[dict[str, Any]] = []
        for err in exc.errors():
            loc = tuple(err.get("loc", ()))
            # FastAPI prefixes body errors with "body"; the contract names fields from the body root.
            errors.append({**err, "loc": loc[1:] if loc[:1] == ("body",) else loc})
        return problem_response(invalid_from_errors(errors), request.url.path)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        # Keep Starlette's headers: a 405 carries the Allow header (RFC 9110 §15.5.6).
        return problem_response(_from_http(exc), request.url.path, dict(exc.headers or {}))

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error(
            "unhandled_error",
            path=request.url.path,
            error_type=type(exc).__name__,
            frames=frames(exc),
        )
        return problem_response(
            InternalError("internal error; see the service log (X-Request-Id)"), request.url.path
        )

    app.add_exception_handler(ServiceError, service_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
