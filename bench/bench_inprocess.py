"""In-process prepare: the app's own cost for 128 inline blocks, without a socket or a client.

Calls the ASGI app directly (no uvicorn, no network) with the request of bench_service.py,
repeated (every count cached) and with one new entry each time, and prints the p50 of each.

Then the repeated prepare and the bare FastAPI echo of bench_service.py (``echo_app.py``, called
the same way) back to back, and with the thread asleep for ``--idle-us`` (30 µs) before each
call, as a service is between a client's requests: on the project machine that idle alone made
the prepare ~130 µs slower and the echo ~40 µs (a busy wait of the same length
changed neither), a cost that grows with what a request touches. Over HTTP both also pay the
hop (~0.15 ms there), so the ratio here is higher than ``bench_service.py``'s; what carries over
is the difference, prepare minus echo, which the HTTP target (2.0x) allows to be the echo's
HTTP p50. A change to the inline prepare can be judged by it here first, in seconds.

Run: ``make bench`` or ``.venv/bin/python bench/bench_inprocess.py [--idle-us 30]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loopback import inline_request

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.logs import configure_logging
from context_assembly.server import tune_gc


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


async def p50(app: Any, bodies: list[bytes], n: int, idle: float = 0.0) -> float:
    """The median of ``n`` calls, each after ``idle`` seconds asleep (none with 0)."""
    times = []
    for i in range(n):
        if idle:
            time.sleep(idle)
        started = time.perf_counter()
        status = await call(app, bodies[i % len(bodies)])
        times.append(time.perf_counter() - started)
        assert status == 200, status
        # The loop's next turn, untimed, as between a client's requests.
        await asyncio.sleep(0)
    return statistics.median(times) * 1000


async def main(idle: float) -> None:
    import echo_app

    folder = tempfile.mkdtemp(prefix="ca-bench-")
    app = create_app(load_settings(store={"path": os.path.join(folder, "bench.db")}))
    repeated = [inline_request()]
    fresh = [inline_request(turn) for turn in range(1200)]
    try:
        async with app.router.lifespan_context(app):
            tune_gc()  # as the server's factory does in a serving process
            await p50(app, repeated, 300)  # warm up
            hit = await p50(app, repeated, 2000)
            miss = await p50(app, fresh[200:], 1000)
            print("in-process prepare, 128 inline blocks (no socket, no client):")
            print(f"  repeated request                 p50 {hit:6.3f} ms")
            print(f"  one new entry each               p50 {miss:6.3f} ms")
            await p50(echo_app.app, repeated, 300)  # warm up
            rounds: dict[str, list[float]] = {}
            for _ in range(4):  # interleaved: the machine's speed moves within a minute
                for name, target, pause in (
                    ("prepare", app, 0.0),
                    ("echo", echo_app.app, 0.0),
                    ("prepare idle", app, idle),
                    ("echo idle", echo_app.app, idle),
                ):
                    rounds.setdefault(name, []).append(await p50(target, repeated, 500, pause))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    got = {name: statistics.median(values) for name, values in rounds.items()}
    print(
        f"the repeated prepare against the FastAPI echo, back to back and after {idle * 1e6:.0f} µs idle:"
    )
    print(
        f"  back to back  prepare {got['prepare']:6.3f} ms  echo {got['echo']:6.3f} ms"
        f"  difference {(got['prepare'] - got['echo']) * 1000:4.0f} µs"
        f"  ratio {got['prepare'] / got['echo']:.2f}x"
    )
    print(
        f"  after idle    prepare {got['prepare idle']:6.3f} ms  echo {got['echo idle']:6.3f} ms"
        f"  difference {(got['prepare idle'] - got['echo idle']) * 1000:4.0f} µs"
        f"  ratio {got['prepare idle'] / got['echo idle']:.2f}x"
    )


if __name__ == "__main__":
    # As `context-assembly serve` logs (JSON lines on stderr), to a sink: the figures stay readable.
    sys.stderr = open(os.devnull, "w")
    configure_logging("info")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-us", type=float, default=30.0, help="sleep before each call")
    asyncio.run(main(parser.parse_args().idle_us / 1e6))
