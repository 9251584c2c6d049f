"""Inline contributor URLs in a prepare: their DNS is part of each call (docs/contract.md, "Inline URLs").

The lookups run concurrently with each other and with the registered calls, inside the one
deadline; a URL refused or not resolved, or a lookup past the deadline, follows the source's
failure policy like any other contributor failure (``omit``: ``rejected`` / ``timeout`` in the
manifest and the other sources still enter).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import orjson
import pytest
from api_support import AppFactory, FakeWall, basic_request
from fastapi.testclient import TestClient

PUBLIC = "93.184.216.34"
HOSTS = ("nowhere.test", "good.test", "hang.test", "a.test", "b.test")


class SlowResolver:
    """Names answer ``PUBLIC`` after ``delays[name]`` seconds; ``None`` never answers; a name
    not in ``delays`` does not resolve."""

    def __init__(self, delays: dict[str, float | None]) -> None:
        self.delays = delays
        self.cancelled: list[str] = []  # the lookups abandoned before they answered

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        if host not in self.delays:
            raise OSError("no such host")
        delay = self.delays[host]
        try:
            await asyncio.sleep(3600 if delay is None else delay)
        except asyncio.CancelledError:
            self.cancelled.append(host)
            raise
        return [PUBLIC]


class FakeMonotonic:
    """The service's monotonic clock: the real one plus ``offset``, which a test moves on."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


class GatheringResolver:
    """Each name in ``together`` answers ``PUBLIC`` only once every one of them is being looked
    up and the registered contributor has been called: lookups that ran one after the other,
    or before the registered call, would wait until the deadline. The lookups take ``delay``
    seconds on the service's clocks: the first to go on moves the wall and monotonic clocks on
    by as much, before any lookup answers."""

    def __init__(
        self, together: set[str], wall: FakeWall, monotonic: FakeMonotonic, delay: float = 0.3
    ) -> None:
        self.together = together
        self.wall = wall
        self.monotonic = monotonic
        self.delay = delay
        self.started: set[str] = set()
        self.moved = False

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.started.add(host)
        # Bounded polling (the packets arrive on another thread): the deadline ends the wait.
        while not (self.started >= self.together and any(p["source"] == "reg" for p in PACKETS)):
            await asyncio.sleep(0.005)
        if not self.moved:
            self.moved = True
            self.wall.now += self.delay
            self.monotonic.offset += self.delay
        return [PUBLIC]


PACKETS: list[dict[str, Any]] = []


def answer(request: httpx.Request) -> httpx.Response:
    PACKETS.append(orjson.loads(request.content))
    source = PACKETS[-1]["source"]
    return httpx.Response(
        200, json={"revision": "r1", "blocks": [{"id": f"{source}-a", "text": f"{source} fact"}]}
    )


@pytest.fixture
def serve(make_client: AppFactory) -> Callable[..., TestClient]:
    def make(
        resolver: Any, wall: FakeWall | None = None, monotonic: FakeMonotonic | None = None
    ) -> TestClient:
        PACKETS.clear()
        return make_client(
            contributor_transport=httpx.MockTransport(answer),
            resolver=resolver,
            wall=wall,
            monotonic=monotonic,
            contributors={"hook": {"url": "http://contributor.test/hook"}},
            inline_urls={"allow": [f"http://{host}/" for host in HOSTS]},
        )

    return make


def body(inline: dict[str, str], policy: str = "omit", timeout_ms: int = 1000) -> dict[str, Any]:
    request = basic_request(
        contributors=[
            {"source": "reg", "endpoint": "hook", "failure_policy": policy},
            *(
                {"source": source, "url": f"http://{host}/c", "failure_policy": policy}
                for source, host in inline.items()
            ),
        ]
    )
    request["plugins"] = [
        *request["plugins"],
        *({"name": s} for s in ["reg", *inline]),
    ]
    request["assembly"] = {**request["assembly"], "timeout_ms": timeout_ms}
    return request


def statuses(response: httpx.Response) -> dict[str, str]:
    return {
        s["source"]: s["status"]
        for s in response.json()["selection"]["sources"]
        if s["source"] != "memory"
    }


def test_an_unresolved_inline_url_under_omit_is_rejected_and_the_rest_enters(serve: Any) -> None:
    client = serve(SlowResolver({"good.test": 0}))
    response = client.post("/v1/prepare", json=body({"bad": "nowhere.test", "good": "good.test"}))
    assert response.status_code == 200, response.text
    assert statuses(response) == {"reg": "ok", "bad": "rejected", "good": "ok"}
    selected = {
        b["id"] for b in response.json()["selection"]["blocks"] if b["status"] == "selected"
    }
    assert {"reg-a", "good-a"} <= selected


def test_a_lookup_past_the_deadline_under_omit_is_a_timeout(serve: Any) -> None:
    """The hung lookup is abandoned at the deadline (cancelled, not awaited), and the prepare
    answers with the other sources."""
    resolver = SlowResolver({"hang.test": None})
    client = serve(resolver)
    response = client.post("/v1/prepare", json=body({"slow": "hang.test"}, timeout_ms=300))
    assert response.status_code == 200, response.text
    assert statuses(response) == {"reg": "ok", "slow": "timeout"}
    assert resolver.cancelled == ["hang.test"]


def test_under_fail_an_unresolved_url_is_refused_and_a_hung_lookup_times_out(
    serve: Any,
) -> None:
    """Under ``fail`` a name that does not resolve is a 422 naming the refusal, and a lookup
    still running at the deadline is cancelled and answered 504 naming its source."""
    resolver = SlowResolver({"hang.test": None})
    client = serve(resolver)
    refused = client.post("/v1/prepare", json=body({"bad": "nowhere.test"}, policy="fail"))
    assert refused.status_code == 422
    assert refused.json()["code"] == "CONTRIBUTOR_URL_REJECTED"
    late = client.post("/v1/prepare", json=body({"slow": "hang.test"}, "fail", timeout_ms=300))
    assert late.status_code == 504 and late.json()["code"] == "CONTEXT_ASSEMBLY_TIMEOUT"
    assert late.json()["sources"] == ["slow"]
    assert resolver.cancelled == ["hang.test"]


def test_lookups_run_concurrently_and_the_packet_deadline_is_the_real_one(serve: Any) -> None:
    """Both lookups and the registered call are under way together (else a lookup would wait
    until the deadline and the source would time out), every packet carries the deadline the
    prepare started with (the lookups move the wall clock on: taken after them it would be
    later), and a source's duration includes its lookup (the lookups move the service's
    monotonic clock on by 300 ms before either answers: timed from its answer, a source would
    not see them)."""
    wall, monotonic = FakeWall(), FakeMonotonic()
    started = wall.now
    resolver = GatheringResolver({"a.test", "b.test"}, wall, monotonic)
    client = serve(resolver, wall, monotonic)
    response = client.post("/v1/prepare", json=body({"a": "a.test", "b": "b.test"}))
    assert response.status_code == 200, response.text
    assert statuses(response) == {"reg": "ok", "a": "ok", "b": "ok"}
    assert wall.now > started
    durations = {s["source"]: s["duration_ms"] for s in response.json()["selection"]["sources"]}
    assert durations["a"] >= 300 and durations["b"] >= 300, "the lookup is part of the call"
    deadlines = {p["source"]: p["deadline_unix_ms"] for p in PACKETS}
    assert deadlines == dict.fromkeys(["reg", "a", "b"], int((started + 1.0) * 1000))


class RecordingResolver:
    """Names in ``answers`` resolve to their addresses; every lookup is recorded."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append(host)
        if host not in self.answers:
            raise OSError("no such host")
        return self.answers[host]


@pytest.mark.parametrize("location", ["http://10.0.0.1/steal", "http://internal.test/steal"])
@pytest.mark.parametrize("policy", ["fail", "omit"])
def test_a_redirect_to_a_private_address_is_never_followed(
    make_client: AppFactory, location: str, policy: str
) -> None:
    """The SSRF vector "a redirect to a private address": the one request goes to the checked
    public address; the redirect's target is never looked up or connected to (seen at the
    resolver and transport seams). As docs/contract.md, "Webhook protocol", says, a redirect is a contributor failure: under
    ``fail`` a 502 naming the source and the redirect, under ``omit`` ``error`` in the manifest."""
    sent: list[httpx.Request] = []

    def redirect(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(302, headers={"location": location})

    resolver = RecordingResolver({"redir.test": [PUBLIC], "internal.test": ["10.0.0.1"]})
    client = make_client(
        contributor_transport=httpx.MockTransport(redirect),
        resolver=resolver,
        inline_urls={"allow": ["http://redir.test/"]},
    )
    request = basic_request(
        contributors=[{"source": "web", "url": "http://redir.test/c", "failure_policy": policy}]
    )
    request["plugins"] = [*request["plugins"], {"name": "web"}]
    response = client.post("/v1/prepare", json=request)
    assert resolver.asked == ["redir.test"]
    assert [r.url.host for r in sent] == ["redir.test"] and len(sent) == 1
    if policy == "fail":
        assert response.status_code == 502, response.text
        problem = response.json()
        assert (problem["code"], problem["source"]) == ("CONTRIBUTOR_FAILED", "web")
        assert problem["contributor_status"] == "error" and "redirect" in problem["cause"]
        assert "10.0.0.1" not in response.text
    else:
        assert response.status_code == 200, response.text
        sources = {s["source"]: s["status"] for s in response.json()["selection"]["sources"]}
        assert sources["web"] == "error"
