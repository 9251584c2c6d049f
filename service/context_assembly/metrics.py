"""Prometheus metrics of one service process (each app gets its own registry).

Labels carry operations, statuses, reasons, contributor names and tenant names only: never ids,
text or tenants' data, and never a value a caller chooses freely. A contributor call is labelled
by the registered endpoint it went to (the operator's configuration bounds that set), or
``inline`` for an inline URL; a request's own source names would let one caller grow the series
without bound and would show every tenant's names on the unauthenticated ``/metrics``.

Two process-wide mechanisms show whether they pay: the token count cache
(``tokens/counter.py``: hits, misses, entries) and the garbage collector that ``server.tune_gc``
tunes (prometheus_client's ``python_gc_*`` families, and the objects ``gc.freeze`` set aside).
A third process-wide counter, ``context_assembly_internal_errors_total``, counts the service's own
exceptions that a contributor call settled as an ``error`` outcome instead of failing the request.

The usage reports are counted once each, when first recorded (a repeated ``report_id`` is not):
their cost by tenant and bucket, the input and cached input tokens the providers reported (the
cache hit ratio is the second over the first), and the input tokens main calls paid again after a
cache miss, with what that cost, by tenant and cause. Tenants are the configured API keys'
(``default`` without keys), so the operator's configuration bounds them; past
``MAX_TENANT_LABELS`` tenants in one process's life (a reload may bring new ones) the rest share
the label ``OTHER_TENANTS``. Every series of a tenant starts at 0 with its first report, so that
a rate sees its first increase.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.registry import Collector

from context_assembly.core.pricing import BUCKETS
from context_assembly.core.request import ContributorRef
from context_assembly.core.result import DecisionTally, PrepareResponse, decision_tally
from context_assembly.lifecycle_models import MissCause, Observation
from context_assembly.tokens.counter import CountCache, shared_count_cache

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_DELTA_BUCKETS = (-10_000, -1_000, -100, -10, -1, 0, 1, 10, 100, 1_000, 10_000)

MAX_TENANT_LABELS: Final = 100
"""The most tenants one process labels the usage series with; later ones share ``OTHER_TENANTS``."""
OTHER_TENANTS: Final = "_other"
_CAUSES: Final[tuple[MissCause, ...]] = get_args(MissCause)

InternalErrorSite = Literal["contribute", "revision"]
"""Where a broad ``except`` settles the service's own exception as a failed outcome:
``contribute`` (a contributor call of a prepare or refresh, webhook or MCP) and ``revision`` (a
contributor's revision query of validate)."""

INTERNAL_ERRORS = Counter(
    "context_assembly_internal_errors",
    "Exceptions of the service's own code caught and answered as a failed outcome, by where",
    ["where"],
    registry=None,
)
"""Process-wide, like the token count cache: the calls that catch such an exception run below
the app and hold no :class:`Metrics`; each app's registry shows this one counter. Any increase
is a bug to fix (the line ``internal_error`` in the log says its type and frames)."""
for _site in get_args(InternalErrorSite):  # every series from 0, so that an alert sees the first
    INTERNAL_ERRORS.labels(_site)


def count_internal_error(where: InternalErrorSite) -> None:
    """One exception of the service's own code caught at ``where`` (see ``INTERNAL_ERRORS``)."""
    INTERNAL_ERRORS.labels(where).inc()


def _child(cache: dict[tuple[str, str], Any], family: Any, key: tuple[str, str]) -> Any:
    """``family.labels(*key)``, looked up once per key."""
    child = cache.get(key)
    if child is None:
        child = cache[key] = family.labels(*key)
    return child


class CountCacheCollector(Collector):
    """The token count cache's counters, read at each scrape (``CountCache.info``)."""

    def __init__(self, cache: CountCache) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        info = self._cache.info()
        yield CounterMetricFamily(
            "context_assembly_token_count_cache_hits",
            "Token counts answered from the count cache",
            value=info.hits,
        )
        yield CounterMetricFamily(
            "context_assembly_token_count_cache_misses",
            "Token counts computed by the tokenizer (not in the count cache)",
            value=info.misses,
        )
        yield GaugeMetricFamily(
            "context_assembly_token_count_cache_entries",
            "Counts the count cache holds",
            value=info.size,
        )
        yield GaugeMetricFamily(
            "context_assembly_token_count_cache_max_entries",
            "The most counts the count cache holds",
            value=info.max_entries,
        )


class FrozenObjectsCollector(Collector):
    """How many objects ``gc.freeze`` set aside (``server.tune_gc``; 0 when it has not run)."""

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "context_assembly_gc_frozen_objects",
            "Objects moved out of the garbage collector's reach at startup (gc.freeze)",
            value=gc.get_freeze_count(),
        )


class Metrics:
    """The service's metric families. ``count_cache`` is the token count cache to show (by
    default the process-wide one)."""

    def __init__(self, count_cache: CountCache | None = None) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(
            CountCacheCollector(count_cache if count_cache is not None else shared_count_cache())
        )
        GCCollector(registry=self.registry)
        self.registry.register(FrozenObjectsCollector())
        self.registry.register(INTERNAL_ERRORS)
        self.requests = Counter(
            "context_assembly_requests_total",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.prepare_seconds = Histogram(
            "context_assembly_prepare_seconds",
            "Wall time of prepare and refresh calls by HTTP status (failed ones included)",
            ["operation", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.contributor_seconds = Histogram(
            "context_assembly_contributor_seconds",
            "Contributor call duration by contributor (registered endpoint, or inline) and status",
            ["source", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "context_assembly_decisions_total",
            "Block decisions by status and reason",
            ["status", "reason"],
            registry=self.registry,
        )
        self.usage_delta = Histogram(
            "context_assembly_usage_input_token_delta",
            "Provider input tokens minus the estimate",
            ["provider"],
            buckets=_DELTA_BUCKETS,
            registry=self.registry,
        )
        # Read at each scrape from the MCP endpoints the app holds (``watch_mcp_sessions``).
        self.mcp_sessions = Gauge(
            "context_assembly_mcp_sessions_open",
            "MCP sessions open on servers (initialised with an Mcp-Session-Id, not yet ended)",
            registry=self.registry,
        )
        # Usage reports, once each (``observe_usage``), by tenant.
        self.usage_cost = Counter(
            "context_assembly_usage_cost_usd",
            "USD the usage reports cost at the models' prices, by tenant and bucket",
            ["tenant", "bucket"],
            registry=self.registry,
        )
        self.usage_reports = Counter(
            "context_assembly_usage_reports",
            "Usage reports recorded, by tenant and whether they were priced",
            ["tenant", "priced"],
            registry=self.registry,
        )
        self.input_tokens = Counter(
            "context_assembly_usage_input_tokens",
            "Input tokens the providers reported, cached or not, by tenant",
            ["tenant"],
            registry=self.registry,
        )
        self.cached_tokens = Counter(
            "context_assembly_usage_cached_input_tokens",
            "Input tokens the providers reported read from their cache, by tenant",
            ["tenant"],
            registry=self.registry,
        )
        self.rebilled_tokens = Counter(
            "context_assembly_cache_rebilled_tokens",
            "Input tokens main calls paid again because of a cache miss, by tenant and cause",
            ["tenant", "cause"],
            registry=self.registry,
        )
        self.miss_cost = Counter(
            "context_assembly_cache_miss_cost_usd",
            "USD main calls paid over reading their rebilled tokens from the cache, by tenant "
            "and cause",
            ["tenant", "cause"],
            registry=self.registry,
        )
        self._tenants: set[str] = set()
        # Labelled children, looked up once (``labels()`` validates and locks on every call); as
        # many entries as the families' own label sets, which no code path removes.
        self._decision_children: dict[tuple[str, str], Any] = {}
        self._contributor_children: dict[tuple[str, str], Any] = {}
        self._request_children: dict[tuple[str, str], Any] = {}
        self._prepare_children: dict[tuple[str, str], Any] = {}

    def watch_mcp_sessions(self, count: Callable[[], int]) -> None:
        """Show ``count()`` (``McpEndpoints.open_sessions``) as the open MCP sessions."""
        self.mcp_sessions.set_function(count)

    def count_request(self, route: str, status: int) -> None:
        """One answered HTTP request (the access line's counter)."""
        _child(self._request_children, self.requests, (route, str(status))).inc()

    def observe_preparation(
        self,
        operation: str,
        seconds: float,
        response: PrepareResponse,
        decisions: DecisionTally | None = None,
        contributors: Sequence[ContributorRef] = (),
    ) -> None:
        """One answered prepare or refresh; ``decisions`` is ``decision_tally`` of its manifest
        when the caller has it (``Prepared.decisions``), else it is counted here.
        ``contributors`` are the request's, which say where each webhook source was called."""
        _child(self._prepare_children, self.prepare_seconds, (operation, "200")).observe(seconds)
        tally = decisions if decisions is not None else decision_tally(response.selection.blocks)
        for key, amount in tally:
            _child(self._decision_children, self.decisions, key).inc(amount)
        labels = contributor_labels(contributors)
        for source in response.selection.sources:
            if source.kind in ("webhook", "mcp"):
                self._observe_call(labels, source.source, source.status, source.duration_ms)

    def observe_failure(
        self,
        operation: str,
        seconds: float,
        status: int,
        calls: Sequence[tuple[str, str, float]] = (),
        contributors: Sequence[ContributorRef] = (),
    ) -> None:
        """One prepare or refresh answered with an error ``status``, and the contributor calls
        that had settled when it failed (``(source, status, duration_ms)``; a 502 or 504 carries
        them); the calls it abandoned have no outcome to count."""
        key = (operation, str(status))
        _child(self._prepare_children, self.prepare_seconds, key).observe(seconds)
        labels = contributor_labels(contributors)
        for source, call_status, duration_ms in calls:
            self._observe_call(labels, source, call_status, duration_ms)

    def _observe_call(
        self, labels: Mapping[str, str], source: str, status: str, duration_ms: float
    ) -> None:
        key = (labels.get(source, "inline"), status)
        child = _child(self._contributor_children, self.contributor_seconds, key)
        child.observe(duration_ms / 1000.0)

    def observe_usage(self, tenant: str, observed: Observation) -> None:
        """One usage report of ``tenant``, recorded for the first time (never a repeat)."""
        label = self._tenant_label(tenant)
        cost = observed.cost
        self.usage_reports.labels(label, "false" if cost is None else "true").inc()
        if cost is not None:
            for bucket in BUCKETS:
                self.usage_cost.labels(label, bucket).inc(getattr(cost, bucket))
        if observed.provider_input_tokens is not None:
            self.input_tokens.labels(label).inc(observed.provider_input_tokens)
            self.cached_tokens.labels(label).inc(observed.cached_input_tokens or 0)
        cause = observed.miss_cause
        if cause is not None:
            self.rebilled_tokens.labels(label, cause).inc(observed.rebilled_tokens or 0)
            if cost is not None and cost.miss is not None:
                self.miss_cost.labels(label, cause).inc(cost.miss)

    def _tenant_label(self, tenant: str) -> str:
        """``tenant`` as a label (``OTHER_TENANTS`` past ``MAX_TENANT_LABELS``); a new one gets
        every usage series at 0."""
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) >= MAX_TENANT_LABELS:
            tenant = OTHER_TENANTS
            if tenant in self._tenants:
                return tenant
        self._tenants.add(tenant)
        for bucket in BUCKETS:
            self.usage_cost.labels(tenant, bucket)
        for priced in ("true", "false"):
            self.usage_reports.labels(tenant, priced)
        self.input_tokens.labels(tenant)
        self.cached_tokens.labels(tenant)
        for cause in _CAUSES:
            self.rebilled_tokens.labels(tenant, cause)
            self.miss_cost.labels(tenant, cause)
        return tenant

    def render(self) -> bytes:
        return generate_latest(self.registry)


def contributor_labels(contributors: Sequence[ContributorRef]) -> dict[str, str]:
    """Each called source's metric label (webhook or MCP): the registered endpoint it names, or
    ``inline``."""
    return {c.source: c.endpoint if c.endpoint is not None else "inline" for c in contributors}
