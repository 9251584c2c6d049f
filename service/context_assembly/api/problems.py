"""The one place where errors become RFC 9457 ``application/problem+json`` responses."""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from context_assembly.errors import (
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
