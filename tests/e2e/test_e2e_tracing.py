"""Traces from a real ``context-assembly serve`` process configured by ``OTEL_*`` variables alone:
its OTLP/HTTP exporter posts to a loopback collector when the process stops, and its contributor
calls carry the caller's trace to a loopback contributor. A collector that accepts connections and
never answers does not hold the stop past its documented bound."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from context_assembly_client.testing import ScriptedContributor, ServedProcess, service_command
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from context_assembly.contributors.mcp_session import CLOSE_SESSION_SECONDS, SHUTDOWN_GRACE_SECONDS
from context_assembly.tracing import FLUSH_MILLIS

pytestmark = pytest.mark.e2e

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_PARENT = "b7ad6b7169203331"
WANTED = {"POST /v1/prepare", "context_assembly.prepare", "POST"}  # server, ours, contributor call
# A prepare that calls the configured ``hook`` contributor once.
HOOK_BODY = {
    "model": "gpt-4o-mini",
    "plugins": [{"name": "docs"}],
    "contributors": [{"source": "docs", "endpoint": "hook"}],
    "input": [{"role": "user", "content": "hi"}],
}


def serve(config: Path, env: dict[str, str]) -> ServedProcess:
    """``context-assembly serve`` with ``config`` and exactly ``env``, ready once ``/readyz``
    answers, its log in ``service.log`` beside the config."""
    return ServedProcess(
        service_command(config),
        ready="/readyz",
        env=env,
        cwd=config.parent,
        log=config.parent / "service.log",
    )


class Collector:
    """An OTLP/HTTP trace receiver: keeps each span with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, str], Any]] = []
        self.arrived = threading.Event()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        export = ExportTraceServiceRequest.FromString(request.content)
        for resource_spans in export.resource_spans:
            resource = {
                item.key: item.value.string_value for item in resource_spans.resource.attributes
            }
            for scope_spans in resource_spans.scope_spans:
                self.spans += [(resource, span) for span in scope_spans.spans]
        if WANTED <= {span.name for _, span in self.spans}:
            self.arrived.set()
        answer = ExportTraceServiceResponse().SerializeToString()
        return httpx.Response(
            200, content=answer, headers={"content-type": "application/x-protobuf"}
        )

    def named(self, name: str) -> Any:
        found = [span for _, span in self.spans if span.name == name]
        assert len(found) == 1, [span.name for _, span in self.spans]
        return found[0]


@pytest.fixture
def collector() -> Iterator[tuple[Collector, ScriptedContributor]]:
    receiver = Collector()
    with ScriptedContributor(handler=receiver) as server:
        yield receiver, server


def test_a_served_prepare_is_exported_and_continued_at_the_contributor(
    tmp_path: Path, collector: tuple[Collector, ScriptedContributor]
) -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` alone turns tracing on: the collector receives the server
    span (continuing the caller's trace), the prepare span and the contributor call under the
    configured service name, at the latest when the process is stopped; the contributor receives
    the same trace; probes are not traced."""
    receiver, server = collector
    with ScriptedContributor() as contributor:
        config = tmp_path / "service.toml"
        config.write_text(
            f'[store]\npath = "{tmp_path / "traced.db"}"\n\n'
            f'[contributors.hook]\nurl = "{contributor.url()}"\n'
        )
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
            "OTEL_EXPORTER_OTLP_ENDPOINT": server.url(""),
            # Nothing leaves on the batch timer during the test: the spans leave at shutdown.
            "OTEL_BSP_SCHEDULE_DELAY": "600000",
            "OTEL_SERVICE_NAME": "assembly-e2e",
        }
        with serve(config, env) as service:
            answer = httpx.post(
                f"{service.url}/v1/prepare",
                json=HOOK_BODY,
                headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_PARENT}-01"},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
            assert not receiver.spans  # still in the batch
        # The shutdown posted the batch and had its answer before the process ended.
        assert receiver.arrived.is_set(), receiver.spans
        traceparents = [call.request.headers.get("traceparent") for call in contributor.calls()]

    served = receiver.named("POST /v1/prepare")
    prepare = receiver.named("context_assembly.prepare")
    call = receiver.named("POST")
    assert served.trace_id.hex() == prepare.trace_id.hex() == call.trace_id.hex() == CALLER_TRACE
    assert served.parent_span_id.hex() == CALLER_PARENT
    assert prepare.parent_span_id == served.span_id and call.parent_span_id == prepare.span_id
    assert traceparents == [f"00-{CALLER_TRACE}-{call.span_id.hex()}-01"]
    resources = {resource["service.name"] for resource, _ in receiver.spans}
    assert resources == {"assembly-e2e"}
    assert not [span.name for _, span in receiver.spans if "/readyz" in span.name]


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel completes them: a listening socket
    with a backlog) and never reads or answers: a collector that is up but hung."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        yield sock.getsockname()[1]


def test_a_collector_that_never_answers_does_not_hold_the_stop(
    tmp_path: Path, black_hole: int
) -> None:
    """With the collector accepting connections and never answering, and spans of 20 prepares
    waiting in their batch, SIGTERM ends the process within the documented bound: the drain,
    the MCP sessions' end and the 5 s the spans are given, whatever the exporter's own timeout
    and retries (10 s each by default) would take. The spans left are logged as dropped."""
    drain = 0.5
    bound = drain + CLOSE_SESSION_SECONDS + SHUTDOWN_GRACE_SECONDS + FLUSH_MILLIS / 1000 + 1.5
    with ScriptedContributor() as contributor:
        config = tmp_path / "service.toml"
        config.write_text(
            f"[server]\ndrain_seconds = {drain}\n\n"
            f'[store]\npath = "{tmp_path / "traced.db"}"\n\n'
            f'[contributors.hook]\nurl = "{contributor.url()}"\n'
        )
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{black_hole}",
            "OTEL_BSP_SCHEDULE_DELAY": "600000",  # the spans wait for the shutdown
        }
        with serve(config, env) as service:
            for _ in range(20):
                answer = httpx.post(f"{service.url}/v1/prepare", json=HOOK_BODY, timeout=30)
                assert answer.status_code == 200, answer.text
            started = time.monotonic()
            service.proc.send_signal(signal.SIGTERM)
            try:
                service.proc.wait(timeout=bound)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {bound} s after SIGTERM")
            took = time.monotonic() - started
    log_path = tmp_path / "service.log"
    assert took >= FLUSH_MILLIS / 1000 * 0.9  # the spans were given their time
    logged = [orjson.loads(line) for line in log_path.read_text().splitlines()]
    [dropped] = [line for line in logged if line["event"] == "tracing_flush_incomplete"]
    assert dropped["waited_ms"] == FLUSH_MILLIS
    assert "stopped" in [line["event"] for line in logged]  # the rest of the shutdown ran
