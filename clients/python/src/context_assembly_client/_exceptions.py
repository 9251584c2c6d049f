"""The client's exceptions: one base, transport errors, and one class per problem code.

::

    ContextAssemblyError
     ├── APIConnectionError                  no answer (connect, reset, ...)
     │    └── APITimeoutError                 the timeout ran out
     ├── APIResponseValidationError          a 2xx answer that does not match its model
     └── APIStatusError                      a non-2xx answer; .status_code .problem .code
          ├── InvalidRequestError            CONTEXT_ASSEMBLY_INVALID   422
          ├── AssemblyOverflowError          CONTEXT_ASSEMBLY_OVERFLOW  422
          ├── ContextOverflowError           CONTEXT_OVERFLOW           422
          ├── AssemblyTimeoutError           CONTEXT_ASSEMBLY_TIMEOUT   504
          ├── StaleError                     CONTEXT_ASSEMBLY_STALE     409  .reasons
          ├── ContributorFailedError         CONTRIBUTOR_FAILED         502  .source
          ├── ContributorUrlRejectedError    CONTRIBUTOR_URL_REJECTED   422
          ├── AuthenticationError            UNAUTHENTICATED            401
          ├── NotFoundError                  NOT_FOUND                  404
          ├── MethodNotAllowedError          METHOD_NOT_ALLOWED         405
          ├── BadRequestError                BAD_REQUEST                400
          ├── PayloadTooLargeError           PAYLOAD_TOO_LARGE          413
          ├── RequestHeadTooLargeError       REQUEST_HEAD_TOO_LARGE     431
          ├── RequestTimeoutError            REQUEST_TIMEOUT            408
          ├── StoreUnavailableError          STORE_UNAVAILABLE          503
          ├── RecordTooNewError              RECORD_TOO_NEW             503
          └── InternalServerError            INTERNAL                   500, any other 5xx

The class is chosen from the problem ``code`` first; an answer without a known code (a proxy's
page, a future code) falls back by status: 400, 401, 404 and 413 to their classes, any other 5xx
to ``InternalServerError``, anything else to ``APIStatusError`` itself. All of it happens in
:func:`make_status_error`, the one place that reads an error response.

The codes are the OpenAPI document's ``ProblemCode``: each class names one (``expected_code``),
the code→class table is made from the classes, and tests/clients/test_client_shape.py fails when
a code of the document has no class or a class names a code the document does not have.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

__all__ = [
    "APIConnectionError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AssemblyOverflowError",
    "AssemblyTimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ContextAssemblyError",
    "ContextOverflowError",
    "ContributorFailedError",
    "ContributorUrlRejectedError",
    "InternalServerError",
    "InvalidRequestError",
    "MethodNotAllowedError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RecordTooNewError",
    "RequestHeadTooLargeError",
    "RequestTimeoutError",
    "StaleError",
    "StoreUnavailableError",
    "make_status_error",
]


class ContextAssemblyError(Exception):
    """Base of every error this client raises."""


class APIConnectionError(ContextAssemblyError):
    """The request got no HTTP answer: connection refused or reset, DNS failure, protocol error."""

    def __init__(self, request: httpx.Request, message: str = "connection error") -> None:
        super().__init__(message)
        self.request = request


class APITimeoutError(APIConnectionError):
    """The request's timeout ran out before the answer arrived."""

    def __init__(self, request: httpx.Request) -> None:
        super().__init__(request, "request timed out")


class APIResponseValidationError(ContextAssemblyError):
    """A successful answer whose body does not match the expected model (a contract drift)."""

    def __init__(self, response: httpx.Response, message: str) -> None:
        super().__init__(message)
        self.response = response
        self.status_code = response.status_code


class APIStatusError(ContextAssemblyError):
    """A non-2xx answer. ``problem`` is the parsed problem+json body (``{}`` if there was none)."""

    expected_code: ClassVar[str | None] = None

    def __init__(self, message: str, *, response: httpx.Response, problem: dict[str, Any]) -> None:
        super().__init__(message)
        self.response = response
        self.status_code: int = response.status_code
        self.problem = problem
        code = problem.get("code")
        self.code: str | None = code if isinstance(code, str) else None
        detail = problem.get("detail")
        self.detail: str | None = detail if isinstance(detail, str) else None
        self.request_id: str | None = response.headers.get("x-request-id")


class InvalidRequestError(APIStatusError):
    """Malformed request or blocks: duplicates, cycles, missing dependencies, unknown source."""

    expected_code = "CONTEXT_ASSEMBLY_INVALID"


class AssemblyOverflowError(APIStatusError):
    """The protected closure exceeds ``max_data_tokens`` or a source limit."""

    expected_code = "CONTEXT_ASSEMBLY_OVERFLOW"


class ContextOverflowError(APIStatusError):
    """The whole frame cannot fit the window, even after the allowed history compaction."""

    expected_code = "CONTEXT_OVERFLOW"


class AssemblyTimeoutError(APIStatusError):
    """Contributors did not finish within the preparation's deadline (failure policy ``fail``).

    Named so that it does not shadow the builtin ``TimeoutError``; a client-side timeout is
    :class:`APITimeoutError`.
    """

    expected_code = "CONTEXT_ASSEMBLY_TIMEOUT"


class StaleError(APIStatusError):
    """Something the preparation relied on changed; ``reasons`` lists what (docs/contract.md, "Lifecycle")."""

    expected_code = "CONTEXT_ASSEMBLY_STALE"

    def __init__(self, message: str, *, response: httpx.Response, problem: dict[str, Any]) -> None:
        super().__init__(message, response=response, problem=problem)
        reasons = problem.get("reasons")
        self.reasons: list[str] = [str(r) for r in reasons] if isinstance(reasons, list) else []


class ContributorFailedError(APIStatusError):
    """A contributor failed under failure policy ``fail``; ``source`` names it."""

    expected_code = "CONTRIBUTOR_FAILED"

    def __init__(self, message: str, *, response: httpx.Response, problem: dict[str, Any]) -> None:
        super().__init__(message, response=response, problem=problem)
        source = problem.get("source")
        self.source: str | None = source if isinstance(source, str) else None


class ContributorUrlRejectedError(APIStatusError):
    """An inline contributor URL outside the allowlist or resolving to a forbidden address."""

    expected_code = "CONTRIBUTOR_URL_REJECTED"


class AuthenticationError(APIStatusError):
    """No API key, or a key that maps to no tenant."""

    expected_code = "UNAUTHENTICATED"


class NotFoundError(APIStatusError):
    """Unknown preparation id, or another tenant's (the two are indistinguishable on purpose)."""

    expected_code = "NOT_FOUND"


class MethodNotAllowedError(APIStatusError):
    """The path exists, but not with this method."""

    expected_code = "METHOD_NOT_ALLOWED"


class BadRequestError(APIStatusError):
    """The request was not valid HTTP and was refused before it was read (a malformed request
    line, header field, ``Content-Length`` or chunk): a bug in the HTTP stack that sent it, or in
    a proxy on the way."""

    expected_code = "BAD_REQUEST"


class PayloadTooLargeError(APIStatusError):
    """The request body is over the service's configured limit."""

    expected_code = "PAYLOAD_TOO_LARGE"


class RequestHeadTooLargeError(APIStatusError):
    """The request head (target and header fields) is over the service's configured limit."""

    expected_code = "REQUEST_HEAD_TOO_LARGE"


class RequestTimeoutError(APIStatusError):
    """The request head or body did not reach the service within its time limit (a client-side
    timeout is :class:`APITimeoutError`)."""

    expected_code = "REQUEST_TIMEOUT"


class StoreUnavailableError(APIStatusError):
    """The service's store cannot be reached right now; retry-safe calls are retried."""

    expected_code = "STORE_UNAVAILABLE"


class RecordTooNewError(APIStatusError):
    """The preparation was written by a newer version of the service, whose record the replica
    that answered does not read (a rolling deploy); retry-safe calls are retried."""

    expected_code = "RECORD_TOO_NEW"


class InternalServerError(APIStatusError):
    """An unexpected failure of the service, or a 5xx answer without a known problem code (a
    proxy's error)."""

    expected_code = "INTERNAL"


def _status_classes(base: type[APIStatusError]) -> list[type[APIStatusError]]:
    """``base`` and every class under it."""
    return [base, *(cls for sub in base.__subclasses__() for cls in _status_classes(sub))]


# The class of each problem code: every class of this module that names one.
_BY_CODE: dict[str, type[APIStatusError]] = {
    cls.expected_code: cls
    for cls in _status_classes(APIStatusError)
    if cls.expected_code is not None and cls.__module__ == __name__
}

_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    413: PayloadTooLargeError,
}


def _problem_of(response: httpx.Response) -> dict[str, Any]:
    """The JSON object of an error body, or ``{}`` for an empty, non-JSON or non-object body."""
    content_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type != "application/json" and not content_type.endswith("+json"):
        return {}
    try:
        body = response.json()
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are both ValueErrors
        return {}
    return body if isinstance(body, dict) else {}


def make_status_error(response: httpx.Response) -> APIStatusError:
    """The exception for a non-2xx ``response``; its body must already be read.

    Parses the problem+json body, picks the class by ``code`` and falls back by status (see the
    module docstring). The message reads ``"<status> <code>: <detail>"``.
    """
    problem = _problem_of(response)
    code = problem.get("code")
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = _BY_STATUS.get(response.status_code)
    if cls is None:
        cls = InternalServerError if response.status_code >= 500 else APIStatusError
    detail = problem.get("detail")
    if not isinstance(detail, str) or not detail:
        detail = response.reason_phrase or "error"
    label = code if isinstance(code, str) else "HTTP error"
    return cls(f"{response.status_code} {label}: {detail}", response=response, problem=problem)
