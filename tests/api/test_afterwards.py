"""Bookkeeping after the answer (``afterwards.py``): deferred, in order, never lost.

The metric observations and the access line of a request run a moment after its answer; these
tests hold that they are pending when the answer is out, that ``/metrics`` and shutdown run them
first, that one failure does not stop the rest, and that the access line keeps its request id.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
import structlog.testing
from api_support import AppFactory, basic_request
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from context_assembly import afterwards
from context_assembly.afterwards import Afterwards
from context_assembly.api import middleware
from context_assembly.api.app import create_app
from context_assembly.config import load_settings

MARK: contextvars.ContextVar[str] = contextvars.ContextVar("MARK", default="unset")


def test_deferred_calls_run_later_on_the_loop_in_order() -> None:
    ran: list[tuple[str, str]] = []

    async def main() -> list[tuple[str, str]]:
        later = Afterwards(delay=0.01)
        MARK.set("request")
        later.defer(lambda name: ran.append((name, MARK.get())), "first")
        later.defer(lambda name: ran.append((name, MARK.get())), "second")
        assert ran == [] and len(later) == 2  # nothing on the way out of the request
        await asyncio.sleep(0.05)
        return ran

    # Run in order, and in an empty context: nothing of the deferring request leaks in.
    assert asyncio.run(main()) == [("first", "unset"), ("second", "unset")]


def test_run_pending_runs_everything_now_and_cancels_the_timer() -> None:
    ran: list[int] = []

    async def main() -> None:
        later = Afterwards(delay=0.01)
        for i in range(3):
            later.defer(ran.append, i)
        later.run_pending()
        assert ran == [0, 1, 2] and len(later) == 0
        await asyncio.sleep(0.05)  # the timer was cancelled: nothing runs twice

    asyncio.run(main())
    assert ran == [0, 1, 2]


def test_run_pending_from_a_request_runs_outside_its_context() -> None:
    seen: list[str] = []
    later = Afterwards(delay=60.0)

    async def main() -> None:
        later.defer(lambda: seen.append(MARK.get()))
        MARK.set("the /metrics request")  # what a scrape that runs the queue has bound
        later.run_pending()

    asyncio.run(main())
    assert seen == ["unset"]


def test_a_timer_left_on_a_closed_loop_does_not_hold_back_the_next_loop() -> None:
    ran: list[str] = []
    later = Afterwards(delay=0.01)

    async def defer(name: str) -> None:
        later.defer(ran.append, name)

    asyncio.run(defer("first"))  # the loop closes before its timer fires
    assert ran == []

    async def second() -> None:
        later.defer(ran.append, "second")
        await asyncio.sleep(0.05)

    asyncio.run(second())
    assert ran == ["first", "second"]


def test_without_a_running_loop_a_call_runs_at_once() -> None:
    ran: list[str] = []
    Afterwards().defer(ran.append, "now")
    assert ran == ["now"]


def test_a_failing_call_is_logged_and_the_rest_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    captured = structlog.testing.CapturingLogger()
    monkeypatch.setattr(afterwards, "log", captured)
    ran: list[str] = []

    def boom() -> None:
        raise RuntimeError("no")

    async def main() -> None:
        later = Afterwards()
        later.defer(boom)
        later.defer(ran.append, "after")
        later.run_pending()

    asyncio.run(main())
    assert ran == ["after"]
    assert [(c.method_name, c.args) for c in captured.calls] == [
        ("exception", ("bookkeeping_failed",))
    ]
    assert captured.calls[0].kwargs["call"].endswith("boom")


def _prepare_count(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "context_assembly_prepare_seconds_count":
                return sample.value
    return 0.0


def _with_a_contributor(make_client: AppFactory) -> tuple[TestClient, dict[str, Any]]:
    """A client whose prepare calls one registered contributor (it waits on another service)."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"revision": "r1", "blocks": [{"id": "x", "text": "hi"}]})

    client = make_client(
        contributor_transport=httpx.MockTransport(handler),
        contributors={"hook": {"url": "http://contributor.test/hook"}},
    )
    body = basic_request(contributors=[{"source": "docs", "endpoint": "hook"}])
    body["plugins"] = [*body["plugins"], {"name": "docs"}]
    return client, body


def test_a_prepare_that_waited_leaves_its_bookkeeping_to_the_timer_and_metrics_show_it(
    make_client: AppFactory,
) -> None:
    client, body = _with_a_contributor(make_client)
    metrics = client.app.state.metrics  # type: ignore[attr-defined]
    metrics.later = Afterwards(delay=60.0)  # long enough to look before it runs
    assert client.post("/v1/prepare", json=body).status_code == 200
    # The observation and the access line (with its request counter) are still pending ...
    assert len(metrics.later) == 2
    # ... and a scrape runs them first: the prepare it reports was answered before it.
    assert _prepare_count(client.get("/metrics").text) == 1.0


def _watching(app: Any, later: Afterwards, seen: list[int]) -> Any:
    """``app`` with the pending bookkeeping counted as the answer's last body part goes out and
    again as the app returns (on the app's own loop, before anything else runs there)."""

    async def watched(scope: Any, receive: Any, send: Any) -> None:
        async def watch(message: Any) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                seen.append(len(later))
            await send(message)

        await app(scope, receive, watch)
        if scope["type"] == "http":
            seen.append(len(later))

    return watched


def test_a_prepare_that_waited_on_nothing_leaves_its_bookkeeping_to_the_timer_too(
    tmp_path: Path,
) -> None:
    """Not on the way out: the observation is pending as the body goes out and the access line
    is added after it; both run at the timer, with everything deferred meanwhile."""
    app = create_app(load_settings(store={"path": str(tmp_path / "db.db")}))
    metrics = app.state.metrics
    metrics.later = Afterwards(delay=1.0)  # two prepares take a few milliseconds
    seen: list[int] = []
    with TestClient(_watching(app, metrics.later, seen)) as client:
        assert client.post("/v1/prepare", json=basic_request()).status_code == 200
        assert client.post("/v1/prepare", json=basic_request()).status_code == 200
        assert seen == [1, 2, 3, 4]  # the second request's joined the first's: one batch
        assert len(metrics.later) == 4  # the timer has not come yet
        deadline = time.monotonic() + 10
        while len(metrics.later) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(metrics.later) == 0
    assert _prepare_count(metrics.render().decode()) == 2.0


def test_one_timer_runs_a_batch_once() -> None:
    """Work deferred while a timer is set joins it; no second timer runs it again."""
    ran: list[int] = []

    async def main() -> None:
        later = Afterwards(delay=0.05)
        later.defer(ran.append, 1)
        first = later._handle
        later.defer(ran.append, 2)
        assert later._handle is first and ran == []  # joined the timer already set
        await asyncio.sleep(0.2)
        assert ran == [1, 2]
        later.defer(ran.append, 3)  # a new batch, a new timer
        assert later._handle is not None and later._handle is not first
        await asyncio.sleep(0.2)

    asyncio.run(main())
    assert ran == [1, 2, 3]


def test_the_access_line_keeps_its_request_id(
    make_client: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    captured = structlog.testing.CapturingLogger()
    monkeypatch.setattr(middleware, "log", captured)
    client = make_client()
    metrics = client.app.state.metrics  # type: ignore[attr-defined]
    response = client.get("/healthz", headers={"X-Request-Id": "rid-42"})
    assert response.headers["x-request-id"] == "rid-42"
    metrics.later.run_pending()
    access = [c.kwargs for c in captured.calls if c.args == ("request",)]
    assert access[-1]["request_id"] == "rid-42"
    assert access[-1]["route"] == "/healthz" and access[-1]["status"] == 200
