"""The lean request path (api/lean.py): same contract as FastAPI's path, without its machinery."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from api_support import KEYS, AppFactory, basic_request
from fastapi.routing import APIRoute

from context_assembly.api import lean
from context_assembly.api.lean import LeanRoute, lean_handler
from context_assembly.api.routes import v1


def test_every_v1_route_takes_the_lean_path() -> None:
    """No /v1 route silently falls back to FastAPI's dependency solving."""
    routes = [r for r in v1.routes if isinstance(r, APIRoute)]
    assert {r.name for r in routes} >= {"prepare", "budget", "refresh_preparation", "report_usage"}
    for route in routes:
        assert isinstance(route, LeanRoute), route.name
        assert lean_handler(route) is not None, route.name


def test_requests_reach_the_lean_body_reader(
    make_client: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app built by create_app serves /v1 bodies through the lean reader, not FastAPI's."""
    seen: list[str] = []
    original = lean.read_body

    async def spy(request: Any, model: Any) -> Any:
        seen.append(model.__name__)
        return await original(request, model)

    monkeypatch.setattr(lean, "read_body", spy)
    client = make_client()
    assert client.post("/v1/prepare", json=basic_request()).status_code == 200
    assert client.post("/v1/budget", json=basic_request()).status_code == 200
    assert seen == ["PrepareRequest", "PrepareRequest"]


def test_the_body_read_by_the_limit_is_not_streamed_again(
    make_client: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BodyLimit leaves the body it read in the scope and the lean reader parses it from there;
    without it (a request that did not pass the limit) the reader reads the stream as before."""
    from starlette.requests import Request

    from context_assembly.core.request import PrepareRequest

    async def no_stream(self: Any) -> bytes:
        raise AssertionError("the body was streamed again")

    streamed = Request.body
    monkeypatch.setattr(Request, "body", no_stream)
    client = make_client()
    assert client.post("/v1/prepare", json=basic_request()).status_code == 200
    monkeypatch.setattr(Request, "body", streamed)

    raw = orjson.dumps(basic_request())
    messages = [{"type": "http.request", "body": raw, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "headers": [(b"content-type", b"application/json")]}
    parsed = asyncio.run(lean.read_body(Request(scope, receive), PrepareRequest))
    assert parsed == PrepareRequest.model_validate_json(raw)


def test_unknown_parameter_kind_falls_back() -> None:
    """An endpoint with a parameter the lean path does not know is served by FastAPI."""

    async def endpoint(limit: int) -> dict[str, int]:
        return {"limit": limit}

    route = LeanRoute("/v1/other", endpoint, methods=["GET"])
    assert lean_handler(route) is None


@pytest.mark.parametrize(
    ("headers", "content", "needle"),
    [
        ({"content-type": "text/plain"}, b"{}", "must be JSON"),
        ({}, b"{}", "must be JSON"),
        ({"content-type": "application/json"}, b"", "Field required"),
        ({"content-type": "application/json"}, b"[1, 2]", "(body)"),
        ({"content-type": "application/json; charset=utf-8"}, b'{"model": 5}', "model"),
    ],
)
def test_bad_bodies_are_named_problems(
    make_client: AppFactory, headers: dict[str, str], content: bytes, needle: str
) -> None:
    client = make_client()
    response = client.post("/v1/prepare", content=content, headers=headers)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == "CONTEXT_ASSEMBLY_INVALID"
    assert needle in body["detail"]


def test_vendor_json_media_type_is_accepted(make_client: AppFactory) -> None:
    """``application/*+json`` is JSON, as FastAPI accepted it."""
    client = make_client()
    response = client.post(
        "/v1/prepare",
        content=orjson.dumps(basic_request()),
        headers={"content-type": "application/vnd.example+json"},
    )
    assert response.status_code == 200, response.text


def test_missing_key_is_401_before_a_bad_body(make_client: AppFactory) -> None:
    """The tenant is resolved first: without a key the answer is 401 even for a broken body."""
    client = make_client(auth=True)
    response = client.post(
        "/v1/prepare", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 401, response.text
    key = next(iter(KEYS.values()))
    ok = client.post("/v1/prepare", json=basic_request(), headers={"x-api-key": key})
    assert ok.status_code == 200, ok.text


def test_returned_models_are_serialised_by_alias(make_client: AppFactory) -> None:
    """A route returning a model answers the same JSON FastAPI's path answered (by alias)."""
    client = make_client()
    prep = client.post("/v1/prepare", json=basic_request()).json()
    answer = client.post(
        f"/v1/preparations/{prep['preparation_id']}/validate",
        json={"model": prep["model"], "frame": prep["frame"]},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["valid"] is True


class _CountingRouter:
    """Wraps the app's router (the innermost ASGI app) and counts the HTTP requests it serves."""

    def __init__(self, router: Any) -> None:
        self.router = router
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        await self.router(scope, receive, send)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.router, name)


def _exchanges(client: Any) -> list[tuple[int, str, Any]]:
    """Status, content type and body of prepare/budget calls that succeed and that fail."""
    calls = [
        ("/v1/prepare", {"json": basic_request()}),
        ("/v1/budget", {"json": basic_request()}),
        ("/v1/prepare", {"content": b"{", "headers": {"content-type": "application/json"}}),
        ("/v1/prepare", {"content": b"{}", "headers": {"content-type": "text/plain"}}),
        ("/v1/prepare", {"json": {**basic_request(), "model": 5}}),
        ("/v1/prepare", {"json": {**basic_request(), "timezone": "Mars/Base"}}),
        ("/v1/budget", {"json": {**basic_request(), "assembly": {"max_blocks": -1}}}),
        ("/v1/prepare", {"json": basic_request(), "headers": {"authorization": "Bearer wrong"}}),
    ]
    out = []
    for path, kwargs in calls:
        response = client.post(path, **kwargs)
        body = response.json()
        for volatile in ("preparation_id", "expires_at", "instance"):
            body.pop(volatile, None)
        out.append((response.status_code, response.headers["content-type"], body))
    return out


def test_dispatched_routes_answer_as_through_the_router(make_client: AppFactory) -> None:
    """prepare and budget skip the router, and answer exactly as the router path does."""
    fast = make_client(auth=True)
    counting = _CountingRouter(fast.app.router)  # type: ignore[attr-defined]
    fast.app.router = counting  # type: ignore[attr-defined]
    fast.app.middleware_stack = None  # type: ignore[attr-defined]  # rebuilt on the next call
    routed = make_client(auth=True)
    middleware = routed.app.user_middleware  # type: ignore[attr-defined]
    kept = [m for m in middleware if m.cls is not lean.LeanDispatch]
    assert len(kept) == len(middleware) - 1
    routed.app.user_middleware = kept  # type: ignore[attr-defined]
    routed_router = _CountingRouter(routed.app.router)  # type: ignore[attr-defined]
    routed.app.router = routed_router  # type: ignore[attr-defined]
    routed.app.middleware_stack = None  # type: ignore[attr-defined]
    headers = {"authorization": f"Bearer {KEYS['acme']}"}
    fast.headers.update(headers)
    routed.headers.update(headers)
    got = _exchanges(fast)
    assert got == _exchanges(routed)
    assert len(routed_router.paths) == len(got), "the comparison went through the router"
    assert [status for status, _, _ in got] == [200, 200, 422, 422, 422, 422, 422, 401]
    assert counting.paths == [], "the dispatched calls never reached the router"
    assert fast.get("/v1/models").status_code == 200
    slash = fast.post("/v1/prepare/", json=basic_request(), follow_redirects=False)
    assert slash.status_code == 404  # the router's answer to an unknown path (no redirect)
    assert counting.paths == ["/v1/models", "/v1/prepare/"], "everything else still does"


def test_fastapi_telemetry_is_off(make_client: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No request asks OpenTelemetry for a provider (FastAPI's native telemetry is disabled)."""
    from opentelemetry import metrics, trace

    asked: list[str] = []
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: asked.append("tracer"))
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: asked.append("meter"))
    client = make_client()
    assert client.post("/v1/prepare", json=basic_request()).status_code == 200
    assert client.get("/v1/models").status_code == 200
    assert asked == []
