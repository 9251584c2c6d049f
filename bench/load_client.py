"""The client side of the served-process benchmarks: the load clients that send the requests
(the lean keep-alive one, ``load``, and aiohttp's, ``load_aiohttp``, for comparison), on uvloop
(``run``), and the readings taken around them: latency percentiles (``pct``) and CPU time, of a
process from /proc/<pid>/task/*/schedstat (``cpu_seconds``) and of the whole machine from
/proc/stat (``machine_busy_seconds``). bench_service.py measures with them, and bench_ab.py,
bench_conversation.py, bench_load.py and bench_stages.py reuse them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import httptools
import uvloop

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop, as the service and the contributors run (and as the baseline ran
    its fan-out client)."""
    return uvloop.run(coro)


class _Exchange(asyncio.Protocol):
    """One keep-alive connection of the load client: writes a prepared request, parses the answer
    with httptools (the framing the service's own contributor client trusts) and resolves
    ``answered`` with the status once the whole body is in."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answered: asyncio.Future[int] | None = None
        self.keep_alive = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(ConnectionError(f"unparseable answer: {err}"))

    def on_message_complete(self) -> None:
        # Read here: the parser resets its flags once the message is complete.
        self.keep_alive = self.parser.should_keep_alive()
        if self.answered is not None and not self.answered.done():
            self.answered.set_result(self.parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError("connection closed"))

    def _fail(self, err: Exception) -> None:
        if self.answered is not None and not self.answered.done():
            self.answered.set_exception(err)


async def load(
    url: str, body: bytes | list[bytes], concurrency: int, total: int, *, settle: bool = False
) -> tuple[list[float], int]:
    """``total`` POSTs of ``body`` (or of each of ``body`` in turn) from ``concurrency`` workers,
    each on its own keep-alive connection; a non-200 answer, a closed connection or 30 s without
    an answer counts as an error (and the next request opens a new connection). With ``settle``
    each worker's first request, sent in step with the others', is sent on top of ``total`` and
    its latency not counted (its errors are), as the floors' first fan-out of each loop.

    The load client is lean on purpose, as wrk is: each
    request is written from bytes prepared once and its answer framed by httptools, on uvloop.
    aiohttp as the load client adds its own CPU to every latency (0.56–1.02 ms at c=1 on the
    project machine on asyncio's own loop, a median 0.55 ms on uvloop: ``load_aiohttp``, printed
    beside this client's figures), which is the client's time, not the service's; at c=16 it also
    takes CPU from the service on the shared cores.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = (
        f"POST {parts.path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
    )
    bodies = body if isinstance(body, list) else [body]
    requests = [f"{head}content-length: {len(b)}\r\n\r\n".encode() + b for b in bodies]
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors = 0
    remaining = total
    connections = 0

    async def worker() -> None:
        nonlocal remaining, errors, connections
        conn: _Exchange | None = None
        first = settle
        try:
            while remaining > 0 or first:
                if not first:
                    remaining -= 1
                request = requests[remaining % len(requests)]
                started = time.perf_counter()
                try:
                    if conn is None or conn.transport is None or conn.transport.is_closing():
                        _, conn = await loop.create_connection(_Exchange, host, port)
                        connections += 1
                    assert conn.transport is not None
                    conn.answered = loop.create_future()
                    conn.transport.write(request)
                    async with asyncio.timeout(30):
                        status = await conn.answered
                    if status != 200:
                        errors += 1
                    if not conn.keep_alive:
                        conn.transport.close()
                        conn = None
                except (OSError, TimeoutError):
                    errors += 1  # a failed request is an error, not a crash of the benchmark
                    if conn is not None and conn.transport is not None:
                        conn.transport.close()
                    conn = None
                if not first:
                    latencies.append(time.perf_counter() - started)
                first = False
        finally:
            if conn is not None and conn.transport is not None:
                conn.transport.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    if connections > concurrency + errors:  # each worker's one, and one after each failure
        raise RuntimeError(f"the load client opened {connections} connections: keep-alive failed")
    return latencies, errors


async def load_aiohttp(
    url: str, body: bytes | list[bytes], concurrency: int, total: int
) -> tuple[list[float], int]:
    """``load`` through an aiohttp session (a common load client), for comparison."""
    bodies = body if isinstance(body, list) else [body]
    latencies: list[float] = []
    errors = 0
    remaining = total
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal remaining, errors
            while remaining > 0:
                remaining -= 1
                payload = bodies[remaining % len(bodies)]
                started = time.perf_counter()
                try:
                    async with session.post(
                        url,
                        data=payload,
                        headers={"content-type": "application/json"},
                        timeout=aiohttp.ClientTimeout(total=30),
                    ) as resp:
                        await resp.read()
                        if resp.status != 200:
                            errors += 1
                except (aiohttp.ClientError, TimeoutError):
                    errors += 1
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, errors


def cpu_seconds(pid: int) -> float:
    """CPU time the process ``pid`` has used so far, all its threads (Linux schedstat, ns)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores (/proc/stat, Linux)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / hz, sum(fields) / hz


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] * 1000
