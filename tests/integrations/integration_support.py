"""Helpers of the runtime adapter tests: the served process (with a registered summarizer),
failing addresses, service reads."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from context_assembly_client import Client
from context_assembly_client.testing import ScriptedContributor, Step, free_port, start_service
from context_assembly_client.types import PreparationView
from prometheus_client.parser import text_string_to_metric_families

READY_TIMEOUT_S = 20.0
SUMMARIZER = "summarizer"
"""The registered webhook that writes summaries (``assembly.compaction.summarizer``)."""
SUMMARY = "They looked up order A42: it has shipped."


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


@dataclass(frozen=True)
class Summarizer:
    """The summarizer webhook: a scripted contributor double answering every ``summarize``
    packet with ``SUMMARY``; ``packets`` are those it was sent so far."""

    double: ScriptedContributor

    @property
    def url(self) -> str:
        return self.double.url("/summarize")

    @property
    def packets(self) -> list[Any]:
        return [call.packet for call in self.double.calls("/summarize")]


@pytest.fixture(scope="session")
def summarizer() -> Iterator[Summarizer]:
    """The summarizer webhook the served process has registered as ``SUMMARIZER``."""
    with ScriptedContributor(default=Step(summary=SUMMARY)) as double:
        yield Summarizer(double)


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory, summarizer: Summarizer) -> Iterator[Service]:
    """``context-assembly serve`` in its default configuration on a temporary SQLite file, with
    the ``summarizer`` webhook registered."""
    folder = tmp_path_factory.mktemp("adapters")
    config = folder / "service.toml"
    config.write_text(
        f'[store]\nbackend = "sqlite"\npath = "{folder / "adapters.db"}"\n\n'
        f'[contributors.{SUMMARIZER}]\nurl = "{summarizer.url}"\n'
    )
    with (
        start_service(config, log=folder / "service.log", timeout=READY_TIMEOUT_S) as served,
        Client(served.url, timeout=10.0) as client,
    ):
        yield Service(served.url, client)


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


UNAVAILABLE = {
    "title": "Service Unavailable",
    "status": 503,
    "detail": "store down",
    "code": "STORE_UNAVAILABLE",
}


@pytest.fixture(scope="session")
def failing_url() -> Iterator[str]:
    """A real loopback HTTP server answering every request with a 503 problem (a service in
    trouble): the scripted double, its one step a 503 with that body."""
    with ScriptedContributor(default=Step(status=503, body=orjson.dumps(UNAVAILABLE))) as double:
        yield double.base_url
