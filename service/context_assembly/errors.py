"""The service's error hierarchy; each class carries its problem ``code``, title and HTTP status.

::

    ServiceError                   INTERNAL                   500
     ├── InvalidError              CONTEXT_ASSEMBLY_INVALID   422
     ├── AssemblyOverflowError     CONTEXT_ASSEMBLY_OVERFLOW  422
     ├── ContextOverflowError      CONTEXT_OVERFLOW           422
     ├── AssemblyTimeoutError      CONTEXT_ASSEMBLY_TIMEOUT   504
     ├── StaleError                CONTEXT_ASSEMBLY_STALE     409
     ├── ContributorFailedError    CONTRIBUTOR_FAILED         502
     ├── UrlRejectedError          CONTRIBUTOR_URL_REJECTED   422
     ├── UnauthenticatedError      UNAUTHENTICATED            401
     ├── NotFoundError             NOT_FOUND                  404
     ├── MethodNotAllowedError     METHOD_NOT_ALLOWED         405
     ├── BadRequestError           BAD_REQUEST                400
     ├── PayloadTooLargeError      PAYLOAD_TOO_LARGE          413
     ├── RequestHeadTooLargeError  REQUEST_HEAD_TOO_LARGE     431
     ├── RequestTimeoutError       REQUEST_TIMEOUT            408
     ├── StoreUnavailableError     STORE_UNAVAILABLE          503
     └── RecordTooNewError         RECORD_TOO_NEW             503

Errors are plain values: they never hold block text, only ids, field paths, sizes and reasons.
They become RFC 9457 problem+json in exactly one place (``api/problems.py``; the CLI and the
connection limits of ``http_limits.py``, which answer before any application runs, use the same
``to_problem``).

The classes of this module are the service's problem codes: ``PROBLEM_KINDS`` lists them, and
the OpenAPI document's ``ProblemCode`` enumerates their codes (``api/problems.py``), which the
clients' error classes are checked against.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

PROBLEM_TYPE_BASE = "urn:context-assembly:problem:"
"""Each problem's ``type``: this prefix, then its code in lower case with hyphens. A name, not a
link: nothing is served at it, and no client should fetch it (the code says the same)."""


class ServiceError(Exception):
    """Base of every error the service reports as problem+json."""

    code: ClassVar[str] = "INTERNAL"
    title: ClassVar[str] = "Internal error"
    status: ClassVar[int] = 500

    def __init__(self, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extensions = {k: v for k, v in extensions.items() if v is not None}
        # The contributor calls that had settled when a prepare failed, for the metrics:
        # ``(source, status, duration_ms)``. Not part of the problem body.
        self.calls: tuple[tuple[str, str, float], ...] = ()

    def to_problem(self, instance: str | None = None) -> dict[str, Any]:
        """The RFC 9457 body: standard members, ``code``, then this error's extensions."""
        body: dict[str, Any] = {
            "type": PROBLEM_TYPE_BASE + self.code.lower().replace("_", "-"),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
        }
        if instance is not None:
            body["instance"] = instance
        body.update(self.extensions)
        return body


class InvalidError(ServiceError):
    """Malformed request or blocks: duplicates, cycles, missing protected dependencies, unknown source."""

    code = "CONTEXT_ASSEMBLY_INVALID"
    title = "Invalid context-assembly request"
    status = 422


class AssemblyOverflowError(ServiceError):
    """The protected closure exceeds ``max_data_tokens`` or a source limit."""

    code = "CONTEXT_ASSEMBLY_OVERFLOW"
    title = "Protected data exceeds the data budget"
    status = 422


class ContextOverflowError(ServiceError):
    """The whole frame cannot fit the window, even after the allowed history compaction."""

    code = "CONTEXT_OVERFLOW"
    title = "Request does not fit the context window"
    status = 422


class AssemblyTimeoutError(ServiceError):
    """Contributors did not finish within the preparation's deadline (failure policy ``fail``)."""

    code = "CONTEXT_ASSEMBLY_TIMEOUT"
    title = "Contributors did not finish in time"
    status = 504


class StaleError(ServiceError):
    """Something the preparation relied on changed; ``reasons`` lists what."""

    code = "CONTEXT_ASSEMBLY_STALE"
    title = "Preparation is stale"
    status = 409


class ContributorFailedError(ServiceError):
    """A contributor failed under failure policy ``fail``; names the source and keeps the cause."""

    code = "CONTRIBUTOR_FAILED"
    title = "Contributor failed"
    status = 502


class UrlRejectedError(ServiceError):
    """An inline contributor URL outside the allowlist or resolving to a forbidden address."""

    code = "CONTRIBUTOR_URL_REJECTED"
    title = "Contributor URL rejected"
    status = 422


class UnauthenticatedError(ServiceError):
    """No API key, or a key that maps to no tenant."""

    code = "UNAUTHENTICATED"
    title = "Authentication required"
    status = 401


class NotFoundError(ServiceError):
    """Unknown id, or another tenant's id: the two are indistinguishable on purpose."""

    code = "NOT_FOUND"
    title = "Not found"
    status = 404


class MethodNotAllowedError(ServiceError):
    """The path exists but not with this method."""

    code = "METHOD_NOT_ALLOWED"
    title = "Method not allowed"
    status = 405


class BadRequestError(ServiceError):
    """The request is not HTTP/1.1 that the server can parse: an invalid request line, a control
    character in a header, a ``Content-Length`` that is not a number, a malformed chunk."""

    code = "BAD_REQUEST"
    title = "Bad request"
    status = 400


class PayloadTooLargeError(ServiceError):
    """The request body is over the configured limit."""

    code = "PAYLOAD_TOO_LARGE"
    title = "Payload too large"
    status = 413


class RequestHeadTooLargeError(ServiceError):
    """The request head (target and header fields) is over the configured limit."""

    code = "REQUEST_HEAD_TOO_LARGE"
    title = "Request header fields too large"
    status = 431


class RequestTimeoutError(ServiceError):
    """The request head or body did not arrive within its configured time limit."""

    code = "REQUEST_TIMEOUT"
    title = "Request timeout"
    status = 408


class StoreUnavailableError(ServiceError):
    """The preparation store cannot be reached right now; the call can be retried."""

    code = "STORE_UNAVAILABLE"
    title = "Store unavailable"
    status = 503


class RecordTooNewError(ServiceError):
    """A stored preparation written by a newer version of the service, in a shape this version
    does not read (``preparations/record.py``): a replica of the newer version can answer."""

    code = "RECORD_TOO_NEW"
    title = "Preparation written by a newer version"
    status = 503


PROBLEM_KINDS: Final[tuple[type[ServiceError], ...]] = tuple(
    kind
    for kind in list(globals().values())
    if isinstance(kind, type) and issubclass(kind, ServiceError)
)
"""Every kind of problem the service answers with, one class per code, in the order of the
hierarchy above (``ServiceError`` itself is ``INTERNAL``: an unexpected failure)."""
