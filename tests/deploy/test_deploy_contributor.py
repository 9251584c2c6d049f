"""The example contributor of the compose trial (examples/contributor/app.py), run in-process.

The service's contributor client is pointed at the example ASGI app through
``httpx.ASGITransport``, with the compose configuration's contributor registration and a shared
webhook secret, so the example is shown to speak the service's signed protocol end to end (no
socket, no container).
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import httpx
import httpx2
import pytest
from context_assembly_client.testing import ScriptedContributor
from fastapi.testclient import TestClient

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from loopback_client import LoopbackClient

ROOT = Path(__file__).resolve().parents[2]
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
KEY = "ca_deploy_contributor_key"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    """examples/contributor/app.py imported under a unique module name."""
    spec = importlib.util.spec_from_file_location(
        "deploy_example_contributor", ROOT / "examples" / "contributor" / "app.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def _service(
    example: ModuleType, tmp_path: Path, service_secret: str, policy: str
) -> Iterator[TestClient]:
    settings = load_settings(
        auth={
            "mode": "api_key",
            "keys": [{"tenant": "demo", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
        },
        store={"path": str(tmp_path / "store.db")},
        contributors={
            "memory": {
                "url": "http://contributor:9001/contribute",
                "secret": service_secret,
                "failure_policy": policy,
            }
        },
    )

    async def to_example(request: httpx.Request) -> httpx.Response:
        transport = httpx.ASGITransport(app=example.app)
        async with httpx.AsyncClient(transport=transport) as example_client:
            response = await example_client.send(request)
            await response.aread()
            return response

    server = ScriptedContributor(handler=to_example)
    app = create_app(settings, client=LoopbackClient(server.port))
    with server, TestClient(app, raise_server_exceptions=False) as http:
        http.headers["Authorization"] = f"Bearer {KEY}"
        yield http


def _prepare(http: TestClient) -> httpx2.Response:
    return http.post(
        "/v1/prepare",
        json={
            "model": "gpt-4o-mini",
            "plugins": [{"name": "notes", "instructions": "Team notes."}],
            "contributors": [{"source": "notes", "endpoint": "memory"}],
            "input": [{"role": "user", "content": "Can I deploy on Friday?"}],
            "assembly": {"max_data_tokens": 512},
        },
    )


def test_deploy_example_contributor_serves_signed_packets(
    example: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the same secret on both sides the signature verifies and the notes are selected; the
    protected note enters in full; validate's revision query gets the same revision."""
    monkeypatch.setenv("CONTRIBUTOR_SECRET", SECRET)
    with _service(example, tmp_path, SECRET, "fail") as http:
        response = _prepare(http)
        assert response.status_code == 200, response.text
        prep = response.json()
        sources = {s["source"]: s for s in prep["selection"]["sources"]}
        assert sources["notes"]["status"] == "ok"
        assert sources["notes"]["block_count"] == len(example.NOTES)
        decisions = {b["id"]: b for b in prep["selection"]["blocks"]}
        assert decisions["deploy-window"]["status"] == "selected"
        assert "Deploys are allowed" in str(prep["frame"]["messages"])
        check = http.post(
            f"/v1/preparations/{prep['preparation_id']}/validate",
            json={
                "model": prep["model"],
                "scope": {},
                "frame": {"messages": prep["frame"]["messages"], "tools": prep["frame"]["tools"]},
            },
        )
        assert check.status_code == 200, check.text
        assert check.json()["valid"] is True


def test_deploy_example_contributor_refuses_a_wrong_signature(
    example: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service signing with another secret gets 401 from the example: under ``omit`` the source
    is reported as ``error`` and contributes nothing."""
    monkeypatch.setenv("CONTRIBUTOR_SECRET", SECRET)
    other = "whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="
    with _service(example, tmp_path, other, "omit") as http:
        response = _prepare(http)
        assert response.status_code == 200, response.text
        sources = {s["source"]: s for s in response.json()["selection"]["sources"]}
        assert sources["notes"]["status"] == "error"
        assert sources["notes"]["block_count"] == 0


async def test_deploy_example_contributor_health_and_errors(example: ModuleType) -> None:
    """/healthz answers ok (the compose healthcheck); other paths, methods and bodies get 4xx."""
    transport = httpx.ASGITransport(app=example.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://contributor") as client:
        health = await client.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        assert (await client.get("/nope")).status_code == 404
        assert (await client.get("/contribute")).status_code == 405
        assert (await client.post("/contribute", content=b"{nope")).status_code == 400
        revision = await client.post("/contribute", json={"type": "revision", "source": "notes"})
        assert revision.json() == {"revision": example.REVISION}
