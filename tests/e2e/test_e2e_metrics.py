"""The process-wide mechanisms of a real ``context-assembly serve`` process, seen in its /metrics:
the token count cache answers a repeated turn's blocks, and the serving process froze its
startup heap out of the garbage collector's reach."""

from __future__ import annotations

import httpx
import pytest
from e2e_support import ServiceFactory
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

CONFIG = '[store]\nbackend = "sqlite"\npath = "{db}"\n'
BLOCKS = 12


def _samples(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{base}/metrics", timeout=5).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_count_cache_and_the_frozen_heap_show_in_metrics(
    service_factory: ServiceFactory,
) -> None:
    """The same turn sent twice: the second finds each of its blocks' counts in the cache
    (hits grow by at least the number of blocks); the serving process has frozen objects and
    counts its collections by generation."""
    service = service_factory(CONFIG)
    body = {
        "model": "gpt-4o-mini",
        "plugins": [{"name": "notes"}],
        "contributions": [
            {
                "source": "notes",
                "revision": 1,
                "blocks": [
                    {"id": f"n{i}", "text": f"Note {i}: the export ran."} for i in range(BLOCKS)
                ],
            }
        ],
        "input": [{"role": "user", "content": "What ran?"}],
    }
    hits = ("context_assembly_token_count_cache_hits_total", ())
    assert httpx.post(f"{service.base}/v1/prepare", json=body, timeout=10).status_code == 200
    first = _samples(service.base)
    assert first[("context_assembly_token_count_cache_misses_total", ())] >= BLOCKS
    assert first[("context_assembly_token_count_cache_entries", ())] >= BLOCKS
    assert httpx.post(f"{service.base}/v1/prepare", json=body, timeout=10).status_code == 200
    second = _samples(service.base)
    assert second[hits] >= first[hits] + BLOCKS
    assert second[("context_assembly_gc_frozen_objects", ())] > 0
    for generation in "012":
        assert ("python_gc_collections_total", (("generation", generation),)) in second
