"""What the sync and async clients share: operations, request building, response parsing, retries.

The twins in ``_client.py`` differ only in how they send and how they sleep. Every public method
there is one line: it asks this module for a :class:`Call` (operation, path parameters, JSON body,
accepted media type, parser) and runs it through the shared send loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, NamedTuple, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from context_assembly_client._constants import DEFAULT_TIMEOUT, USER_AGENT
from context_assembly_client._exceptions import APIResponseValidationError, make_status_error
from context_assembly_client._retry import retry_delay, should_retry
from context_assembly_client._types import NotGiven, Timeout
from context_assembly_client.types import (
    BudgetResponse,
    CallKind,
    Frame,
    Health,
    ModelList,
    PreparationView,
    PrepareRequest,
    PrepareResponse,
    Provider,
    RepairResponse,
    Scope,
    Timeline,
    UsageResponse,
    ValidateResponse,
)

ResponseT = TypeVar("ResponseT")
ModelT = TypeVar("ModelT", bound=BaseModel)
HttpxClientT = TypeVar("HttpxClientT", httpx.Client, httpx.AsyncClient)

JSON_MEDIA = "application/json"


class Operation(NamedTuple):
    """One HTTP operation of the service; ``operation_id`` is the OpenAPI ``operationId``."""

    operation_id: str
    method: str
    path: str
    retry_safe: bool


OPERATIONS: Final[Mapping[str, Operation]] = {
    op.operation_id: op
    for op in (
        Operation("prepare", "POST", "/v1/prepare", False),
        Operation("budget", "POST", "/v1/budget", False),
        Operation("get_preparation", "GET", "/v1/preparations/{preparation_id}", True),
        Operation(
            "validate_preparation", "POST", "/v1/preparations/{preparation_id}/validate", False
        ),
        Operation(
            "refresh_preparation", "POST", "/v1/preparations/{preparation_id}/refresh", False
        ),
        Operation("repair_preparation", "POST", "/v1/preparations/{preparation_id}/repair", False),
        # Idempotent by report_id on the server (docs/contract.md, "Accounting"), hence safe to repeat.
        Operation("report_usage", "POST", "/v1/preparations/{preparation_id}/usage", True),
        Operation("get_breakdown", "GET", "/v1/preparations/{preparation_id}/breakdown", True),
        Operation("get_timeline", "GET", "/v1/preparations/{preparation_id}/timeline", True),
        Operation("list_models", "GET", "/v1/models", True),
        Operation("healthz", "GET", "/healthz", True),
    )
}
"""Every operation the clients call, keyed by OpenAPI ``operationId`` (checked against the
committed document by the drift test)."""


@dataclass(frozen=True, slots=True)
class Call(Generic[ResponseT]):
    """One call, ready to send: which operation, with what, and how to read the answer."""

    operation: Operation
    parse: Callable[[httpx.Response], ResponseT]
    path_params: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    accept: str = JSON_MEDIA


# --------------------------------------------------------------------------- bodies and answers


def to_jsonable(value: Any) -> Any:
    """A request body value as JSON-ready data: models dump only the fields that were set.

    ``exclude_unset`` keeps the server's defaults authoritative; dicts and lists are walked so a
    plain dict may hold models.
    """
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


def model_parser(model: type[ModelT]) -> Callable[[httpx.Response], ModelT]:
    """A parser of a 2xx JSON answer into ``model``; a mismatch is ``APIResponseValidationError``."""

    def parse(response: httpx.Response) -> ModelT:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as err:
            raise APIResponseValidationError(
                response, f"answer does not match {model.__name__}: {err.error_count()} error(s)"
            ) from err

    return parse


def text_parser(response: httpx.Response) -> str:
    """The answer's text, decoded with its declared charset."""
    return response.text


def _id(preparation_id: str) -> dict[str, str]:
    if not isinstance(preparation_id, str) or not preparation_id:
        raise ValueError("preparation_id must be a non-empty string")
    return {"preparation_id": preparation_id}


# --------------------------------------------------------------------------- the calls


def prepare_call(request: PrepareRequest | Mapping[str, Any]) -> Call[PrepareResponse]:
    """``POST /v1/prepare``."""
    return Call(OPERATIONS["prepare"], model_parser(PrepareResponse), body=to_jsonable(request))


def budget_call(request: PrepareRequest | Mapping[str, Any]) -> Call[BudgetResponse]:
    """``POST /v1/budget``."""
    return Call(OPERATIONS["budget"], model_parser(BudgetResponse), body=to_jsonable(request))


def get_preparation_call(preparation_id: str) -> Call[PreparationView]:
    """``GET /v1/preparations/{id}``."""
    return Call(OPERATIONS["get_preparation"], model_parser(PreparationView), _id(preparation_id))


def validate_call(
    preparation_id: str,
    model: str,
    frame: Frame | Mapping[str, Any],
    scope: Scope | Mapping[str, Any] | None,
) -> Call[ValidateResponse]:
    """``POST /v1/preparations/{id}/validate``."""
    body: dict[str, Any] = {"model": model, "frame": to_jsonable(frame)}
    if scope is not None:
        body["scope"] = to_jsonable(scope)
    return Call(
        OPERATIONS["validate_preparation"],
        model_parser(ValidateResponse),
        _id(preparation_id),
        body,
    )


def refresh_call(
    preparation_id: str, request: PrepareRequest | Mapping[str, Any]
) -> Call[PrepareResponse]:
    """``POST /v1/preparations/{id}/refresh``."""
    return Call(
        OPERATIONS["refresh_preparation"],
        model_parser(PrepareResponse),
        _id(preparation_id),
        to_jsonable(request),
    )


def repair_call(
    preparation_id: str,
    model: str,
    instructions: str,
    frame: Frame | Mapping[str, Any],
    answer: str,
    schema: Mapping[str, Any] | None,
    scope: Scope | Mapping[str, Any] | None,
) -> Call[RepairResponse]:
    """``POST /v1/preparations/{id}/repair``."""
    body: dict[str, Any] = {
        "model": model,
        "instructions": instructions,
        "frame": to_jsonable(frame),
        "answer": answer,
    }
    if schema is not None:
        body["schema"] = to_jsonable(schema)
    if scope is not None:
        body["scope"] = to_jsonable(scope)
    return Call(
        OPERATIONS["repair_preparation"], model_parser(RepairResponse), _id(preparation_id), body
    )


def usage_call(
    preparation_id: str,
    report_id: str,
    provider: Provider,
    usage: Mapping[str, Any],
    call: CallKind,
    response_id: str | None = None,
    diagnostics: Mapping[str, Any] | None = None,
) -> Call[UsageResponse]:
    """``POST /v1/preparations/{id}/usage``."""
    body = {
        "report_id": report_id,
        "provider": provider,
        "call": call,
        "usage": to_jsonable(usage),
    }
    if response_id is not None:
        body["response_id"] = response_id
    if diagnostics is not None:
        body["diagnostics"] = to_jsonable(diagnostics)
    return Call(OPERATIONS["report_usage"], model_parser(UsageResponse), _id(preparation_id), body)


def breakdown_call(preparation_id: str, html: bool) -> Call[str]:
    """``GET /v1/preparations/{id}/breakdown`` as HTML or plain text."""
    return Call(
        OPERATIONS["get_breakdown"],
        text_parser,
        _id(preparation_id),
        accept="text/html" if html else "text/plain",
    )


def timeline_call(preparation_id: str) -> Call[Timeline]:
    """``GET /v1/preparations/{id}/timeline`` as JSON."""
    return Call(
        OPERATIONS["get_timeline"],
        model_parser(Timeline),
        _id(preparation_id),
        accept="application/json",
    )


def models_call() -> Call[ModelList]:
    """``GET /v1/models``."""
    return Call(OPERATIONS["list_models"], model_parser(ModelList))


def health_call() -> Call[Health]:
    """``GET /healthz``."""
    return Call(OPERATIONS["healthz"], model_parser(Health))


# --------------------------------------------------------------------------- the shared base


class BaseClient(ABC, Generic[HttpxClientT]):
    """Configuration, request building, answer handling and retry policy of both twins."""

    def __init__(
        self,
        base_url: str | httpx.URL,
        *,
        api_key: str | None,
        timeout: Timeout | NotGiven,
        max_retries: int,
        http_client: HttpxClientT | None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.base_url = str(base_url).rstrip("/")
        self.api_key = api_key
        self.max_retries = max_retries
        if isinstance(timeout, NotGiven):
            timeout = http_client.timeout if http_client is not None else DEFAULT_TIMEOUT
        self.timeout: Timeout = timeout
        self._owns_http_client = http_client is None
        self._client: HttpxClientT = (
            http_client if http_client is not None else self._default_http_client()
        )

    @abstractmethod
    def _default_http_client(self) -> HttpxClientT:
        """The httpx client used when none is injected (closed by ``close``/``aclose``)."""

    def _headers(self, accept: str) -> dict[str, str]:
        headers = {"accept": accept, "user-agent": USER_AGENT}
        if self.api_key is not None:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

    def _build_request(self, call: Call[Any], timeout: Timeout | NotGiven) -> httpx.Request:
        """The request of ``call``: absolute URL, headers, JSON body and the effective timeout."""
        path = call.operation.path.format(
            **{name: quote(value, safe="") for name, value in call.path_params.items()}
        )
        return self._client.build_request(
            call.operation.method,
            self.base_url + path,
            json=call.body,
            headers=self._headers(call.accept),
            timeout=self.timeout if isinstance(timeout, NotGiven) else timeout,
        )

    def _should_retry(self, call: Call[Any], retries_done: int, status_code: int | None) -> bool:
        return should_retry(
            retry_safe=call.operation.retry_safe,
            retries_done=retries_done,
            max_retries=self.max_retries,
            status_code=status_code,
        )

    def _retry_delay(self, retries_done: int, response: httpx.Response | None) -> float:
        return retry_delay(retries_done, None if response is None else response.headers)

    @staticmethod
    def _process(call: Call[ResponseT], response: httpx.Response) -> ResponseT:
        """Raise the status error of a non-2xx answer, else parse it (the body is already read)."""
        if not response.is_success:
            raise make_status_error(response)
        return call.parse(response)
