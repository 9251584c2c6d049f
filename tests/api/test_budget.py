"""POST /v1/budget: the budget of the same request with nothing called, refused as prepare would
refuse it before calling anyone."""

from __future__ import annotations

from typing import Any

import httpx
from api_support import KEYS, AppFactory, basic_request


def _client(make_client: AppFactory, calls: list[str], **kw: Any) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        return httpx.Response(200, json={"revision": "r1", "blocks": []})

    return make_client(
        contributor_transport=httpx.MockTransport(handler),
        contributors={
            "hook": {"url": "http://contributor.test/hook"},
            "globex-only": {"url": "http://contributor.test/g", "tenants": ["globex"]},
        },
        **kw,
    )


def _request(*refs: dict[str, str]) -> dict[str, Any]:
    body = basic_request(contributors=list(refs))
    body["plugins"] = [*body["plugins"], *({"name": r["source"]} for r in refs)]
    return body


def test_budget_calls_no_contributor_and_lists_them_pending(make_client: AppFactory) -> None:
    calls: list[str] = []
    client = _client(make_client, calls)
    body = _request(
        {"source": "docs", "endpoint": "hook"}, {"source": "web", "url": "http://203.0.113.9/x"}
    )
    response = client.post("/v1/budget", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["pending_sources"] == ["docs", "web"]
    assert calls == []
    assert client.post("/v1/prepare", json=_request(body["contributors"][0])).status_code == 200
    assert len(calls) == 1  # the same transport, when prepare does call


def test_budget_refuses_an_endpoint_the_tenant_does_not_have(make_client: AppFactory) -> None:
    """As prepare does: an unknown endpoint, or one registered for another tenant, is a 422
    naming the field, and nothing is called."""
    calls: list[str] = []
    client = _client(make_client, calls, auth=True)
    key = {"X-API-Key": KEYS["acme"]}
    for endpoint in ("nosuch", "globex-only"):
        body = _request({"source": "docs", "endpoint": endpoint})
        for path in ("/v1/budget", "/v1/prepare"):
            response = client.post(path, json=body, headers=key)
            assert response.status_code == 422, (path, endpoint, response.text)
            assert response.json()["field"] == "contributors.0.endpoint", path
    assert calls == []
    body = _request({"source": "docs", "endpoint": "globex-only"})
    response = client.post("/v1/budget", json=body, headers={"X-API-Key": KEYS["globex"]})
    assert response.status_code == 200, response.text
