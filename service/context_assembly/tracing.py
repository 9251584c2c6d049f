"""OpenTelemetry traces: off unless the standard ``OTEL_*`` variables ask for them.

Everything about traces lives in this module; the rest of the service holds three hooks:
``create_app`` passes :func:`fastapi_telemetry` to ``FastAPI(telemetry=...)`` and awaits
:func:`flush` at shutdown, and the lifecycle operations (``preparations/operations.py``) wear
:func:`traced`.

**The shutdown** waits ``FLUSH_MILLIS`` at most for the spans still in a batch, by the wall
clock, whatever the exporter does: the SDK's ``force_flush`` ignores its timeout and exports
every batch with the exporter's own timeout and retries (10 s each by default, against a
collector that accepts connections and never answers), so it runs in a daemon thread that the
shutdown stops waiting for; the spans it has not sent by then are dropped, logged as
``tracing_flush_incomplete``. No exit hook of the SDK runs either (the provider is made without
one): it would wait on the same exporter.

**The switch** (:func:`enabled`): tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter
(``otlp`` or ``console``; ``none`` is off) or, without it, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set; ``OTEL_SDK_DISABLED=true`` turns it off whatever
else is set. Unlike the OpenTelemetry SDK, which exports to ``localhost:4318`` when nothing is set,
the service traces only when asked. On, it needs the ``[otel]`` extra (the SDK, the OTLP/HTTP
exporter and the aiohttp client instrumentation); without it, or with an exporter or protocol it
cannot serve, it logs one ``tracing_unavailable`` warning naming the cause and serves without
traces: OpenTelemetry's own rule is that telemetry never stops the application, and an
``OTEL_*`` variable set for a whole cluster must not stop a replica built without the extra.
The SDK and the exporter read the rest of the variables themselves (endpoint, headers, timeout,
sampler, batch delays, resource attributes, ``OTEL_SERVICE_NAME``).

**What is traced**, once per process (uvicorn imports the app once per worker):

* every HTTP request but ``/healthz``, ``/readyz`` and ``/metrics``, by FastAPI's own telemetry
  (FastAPI ≥ 0.165 traces requests itself when given a tracer provider, and extracts the caller's
  ``traceparent``; ``opentelemetry-instrumentation-fastapi`` would be a second path it treats as
  legacy). Its metrics and log records stay off: the service's metrics are Prometheus'
  (``/metrics``), and its log records would carry exception messages;
* every contributor call (webhook and MCP: both go through the one aiohttp client), by
  ``opentelemetry-instrumentation-aiohttp-client``, which also sends the W3C ``traceparent`` (and
  what ``OTEL_PROPAGATORS`` adds) with each call, and records the URL without its query. It
  instruments every aiohttp session made after tracing starts; the contributor client makes its
  sessions on first use, so ``contributors/client.py`` needs no hook;
* one span per prepare, refresh and usage report (:func:`traced`), with the GenAI semantic
  conventions' attributes where they have one and ``context_assembly.*`` attributes named after
  the response field they copy where they do not.

**Never** block text, instructions, history, input, a frame or an answer: the attributes are
ids, model and provider names, counts, sizes and closed-set names (statuses, parts, codes), and a
failed operation records its problem ``code`` as ``error.type``, not its message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, ParamSpec, TypeVar, cast

import structlog
from fastapi.telemetry import TelemetryConfig

from context_assembly import __version__
from context_assembly.errors import ServiceError
from context_assembly.lifecycle_models import UsageRequest
from context_assembly.tokens.registry import ModelRegistry

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Tracer
    from opentelemetry.util.types import AttributeValue
    from yarl import URL

    from context_assembly.preparations.record import Prepared
    from context_assembly.preparations.usage import RecordedUsage

EXTRA: Final = "context-assembly[otel]"
SERVICE_NAME: Final = "context-assembly"
FLUSH_MILLIS: Final = 5_000
"""How long a shutdown waits for the last spans to leave, by the wall clock."""
UNTRACED_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})
"""Probes and scrapes: many a minute, nothing to follow."""

# The registry's providers as the OpenTelemetry GenAI semantic conventions spell them in
# ``gen_ai.provider.name`` (their well-known values; "gcp.gen_ai" is any Google generative AI
# endpoint). A usage report in the ``normalized`` shape names no provider.
GEN_AI_PROVIDERS: Final = {"openai": "openai", "anthropic": "anthropic", "google": "gcp.gen_ai"}

Operation = Literal["prepare", "refresh", "usage"]
Attributes = dict[str, "AttributeValue"]
P = ParamSpec("P")
R = TypeVar("R")

log = structlog.get_logger("context_assembly.tracing")

_provider: TracerProvider | None = None
_tracer: Tracer | None = None


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for traces (the switch of the module docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if named:
        return bool(_exporter_names(named))
    return any(
        environ.get(name, "").strip()
        for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def _exporter_names(value: str) -> list[str]:
    """The exporters a comma-separated ``OTEL_TRACES_EXPORTER`` names, ``none`` left out."""
    return [n for n in (part.strip().lower() for part in value.split(",")) if n and n != "none"]


def fastapi_telemetry() -> TelemetryConfig:
    """What ``create_app`` gives ``FastAPI(telemetry=...)``: server spans on this process's tracer
    provider when tracing is on (started here on the first call that finds it asked for).

    Off, FastAPI's telemetry is switched off outright: with no provider configured it would still
    ask the OpenTelemetry API on every request whether one is (~60 µs of a ~1 ms prepare)."""
    provider = _provider
    if provider is None and enabled(os.environ):
        provider = start()
    if provider is None:
        return {"tracing": False, "metrics": False, "logs": False, "auto_configure": False}
    return {
        "tracer_provider": provider,
        "tracing": True,
        "metrics": False,
        "logs": False,
        "operation_spans": False,  # dependency and serialisation spans: noise beside ours
        "auto_configure": False,  # the exporters are this module's, not FastAPI's
        "exclude": _untraced,
    }


def _untraced(scope: MutableMapping[str, Any]) -> bool:
    return scope.get("path") in UNTRACED_PATHS


def start(processor: SpanProcessor | None = None) -> TracerProvider | None:
    """Start tracing in this process, once: a tracer provider whose spans go to ``processor``
    (tests: an in-memory exporter) or, without one, to the exporters ``OTEL_TRACES_EXPORTER``
    names (``otlp`` by default), and aiohttp sessions made from now on traced. Returns the
    provider, or ``None`` (logged) when the extra is missing or no exporter can be made."""
    global _provider, _tracer
    if _provider is not None:
        return _provider
    try:
        from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
        from opentelemetry.sdk.resources import (
            OTELResourceDetector,
            Resource,
            get_aggregated_resources,
        )
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError as err:
        log.warning(
            "tracing_unavailable",
            cause=f"the OpenTelemetry packages are not installed ({err.name}): install {EXTRA}",
        )
        return None
    processors = [processor] if processor is not None else _exporting_processors()
    if not processors:
        return None
    # Ours first, then what OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME say over it.
    ours = Resource.create({"service.name": SERVICE_NAME, "service.version": __version__})
    # No exit hook: :func:`flush` is the shutdown's, bounded; the SDK's would wait on the exporter.
    provider = TracerProvider(
        resource=get_aggregated_resources([OTELResourceDetector()], ours), shutdown_on_exit=False
    )
    for each in processors:
        provider.add_span_processor(each)
    AioHttpClientInstrumentor().instrument(tracer_provider=provider, url_filter=_without_query)
    _provider = provider
    _tracer = provider.get_tracer("context_assembly", __version__)
    log.info(
        "tracing_started",
        service_name=provider.resource.attributes.get("service.name"),
        processors=[type(each).__name__ for each in processors],
    )
    return provider


def _without_query(url: URL) -> str:
    """A contributor's URL as its span records it: no query (a registered URL may carry a token
    there; the instrumentation itself removes user and password)."""
    return str(url.with_query(None).with_fragment(None))


def _exporting_processors() -> list[SpanProcessor]:
    """One batch processor per exporter ``OTEL_TRACES_EXPORTER`` names (``otlp`` when unset);
    each one that cannot be made is logged and left out."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    names = _exporter_names(os.environ.get("OTEL_TRACES_EXPORTER", "") or "otlp")
    processors: list[SpanProcessor] = []
    for name in names:
        if name == "console":
            processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name != "otlp":
            log.warning("tracing_unavailable", cause=f"unknown OTEL_TRACES_EXPORTER {name!r}")
        elif (protocol := _otlp_protocol()) != "http/protobuf":
            log.warning(
                "tracing_unavailable",
                cause=f"OTLP protocol {protocol!r}: the service exports http/protobuf only",
            )
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            processors.append(BatchSpanProcessor(OTLPSpanExporter()))
    return processors


def _otlp_protocol() -> str:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return "http/protobuf"


async def flush(timeout_millis: int = FLUSH_MILLIS) -> bool:
    """Export the spans still waiting in a batch, waiting ``timeout_millis`` at most by the wall
    clock; at shutdown (the app's lifespan), since uvicorn ends the process by raising the signal
    it caught again, so no exit hook runs. Returns whether the export ended in time.

    The export runs in a daemon thread of its own, not the loop's executor, whose threads the
    loop's end and the interpreter's exit both wait for: an exporter still retrying after the
    bound holds neither.
    """
    provider = _provider
    if provider is None:
        return True
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not done.done():
            done.set_result(None)

    def export() -> None:
        try:
            provider.force_flush(timeout_millis)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle)

    threading.Thread(target=export, name="context-assembly-trace-flush", daemon=True).start()
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout_millis / 1000)
    except TimeoutError:
        log.warning("tracing_flush_incomplete", waited_ms=timeout_millis)
        return False
    return True


def stop() -> None:
    """Stop tracing in this process: flush and shut the provider down, trace no aiohttp session
    made from now on. Apps built while it ran keep their server spans, which go nowhere."""
    global _provider, _tracer
    if _provider is None:
        return
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

    AioHttpClientInstrumentor().uninstrument()
    provider, _provider, _tracer = _provider, None, None
    provider.shutdown()


# ---------------------------------------------------------------------- the operations' spans


def traced(
    operation: Operation,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Run the decorated lifecycle operation in a ``context_assembly.<operation>`` span (when
    tracing is on) holding what its answer says (:func:`prepare_attributes`,
    :func:`usage_attributes`); contributor calls made meanwhile are its children."""

    def decorate(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(method)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            tracer = _tracer
            if tracer is None:
                return await method(*args, **kwargs)
            return await _in_span(
                tracer, operation, method(*args, **kwargs), (*args, *kwargs.values())
            )

        return run

    return decorate


async def _in_span(
    tracer: Tracer, operation: Operation, call: Awaitable[R], arguments: Sequence[Any]
) -> R:
    from opentelemetry.trace import SpanKind, StatusCode

    with tracer.start_as_current_span(
        f"context_assembly.{operation}",
        kind=SpanKind.INTERNAL,
        record_exception=False,  # an exception's message may quote what it refused
        set_status_on_exception=False,
    ) as span:
        try:
            result = await call
        except Exception as err:
            span.set_attribute("error.type", _error_type(err))
            span.set_status(StatusCode.ERROR)
            raise
        if operation == "usage":
            body = next(each for each in arguments if isinstance(each, UsageRequest))
            span.set_attributes(usage_attributes(cast("RecordedUsage", result), body))
        else:
            span.set_attributes(prepare_attributes(cast("Prepared", result)))
        return result


def _error_type(err: Exception) -> str:
    return err.code if isinstance(err, ServiceError) else type(err).__qualname__


def _present(attributes: Mapping[str, AttributeValue | None]) -> Attributes:
    """``attributes`` without the ``None`` values (an attribute is absent, never null)."""
    return {name: value for name, value in attributes.items() if value is not None}


def prepare_attributes(prepared: Prepared) -> Attributes:
    """The span attributes of a prepare or refresh answer (never a text of it)."""
    response = prepared.response
    budget = response.budget
    selection = response.selection
    profile = ModelRegistry.load().lookup(response.model)
    statuses = dict.fromkeys(("selected", "projected", "omitted"), 0)
    for (status, _reason), count in prepared.decisions:
        statuses[status] = statuses.get(status, 0) + count
    cache = selection.cache
    attributes: dict[str, AttributeValue | None] = {
        "gen_ai.request.model": response.model,
        "gen_ai.provider.name": GEN_AI_PROVIDERS.get(profile.provider) if profile else None,
        "context_assembly.preparation_id": response.preparation_id,
        "context_assembly.attempt": response.attempt,
        "context_assembly.render": response.render,
        "context_assembly.layout": response.layout,
        "context_assembly.prefix_tokens": response.prefix_tokens,
        "context_assembly.budget.capacity": budget.capacity,
        "context_assembly.budget.capacity_source": budget.capacity_source,
        "context_assembly.budget.response_reserve": budget.response_reserve,
        "context_assembly.budget.data_limit_tokens": budget.data_limit_tokens,
        "context_assembly.budget.data_tokens": budget.data_tokens,
        "context_assembly.budget.remaining_tokens": budget.remaining_tokens,
        "context_assembly.budget.total_input_tokens": budget.total_input_tokens,
        "context_assembly.selection.tokenizer": selection.tokenizer,
        "context_assembly.selection.exact": selection.exact,
        "context_assembly.selection.selected_data_tokens": selection.selected_data_tokens,
        **{f"context_assembly.selection.blocks.{s}": n for s, n in statuses.items()},
        "context_assembly.selection.sources.failed": sum(
            source.status not in ("ok", "inline") for source in selection.sources
        ),
        "context_assembly.selection.warnings": tuple(w.code for w in selection.warnings) or None,
    }
    if cache is not None:
        attributes |= {
            "context_assembly.selection.cache.prefix_kept": cache.prefix_kept,
            "context_assembly.selection.cache.first_change": (
                cache.first_change.part if cache.first_change else None
            ),
            "context_assembly.selection.cache.cacheable_tokens": cache.cacheable_tokens,
            "context_assembly.selection.cache.breakpoints": len(cache.breakpoints),
        }
    return _present(attributes)


def usage_attributes(recorded: RecordedUsage, body: UsageRequest) -> Attributes:
    """The span attributes of a usage report: the GenAI conventions' ``gen_ai.usage.*`` (input
    tokens include the cached ones, as the conventions count them) and the comparison with the
    service's estimate."""
    accounting = recorded.response.accounting
    slot = accounting.auxiliary if body.call == "repair" else accounting.last
    seen = slot if slot is not None and slot.report_id == body.report_id else None
    attributes: dict[str, AttributeValue | None] = {
        "gen_ai.provider.name": GEN_AI_PROVIDERS.get(body.provider),
        "context_assembly.preparation_id": recorded.response.preparation_id,
        "context_assembly.usage.report_id": body.report_id,
        "context_assembly.usage.call": body.call,
        "context_assembly.usage.applied": recorded.applied,
    }
    if seen is not None:
        attributes |= {
            "gen_ai.usage.input_tokens": seen.provider_input_tokens,
            "gen_ai.usage.output_tokens": seen.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": seen.cached_input_tokens,
            "gen_ai.usage.cache_creation.input_tokens": seen.cache_creation_input_tokens,
            "context_assembly.usage.input_token_delta": seen.input_token_delta,
            "context_assembly.usage.expected_cached_tokens": seen.expected_cached_tokens,
        }
    return _present(attributes)
