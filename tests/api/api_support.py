"""In-process HTTP helpers and fixtures: the real app (real SQLite file) behind the TestClient."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from context_assembly_client.testing import ScriptedContributor
from fastapi.testclient import TestClient

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.contributors.ssrf import Resolver
from context_assembly.preparations import Clock
from loopback_client import LoopbackClient

KEYS = {"acme": "key-acme-0001", "globex": "key-globex-0002"}


class FakeWall:
    """A settable wall clock (unix seconds) for expiry tests."""

    def __init__(self, start: float = 1_796_212_800.0) -> None:  # 2026-12-02T12:00:00Z
        self.now = start

    def __call__(self) -> float:
        return self.now


AppFactory = Callable[..., TestClient]


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[AppFactory]:
    clients: list[TestClient] = []
    servers: list[ScriptedContributor] = []

    def make(
        *,
        auth: bool = False,
        wall: FakeWall | None = None,
        contributor_transport: httpx.MockTransport | None = None,
        monotonic: Callable[[], float] | None = None,
        resolver: Resolver | None = None,
        **overrides: Any,
    ) -> TestClient:
        settings_kw: dict[str, Any] = {
            "store": {"path": str(tmp_path / f"db{len(clients)}.db")},
            **overrides,
        }
        if auth:
            settings_kw["auth"] = {
                "mode": "api_key",
                "keys": [
                    {"tenant": t, "key_sha256": hashlib.sha256(k.encode()).hexdigest()}
                    for t, k in KEYS.items()
                ],
            }
        settings = load_settings(**settings_kw)
        client = None
        if contributor_transport is not None:
            # The transport's handler answers on a real loopback server, which every contributor
            # name reaches through the production client.
            servers.append(ScriptedContributor(handler=contributor_transport.handler))
            client = LoopbackClient(servers[-1].port)
        clock = None
        if wall is not None or monotonic is not None:
            clock = Clock(wall=wall or Clock().wall, monotonic=monotonic or Clock().monotonic)
        app = create_app(settings, client=client, clock=clock, resolver=resolver)
        test_client = TestClient(app, raise_server_exceptions=False)
        test_client.__enter__()
        clients.append(test_client)
        return test_client

    yield make
    for client in clients:
        client.__exit__(None, None, None)
    for server in servers:
        server.close()


def basic_request(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "instructions": "Be exact.",
        "plugins": [{"name": "memory", "instructions": "Saved entries."}],
        "contributions": [
            {
                "source": "memory",
                "revision": 1,
                "blocks": [
                    {
                        "id": "receipt",
                        "text": "Receipt A42: completion unknown.",
                        "protected": True,
                    },
                    {
                        "id": "note",
                        "text": "A note that expires.",
                        "expires_at": "2026-12-02T12:30:00Z",
                        "priority": 5,
                    },
                ],
            }
        ],
        "history": [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "ok"}],
        "input": [{"role": "user", "content": "Inspect receipt A42."}],
        "assembly": {"layout": "stable-prefix"},
    }
    body.update(overrides)
    return body


def neutral_frame(prep: dict[str, Any]) -> dict[str, Any]:
    return {"messages": prep["frame"]["messages"], "tools": prep["frame"]["tools"]}
