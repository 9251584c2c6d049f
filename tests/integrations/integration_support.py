"""Helpers of the runtime adapter tests: the served process (with a registered summarizer),
failing addresses, service reads."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from context_assembly_client import Client
from context_assembly_client.types import PreparationView
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse

BIN = Path(sys.executable).parent
READY_TIMEOUT_S = 20.0
SUMMARIZER = "summarizer"
"""The registered webhook that writes summaries (``assembly.compaction.summarizer``)."""
SUMMARY = "They looked up order A42: it has shipped."


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Service:
    """A served process: its URL and a sync client to read what it stored."""

    url: str
    client: Client

    def preparation(self, preparation_id: str) -> PreparationView:
        return self.client.get_preparation(preparation_id)

    def requests_total(self, route: str, status: str = "200") -> float:
        """``context_assembly_requests_total`` of one route and status, from ``/metrics``."""
        text = httpx.get(self.url + "/metrics", timeout=5.0).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "context_assembly_requests_total" and sample.labels == {
                    "route": route,
                    "status": status,
                }:
                    return float(sample.value)
        return 0.0

    def wait_for_requests(self, route: str, count: float) -> None:
        """Bounded polling of ``/metrics``: a request is counted right after its answer is sent,
        so the count may trail the answer the client already has by a moment."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.requests_total(route) < count:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{route} counted {self.requests_total(route)}, expected {count}"
                )
            time.sleep(0.02)
        assert self.requests_total(route) == count


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    """Bounded polling: the process needs a moment to bind; give up loudly after the limit."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode} before becoming ready")
        try:
            if httpx.get(url + "/healthz", timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready within {READY_TIMEOUT_S} s")


@dataclass
class Summarizer:
    """A loopback summarizer webhook: answers every packet with ``SUMMARY`` and keeps them."""

    url: str
    packets: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture(scope="session")
def summarizer() -> Iterator[Summarizer]:
    """The summarizer webhook the served process has registered as ``SUMMARIZER``."""
    packets: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            packets.append(orjson.loads(self.rfile.read(length)))
            payload = orjson.dumps({"summary": SUMMARY})
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Summarizer(f"http://127.0.0.1:{server.server_address[1]}/summarize", packets)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory, summarizer: Summarizer) -> Iterator[Service]:
    """``context-assembly serve`` in its default configuration on a temporary SQLite file, with
    the ``summarizer`` webhook registered."""
    folder = tmp_path_factory.mktemp("adapters")
    port = free_port()
    config = folder / "service.toml"
    config.write_text(
        f'[store]\nbackend = "sqlite"\npath = "{folder / "adapters.db"}"\n\n'
        f'[contributors.{SUMMARIZER}]\nurl = "{summarizer.url}"\n'
    )
    log = (folder / "service.log").open("wb")
    proc = subprocess.Popen(
        [str(BIN / "context-assembly"), "serve", "--port", str(port), "--config", str(config)],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        with Client(url, timeout=10.0) as client:
            yield Service(url, client)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()


@pytest.fixture
def closed_url() -> str:
    """An address where nothing listens: every connection is refused."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """An address that accepts connections and never answers (a service slower than any deadline)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


async def _unavailable(request: Request) -> JSONResponse:
    body = {
        "title": "Service Unavailable",
        "status": 503,
        "detail": "store down",
        "code": "STORE_UNAVAILABLE",
    }
    return JSONResponse(body, status_code=503, media_type="application/problem+json")


@pytest.fixture(scope="session")
def failing_url() -> Iterator[str]:
    """A real loopback HTTP server answering every request with a 503 problem (a service in
    trouble), served by uvicorn in a thread on a socket bound here (no port race)."""
    app = Starlette()
    app.add_route("/{path:path}", _unavailable, methods=["GET", "POST"])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not server.started:  # bounded polling: the thread needs a moment to start serving
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the 503 server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
