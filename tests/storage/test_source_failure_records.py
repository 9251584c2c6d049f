"""A failed source's report in a stored record: written before the failure was reported (a
failed source with its status only), the record still reads and serves its view and its
breakdown page; written with it, the failure is kept through a read and a write and shown."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.preparations import Clock
from context_assembly.preparations.record import StoredPreparation
from context_assembly.storage import PreparationRecord

FIXTURES = Path(__file__).parent / "fixtures"
WRITTEN_AT = 1_796_212_800.0  # 2026-12-02T12:00:00Z, the clock every fixture was written at

# An omitted contributor's report as the versions before the failure was reported wrote it.
OLD_REPORT = {
    "source": "notes",
    "kind": "webhook",
    "status": "error",
    "duration_ms": 4.2,
    "block_count": 0,
}
FAILURE = {"cause": "http_status", "detail": "HTTP 503", "status": 503}


def _record(report: dict[str, Any]) -> dict[str, Any]:
    """The current fixture's record with ``report`` among its sources."""
    fixture = json.loads((FIXTURES / "record-v2.json").read_text(encoding="utf-8"))
    record: dict[str, Any] = copy.deepcopy(fixture["record"])
    record["data"]["response"]["selection"]["sources"].append(report)
    return record


@pytest.mark.parametrize(
    ("report", "shown"),
    [
        (OLD_REPORT, None),
        ({**OLD_REPORT, "failure": FAILURE}, "http_status 503: HTTP 503"),
    ],
)
def test_a_failed_source_report_reads_with_or_without_its_failure(
    tmp_path: Path, report: dict[str, Any], shown: str | None
) -> None:
    record = _record(report)
    stored = StoredPreparation.read(PreparationRecord(**record))
    assert StoredPreparation.model_validate(stored.dump()) == stored  # written back, the same
    assert stored.dump()["response"]["selection"]["sources"][-1] == report
    settings = load_settings(store={"path": str(tmp_path / "store.db")})
    clock = Clock(wall=lambda: WRITTEN_AT + 60, monotonic=Clock().monotonic)
    app = create_app(settings, clock=clock)
    base = f"/v1/preparations/{record['id']}"
    with TestClient(app) as client:
        assert client.portal is not None
        client.portal.call(app.state.preparations.store.put, PreparationRecord(**record))
        got = client.get(base)
        text = client.get(f"{base}/breakdown", headers={"accept": "text/plain"})
        html = client.get(f"{base}/breakdown", headers={"accept": "text/html"})
    assert got.status_code == text.status_code == html.status_code == 200, got.text
    assert got.json()["selection"]["sources"][-1] == report
    lines = text.text.splitlines()
    notes = next(i for i, line in enumerate(lines) if line.strip().startswith("notes "))
    if shown is None:
        assert "failed:" not in text.text
    else:
        assert lines[notes + 1] == f"    failed: {shown}"
        assert shown in html.text
