"""Metrics.observe_preparation: decisions by status and reason, contributor calls by source and
status (webhook sources only), counted exactly over several preparations."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from prometheus_client.parser import text_string_to_metric_families

from context_assembly.metrics import Metrics


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
    metrics.observe_preparation("prepare", 0.02, first)
    metrics.observe_preparation("prepare", 0.03, second)
    metrics.observe_preparation("refresh", 0.01, second)
    samples = _samples(metrics)
    decisions = "context_assembly_decisions_total"
    assert samples[(decisions, (("reason", "fits"), ("status", "selected")))] == 4
    assert samples[(decisions, (("reason", "budget"), ("status", "dropped")))] == 1
    assert samples[(decisions, (("reason", "expired"), ("status", "dropped")))] == 2
    calls = "context_assembly_contributor_seconds"
    docs_ok = (("source", "docs"), ("status", "ok"))
    assert samples[(calls + "_count", docs_ok)] == 3
    assert abs(samples[(calls + "_sum", docs_ok)] - 0.08) < 1e-9
    assert samples[(calls + "_count", (("source", "docs"), ("status", "error")))] == 2
    assert samples[(calls + "_count", (("source", "notes"), ("status", "timeout")))] == 1
    assert not any(name.startswith(calls) and ("source", "memory") in labels
                   for name, labels in samples)  # fmt: skip
    prepare = "context_assembly_prepare_seconds_count"
    assert samples[(prepare, (("operation", "prepare"),))] == 2
    assert samples[(prepare, (("operation", "refresh"),))] == 1


def test_a_given_tally_counts_as_the_responses_own() -> None:
    """``decisions`` (a memoised turn's tally) adds up exactly as counting the reports does."""
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
