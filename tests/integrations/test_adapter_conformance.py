"""The conformance kit: every recorded call shape through every adapter, against the real service.

Each fixture under ``fixtures/`` is one conversation as each runtime records it. For every
adapter and fixture, one agent call with the runtime's own test model must show: the model sees
the selected block; the runtime's messages all reach it, in order, as the runtime's own content
(only the service's system, developer and data messages are added); every tool call is still
followed by its results; and the usage report reaches the service under the preparation's id.
The failure paths (service down, slow, failing, a bad template) run through every adapter too.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from adapter_harness import HARNESSES, Event, Harness, Observation
from context_assembly_client import APIConnectionError, InvalidRequestError
from context_assembly_client.types import PrepareResponse
from integration_support import Service

pytestmark = pytest.mark.e2e

FIXTURES = sorted((Path(__file__).resolve().parent / "fixtures").glob("*.json"))
BLOCK_TEXT = "Receipt A42: paid 40 EUR on 2026-11-30."
TEMPLATE: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "assembly": {"layout": "stable-prefix"},
    "plugins": [{"name": "memory", "instructions": "Saved entries from earlier turns."}],
}


def contributions(state: Any) -> list[dict[str, Any]]:
    return [
        {
            "source": "memory",
            "revision": "7",
            "blocks": [{"id": "receipt", "text": BLOCK_TEXT, "protected": True}],
        }
    ]


@pytest.fixture(params=HARNESSES, ids=lambda h: h.name)
def harness(request: pytest.FixtureRequest) -> Harness:
    harness: Harness = request.param
    return harness


def texts(event: Event) -> str:
    return json.dumps(event[1:], default=repr)


def added_events(observation: Observation) -> list[Event]:
    """The events of ``seen`` that are not the runtime's, in order; fails when one is missing."""
    added: list[Event] = []
    original = iter(observation.original)
    expected = next(original, None)
    for event in observation.seen:
        if expected is not None and event == expected:
            expected = next(original, None)
        else:
            added.append(event)
    assert expected is None, f"the model never saw {expected!r}"
    return added


def assert_tool_pairs(events: list[Event]) -> None:
    """Every run of tool calls is followed at once by one result per call."""
    position = 0
    while position < len(events):
        if events[position][0] != "call":
            position += 1
            continue
        calls = []
        while position < len(events) and events[position][0] == "call":
            calls.append(events[position][1])
            position += 1
        results = []
        while position < len(events) and events[position][0] == "tool":
            results.append(events[position][1])
            position += 1
        assert sorted(results) == sorted(calls), f"calls {calls} answered by {results}"


@pytest.mark.parametrize("fixture_path", FIXTURES, ids=lambda p: p.stem)
async def test_recorded_calls_keep_history_pairs_and_report_usage(
    harness: Harness, fixture_path: Path, service: Service
) -> None:
    """The model sees the block and the whole recorded conversation in order, tool pairs intact,
    and the usage report reaches the preparation the call was made with."""
    fixture = json.loads(fixture_path.read_text())
    prepared: list[PrepareResponse] = []
    adapter = harness.make(
        service.url, template=TEMPLATE, contributions=contributions, on_prepared=prepared.append
    )
    try:
        observation = await harness.run(adapter, fixture)
    finally:
        await adapter.aclose()
    assert observation.answer == "Order A42 has shipped."
    assert len(prepared) == 1 and adapter.stats.prepared == 1
    (preparation,) = prepared
    assert [(b.id, b.status) for b in preparation.selection.blocks] == [("receipt", "selected")]

    added = added_events(observation)
    assert {event[0] for event in added} <= {"user", "developer", "system"}
    assert sum(BLOCK_TEXT in texts(event) for event in observation.seen) == 1
    assert sum(BLOCK_TEXT in texts(event) for event in added) == 1
    assert "Saved entries from earlier turns." in observation.instructions_seen
    if fixture["instructions"]:  # in the instructions, or still the runtime's system message
        instructions = fixture["instructions"]
        assert (
            instructions in observation.instructions_seen
            or ("system", instructions) in observation.seen
        )
    assert_tool_pairs(observation.seen)
    assert preparation.budget.history_dropped_messages == 0
    # An image reaches the service as an opaque part, which it counts with its constant and flags.
    assert preparation.selection.opaque_or_multimodal == (fixture["scenario"] == "image")

    last = service.preparation(preparation.preparation_id).accounting.last
    assert last is not None, "the usage report did not arrive"
    assert last.provider_input_tokens == observation.input_tokens
    if observation.report_id is not None:
        assert last.report_id == observation.report_id
    assert adapter.stats.usage_reports == 1 and adapter.stats.usage_report_failures == 0


def one_fixture(name: str = "parallel_tool_calls") -> dict[str, Any]:
    fixture: dict[str, Any] = json.loads((FIXTURES[0].parent / f"{name}.json").read_text())
    return fixture


async def test_an_unreachable_service_lets_the_original_call_through(
    harness: Harness, closed_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With nothing listening, the model gets exactly the runtime's own messages, one warning is
    logged and the failure is counted."""
    adapter = harness.make(closed_url, template=TEMPLATE, contributions=contributions)
    with caplog.at_level(logging.WARNING, logger="context_assembly_client.integrations"):
        observation = await harness.run(adapter, one_fixture())
    await adapter.aclose()
    assert added_events(observation) == []
    assert BLOCK_TEXT not in json.dumps(observation.seen, default=repr)
    assert adapter.stats.failed_open == 1 and adapter.stats.prepared == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "APIConnectionError" in warnings[0].getMessage()


async def test_fail_closed_raises_the_connection_error(harness: Harness, closed_url: str) -> None:
    """``fail_open=False`` turns the same failure into the client's error."""
    adapter = harness.make(
        closed_url, template=TEMPLATE, contributions=contributions, fail_open=False
    )
    with pytest.raises(APIConnectionError):
        await harness.run(adapter, one_fixture())
    await adapter.aclose()


async def test_a_bad_template_raises_even_when_failing_open(
    harness: Harness, service: Service
) -> None:
    """A 4xx answer is the application's bug: it raises whatever ``fail_open`` says."""
    template = {**TEMPLATE, "contributors": [{"source": "memory", "endpoint": "not-registered"}]}
    adapter = harness.make(service.url, template=template)
    with pytest.raises(InvalidRequestError):
        await harness.run(adapter, one_fixture())
    await adapter.aclose()
    assert adapter.stats.failed_open == 0


async def test_a_service_slower_than_the_deadline_is_left_behind(
    harness: Harness, silent_url: str
) -> None:
    """A service that never answers costs the call the deadline, then the call goes on unchanged."""
    adapter = harness.make(silent_url, template=TEMPLATE, contributions=contributions, timeout=0.3)
    observation = await harness.run(adapter, one_fixture())
    await adapter.aclose()
    assert added_events(observation) == []
    assert adapter.stats.failed_open == 1


async def test_a_5xx_answer_lets_the_original_call_through(
    harness: Harness, failing_url: str
) -> None:
    """A 5xx is the service's failure, not the application's: the call goes on unchanged."""
    adapter = harness.make(failing_url, template=TEMPLATE, contributions=contributions)
    observation = await harness.run(adapter, one_fixture())
    await adapter.aclose()
    assert added_events(observation) == []
    assert adapter.stats.failed_open == 1
