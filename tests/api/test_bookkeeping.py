"""The access line and the metric observations of a request are written once, when its answer
is complete: by the time the app has sent the last part of the body and returned, not later."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from api_support import basic_request
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from context_assembly.api import middleware
from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.metrics import Metrics


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` with ``labels`` (any other labels)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def _access_lines(captured: structlog.testing.CapturingLogger) -> list[dict[str, Any]]:
    return [call.kwargs for call in captured.calls if call.args == ("request",)]


def test_bookkeeping_is_written_once_by_the_time_the_answer_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    captured = structlog.testing.CapturingLogger()
    monkeypatch.setattr(middleware, "log", captured)
    app = create_app(load_settings(store={"path": str(tmp_path / "db.db")}))
    metrics: Metrics = app.state.metrics
    seen: list[tuple[str, int, float, float]] = []

    def look(when: str) -> None:
        seen.append(
            (
                when,
                len(_access_lines(captured)),
                _sample(metrics, "context_assembly_prepare_seconds_count", operation="prepare"),
                _sample(metrics, "context_assembly_requests_total", route="/v1/prepare"),
            )
        )

    async def watched(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)
        if scope["type"] == "http":
            look("returned")  # on the app's own loop, before anything else runs there

    with TestClient(watched) as client:
        answers = [
            client.post("/v1/prepare", json=basic_request(), headers={"X-Request-Id": "rid-7"})
            for _ in range(2)
        ]
        assert [answer.status_code for answer in answers] == [200, 200]
        assert client.post("/v1/prepare", content=b"{").status_code == 422
    assert seen == [
        ("returned", 1, 1.0, 1.0),
        ("returned", 2, 2.0, 2.0),
        ("returned", 3, 2.0, 3.0),  # a refused body is a request, not a preparation
    ]
    lines = _access_lines(captured)
    assert [line["status"] for line in lines] == [200, 200, 422]
    first = lines[0]
    assert first["request_id"] == "rid-7" and first["route"] == "/v1/prepare"
    assert first["preparation_id"] == answers[0].json()["preparation_id"]
    assert first["bytes_in"] > 0 and first["bytes_out"] == len(answers[0].content)
    assert first["duration_ms"] > 0
    assert set(first) == {
        "request_id",
        "method",
        "route",
        "status",
        "duration_ms",
        "bytes_in",
        "bytes_out",
        "preparation_id",
    }


def test_a_scrape_counts_every_request_answered_before_it(tmp_path: Path) -> None:
    app = create_app(load_settings(store={"path": str(tmp_path / "db.db")}))
    with TestClient(app) as client:
        for _ in range(3):
            assert client.post("/v1/prepare", json=basic_request()).status_code == 200
        text = client.get("/metrics").text
    counts = {
        sample.labels.get("operation"): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "context_assembly_prepare_seconds_count"
    }
    assert counts == {"prepare": 3.0}


async def test_a_client_gone_before_its_body_is_whole_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body cut off by a disconnect (a client that went away, or the server's body time limit)
    runs no route: no unhandled error, no 500 in the metrics; the access line says 499."""
    captured = structlog.testing.CapturingLogger()
    monkeypatch.setattr(middleware, "log", captured)
    app = create_app(load_settings(store={"path": str(tmp_path / "db.db")}))
    metrics: Metrics = app.state.metrics
    incoming: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"model": "gpt-4o-', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/prepare",
        "raw_path": b"/v1/prepare",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8080),
    }
    await app(scope, receive, send)
    assert sent == []
    assert not [call for call in captured.calls if call.args == ("unhandled_error",)]
    assert [line["status"] for line in _access_lines(captured)] == [499]
    assert _sample(metrics, "context_assembly_requests_total", status="500") == 0
    assert _sample(metrics, "context_assembly_requests_total", status="499") == 1
