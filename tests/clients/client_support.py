"""Helpers of the client tests: the real app in-process, loopback servers, request bodies."""

from __future__ import annotations

import hashlib
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from context_assembly_client import AsyncClient, Client
from context_assembly_client.testing import start_service
from fastapi import FastAPI
from starlette.testclient import TestClient

from context_assembly.api.app import create_app
from context_assembly.config import load_settings

BASE = "http://testserver"
SECRET = "whsec_" + "c2VjcmV0LWtleS1vZi10aGUtY29udHJpYnV0b3ItdGVzdHM="
API_KEY = "key-client-tests-0001"


def auth_settings(tenant: str = "acme", key: str = API_KEY) -> dict[str, Any]:
    """Settings overrides that turn on API-key auth with one key (stored as its sha256)."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return {"auth": {"mode": "api_key", "keys": [{"tenant": tenant, "key_sha256": digest}]}}


def build_app(tmp_path: Path, **overrides: Any) -> FastAPI:
    """The real app on a fresh SQLite file under ``tmp_path``."""
    db = tmp_path / f"client-{secrets.token_hex(4)}.db"
    settings = load_settings(store={"path": str(db)}, **overrides)
    return create_app(settings)


@asynccontextmanager
async def async_client_for(
    app: FastAPI, *, api_key: str | None = None, max_retries: int = 2
) -> AsyncIterator[AsyncClient]:
    """An ``AsyncClient`` talking to ``app`` in-process; the app's lifespan runs around it.

    ``ASGITransport`` does not run the lifespan, so it is entered here explicitly.
    """
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            async with AsyncClient(
                BASE, api_key=api_key, http_client=http, max_retries=max_retries
            ) as client:
                yield client


@contextmanager
def sync_client_for(app: FastAPI, *, api_key: str | None = None) -> Iterator[Client]:
    """A ``Client`` sending through Starlette's ``TestClient`` (which runs the lifespan)."""
    with TestClient(app, base_url=BASE) as test_client:
        # Starlette's TestClient is an httpx2.Client, which sends as the httpx.Client that
        # ``http_client`` is declared as.
        with Client(BASE, api_key=api_key, http_client=test_client) as client:  # type: ignore[arg-type]
            yield client


def prepare_body(**overrides: Any) -> dict[str, Any]:
    """A prepare request with one inline source (a protected block and an optional one)."""
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
                    {"id": "note", "text": "A note about A42.", "priority": 5},
                ],
            }
        ],
        "history": [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "ok"}],
        "input": [{"role": "user", "content": "Inspect receipt A42."}],
        "assembly": {"layout": "stable-prefix"},
    }
    body.update(overrides)
    return body


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Bounded polling: something needs a moment (a server binding); fail loudly after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise RuntimeError(f"{what} not ready within {timeout} s")


@contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Serve an ASGI app with a real uvicorn on loopback in a background thread; yield its URL.

    The socket is bound here and handed to uvicorn, so there is no free-port race.
    """
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", ws="none", http="h11"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), "uvicorn thread")
        if not server.started:
            raise RuntimeError("uvicorn thread exited before it started")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextmanager
def serve_process(tmp_path: Path, config_toml: str) -> Iterator[str]:
    """Run ``context-assembly serve`` with ``config_toml``; yield its URL; stop it afterwards."""
    config = tmp_path / f"config-{secrets.token_hex(4)}.toml"
    config.write_text(config_toml)
    with start_service(config) as service:
        yield service.url


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    """The real app, authentication off, on a fresh SQLite file."""
    return build_app(tmp_path)


@pytest.fixture
async def aclient(app: FastAPI) -> AsyncIterator[AsyncClient]:
    """An ``AsyncClient`` on the in-process app."""
    async with async_client_for(app) as client:
        yield client


@pytest.fixture
def client(app: FastAPI) -> Iterator[Client]:
    """A ``Client`` on the in-process app (through ``TestClient``)."""
    with sync_client_for(app) as sync_client:
        yield sync_client
