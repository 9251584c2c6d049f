"""Fan-out benchmark: 8 loopback contributors through ``contribute_all`` and through bare aiohttp.

Compares the service's contributor path (``contribute_all`` on ``create_client()``: deadline,
signing, caps, validation) with a bare aiohttp session posting the same requests, and with a
floor of eight sleeps and no HTTP, at concurrency 1 (sequential fan-outs) and 16 (16 concurrent
fan-out loops, 128 requests in flight). Each contributor sleeps 20 ms and answers ~5.6 KB of valid
``{revision, blocks}`` JSON. "Overhead" is fan-out
wall time minus the 20 ms sleep; client CPU is this process's ``time.process_time()`` per fan-out.

The 8 contributors are the scripted contributor double of ``context_assembly_client.testing``,
each in a process of its own on uvloop (so their CPU is not counted), bound to 127.0.0.1 only,
and are stopped at the end. Bounded: a whole run takes well under 60 s.

    .venv/bin/python bench/bench_fanout.py [--rounds-c1 100] [--rounds-c16 12]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import uvloop
from context_assembly_client.testing import ServedProcess, Step, start_contributor

SLEEP_S = 0.020
SERVERS = 8


# --------------------------------------------------------------------------- contributors

BLOCKS = [{"id": f"b{i}", "text": "lorem ipsum " * 40, "priority": i} for i in range(11)]
"""Each contributor's answer: about 5.6 KB of valid ``{revision, blocks}`` JSON."""


# --------------------------------------------------------------------------- client side


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(
    fan_out: Callable[[], Awaitable[None]], concurrency: int, rounds: int
) -> tuple[list[float], float, int]:
    """Run ``concurrency`` loops of ``rounds`` fan-outs; return overheads (ms), CPU, count."""
    for _ in range(5):  # warm-up: connections, caches
        await fan_out()
    overheads: list[float] = []

    async def loop() -> None:
        for _ in range(rounds):
            started = time.perf_counter()
            await fan_out()
            overheads.append((time.perf_counter() - started - SLEEP_S) * 1000)

    cpu = time.process_time()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return overheads, time.process_time() - cpu, concurrency * rounds


async def _fan_out(client: Any, targets: Sequence[Any], fields: Any) -> None:
    """One fan-out through ``contribute_all``; every contributor must answer ok."""
    from context_assembly.contributors import contribute_all

    outcomes = await contribute_all(client, targets, fields, time.monotonic() + 5.0, 1 << 20)
    bad = [o for o in outcomes if o.status != "ok"]
    if bad:
        raise RuntimeError(f"fan-out failed: {bad[0].status} {bad[0].cause}")


async def _bench(ports: list[int], rounds_c1: int, rounds_c16: int) -> None:
    from context_assembly.contributors import (
        ContributorTarget,
        PacketFields,
        create_client,
    )
    from context_assembly.core.request import Message, Scope

    targets = [
        ContributorTarget(source=f"s{i}", url=f"http://127.0.0.1:{p}/contribute")
        for i, p in enumerate(ports)
    ]
    fields = PacketFields(
        preparation_id="prep_bench",
        model="gpt-4o-mini",
        input=[Message(role="user", content="hello")],
        data_budget_tokens=2048,
        scope=Scope(account_id="a"),
        deadline_unix_ms=0,
    )

    async def floor() -> None:
        await asyncio.gather(*(asyncio.sleep(SLEEP_S) for _ in targets))

    # Reference: bare aiohttp with no contribute_all (no deadline, signing, caps or validation),
    # to show what the service's contributor path adds to the same HTTP client.
    import aiohttp
    import orjson

    session = aiohttp.ClientSession()
    urls = [t.url for t in targets]

    async def bare_aiohttp() -> None:
        async def post(url: str) -> None:
            async with session.post(url, data=b'{"type":"contribute"}') as response:
                orjson.loads(await response.read())

        await asyncio.gather(*(post(u) for u in urls))

    print(
        f"{'client':32} {'c':>3} {'p50 ms':>8} {'p99 ms':>8} {'fan-outs/s':>11} {'CPU ms/fan-out':>15}"
    )
    for concurrency, rounds in ((1, rounds_c1), (16, rounds_c16)):
        client = create_client()
        runs: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("floor (8x sleep, no HTTP)", floor),
            ("bare aiohttp (reference)", bare_aiohttp),
            (
                "contribute_all (create_client)",
                functools.partial(_fan_out, client, targets, fields),
            ),
        ]
        for name, fan_out in runs:
            started = time.perf_counter()
            overheads, cpu, count = await _measure(fan_out, concurrency, rounds)
            wall = time.perf_counter() - started
            print(
                f"{name:32} {concurrency:>3} {statistics.median(overheads):>8.2f}"
                f" {_percentile(overheads, 0.99):>8.2f} {count / wall:>11.1f}"
                f" {cpu / count * 1000:>15.2f}",
                flush=True,
            )
        await client.aclose()
    await session.close()


def main() -> None:
    """Start the contributor processes, run the comparison, stop the processes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds-c1", type=int, default=100)
    parser.add_argument("--rounds-c16", type=int, default=12)
    args = parser.parse_args()
    contributors: list[ServedProcess] = []
    try:
        for _ in range(SERVERS):
            contributors.append(
                start_contributor(default=Step(delay=SLEEP_S, blocks=BLOCKS), uvloop=True)
            )
        print(f"client loop: uvloop; {SERVERS} contributor processes, 20 ms each")

        async def bounded() -> None:
            async with asyncio.timeout(55):
                await _bench([c.port for c in contributors], args.rounds_c1, args.rounds_c16)

        uvloop.run(bounded())
    finally:
        for contributor in contributors:
            contributor.stop()


if __name__ == "__main__":
    main()
