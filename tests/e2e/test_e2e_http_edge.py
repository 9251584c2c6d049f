"""The HTTP edge of a real ``context-assembly serve`` process, over raw loopback sockets: a request
the HTTP parser refuses is answered with a problem+json 400 that carries an ``X-Request-Id``, and
everything the process writes on stderr, uvicorn's own lines included, is one JSON object a line."""

from __future__ import annotations

import http.client
import io
import json
import signal
import socket
import uuid
from typing import Any

import pytest
from e2e_support import Service, ServiceFactory

pytestmark = pytest.mark.e2e

SQLITE = """
[store]
backend = "sqlite"
path = "{db}"

[limits]
max_head_bytes = 1024
"""

# Each is refused by the HTTP parser: in the head, before any route runs, or (the chunk) while the
# route reads the body.
MALFORMED = {
    "a NUL in a header value": b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Note: a\x00b\r\n\r\n",
    "a Content-Length that is not a number": (
        b"POST /v1/prepare HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: abc\r\n\r\n{}"
    ),
    "a chunk size that is not hexadecimal": (
        b"POST /v1/prepare HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
    ),
    "a request line that is not one": b"NOT A REQUEST\r\n\r\n",
    "an unknown protocol version": b"GET /healthz HTTX/1.1\r\nHost: t\r\n\r\n",
}


class _Received:
    """The bytes read off a socket, where ``http.client`` expects a socket."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self._data)


def _exchange(svc: Service, raw: bytes) -> http.client.HTTPResponse:
    """Send ``raw`` on a new connection and read until the service closes it (the refusals close
    the connection; the socket timeout bounds a service that would not), then parse the answer."""
    port = int(svc.base.rsplit(":", 1)[1])
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(raw)
        while chunk := sock.recv(65536):
            received += chunk
    response = http.client.HTTPResponse(_Received(bytes(received)))  # type: ignore[arg-type]
    response.begin()
    return response


def _lines(svc: Service) -> list[dict[str, Any]]:
    """Every line the process wrote on stderr so far, each parsed as JSON (a line that is not
    fails the test here)."""
    lines: list[dict[str, Any]] = []
    for number, line in enumerate(svc.log.read_bytes().splitlines(), 1):
        try:
            lines.append(json.loads(line))
        except ValueError:
            pytest.fail(f"stderr line {number} is not JSON: {line[:200]!r}")
    return lines


def _assert_refused(response: http.client.HTTPResponse, code: str, status: int) -> str:
    """The refusal is problem+json with ``code``, closes the connection, and names a request id,
    which is returned."""
    assert response.status == status
    assert response.getheader("content-type") == "application/problem+json"
    assert response.getheader("connection") == "close"
    problem = json.loads(response.read())
    assert (problem["status"], problem["code"]) == (status, code)
    request_id = response.getheader("x-request-id")
    assert request_id, "no X-Request-Id on the refusal"
    return request_id


@pytest.fixture
def svc(service_factory: ServiceFactory) -> Service:
    return service_factory(SQLITE)


@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_request_the_parser_refuses_gets_a_problem_400_with_a_request_id(
    svc: Service, raw: bytes
) -> None:
    """The parser's refusal is a 400 BAD_REQUEST problem with a new request id, and uvicorn's
    warning about it is a JSON line that names the same id (written before the answer)."""
    request_id = _assert_refused(_exchange(svc, raw), "BAD_REQUEST", 400)
    assert len(request_id) == 16  # a new id: the request sent none
    warnings = [
        line
        for line in _lines(svc)
        if line.get("logger") == "uvicorn.error" and line["level"] == "warning"
    ]
    assert {"event": "Invalid HTTP request received.", "request_id": request_id} in [
        {"event": line["event"], "request_id": line.get("request_id")} for line in warnings
    ]


def test_the_callers_request_id_read_before_the_fault_is_echoed(svc: Service) -> None:
    """A usable X-Request-Id that arrives before the malformed field is the refusal's id, on
    the answer and on the log line; one that is not usable (over 128 characters) is replaced."""
    mine = f"edge-{uuid.uuid4().hex}"
    raw = (
        b"POST /v1/prepare HTTP/1.1\r\nHost: t\r\nX-Request-Id: %s\r\nContent-Length: abc\r\n\r\n"
        % mine.encode()
    )
    assert _assert_refused(_exchange(svc, raw), "BAD_REQUEST", 400) == mine
    assert any(line.get("request_id") == mine for line in _lines(svc))
    unusable = b"x" * 129
    raw = b"GET /healthz HTTP/1.1\r\nX-Request-Id: %s\r\nX-Note: a\x00b\r\n\r\n" % unusable
    assert _assert_refused(_exchange(svc, raw), "BAD_REQUEST", 400) != unusable.decode()


def test_a_head_over_the_limit_also_names_a_request_id(svc: Service) -> None:
    """The connection limits' refusals carry the same header: a head over max_head_bytes gets a
    431 problem with an X-Request-Id."""
    raw = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 2048 + b"\r\n\r\n"
    _assert_refused(_exchange(svc, raw), "REQUEST_HEAD_TOO_LARGE", 431)


def test_every_stderr_line_is_json_from_start_to_stop(svc: Service) -> None:
    """Through a start, refusals, a served request and a stop, every line on the process's
    stderr parses as JSON, uvicorn's own start-up and shutdown lines among them."""
    for raw in MALFORMED.values():
        _assert_refused(_exchange(svc, raw), "BAD_REQUEST", 400)
    served = _exchange(svc, b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert served.status == 200
    status = svc.stop()
    # Stopped by its SIGTERM (uvicorn re-raises it once shut down), not killed.
    assert status in (0, -signal.SIGTERM)
    lines = _lines(svc)
    uvicorn_events = {line["event"] for line in lines if line.get("logger") == "uvicorn.error"}
    assert {"Application startup complete.", "Application shutdown complete."} <= uvicorn_events
    assert {"started", "request", "stopped"} <= {line["event"] for line in lines}


def test_with_two_workers_every_line_is_json_too(service_factory: ServiceFactory) -> None:
    """With two worker processes (Redis store) the refusals are problem+json too, and the
    workers and their supervising process write JSON lines only."""
    svc = service_factory(
        f"""
[store]
backend = "redis"
redis_url = "redis://127.0.0.1:6379/14"
key_prefix = "edge-{uuid.uuid4().hex}:"
""",
        "--workers",
        "2",
    )
    ids = {
        _assert_refused(_exchange(svc, MALFORMED["a NUL in a header value"]), "BAD_REQUEST", 400)
        for _ in range(8)
    }
    assert len(ids) == 8  # one new id per refused request
    svc.stop()
    assert ids <= {line.get("request_id") for line in _lines(svc)}
