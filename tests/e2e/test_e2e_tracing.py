"""Traces from a real ``context-assembly serve`` process configured by ``OTEL_*`` variables alone:
its OTLP/HTTP exporter posts to a loopback collector when the process stops, and its contributor
calls carry the caller's trace to a loopback contributor."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import BIN, free_port, stop, wait_ready
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from loopback_handler import HandlerServer

pytestmark = pytest.mark.e2e

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_PARENT = "b7ad6b7169203331"
WANTED = {"POST /v1/prepare", "context_assembly.prepare", "POST"}  # server, ours, contributor call


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
def collector() -> Iterator[tuple[Collector, HandlerServer]]:
    receiver = Collector()
    with HandlerServer(receiver) as server:
        yield receiver, server


def test_a_served_prepare_is_exported_and_continued_at_the_contributor(
    tmp_path: Path, collector: tuple[Collector, HandlerServer]
) -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` alone turns tracing on: the collector receives the server
    span (continuing the caller's trace), the prepare span and the contributor call under the
    configured service name, at the latest when the process is stopped; the contributor receives
    the same trace; probes are not traced."""
    receiver, server = collector
    traceparents: list[str | None] = []

    def contribute(request: httpx.Request) -> httpx.Response:
        traceparents.append(request.headers.get("traceparent"))
        return httpx.Response(200, json={"revision": "r1", "blocks": [{"id": "a", "text": "x"}]})

    with HandlerServer(contribute) as contributor:
        port = free_port()
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
        with (tmp_path / "service.log").open("wb") as log:
            proc = subprocess.Popen(
                [
                    str(BIN / "context-assembly"),
                    "serve",
                    "--port",
                    str(port),
                    "--config",
                    str(config),
                ],
                cwd=tmp_path,
                env=env,
                stderr=log,
            )
            try:
                base = f"http://127.0.0.1:{port}"
                wait_ready(f"{base}/readyz", proc)
                body = {
                    "model": "gpt-4o-mini",
                    "plugins": [{"name": "docs"}],
                    "contributors": [{"source": "docs", "endpoint": "hook"}],
                    "input": [{"role": "user", "content": "hi"}],
                }
                answer = httpx.post(
                    f"{base}/v1/prepare",
                    json=body,
                    headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_PARENT}-01"},
                    timeout=30,
                )
                assert answer.status_code == 200, answer.text
                assert not receiver.spans  # still in the batch
            finally:
                stop(proc)
        # The shutdown posted the batch and had its answer before the process ended.
        assert receiver.arrived.is_set(), receiver.spans

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
