"""The lean request path (api/lean.py): same contract as FastAPI's path, without its machinery."""

from __future__ import annotations

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
