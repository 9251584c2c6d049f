"""In-process prepare: the app's own cost for 128 inline blocks, without a socket or a client.

Calls the ASGI app directly (no uvicorn, no network) with the request of bench_service.py,
repeated (a memo hit) and with one new entry each time (a memo miss), and prints the p50 of each.
These are the in-process figures the README and docs/performance.md quote.
Run: ``make bench`` or ``.venv/bin/python bench/bench_inprocess.py``.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_service import inline_request

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.logs import configure_logging


async def call(app: Any, body: bytes) -> int:
    """One POST /v1/prepare through the ASGI app; returns the status."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    status = 0

    async def receive() -> dict[str, Any]:
        return pending.pop() if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/prepare", "raw_path": b"/v1/prepare", "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {},
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    }  # fmt: skip
    await app(scope, receive, send)
    return status


async def p50(app: Any, bodies: list[bytes], n: int) -> float:
    times = []
    for i in range(n):
        started = time.perf_counter()
        status = await call(app, bodies[i % len(bodies)])
        times.append(time.perf_counter() - started)
        assert status == 200, status
    return statistics.median(times) * 1000


async def main() -> None:
    folder = tempfile.mkdtemp(prefix="ca-bench-")
    app = create_app(load_settings(store={"path": os.path.join(folder, "bench.db")}))
    repeated = [inline_request()]
    fresh = [inline_request(turn) for turn in range(1200)]
    async with app.router.lifespan_context(app):
        await p50(app, repeated, 300)  # warm up
        hit = await p50(app, repeated, 2000)
        miss = await p50(app, fresh[200:], 1000)
    print("in-process prepare, 128 inline blocks (no socket, no client):")
    print(f"  repeated request (memo hit)      p50 {hit:6.3f} ms")
    print(f"  one new entry each (memo miss)   p50 {miss:6.3f} ms")


if __name__ == "__main__":
    # As `context-assembly serve` logs (JSON lines on stderr), to a sink: the figures stay readable.
    sys.stderr = open(os.devnull, "w")
    configure_logging("info")
    asyncio.run(main())
