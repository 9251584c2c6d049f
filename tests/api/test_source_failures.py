"""A contributor left out under ``failure_policy = "omit"`` says why, end to end: the real app
calls real loopback servers (nothing listening, a server that never answers, a 503, an answer
that is not the protocol's shape, blocks that break the block rules) and the cause is in the
answer's source reports, in the stored view, on the breakdown page (HTML and text) and in the
``contributor_failed`` log line, which holds ids, causes, statuses and field paths only."""

from __future__ import annotations

import socket
from collections.abc import Iterator, MutableMapping
from typing import Any

import orjson
import pytest
import structlog
from api_support import AppFactory, basic_request
from context_assembly_client.testing import ScriptedContributor, Step
from page_support import Page

from context_assembly.preparations import targets

SECRET_TEXT = "ZZ-contributor-text-ZZ"

# source → (the manifest's status, its failure)
EXPECTED: dict[str, tuple[str, dict[str, Any]]] = {
    "refused": ("error", {"cause": "connect_refused", "detail": "connect refused"}),
    "hanging": (
        "timeout",
        {"cause": "timeout", "detail": "deadline reached while waiting for the response headers"},
    ),
    "unavailable": ("error", {"cause": "http_status", "detail": "HTTP 503", "status": 503}),
    "malformed": ("invalid", {"cause": "invalid_answer", "field": "blocks.0.id"}),
    "unruly": ("invalid", {"cause": "block_rules", "field": "blocks.1.priority"}),
}


@pytest.fixture
def hanging_port() -> Iterator[int]:
    """A loopback port that takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port bound but not listening: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def registrations(hanging_port: int, refused_port: int) -> Iterator[dict[str, Any]]:
    """Every contributor of ``EXPECTED``, registered with ``failure_policy = "omit"``."""
    with ScriptedContributor() as double:
        double.script("/unavailable", Step(status=503, body=orjson.dumps({"error": SECRET_TEXT})))
        double.script("/malformed", Step(revision=1, blocks=[{"id": 7, "text": SECRET_TEXT}]))
        double.script(
            "/unruly",
            Step(
                revision=1,
                blocks=[
                    {"id": "fine", "text": SECRET_TEXT},
                    {"id": "loud", "text": SECRET_TEXT, "priority": 5000},
                ],
            ),
        )
        urls = {
            "refused": f"http://127.0.0.1:{refused_port}/contribute",
            "hanging": f"http://127.0.0.1:{hanging_port}/contribute",
            **{name: double.url(f"/{name}") for name in ("unavailable", "malformed", "unruly")},
        }
        yield {name: {"url": url, "failure_policy": "omit"} for name, url in urls.items()}


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MutableMapping[str, Any]]]:
    """The log lines of the contributor calls, as structlog's event dicts."""
    with structlog.testing.capture_logs() as lines:
        # A fresh logger: one bound before (under a configuration that caches it) would not
        # write to the capture.
        monkeypatch.setattr(targets, "log", structlog.get_logger("context_assembly.contributors"))
        yield lines


def _request() -> dict[str, Any]:
    body = basic_request()
    body["plugins"] = [*body["plugins"], *({"name": name} for name in EXPECTED)]
    body["contributors"] = [{"source": name, "endpoint": name} for name in EXPECTED]
    body["assembly"] = {**body["assembly"], "timeout_ms": 500}
    return body


def test_an_omitted_contributor_reports_its_cause_everywhere(
    make_client: AppFactory, registrations: dict[str, Any], captured: list[MutableMapping[str, Any]]
) -> None:
    client = make_client(contributors=registrations)
    response = client.post("/v1/prepare", json=_request())
    assert response.status_code == 200, response.text
    answer = response.json()
    assert SECRET_TEXT not in response.text
    sources = {s["source"]: s for s in answer["selection"]["sources"]}
    assert "failure" not in sources["memory"]  # an inline source that did not fail: no member
    for name, (status, expected) in EXPECTED.items():
        report = sources[name]
        assert (report["kind"], report["status"], report["block_count"]) == ("webhook", status, 0)
        failure = report["failure"]
        assert {key: failure[key] for key in expected} == expected, failure
        assert set(failure) <= {"cause", "detail", "status", "field"}
        assert isinstance(failure["detail"], str) and failure["detail"]
    assert sources["malformed"]["failure"]["detail"].startswith("schema: blocks.0.id: ")
    assert sources["unruly"]["failure"]["detail"].startswith("block rules: ")

    # The stored view has what the answer had.
    prep_id = answer["preparation_id"]
    view = client.get(f"/v1/preparations/{prep_id}").json()
    assert view["selection"]["sources"] == answer["selection"]["sources"]

    # The breakdown page, HTML and text.
    html = client.get(f"/v1/preparations/{prep_id}/breakdown", headers={"accept": "text/html"})
    rows = Page(html.text).table("sources")
    assert rows[0][-1] == "cause"
    causes = {row[0]: row[-1] for row in rows[1:]}
    assert causes["memory"] == ""
    assert causes["refused"] == "connect_refused: connect refused"
    assert causes["unavailable"] == "http_status 503: HTTP 503"
    assert causes["malformed"].startswith("invalid_answer at blocks.0.id: schema: blocks.0.id:")
    assert causes["unruly"].startswith("block_rules at blocks.1.priority: block rules: ")
    assert causes["hanging"].startswith("timeout: deadline reached")
    text = client.get(f"/v1/preparations/{prep_id}/breakdown", headers={"accept": "text/plain"})
    assert "    failed: connect_refused: connect refused" in text.text.splitlines()
    assert "    failed: http_status 503: HTTP 503" in text.text.splitlines()
    assert "failed: invalid_answer at blocks.0.id" in text.text
    assert SECRET_TEXT not in html.text + text.text

    # One log line per omitted contributor: ids, cause, status and field, no words, no text.
    failed = [line for line in captured if line["event"] == "contributor_failed"]
    assert {line["source"] for line in failed} == set(EXPECTED)
    for line in failed:
        status, expected = EXPECTED[line["source"]]
        assert line["preparation_id"] == prep_id
        assert (line["status"], line["cause"]) == (status, expected["cause"])
        assert line.get("http_status") == expected.get("status")
        assert line.get("field") == expected.get("field")
        assert line["log_level"] == "warning"
        assert "detail" not in line
    assert SECRET_TEXT not in repr(captured)


def test_a_failure_policy_fail_still_answers_502_with_the_cause(
    make_client: AppFactory, registrations: dict[str, Any]
) -> None:
    """Under ``fail`` nothing changes: the prepare is a 502 naming the source and the cause."""
    client = make_client(
        contributors={"unavailable": {**registrations["unavailable"], "failure_policy": "fail"}}
    )
    body = basic_request()
    body["plugins"] = [*body["plugins"], {"name": "unavailable"}]
    body["contributors"] = [{"source": "unavailable", "endpoint": "unavailable"}]
    response = client.post("/v1/prepare", json=body)
    assert response.status_code == 502, response.text
    problem = response.json()
    assert (problem["code"], problem["source"], problem["cause"]) == (
        "CONTRIBUTOR_FAILED",
        "unavailable",
        "HTTP 503",
    )
