"""Metrics: decisions by status and reason, contributor calls by contributor (the registered
endpoint, or ``inline``) and status (webhook sources only), prepares by operation and status,
failed ones included, counted exactly; the token count cache and the garbage collector as the
process reports them; through the app, a label set that no request can grow; and each usage
report counted once by tenant (cost by bucket, input and cached tokens, the tokens a cache miss
billed again and their cost by cause), with at most ``MAX_TENANT_LABELS`` tenants labelled."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from api_support import KEYS, AppFactory, FakeWall, basic_request
from page_support import new_scope, next_history, tool, turn_body
from prometheus_client.parser import text_string_to_metric_families

from context_assembly.core.request import ContributorRef
from context_assembly.lifecycle_models import Observation
from context_assembly.metrics import MAX_TENANT_LABELS, OTHER_TENANTS, Metrics
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


def _usage_samples(client: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
        if sample.name.startswith(("context_assembly_usage_", "context_assembly_cache_"))
        and not sample.name.endswith("_created")
    }


def _post_usage(
    client: Any, key: str, prep_id: str, report_id: str, provider: str, usage: dict[str, Any]
) -> dict[str, Any]:
    payload = {"report_id": report_id, "provider": provider, "usage": usage}
    response = client.post(
        f"/v1/preparations/{prep_id}/usage", json=payload, headers={"X-API-Key": key}
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()["accounting"]["last"]
    return answer


def test_usage_reports_count_cost_tokens_and_misses_by_tenant_once_each(
    make_client: AppFactory,
) -> None:
    """A priced report adds its cost to each bucket of its tenant and its input and cached
    tokens to the hit ratio's counters; the same report_id again adds nothing; a report
    without a price counts as unpriced; a main call that missed the cache adds the tokens it
    billed again, and their cost, under its cause. Every series of a tenant starts at 0."""
    wall = FakeWall()
    client = make_client(auth=True, wall=wall)
    acme, globex = KEYS["acme"], KEYS["globex"]
    headers = {"X-API-Key": acme}
    body = turn_body(new_scope())
    ids = []
    for number in range(1, 3):
        if number == 2:
            body = {**body, "tools": [tool("search", 210), tool("fetch")]}
        wall.now += 60
        answer = client.post("/v1/prepare", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        ids.append(answer.json()["preparation_id"])
        body = next_history(body, number)
    usage = {
        "input_tokens": 1234,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 6500,
        "cache_creation": {"ephemeral_5m_input_tokens": 2500, "ephemeral_1h_input_tokens": 4000},
        "output_tokens": 789,
    }
    first = _post_usage(client, acme, ids[0], "a", "anthropic", usage)
    read = {**usage, "cache_read_input_tokens": 100}
    second = _post_usage(client, acme, ids[1], "b", "anthropic", read)
    again = _post_usage(client, acme, ids[1], "b", "anthropic", read)
    assert again == second and second["miss_cause"] == "tools" and second["rebilled_tokens"] > 0
    gemini = client.post(
        "/v1/prepare",
        json={"model": "gemini-2.5-pro", "input": [{"role": "user", "content": "hi"}]},
        headers={"X-API-Key": globex},
    ).json()["preparation_id"]
    unpriced = {"promptTokenCount": 10, "cachedContentTokenCount": 4, "candidatesTokenCount": 2}
    _post_usage(client, globex, gemini, "g", "google", unpriced)
    samples = _usage_samples(client)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    cost = "context_assembly_usage_cost_usd_total"
    for bucket in ("uncached_input", "cache_read", "cache_write_5m", "cache_write_1h", "output"):
        spent = first["cost"][bucket] + second["cost"][bucket]
        assert value(cost, tenant="acme", bucket=bucket) == pytest.approx(spent, abs=1e-12)
        assert value(cost, tenant="globex", bucket=bucket) == 0
    assert value(cost, tenant="acme", bucket="cache_write_1h") > 0
    reports = "context_assembly_usage_reports_total"
    assert value(reports, tenant="acme", priced="true") == 2
    assert value(reports, tenant="acme", priced="false") == 0
    assert value(reports, tenant="globex", priced="false") == 1
    inputs = "context_assembly_usage_input_tokens_total"
    cached = "context_assembly_usage_cached_input_tokens_total"
    assert value(inputs, tenant="acme") == 2 * (1234 + 6500) + 100
    assert value(cached, tenant="acme") == 100
    assert (value(inputs, tenant="globex"), value(cached, tenant="globex")) == (10, 4)
    rebilled = "context_assembly_cache_rebilled_tokens_total"
    miss_cost = "context_assembly_cache_miss_cost_usd_total"
    assert value(rebilled, tenant="acme", cause="tools") == second["rebilled_tokens"]
    assert value(miss_cost, tenant="acme", cause="tools") == pytest.approx(
        second["cost"]["miss"], abs=1e-12
    )
    causes = ("model", "layout", "tools", "instructions", "history", "expired", "provider")
    assert {labels for name, labels in samples if name == rebilled} == {
        (("cause", c), ("tenant", t)) for c in causes for t in ("acme", "globex")
    }
    assert (
        sum(v for (name, _), v in samples.items() if name == rebilled)
        == (second["rebilled_tokens"])
    )


def test_tenants_past_the_bound_share_one_label() -> None:
    """A process labels at most ``MAX_TENANT_LABELS`` tenants; the later ones are counted
    together under ``OTHER_TENANTS``, so that no number of tenants grows the series further."""
    metrics = Metrics()
    observed = Observation.model_validate(
        {"provider": "openai", "call": "main", "report_id": "r", "observed_at": "now",
         "provider_input_tokens": 10, "input_token_delta": 0, "cached_input_tokens": 4,
         "cache_creation_input_tokens": None, "output_tokens": 1}
    )  # fmt: skip
    for index in range(MAX_TENANT_LABELS + 5):
        metrics.observe_usage(f"tenant-{index}", observed)
    metrics.observe_usage("tenant-0", observed)
    samples = _samples(metrics)
    tenants = {
        dict(labels)["tenant"]
        for name, labels in samples
        if name == "context_assembly_usage_input_tokens_total"
    }
    assert len(tenants) == MAX_TENANT_LABELS + 1 and OTHER_TENANTS in tenants
    inputs = "context_assembly_usage_input_tokens_total"
    assert samples[(inputs, (("tenant", OTHER_TENANTS),))] == 5 * 10
    assert samples[(inputs, (("tenant", "tenant-0"),))] == 2 * 10
    assert (inputs, (("tenant", f"tenant-{MAX_TENANT_LABELS}"),)) not in samples
