"""Records of every shape a store may hold still serve every lifecycle call: a store keeps a record
for ``store.ttl_seconds`` and a rolling deploy reads records the previous version wrote.

Each ``fixtures/record-*.json`` is a record written by the service version named in its
``about`` (``preparations/record.py`` lists the shapes), with the request it was prepared for and
the answer. The record is put into a real store, a SQLite file and the Redis on 127.0.0.1:6379,
as that version left it, and read through the views, validate, usage, repair and refresh of this
one. ``fixtures/newer-record-v3.json`` stands for a record of a later version, which this one
refuses.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from storage_support import REDIS_URL

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.core.request import Scope
from context_assembly.core.result import (
    BudgetReport,
    FirstChange,
    PrepareResponse,
    SelectionReport,
)
from context_assembly.errors import RecordTooNewError
from context_assembly.preparations import Clock, turns
from context_assembly.preparations.record import (
    PACKED_ROWS,
    RECORD_VERSION,
    StoredPreparation,
    StoredResponse,
    TurnRecord,
)
from context_assembly.storage import PreparationRecord, Store

FIXTURES = Path(__file__).parent / "fixtures"
WRITTEN_AT = 1_796_212_800.0  # 2026-12-02T12:00:00Z, the clock every fixture was written at
SHAPES = sorted(path.name for path in FIXTURES.glob("record-*.json"))
NEWER = "newer-record-v3.json"


def _fixture(name: str) -> dict[str, Any]:
    fixture: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return fixture


@pytest.fixture(params=["sqlite", "redis"])
def store_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The ``[store]`` of the app under test: a SQLite file, or the real Redis (database 15, under
    a key prefix of the test's own, deleted afterwards)."""
    if request.param == "sqlite":
        yield {"path": str(tmp_path / "store.db")}
        return
    prefix = request.getfixturevalue("redis_prefix")
    yield {"backend": "redis", "redis_url": REDIS_URL, "key_prefix": prefix}


def _as_kept(record: dict[str, Any]) -> PreparationRecord:
    """The fixture's record as a store holds it. Redis drops a key at its record's expiry by its
    own clock, not the app's: the expiry is moved an hour past the real time, so the record lives
    while the app reads it at the fixture's clock (the record's data is as written)."""
    return PreparationRecord(
        **{**record, "expires_at": max(record["expires_at"], time.time() + 3600)}
    )


def _put(client: TestClient, store: Store, record: PreparationRecord, **latest: Any) -> None:
    assert client.portal is not None
    client.portal.call(functools.partial(store.put, record, **latest))


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
    assert _fixture(NEWER)["record"]["data"]["record_version"] > RECORD_VERSION


@pytest.mark.parametrize("name", SHAPES)
def test_a_record_reads_in_the_current_shape(name: str) -> None:
    """The reader gives every shape in the current version, with the answer's block reports and
    the model as its one requested model when the record predates routing."""
    fixture = _fixture(name)
    record = PreparationRecord(**fixture["record"])
    stored = StoredPreparation.read(record)
    assert stored.record_version == RECORD_VERSION
    blocks = [block.model_dump(mode="json") for block in stored.response.selection.blocks]
    assert blocks == fixture["answer"]["selection"]["blocks"]
    assert PACKED_ROWS not in stored.dump()["response"]["selection"]
    assert stored.requested_models == [fixture["request"]["model"]]
    assert stored.estimated_input_tokens == fixture["answer"]["budget"]["total_input_tokens"]
    # Its parts are the answer's own models, with the answer's values.
    answer = fixture["answer"]
    assert stored.response.budget == BudgetReport.model_validate(answer["budget"])
    assert stored.response.selection == SelectionReport.model_validate(answer["selection"])
    assert stored.scope == Scope.model_validate(fixture["request"].get("scope", {}))
    # Written back (a repair does), it is a current record that reads the same.
    assert (
        StoredPreparation.read(PreparationRecord(**{**fixture["record"], "data": stored.dump()}))
        == stored
    )


def test_the_record_keeps_every_field_of_the_answer_but_the_frame() -> None:
    """``StoredResponse`` names each field of the prepare answer except the frame, so a field
    the answer gains is typed in the record too."""
    assert set(StoredResponse.model_fields) == set(PrepareResponse.model_fields) - {"frame"}


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
def test_a_stored_record_serves_every_lifecycle_call(
    name: str, store_settings: dict[str, Any]
) -> None:
    """Put as a store held it, the record answers the stored view, the breakdown page, the
    timeline, validate of the answered frame, usage, repair and refresh (its shape hash, of
    either version, matches the same request), and is written back in the current version."""
    fixture = _fixture(name)
    record, answer, request = fixture["record"], fixture["answer"], fixture["request"]
    prep_id = record["id"]
    settings = load_settings(store=store_settings)
    clock = Clock(wall=lambda: WRITTEN_AT + 60, monotonic=Clock().monotonic)
    app = create_app(settings, clock=clock)
    base = f"/v1/preparations/{prep_id}"
    checked = {"model": request["model"], "scope": request["scope"], "frame": answer["frame"]}
    with TestClient(app) as client:
        store = app.state.preparations.store
        _put(client, store, _as_kept(record))
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
        assert client.portal is not None
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
    """A record keeps the fields it does not know, at any depth (its own parts and the answer's
    models inside them), so a repair here loses nothing of a record a newer replica wrote with
    the same version."""
    data = _fixture("record-v2.json")["record"]["data"]
    response, cache = data["response"], data["cache"]
    selection = response["selection"]
    newer = {
        **data,
        "future": {"kept": True},
        "scope": {**data["scope"], "future_scope": "s"},
        "contributors": [{"source": "crm", "endpoint": "crm", "future_ref": 1}],
        "cache": {
            **cache,
            "future_turn": 3,
            "options": {"ttl": "1h", "future_option": True},
            "named_change": {"part": "tools", "index": 0, "future_change": "c"},
            "report": {
                **cache["report"],
                "first_change": {"part": "tools", "index": 0, "future_first": 1},
                "breakpoints": [{"after": "tools", "tokens": 9, "ttl": "5m", "future_mark": 2}],
            },
        },
        "response": {
            **response,
            "future_report": [1],
            "budget": {**response["budget"], "future_budget": 4},
            "selection": {
                **selection,
                "future_selection": 5,
                "blocks": [{**block, "future_block": 6} for block in selection["blocks"]],
            },
        },
    }
    stored = StoredPreparation.read(
        PreparationRecord(id="prep_x", tenant="t", expires_at=0, data=newer)
    )
    assert stored.scope.model_dump() == Scope.model_validate(data["scope"]).model_dump()
    assert [(ref.source, ref.endpoint) for ref in stored.contributor_refs()] == [("crm", "crm")]
    assert stored.cache is not None
    options = stored.cache.options
    assert options is not None
    assert (options.ttl, options.model_fields_set) == ("1h", {"ttl", "future_option"})
    written = stored.model_copy(update={"repair_estimated_input_tokens": 5}).dump()
    assert written["repair_estimated_input_tokens"] == 5
    assert _holds(written, {**newer, "repair_estimated_input_tokens": 5})


def _holds(written: Any, read: Any) -> bool:
    """Whether ``written`` holds every member of ``read``, at any depth (it may add defaults)."""
    if isinstance(read, dict):
        return isinstance(written, dict) and all(
            key in written and _holds(written[key], value) for key, value in read.items()
        )
    if isinstance(read, list):
        return (
            isinstance(written, list)
            and len(written) == len(read)
            and all(_holds(w, r) for w, r in zip(written, read, strict=True))
        )
    return bool(written == read)


def test_a_stored_view_shows_what_this_version_knows(tmp_path: Path) -> None:
    """The stored view of a record with fields a newer replica added inside the answer's parts
    shows the answer as this version models it, without them."""
    fixture = _fixture("record-v2.json")
    record, answer = fixture["record"], fixture["answer"]
    response = record["data"]["response"]
    newer = {
        **response,
        "future_report": [1],
        "budget": {**response["budget"], "future_budget": 4},
        "selection": {**response["selection"], "future_selection": 5},
    }
    settings = load_settings(store={"path": str(tmp_path / "store.db")})
    app = create_app(
        settings, clock=Clock(wall=lambda: WRITTEN_AT + 60, monotonic=Clock().monotonic)
    )
    with TestClient(app) as client:
        kept = PreparationRecord(**{**record, "data": {**record["data"], "response": newer}})
        _put(client, app.state.preparations.store, kept)
        view = client.get(f"/v1/preparations/{record['id']}")
    assert view.status_code == 200, view.text
    assert view.json()["budget"] == BudgetReport.model_validate(answer["budget"]).model_dump()
    selection = SelectionReport.model_validate(answer["selection"])
    assert view.json()["selection"] == selection.model_dump(mode="json")
    assert "future_report" not in view.json()


def test_the_readers_refuse_a_record_of_a_newer_version() -> None:
    """A record whose ``record_version`` is above this version's is not read as if it were
    ours: the whole-record reader and the timeline's turn reader refuse it, naming both
    versions."""
    record = PreparationRecord(**_fixture(NEWER)["record"])
    for read in (StoredPreparation.read, TurnRecord.read):
        with pytest.raises(RecordTooNewError) as refused:
            read(record)
        assert refused.value.status == 503
        assert (
            f"record version 3; this version reads up to {RECORD_VERSION}" in refused.value.detail
        )
        assert refused.value.extensions["preparation_id"] == record.id


def test_every_call_on_a_record_of_a_newer_version_answers_503(
    store_settings: dict[str, Any],
) -> None:
    """The stored view, the breakdown page, the timeline, validate, usage, repair and refresh of
    a record a newer version wrote each answer ``503 RECORD_TOO_NEW`` (a replica of that
    version can answer; the clients retry a 503), and the record is left as it was."""
    fixture = _fixture(NEWER)
    record, answer, request = fixture["record"], fixture["answer"], fixture["request"]
    settings = load_settings(store=store_settings)
    app = create_app(
        settings, clock=Clock(wall=lambda: WRITTEN_AT + 60, monotonic=Clock().monotonic)
    )
    base = f"/v1/preparations/{record['id']}"
    checked = {"model": request["model"], "scope": request["scope"], "frame": answer["frame"]}
    usage = {"report_id": "r1", "provider": "openai", "usage": {"prompt_tokens": 400}}
    with TestClient(app) as client:
        store = app.state.preparations.store
        _put(client, store, _as_kept(record))
        answers = [
            client.get(base),
            client.get(f"{base}/breakdown", headers={"accept": "text/plain"}),
            client.get(f"{base}/timeline", headers={"accept": "application/json"}),
            client.post(f"{base}/validate", json=checked),
            client.post(f"{base}/usage", json=usage),
            client.post(f"{base}/repair", json={**checked, "answer": "{}"}),
            client.post(f"{base}/refresh", json=request),
        ]
        assert client.portal is not None
        after = client.portal.call(store.get, "default", record["id"], WRITTEN_AT + 60)
    for refused in answers:
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "RECORD_TOO_NEW"
        assert refused.json()["preparation_id"] == record["id"]
    assert after is not None
    assert (after.data, after.refresh_used, after.accounting.last) == (record["data"], False, None)


@pytest.mark.parametrize("named", [False, True], ids=["scope-latest", "named"])
def test_a_turn_after_one_of_a_newer_version_compares_with_nothing(
    store_settings: dict[str, Any], named: bool
) -> None:
    """A prepare whose previous turn a newer version wrote (the scope's latest, whose pointer
    carries the newer version, or named by ``cache.previous_preparation_id``) is answered,
    compared with nothing (``prefix_kept: null``) instead of misreading that turn."""
    fixture = _fixture(NEWER)
    record, request = fixture["record"], fixture["request"]
    data = record["data"]
    settings = load_settings(store=store_settings)
    now = max(WRITTEN_AT + 60, time.time())
    app = create_app(settings, clock=Clock(wall=lambda: now, monotonic=Clock().monotonic))
    # A ``cache`` object, so that the answer reports the comparison (``selection.cache``).
    request = {**request, "cache": {"previous_preparation_id": record["id"]} if named else {}}
    with TestClient(app) as client:
        store = app.state.preparations.store
        pointer = turns.scope_key("default", Scope.model_validate(request["scope"]))
        newer_turn = {**data["cache"], "record_version": data["record_version"]}
        _put(client, store, _as_kept(record), latest_of=pointer, latest_data=newer_turn)
        answer = client.post("/v1/prepare", json=request)
    assert answer.status_code == 200, answer.text
    report = answer.json()["selection"]["cache"]
    assert (report["previous_preparation_id"], report["prefix_kept"]) == (record["id"], None)


def test_a_pointer_written_without_the_turn_reads_it_from_the_record(
    store_settings: dict[str, Any],
) -> None:
    """The first cache turns wrote the scope's latest pointer without the turn (``{}``): the
    next prepare of the scope reads the turn from the record the pointer names and compares
    with it."""
    fixture = _fixture("record-v1-cache-turn.json")
    record, request = fixture["record"], fixture["request"]
    settings = load_settings(store=store_settings)
    # The real time: the new record must outlive the call in Redis, which expires it by its clock.
    now = max(WRITTEN_AT + 60, time.time())
    app = create_app(settings, clock=Clock(wall=lambda: now, monotonic=Clock().monotonic))
    with TestClient(app) as client:
        store = app.state.preparations.store
        pointer = turns.scope_key("default", Scope.model_validate(request["scope"]))
        _put(client, store, _as_kept(record), latest_of=pointer)
        answer = client.post("/v1/prepare", json=request)
        assert answer.status_code == 200, answer.text
        assert client.portal is not None
        made = client.portal.call(store.get, "default", answer.json()["preparation_id"], now)
    assert made is not None
    turn = StoredPreparation.read(made).cache
    assert turn is not None
    assert turn.previous_preparation_id == record["id"]
    # Compared (``None`` would be compared with nothing); that version's instructions differ.
    assert turn.report.prefix_kept is False
    assert turn.report.first_change == FirstChange(part="instructions", index=None)
