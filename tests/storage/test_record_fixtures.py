"""Records of every shape a store may hold still serve every lifecycle call: a store keeps a record
for ``store.ttl_seconds`` and a rolling deploy reads records the previous version wrote.

Each file of ``fixtures/`` is a record written by the service version named in its ``about``
(``preparations/record.py`` lists the shapes), with the request it was prepared for and the
answer. The record is put into a real SQLite store as that version left it, and read through
the views, validate, usage, repair and refresh of this one.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.core.request import Scope
from context_assembly.preparations import Clock, turns
from context_assembly.preparations.record import (
    PACKED_ROWS,
    RECORD_VERSION,
    StoredPreparation,
    TurnRecord,
)
from context_assembly.storage import PreparationRecord

FIXTURES = Path(__file__).parent / "fixtures"
WRITTEN_AT = 1_796_212_800.0  # 2026-12-02T12:00:00Z, the clock every fixture was written at
SHAPES = sorted(path.name for path in FIXTURES.glob("record-*.json"))


def _fixture(name: str) -> dict[str, Any]:
    fixture: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return fixture


def test_the_fixtures_cover_each_shape() -> None:
    """One fixture per shape the module doc lists: with and without the routing fields, packed
    block reports, a cache turn with and without names, and the current version."""
    records = {name: _fixture(name)["record"]["data"] for name in SHAPES}
    assert {"record_version" in data for data in records.values()} == {True, False}
    assert any("requested_models" not in data for data in records.values())
    assert any(PACKED_ROWS in data["response"]["selection"] for data in records.values())
    turns = [data["cache"] for data in records.values() if data.get("cache")]
    assert {"names" in turn for turn in turns} == {True, False}
    assert any("cache" not in data for data in records.values())
    current = [data for data in records.values() if "record_version" in data]
    assert [data["record_version"] for data in current] == [RECORD_VERSION]


@pytest.mark.parametrize("name", SHAPES)
def test_a_record_reads_in_the_current_shape(name: str) -> None:
    """The reader gives every shape in the current version, with the answer's block reports and
    the model as its one requested model when the record predates routing."""
    fixture = _fixture(name)
    record = PreparationRecord(**fixture["record"])
    stored = StoredPreparation.read(record)
    assert stored.record_version == RECORD_VERSION
    assert stored.response.selection["blocks"] == fixture["answer"]["selection"]["blocks"]
    assert PACKED_ROWS not in stored.response.selection
    assert stored.requested_models == [fixture["request"]["model"]]
    assert stored.estimated_input_tokens == fixture["answer"]["budget"]["total_input_tokens"]
    # Written back (a repair does), it is a current record that reads the same.
    assert StoredPreparation.model_validate(stored.dump()) == stored


@pytest.mark.parametrize("name", SHAPES)
def test_the_turn_part_reads_as_the_whole_record_does(name: str) -> None:
    """What the timeline reads of a record of each shape (``TurnRecord``: the turn and the
    fields a turn shows) is what the whole record says."""
    record = PreparationRecord(**_fixture(name)["record"])
    part, whole = TurnRecord.read(record), StoredPreparation.read(record)
    assert part.cache == whole.cache
    assert part.response.layout == whole.response.layout
    shown = ("model", "render", "scope_hash", "estimated_input_tokens")
    assert [getattr(part, f) for f in shown] == [getattr(whole, f) for f in shown]


@pytest.mark.parametrize("name", SHAPES)
def test_a_stored_record_serves_every_lifecycle_call(name: str, tmp_path: Path) -> None:
    """Put as a store held it, the record answers the stored view, the breakdown page, the
    timeline, validate of the answered frame, usage, repair and refresh (its shape hash, of
    either version, matches the same request), and is written back in the current version."""
    fixture = _fixture(name)
    record, answer, request = fixture["record"], fixture["answer"], fixture["request"]
    prep_id = record["id"]
    settings = load_settings(store={"path": str(tmp_path / "store.db")})
    clock = Clock(wall=lambda: WRITTEN_AT + 60, monotonic=Clock().monotonic)
    app = create_app(settings, clock=clock)
    base = f"/v1/preparations/{prep_id}"
    checked = {"model": request["model"], "scope": request["scope"], "frame": answer["frame"]}
    with TestClient(app) as client:
        store = app.state.preparations.store
        client.portal.call(store.put, PreparationRecord(**record))
        view = client.get(base)
        page = client.get(f"{base}/breakdown", headers={"accept": "text/plain"})
        timeline = client.get(f"{base}/timeline", headers={"accept": "application/json"})
        validated = client.post(f"{base}/validate", json=checked)
        usage = client.post(
            f"{base}/usage",
            json={
                "report_id": "r1",
                "provider": "openai",
                "usage": {"prompt_tokens": 400, "completion_tokens": 20},
            },
        )
        repaired = client.post(
            f"{base}/repair",
            json={**checked, "instructions": request["instructions"], "answer": "A42: 3 items"},
        )
        refreshed = client.post(f"{base}/refresh", json=request)
        after = client.portal.call(store.get, "default", prep_id, WRITTEN_AT + 60)
    assert view.status_code == 200, view.text
    assert view.json()["selection"]["blocks"] == answer["selection"]["blocks"]
    assert view.json()["budget"] == answer["budget"]
    assert page.status_code == 200, page.text
    for block in answer["selection"]["blocks"]:
        assert f"{block['source']}/{block['id']}" in page.text
    assert timeline.status_code == 200, timeline.text
    assert [turn["preparation_id"] for turn in timeline.json()["turns"]] == [prep_id]
    assert validated.status_code == 200, validated.text
    assert usage.status_code == 200, usage.text
    accounting = usage.json()["accounting"]
    assert accounting["estimated_input_tokens"] == answer["budget"]["total_input_tokens"]
    assert accounting["last"]["provider_input_tokens"] == 400
    turn = record["data"].get("cache")
    expected = None if turn is None else turn["expected_cached_tokens"]
    assert accounting["last"]["expected_cached_tokens"] == expected
    assert repaired.status_code == 200, repaired.text
    assert refreshed.status_code == 200, refreshed.text
    assert refreshed.json()["attempt"] == 2
    assert refreshed.json()["selection"]["blocks"] == answer["selection"]["blocks"]
    assert after is not None
    written = StoredPreparation.read(after)
    assert after.data["record_version"] == RECORD_VERSION
    # The repair's estimate survives the refresh written after it.
    assert written.repair_estimated_input_tokens == repaired.json()["estimated_input_tokens"]


def test_fields_a_newer_version_wrote_survive_a_write_back() -> None:
    """A record part keeps fields it does not know, so a repair here loses nothing of a record a
    newer replica wrote."""
    data = _fixture("record-v2.json")["record"]["data"]
    newer = {
        **data,
        "future": {"kept": True},
        "cache": {**data["cache"], "future_turn": 3},
        "response": {**data["response"], "future_report": [1]},
    }
    stored = StoredPreparation.model_validate(newer)
    written = stored.model_copy(update={"repair_estimated_input_tokens": 5}).dump()
    assert written["future"] == {"kept": True}
    assert written["cache"]["future_turn"] == 3
    assert written["response"]["future_report"] == [1]
    assert written["repair_estimated_input_tokens"] == 5


def test_a_pointer_written_without_the_turn_reads_it_from_the_record(tmp_path: Path) -> None:
    """The first cache turns wrote the scope's latest pointer without the turn (``{}``): the
    next prepare of the scope reads the turn from the record the pointer names and compares
    with it."""
    fixture = _fixture("record-v1-cache-turn.json")
    record, request = fixture["record"], fixture["request"]
    settings = load_settings(store={"path": str(tmp_path / "store.db")})
    clock = Clock(wall=lambda: WRITTEN_AT + 60, monotonic=Clock().monotonic)
    app = create_app(settings, clock=clock)
    with TestClient(app) as client:
        store = app.state.preparations.store
        pointer = turns.scope_key("default", Scope.model_validate(request["scope"]))
        client.portal.call(
            functools.partial(store.put, PreparationRecord(**record), latest_of=pointer)
        )
        answer = client.post("/v1/prepare", json=request)
        assert answer.status_code == 200, answer.text
        made = client.portal.call(
            store.get, "default", answer.json()["preparation_id"], WRITTEN_AT + 60
        )
    assert made is not None
    turn = StoredPreparation.read(made).cache
    assert turn is not None
    assert turn.previous_preparation_id == record["id"]
    # Compared (``None`` would be compared with nothing); that version's instructions differ.
    assert turn.report.prefix_kept is False
    assert turn.report.first_change == {"part": "instructions", "index": None}
