"""Metrics: decisions by status and reason, contributor calls by contributor (the registered
endpoint, or ``inline``) and status (webhook sources only), prepares by operation and status,
failed ones included, counted exactly; the token count cache and the garbage collector as the
process reports them; and, through the app, a label set that no request can grow."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any, cast

import httpx
from api_support import AppFactory, basic_request
from prometheus_client.parser import text_string_to_metric_families

from context_assembly.core.request import ContributorRef
from context_assembly.metrics import Metrics
from context_assembly.server import tune_gc
from context_assembly.tokens.counter import CachedCounter, CountCache
from context_assembly.tokens.estimate import EstimateCounter


def _response(blocks: list[tuple[str, str]], sources: list[tuple[str, str, str, float]]) -> Any:
    return cast(
        Any,
        SimpleNamespace(
            selection=SimpleNamespace(
                blocks=[SimpleNamespace(status=s, reason=r) for s, r in blocks],
                sources=[
                    SimpleNamespace(kind=k, source=n, status=st, duration_ms=ms)
                    for k, n, st, ms in sources
                ],
            )
        ),
    )


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_decisions_and_contributor_calls_are_counted_by_their_labels() -> None:
    metrics = Metrics()
    first = _response(
        [("selected", "fits"), ("selected", "fits"), ("dropped", "budget")],
        [("webhook", "docs", "ok", 20.0), ("webhook", "notes", "timeout", 100.0),
         ("inline", "memory", "ok", 0.0)],
    )  # fmt: skip
    second = _response(
        [("selected", "fits"), ("dropped", "expired")],
        [("webhook", "docs", "ok", 30.0), ("webhook", "docs", "error", 5.0)],
    )
    refs = [
        ContributorRef(source="docs", endpoint="docs-hook"),
        ContributorRef(source="notes", url="http://notes.example/hook"),
    ]
    metrics.observe_preparation("prepare", 0.02, first, contributors=refs)
    metrics.observe_preparation("prepare", 0.03, second, contributors=refs)
    metrics.observe_preparation("refresh", 0.01, second, contributors=refs)
    samples = _samples(metrics)
    decisions = "context_assembly_decisions_total"
    assert samples[(decisions, (("reason", "fits"), ("status", "selected")))] == 4
    assert samples[(decisions, (("reason", "budget"), ("status", "dropped")))] == 1
    assert samples[(decisions, (("reason", "expired"), ("status", "dropped")))] == 2
    calls = "context_assembly_contributor_seconds"
    docs_ok = (("source", "docs-hook"), ("status", "ok"))
    assert samples[(calls + "_count", docs_ok)] == 3
    assert abs(samples[(calls + "_sum", docs_ok)] - 0.08) < 1e-9
    assert samples[(calls + "_count", (("source", "docs-hook"), ("status", "error")))] == 2
    assert samples[(calls + "_count", (("source", "inline"), ("status", "timeout")))] == 1
    assert {labels for name, labels in samples if name == calls + "_count"} == {
        docs_ok,
        (("source", "docs-hook"), ("status", "error")),
        (("source", "inline"), ("status", "timeout")),
    }  # no request's source name, and no inline source ("memory")
    prepare = "context_assembly_prepare_seconds_count"
    assert samples[(prepare, (("operation", "prepare"), ("status", "200")))] == 2
    assert samples[(prepare, (("operation", "refresh"), ("status", "200")))] == 1


def test_a_failed_prepare_counts_its_status_and_its_settled_calls() -> None:
    metrics = Metrics()
    refs = [ContributorRef(source="slow", endpoint="slow-hook"),
            ContributorRef(source="docs", endpoint="docs-hook")]  # fmt: skip
    metrics.observe_failure("prepare", 2.0, 504, [("slow", "timeout", 2000.0)], refs)
    metrics.observe_failure(
        "prepare", 0.1, 502, [("docs", "error", 5.0), ("slow", "ok", 20.0)], refs
    )
    metrics.observe_failure("refresh", 0.001, 409)
    samples = _samples(metrics)
    prepare = "context_assembly_prepare_seconds_count"
    assert samples[(prepare, (("operation", "prepare"), ("status", "504")))] == 1
    assert samples[(prepare, (("operation", "prepare"), ("status", "502")))] == 1
    assert samples[(prepare, (("operation", "refresh"), ("status", "409")))] == 1
    calls = "context_assembly_contributor_seconds"
    assert samples[(calls + "_count", (("source", "slow-hook"), ("status", "timeout")))] == 1
    assert samples[(calls + "_sum", (("source", "slow-hook"), ("status", "timeout")))] == 2.0
    assert samples[(calls + "_count", (("source", "docs-hook"), ("status", "error")))] == 1
    assert samples[(calls + "_count", (("source", "slow-hook"), ("status", "ok")))] == 1


def test_a_given_tally_counts_as_the_responses_own() -> None:
    """``decisions`` (an answer's tally) adds up exactly as counting the reports does."""
    from context_assembly.core.result import decision_tally

    blocks = [("selected", "fits"), ("dropped", "budget"), ("selected", "fits")]
    response = _response(blocks, [])
    counted, given = Metrics(), Metrics()
    counted.observe_preparation("prepare", 0.01, response)
    given.observe_preparation("prepare", 0.01, response, decision_tally(response.selection.blocks))

    def counts(metrics: Metrics) -> dict[Any, float]:
        return {k: v for k, v in _samples(metrics).items() if not k[0].endswith("_created")}

    assert counts(counted) == counts(given)
    assert decision_tally(response.selection.blocks) == (
        (("selected", "fits"), 2),
        (("dropped", "budget"), 1),
    )


def test_the_count_cache_shows_its_hits_misses_and_entries() -> None:
    """Each scrape reads the count cache: two texts counted (misses), one of them again (a hit),
    two entries held, and its bound."""
    cache = CountCache(max_entries=8)
    counter = CachedCounter(EstimateCounter(), cache)
    metrics = Metrics(count_cache=cache)
    assert _samples(metrics)[("context_assembly_token_count_cache_misses_total", ())] == 0
    for text in ("alpha", "alpha", "beta"):
        counter.count(text)
    samples = _samples(metrics)
    assert samples[("context_assembly_token_count_cache_hits_total", ())] == 1
    assert samples[("context_assembly_token_count_cache_misses_total", ())] == 2
    assert samples[("context_assembly_token_count_cache_entries", ())] == 2
    assert samples[("context_assembly_token_count_cache_max_entries", ())] == 8


def test_the_garbage_collector_is_in_the_metrics() -> None:
    """Collections by generation (a full one counts under generation 2), and the objects that
    ``tune_gc`` sets aside, as the process reports them."""
    metrics = Metrics()
    full = ("python_gc_collections_total", (("generation", "2"),))
    frozen = ("context_assembly_gc_frozen_objects", ())
    before = _samples(metrics)
    gc.collect()
    assert _samples(metrics)[full] >= before[full] + 1
    assert before[frozen] == gc.get_freeze_count() == 0, "nothing frozen in the test process"
    thresholds = gc.get_threshold()
    try:
        tune_gc()
        assert _samples(metrics)[frozen] > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert _samples(metrics)[frozen] == 0


def _series(client: Any, family: str) -> set[tuple[tuple[str, str], ...]]:
    text = client.get("/metrics").text
    return {
        tuple(sorted(sample.labels.items()))
        for fam in text_string_to_metric_families(text)
        for sample in fam.samples
        if sample.name == family + "_count"
    }


def test_no_request_grows_the_contributor_series(make_client: AppFactory) -> None:
    """Sources are the caller's names: 300 of them, new in every request, called through one
    registered endpoint or refused as inline URLs, make two series, not hundreds."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"revision": "r1", "blocks": []})

    client = make_client(
        contributor_transport=httpx.MockTransport(handler),
        contributors={"hook": {"url": "http://contributor.test/hook"}},
    )
    for turn in range(3):
        names = [f"caller-name-{turn}-{i}" for i in range(100)]
        body = basic_request(
            contributors=[
                {"source": n, "endpoint": "hook"} if i % 2 else
                {"source": n, "url": "http://203.0.113.9/x", "failure_policy": "omit"}
                for i, n in enumerate(names)
            ]
        )  # fmt: skip
        body["plugins"] = [*body["plugins"], *({"name": n} for n in names)]
        response = client.post("/v1/prepare", json=body)
        assert response.status_code == 200, response.text
    assert _series(client, "context_assembly_contributor_seconds") == {
        (("source", "hook"), ("status", "ok")),
        (("source", "inline"), ("status", "rejected")),
    }
    assert "caller-name" not in client.get("/metrics").text


def test_failed_prepares_are_in_the_metrics(make_client: AppFactory) -> None:
    """A 502 from a failing contributor counts under its status, with the failed call."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={})

    client = make_client(
        contributor_transport=httpx.MockTransport(handler),
        contributors={"hook": {"url": "http://contributor.test/hook"}},
    )
    body = basic_request(contributors=[{"source": "docs", "endpoint": "hook"}])
    body["plugins"] = [*body["plugins"], {"name": "docs"}]
    assert client.post("/v1/prepare", json=body).status_code == 502
    assert (("operation", "prepare"), ("status", "502")) in _series(
        client, "context_assembly_prepare_seconds"
    )
    assert _series(client, "context_assembly_contributor_seconds") == {
        (("source", "hook"), ("status", "error")),
    }
