"""The adapters' usage reports never pile up and never keep the process alive.

Reports go into a bounded queue (a full one drops its oldest report, counted), are sent by a
daemon thread with a short timeout of their own and no retry, and ``close`` and the
interpreter's exit wait a bounded time. Checked here against addresses that refuse, hold or
fail, and with a real process exit: a script that makes LangChain agent calls through a
stand-in of the service that prepares normally but holds or refuses the usage reports.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from context_assembly_client.integrations.preparer import (
    EXIT_WAIT,
    REPORT_QUEUE,
    REPORT_TIMEOUT,
    Preparer,
)
from integration_support import Service

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent


def report(preparer: Preparer, number: int) -> None:
    prepared: Any = SimpleNamespace(preparation_id="prep_missing")  # what report_usage reads
    preparer.report_usage(
        prepared, provider="normalized", usage={"provider_input_tokens": 10}, report_id=f"r{number}"
    )


def test_reports_to_a_refusing_address_fail_at_once_and_the_queue_stays_bounded(
    closed_url: str,
) -> None:
    """A thousand reports to a port that refuses connections: none is retried, the queue never
    holds more than its bound (the oldest are dropped and counted), and flush returns quickly."""
    preparer = Preparer(closed_url, template={})
    for number in range(1000):
        report(preparer, number)
        assert preparer._reports.pending() <= REPORT_QUEUE + 1  # the queue and the one under way
    # With retries (backoff of half a second and more) the queue would still be full here.
    assert preparer.flush(timeout=10)
    stats = preparer.stats
    assert stats.usage_report_failures + stats.usage_reports_dropped == 1000
    assert stats.usage_reports == 0
    assert preparer.close(timeout=1)


def test_close_waits_a_bounded_time_for_a_service_that_holds_reports(silent_url: str) -> None:
    """Against a service that accepts and never answers, ``flush`` and ``close`` give up at their
    timeouts; what was left is dropped and counted, and the report under way ends within its
    own timeout."""
    preparer = Preparer(silent_url, template={})
    for number in range(REPORT_QUEUE + 50):
        report(preparer, number)
    assert preparer.stats.usage_reports_dropped >= 49  # the queue kept its bound
    assert not preparer.flush(timeout=0.2)
    started = time.monotonic()
    assert preparer.close(timeout=0.5) is False
    assert time.monotonic() - started < 2
    stats = preparer.stats
    deadline = time.monotonic() + 4 * REPORT_TIMEOUT
    while stats.usage_report_failures < 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # the report under way times out on its own
    assert stats.usage_report_failures == 1
    assert stats.usage_reports_dropped == REPORT_QUEUE + 50 - 1


async def test_aclose_returns_within_its_bound(silent_url: str) -> None:
    preparer = Preparer(silent_url, template={})
    for number in range(20):
        report(preparer, number)
    started = time.monotonic()
    assert await preparer.aclose(timeout=0.5) is False
    assert time.monotonic() - started < 2


# --------------------------------------------------------------------------- a real process exit


class Gate:
    """A stand-in of the service: prepares (and every other route) go to the real one; usage
    reports are held without an answer (``hold``) or refused with a 503 (``refuse``)."""

    def __init__(self, upstream: str, mode: str) -> None:
        self.upstream, self.mode = upstream, mode
        self.released = threading.Event()
        self.reports = 0
        gate = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                if self.path.endswith("/usage"):
                    gate.reports += 1
                    if gate.mode == "hold":
                        gate.released.wait(60)
                        self.close_connection = True
                        return
                    self._send(503, b'{"status": 503, "code": "STORE_UNAVAILABLE"}')
                    return
                answer = httpx.request(
                    method,
                    gate.upstream + self.path,
                    content=body,
                    headers={"content-type": "application/json"},
                    timeout=10,
                )
                self._send(answer.status_code, answer.content)

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def close(self) -> None:
        self.released.set()
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(params=["hold", "refuse"])
def gate(request: pytest.FixtureRequest, service: Service) -> Iterator[Gate]:
    stand_in = Gate(service.url, request.param)
    yield stand_in
    stand_in.close()


SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_fakes import RecordingChatModel, usage
    from context_assembly_client.integrations.langchain import ContextAssemblyMiddleware

    def main():
        middleware = ContextAssemblyMiddleware({url!r}, template={{"model": "gpt-4o-mini"}})
        for number in range(5):
            answer = AIMessage("ok", id=f"resp-{{number}}", usage_metadata=usage(100, 2))
            model = RecordingChatModel(messages=iter([answer]))
            agent = create_agent(model, tools=[], middleware=[middleware])
            agent.invoke({{"messages": [HumanMessage("Where is A42?")]}})
        print("prepared", middleware.stats.prepared, flush=True)

    main()
    print("main returned", flush=True)
    """
)


def test_a_process_exits_within_a_bound_while_the_service_holds_or_refuses_reports(
    gate: Gate, tmp_path: Path
) -> None:
    """Five agent calls, then main returns without closing the adapter: the process exits within
    ``EXIT_WAIT`` plus a margin, whatever the service does with the reports."""
    script = tmp_path / "agent.py"
    script.write_text(SCRIPT.format(tests=str(HERE), url=gate.url))
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "prepared 5"
        assert proc.stdout.readline().strip() == "main returned"
        returned = time.monotonic()
        proc.wait(timeout=EXIT_WAIT + 10)
        assert time.monotonic() - returned < EXIT_WAIT + 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
        stderr = proc.stderr.read() if proc.stderr is not None else ""
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == 0, stderr
    assert gate.reports >= 1  # the reports did go out, and were held or refused
