"""Records of an earlier shape still read: a store keeps a record for ``ttl_seconds`` and a rolling
deploy reads records the previous version wrote.

``fixtures/record-packed-rows.json`` is a record as the stores held it when its block reports were
kept packed (``selection.block_rows_z``), with the block reports its prepare answered. It is put
into a real SQLite store and read through the service's views.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.preparations import Clock
from context_assembly.preparations.record import PACKED_ROWS, stored_response
from context_assembly.storage import PreparationRecord

FIXTURES = Path(__file__).parent / "fixtures"
WRITTEN_AT = 1_796_212_800.0  # 2026-12-02T12:00:00Z, when the fixture's record was written


def _fixture(name: str) -> dict[str, Any]:
    fixture: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return fixture


def test_packed_block_rows_read_as_the_answered_reports() -> None:
    """The record reader turns the packed rows back into the report objects the answer had."""
    fixture = _fixture("record-packed-rows.json")
    stored = fixture["record"]["data"]["response"]
    assert PACKED_ROWS in stored["selection"], "the fixture holds the packed shape"
    read = stored_response(stored)
    assert read["selection"]["blocks"] == fixture["answer_blocks"]
    assert PACKED_ROWS not in read["selection"]
    rest = {k: v for k, v in stored["selection"].items() if k != PACKED_ROWS}
    assert {k: v for k, v in read["selection"].items() if k != "blocks"} == rest


def test_a_stored_record_with_packed_rows_is_served_by_the_views(tmp_path: Path) -> None:
    """Put as a store held it, the record answers the stored view and the breakdown page with
    the reports of its answer: every status and reason the fixture holds."""
    fixture = _fixture("record-packed-rows.json")
    record = fixture["record"]
    statuses = {(b["status"], b["reason"]) for b in fixture["answer_blocks"]}
    assert {"selected", "projected", "omitted"} == {status for status, _ in statuses}
    settings = load_settings(store={"path": str(tmp_path / "store.db")})
    clock = Clock(wall=lambda: WRITTEN_AT, monotonic=Clock().monotonic)
    app = create_app(settings, clock=clock)
    with TestClient(app) as client:
        store = app.state.preparations.store
        client.portal.call(store.put, PreparationRecord(**record))
        view = client.get(f"/v1/preparations/{record['id']}")
        page = client.get(
            f"/v1/preparations/{record['id']}/breakdown", headers={"accept": "text/plain"}
        )
    assert view.status_code == 200, view.text
    assert view.json()["selection"]["blocks"] == fixture["answer_blocks"]
    assert view.json()["budget"] == record["data"]["response"]["budget"]
    assert page.status_code == 200, page.text
    for block in fixture["answer_blocks"]:
        assert f"{block['source']}/{block['id']}" in page.text
