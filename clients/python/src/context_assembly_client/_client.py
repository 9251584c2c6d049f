"""``Client`` and ``AsyncClient``: the same methods, one blocking and one ``async``.

Both send through httpx and share everything else with :mod:`._base`. Only the retry-safe calls
are repeated (``get_preparation``, ``breakdown``, ``models``, ``health`` and ``report_usage``), on
a connection error, a timeout or a 502/503/504, with jittered backoff.

**Timeouts.** ``timeout`` (constructor or per call) is httpx's timeout of one attempt, per
phase (connect, write, each read). The service bounds its own work by the request's
``assembly.timeout_ms``; the clients send no deadline header, because the service reads none.
For a hard bound on a whole call, retries included, wrap it: ``with anyio.fail_after(2.0): ...``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

import anyio
import httpx

from context_assembly_client import _base
from context_assembly_client._base import BaseClient, Call, ResponseT
from context_assembly_client._constants import DEFAULT_MAX_RETRIES
from context_assembly_client._exceptions import APIConnectionError, APITimeoutError
from context_assembly_client._types import NOT_GIVEN, NotGiven, Timeout
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

__all__ = ["AsyncClient", "Client"]


def _connection_error(request: httpx.Request, err: httpx.TransportError) -> APIConnectionError:
    if isinstance(err, httpx.TimeoutException):
        return APITimeoutError(request)
    return APIConnectionError(request, f"connection error: {type(err).__name__}: {err}")


class Client(BaseClient[httpx.Client]):
    """A blocking client of the context-assembly service.

    Args:
        base_url: where the service answers, e.g. ``"http://127.0.0.1:8080"``.
        api_key: sent as ``Authorization: Bearer <key>`` when given.
        timeout: seconds or an ``httpx.Timeout`` per attempt; ``None`` for none. Defaults to the
            injected client's timeout, else ``DEFAULT_TIMEOUT``.
        max_retries: retries of retry-safe calls (see the module docstring).
        http_client: an ``httpx.Client`` to send with (for proxies, a test app, ...); it is not
            closed by :meth:`close`.

    Raises:
        APIStatusError: (a subclass per problem code) for a non-2xx answer.
        APIConnectionError: when no answer came; ``APITimeoutError`` when the timeout ran out.
    """

    def __init__(
        self,
        base_url: str | httpx.URL,
        *,
        api_key: str | None = None,
        timeout: Timeout | NotGiven = NOT_GIVEN,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(
            base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            http_client=http_client,
        )

    def _default_http_client(self) -> httpx.Client:
        return httpx.Client(timeout=self.timeout, follow_redirects=False)

    def _run(self, call: Call[ResponseT], timeout: Timeout | NotGiven) -> ResponseT:
        retries = 0
        while True:
            request = self._build_request(call, timeout)
            try:
                response = self._client.send(request)
            except httpx.TransportError as err:
                if not self._should_retry(call, retries, None):
                    raise _connection_error(request, err) from err
                time.sleep(self._retry_delay(retries, None))
                retries += 1
                continue
            if self._should_retry(call, retries, response.status_code):
                response.close()
                time.sleep(self._retry_delay(retries, response))
                retries += 1
                continue
            return self._process(call, response)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the underlying httpx client if this client created it."""
        if self._owns_http_client:
            self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ operations

    def prepare(
        self,
        request: PrepareRequest | Mapping[str, Any],
        *,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> PrepareResponse:
        """Run contributors, select under the budget and lay out the frame (``POST /v1/prepare``).

        Never retried: a lost answer is raised, not silently repeated.
        """
        return self._run(_base.prepare_call(request), timeout)

    def budget(
        self,
        request: PrepareRequest | Mapping[str, Any],
        *,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> BudgetResponse:
        """The budget of what is already materialisable; no contributor is called."""
        return self._run(_base.budget_call(request), timeout)

    def get_preparation(
        self, preparation_id: str, *, timeout: Timeout | NotGiven = NOT_GIVEN
    ) -> PreparationView:
        """Manifest, budget, hashes and accounting of one preparation (never block bodies)."""
        return self._run(_base.get_preparation_call(preparation_id), timeout)

    def validate(
        self,
        preparation_id: str,
        *,
        model: str,
        frame: Frame | Mapping[str, Any],
        scope: Scope | Mapping[str, Any] | None = None,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> ValidateResponse:
        """Final dispatch check of the frame about to be sent.

        ``scope`` must be the preparation's scope (omitted means the empty scope).

        Raises:
            StaleError: with ``reasons`` when anything the preparation relied on changed.
        """
        return self._run(_base.validate_call(preparation_id, model, frame, scope), timeout)

    def refresh(
        self,
        preparation_id: str,
        request: PrepareRequest | Mapping[str, Any],
        *,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> PrepareResponse:
        """One more contribution and selection round over the edited request (once per preparation).

        Raises:
            StaleError: ``refresh_used`` on a second refresh, or when the trusted prefix changed.
        """
        return self._run(_base.refresh_call(preparation_id, request), timeout)

    def repair(
        self,
        preparation_id: str,
        *,
        model: str,
        instructions: str,
        frame: Frame | Mapping[str, Any],
        answer: str,
        schema: Mapping[str, Any] | None = None,
        scope: Scope | Mapping[str, Any] | None = None,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> RepairResponse:
        """A frame asking the model to format ``answer`` to ``schema``, over the frozen frame."""
        return self._run(
            _base.repair_call(preparation_id, model, instructions, frame, answer, schema, scope),
            timeout,
        )

    def report_usage(
        self,
        preparation_id: str,
        *,
        report_id: str,
        provider: Provider,
        usage: Mapping[str, Any],
        call: CallKind = "main",
        response_id: str | None = None,
        diagnostics: Mapping[str, Any] | None = None,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> UsageResponse:
        """Record the provider's usage object as received; the same ``report_id`` twice is one report.

        See :func:`usage_from_openai` and its siblings for ``provider`` and ``usage``.
        ``response_id`` is the provider's id of the response and ``diagnostics`` its cache
        diagnostics object, when it returned one; the service keeps both with the observation.
        """
        return self._run(
            _base.usage_call(
                preparation_id, report_id, provider, usage, call, response_id, diagnostics
            ),
            timeout,
        )

    def breakdown(
        self, preparation_id: str, *, html: bool = False, timeout: Timeout | NotGiven = NOT_GIVEN
    ) -> str:
        """The human view of a preparation: plain text, or an HTML page with ``html=True``."""
        return self._run(_base.breakdown_call(preparation_id, html), timeout)

    def timeline(self, preparation_id: str, *, timeout: Timeout | NotGiven = NOT_GIVEN) -> Timeline:
        """The preparation and the turns before it in its scope (up to 50, oldest first)."""
        return self._run(_base.timeline_call(preparation_id), timeout)

    def models(self, *, timeout: Timeout | NotGiven = NOT_GIVEN) -> ModelList:
        """The capacity registry: window, output limit, tokenizer and framing of each model."""
        return self._run(_base.models_call(), timeout)

    def health(self, *, timeout: Timeout | NotGiven = NOT_GIVEN) -> Health:
        """Liveness of the service (``GET /healthz``)."""
        return self._run(_base.health_call(), timeout)


class AsyncClient(BaseClient[httpx.AsyncClient]):
    """The ``async`` twin of :class:`Client`: same constructor, same methods, awaited.

    Works under asyncio and trio (it sleeps with anyio). Close it with :meth:`aclose` or
    ``async with``.
    """

    def __init__(
        self,
        base_url: str | httpx.URL,
        *,
        api_key: str | None = None,
        timeout: Timeout | NotGiven = NOT_GIVEN,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(
            base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            http_client=http_client,
        )

    def _default_http_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self.timeout, follow_redirects=False)

    async def _run(self, call: Call[ResponseT], timeout: Timeout | NotGiven) -> ResponseT:
        retries = 0
        while True:
            request = self._build_request(call, timeout)
            try:
                response = await self._client.send(request)
            except httpx.TransportError as err:
                if not self._should_retry(call, retries, None):
                    raise _connection_error(request, err) from err
                await anyio.sleep(self._retry_delay(retries, None))
                retries += 1
                continue
            if self._should_retry(call, retries, response.status_code):
                await response.aclose()
                await anyio.sleep(self._retry_delay(retries, response))
                retries += 1
                continue
            return self._process(call, response)

    # ------------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        """Close the underlying httpx client if this client created it."""
        if self._owns_http_client:
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ operations

    async def prepare(
        self,
        request: PrepareRequest | Mapping[str, Any],
        *,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> PrepareResponse:
        """Run contributors, select under the budget and lay out the frame (``POST /v1/prepare``).

        Never retried: a lost answer is raised, not silently repeated.
        """
        return await self._run(_base.prepare_call(request), timeout)

    async def budget(
        self,
        request: PrepareRequest | Mapping[str, Any],
        *,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> BudgetResponse:
        """The budget of what is already materialisable; no contributor is called."""
        return await self._run(_base.budget_call(request), timeout)

    async def get_preparation(
        self, preparation_id: str, *, timeout: Timeout | NotGiven = NOT_GIVEN
    ) -> PreparationView:
        """Manifest, budget, hashes and accounting of one preparation (never block bodies)."""
        return await self._run(_base.get_preparation_call(preparation_id), timeout)

    async def validate(
        self,
        preparation_id: str,
        *,
        model: str,
        frame: Frame | Mapping[str, Any],
        scope: Scope | Mapping[str, Any] | None = None,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> ValidateResponse:
        """Final dispatch check of the frame about to be sent.

        ``scope`` must be the preparation's scope (omitted means the empty scope).

        Raises:
            StaleError: with ``reasons`` when anything the preparation relied on changed.
        """
        return await self._run(_base.validate_call(preparation_id, model, frame, scope), timeout)

    async def refresh(
        self,
        preparation_id: str,
        request: PrepareRequest | Mapping[str, Any],
        *,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> PrepareResponse:
        """One more contribution and selection round over the edited request (once per preparation).

        Raises:
            StaleError: ``refresh_used`` on a second refresh, or when the trusted prefix changed.
        """
        return await self._run(_base.refresh_call(preparation_id, request), timeout)

    async def repair(
        self,
        preparation_id: str,
        *,
        model: str,
        instructions: str,
        frame: Frame | Mapping[str, Any],
        answer: str,
        schema: Mapping[str, Any] | None = None,
        scope: Scope | Mapping[str, Any] | None = None,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> RepairResponse:
        """A frame asking the model to format ``answer`` to ``schema``, over the frozen frame."""
        return await self._run(
            _base.repair_call(preparation_id, model, instructions, frame, answer, schema, scope),
            timeout,
        )

    async def report_usage(
        self,
        preparation_id: str,
        *,
        report_id: str,
        provider: Provider,
        usage: Mapping[str, Any],
        call: CallKind = "main",
        response_id: str | None = None,
        diagnostics: Mapping[str, Any] | None = None,
        timeout: Timeout | NotGiven = NOT_GIVEN,
    ) -> UsageResponse:
        """Record the provider's usage object as received; the same ``report_id`` twice is one report.

        See :func:`usage_from_openai` and its siblings for ``provider`` and ``usage``.
        ``response_id`` is the provider's id of the response and ``diagnostics`` its cache
        diagnostics object, when it returned one; the service keeps both with the observation.
        """
        return await self._run(
            _base.usage_call(
                preparation_id, report_id, provider, usage, call, response_id, diagnostics
            ),
            timeout,
        )

    async def breakdown(
        self, preparation_id: str, *, html: bool = False, timeout: Timeout | NotGiven = NOT_GIVEN
    ) -> str:
        """The human view of a preparation: plain text, or an HTML page with ``html=True``."""
        return await self._run(_base.breakdown_call(preparation_id, html), timeout)

    async def timeline(
        self, preparation_id: str, *, timeout: Timeout | NotGiven = NOT_GIVEN
    ) -> Timeline:
        """The preparation and the turns before it in its scope (up to 50, oldest first)."""
        return await self._run(_base.timeline_call(preparation_id), timeout)

    async def models(self, *, timeout: Timeout | NotGiven = NOT_GIVEN) -> ModelList:
        """The capacity registry: window, output limit, tokenizer and framing of each model."""
        return await self._run(_base.models_call(), timeout)

    async def health(self, *, timeout: Timeout | NotGiven = NOT_GIVEN) -> Health:
        """Liveness of the service (``GET /healthz``)."""
        return await self._run(_base.health_call(), timeout)
