"""Service benchmark: real uvicorn processes on loopback, measured from a client process.

1. ``prepare`` with inline blocks (128 blocks, ~20 KB of data) against a bare FastAPI echo of the
   same payload (bench/echo_app.py), interleaved rounds, concurrency 1: p50 ratio. The same body
   each time is an agent's repeated turn (its token counts are cached); a second line sends one
   new entry every request, so one block of each turn is counted afresh. The figure, for reference and
   without a target, is the repeated prepare against the same echo that also writes the body to
   SQLite, committed before it answers, as a prepare writes its record: the floor of an endpoint
   whose 200 means stored. (The figure with a target is a real conversation's:
   bench_conversation.py.)
2. ``prepare`` fanning out to 8 registered contributors answering in 20 ms, at concurrency 1
   and 16: p50, p99, errors. Each contributor is its own process (8 servers, as in the
   baseline's fan-out measurement: the scripted contributor double of
   ``context_assembly_client.testing``, on uvloop): one process serving
   all eight would measure that process's queue, not the service. At concurrency 1 the same run
   also measures two floors with no service in the path, interleaved with the prepares: the
   service's own contributor client (``contribute_all``) called from this process, and a bare
   aiohttp fan-out; what the service adds to the bare floor's p50 (HTTP hop, parsing, signing,
   assembly, store) is a figure.
3. Beside each service figure, the CPU time the service process spent per prepare (its threads'
   run time from /proc/<pid>/task/*/schedstat, Linux): a figure that does not move with the
   machine's wake-up latency, which changes 2-3x between days on these machines. At c=16 the
   figure is that CPU per prepare against the CPU this process spends per bare aiohttp fan-out
   of the same eight calls (schedstat too); also printed: the contributors' and this client's
   CPU per prepare and how busy the whole machine was: when every core is busy, the c=16
   latency measures the machine, not the service alone.
4. At c=16 the first 160 prepares are a warm-up, printed on their own line: they open most of
   the 128 contributor connections the steady state keeps (c=4 and c=1 before needed at most
   32). The c=16 figures that follow are the steady state of a running service, in four rounds
   interleaved with two floors at c=16 with no service in the path: 16 loops of fan-outs from
   this process through a bare aiohttp session (the baseline's client and settings) and through
   the service's own contributor client.
5. The documented scale-out: the same fan-out at c=16 through ``--workers 2`` on the Redis store
   (127.0.0.1:6379), after a warm-up: errors and p99.
6. The load client (``load``, bench/load_client.py) is lean, as wrk was in the baseline's HTTP
   figures: keep-alive connections, each request written from bytes prepared once,
   its answer framed by httptools, on uvloop, like every process here. The inline and c=1
   figures are also printed through an aiohttp session (``load_aiohttp``), whose own CPU is in
   its latencies. Every client of this process, the floors' too, runs on uvloop.

Bounded: fixed request counts, loopback only, every process stopped at the end.
Run: ``make bench`` or ``.venv/bin/python bench/bench_service.py``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
import redis
from context_assembly_client.testing import ServedProcess, start_service
from figures import report
from load_client import cpu_seconds, load, load_aiohttp, machine_busy_seconds, pct, run
from loopback import fanout_request, inline_request, registrations, start_contributors, start_echo

REDIS_URL = "redis://127.0.0.1:6379/13"  # the scale-out's store (bench_load.py's database)


async def floor_fanouts(
    urls: list[str], total: int, how: str, concurrency: int = 1
) -> tuple[list[float], float]:
    """``total`` fan-outs to ``urls`` from this process, with no service in the path: through the
    service's own contributor client (``how="client"``: ``contribute_all``, as the service calls
    it) or a bare aiohttp session (``"aiohttp"``: no deadline, signing or validation), from
    ``concurrency`` loops of fan-outs one after another (at 16, 128 calls in flight, as the
    baseline's c=16 fan-out, with its ``TCPConnector(limit=200)``). Returns the latencies and
    this process's CPU time per fan-out (schedstat, as the service's; each loop's first fan-out,
    not timed, is counted in it)."""
    from context_assembly.contributors import (
        ContributorTarget,
        PacketFields,
        contribute_all,
        create_client,
    )
    from context_assembly.core.request import Message, Scope

    targets = [ContributorTarget(source=f"c{i}", url=url) for i, url in enumerate(urls)]
    fields = PacketFields(
        preparation_id="prep_floor",
        model="gpt-4o-mini",
        input=[Message(role="user", content="What finished?")],
        data_budget_tokens=4000,
        scope=Scope(),
        deadline_unix_ms=0,
    )
    client = create_client()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200))

    async def one() -> None:
        if how == "client":
            outcomes = await contribute_all(client, targets, fields, time.monotonic() + 5, 1 << 20)
            if any(not o.ok for o in outcomes):
                raise RuntimeError("a floor fan-out failed")
            return

        async def post(url: str) -> None:
            async with session.post(url, data=b'{"type":"contribute"}') as resp:
                orjson.loads(await resp.read())

        await asyncio.gather(*(post(url) for url in urls))

    latencies: list[float] = []
    remaining = total

    async def loop_of_fanouts() -> None:
        nonlocal remaining
        await one()  # this loop's connections, not counted
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            await one()
            latencies.append(time.perf_counter() - started)

    try:
        before = cpu_seconds(os.getpid())
        await asyncio.gather(*(loop_of_fanouts() for _ in range(concurrency)))
        cpu = cpu_seconds(os.getpid()) - before
    finally:
        await session.close()
        await client.aclose()
    return latencies, cpu / (total + concurrency)


def main() -> None:
    procs: list[ServedProcess] = []
    folder = Path(tempfile.mkdtemp(prefix="ca-bench-"))
    try:
        contributors, config = start_contributors(folder)
        procs += contributors
        contrib_ports = [proc.port for proc in contributors]
        service = start_service(config)
        procs.append(service)
        echo_app = start_echo(folder)
        procs.append(echo_app)
        svc = f"{service.url}/v1/prepare"
        echo = f"{echo_app.url}/v1/prepare"
        stored = f"{echo_app.url}/v1/prepare-stored"

        body = inline_request()
        print(f"inline prepare: 128 blocks, request body {len(body)} bytes")
        run(load(svc, body, 1, 50))
        run(load(echo, body, 1, 50))
        run(load(stored, body, 1, 50))
        prep, base, cpu, prep_aio, base_aio, base_stored = [], [], 0.0, [], [], []
        for _ in range(5):  # interleaved rounds
            before = cpu_seconds(service.pid)
            prep += run(load(svc, body, 1, 100))[0]
            cpu += cpu_seconds(service.pid) - before
            base += run(load(echo, body, 1, 100))[0]
            base_stored += run(load(stored, body, 1, 100))[0]
            prep_aio += run(load_aiohttp(svc, body, 1, 100))[0]
            base_aio += run(load_aiohttp(echo, body, 1, 100))[0]
        print(
            f"  prepare      p50 {pct(prep, 0.5):6.2f} ms  p99 {pct(prep, 0.99):6.2f} ms"
            f"  service CPU {cpu / len(prep) * 1000:5.2f} ms per prepare"
        )
        print(f"  FastAPI echo p50 {pct(base, 0.5):6.2f} ms  p99 {pct(base, 0.99):6.2f} ms")
        ratio = statistics.median(prep) / statistics.median(base)
        print(f"  ratio prepare/echo at p50: {ratio:.2f}x")
        # For reference: the echo that also writes the body durably before answering, as a
        # prepare writes its record (its 200 means stored). The figure with a target is a real
        # conversation's (bench_conversation.py), not a repeated body.
        stored_ratio = statistics.median(prep) / statistics.median(base_stored)
        print(
            f"  FastAPI echo that stores the body (SQLite, committed before the answer)"
            f" p50 {pct(base_stored, 0.5):6.2f} ms; ratio prepare/stored echo {stored_ratio:.2f}x"
        )
        report(
            "inline prepare, 128 repeated blocks, c=1 p50 / FastAPI echo that stores the body p50",
            f"{stored_ratio:.2f}x ({pct(prep, 0.5):.2f} / {pct(base_stored, 0.5):.2f} ms)",
            "",
            None,
        )
        print(
            f"  through aiohttp as the load client: prepare p50 {pct(prep_aio, 0.5):6.2f} ms,"
            f" echo p50 {pct(base_aio, 0.5):6.2f} ms,"
            f" ratio {statistics.median(prep_aio) / statistics.median(base_aio):.2f}x"
        )
        # The same request again and again is a repeated turn. Here every request carries one
        # new entry, whose count is not cached yet.
        fresh = [inline_request(turn) for turn in range(1000)]
        run(load(svc, fresh[:50], 1, 50))
        new, base, cpu = [], [], 0.0
        for round_ in range(5):
            chunk = fresh[50 + round_ * 100 : 150 + round_ * 100]
            before = cpu_seconds(service.pid)
            new += run(load(svc, chunk, 1, 100))[0]
            cpu += cpu_seconds(service.pid) - before
            base += run(load(echo, body, 1, 100))[0]
        print(
            f"  prepare, a new block every turn       p50 {pct(new, 0.5):6.2f} ms"
            f"  service CPU {cpu / len(new) * 1000:5.2f} ms per prepare"
        )
        ratio = statistics.median(new) / statistics.median(base)
        print(f"  ratio new-block/echo at p50: {ratio:.2f}x")

        fan = fanout_request(8)
        print("fan-out prepare: 8 contributors answering in 20 ms")
        run(load(svc, fan, 4, 40))
        urls = [f"http://127.0.0.1:{port}/c{i}" for i, port in enumerate(contrib_ports)]
        lat, client_floor, bare_floor, errors, cpu, lat_aio = [], [], [], 0, 0.0, []
        for _ in range(5):  # interleaved rounds: the service, then the two floors
            before = cpu_seconds(service.pid)
            round_lat, round_errors = run(load(svc, fan, 1, 40))
            cpu += cpu_seconds(service.pid) - before
            lat += round_lat
            errors += round_errors
            round_lat, round_errors = run(load_aiohttp(svc, fan, 1, 40))
            lat_aio += round_lat
            errors += round_errors
            client_floor += run(floor_fanouts(urls, 40, "client"))[0]
            bare_floor += run(floor_fanouts(urls, 40, "aiohttp"))[0]
        print(
            f"  c=1   n={len(lat)}  p50 {pct(lat, 0.5):6.2f} ms (target <= 24)"
            f"  p99 {pct(lat, 0.99):6.2f} ms (target <= 30)  errors {errors} (target 0)"
            f"  service CPU {cpu / len(lat) * 1000:5.2f} ms per prepare"
        )
        report(
            "fan-out 8 × 20 ms, c=1 p50", f"{pct(lat, 0.5):.2f} ms", "≤ 24 ms", pct(lat, 0.5) <= 24
        )
        report(
            "fan-out 8 × 20 ms, c=1 p99",
            f"{pct(lat, 0.99):.2f} ms",
            "≤ 30 ms",
            pct(lat, 0.99) <= 30,
        )
        added = pct(lat, 0.5) - pct(bare_floor, 0.5)
        print(
            f"  floors, no service: our contributor client p50 {pct(client_floor, 0.5):6.2f} ms,"
            f" bare aiohttp p50 {pct(bare_floor, 0.5):6.2f} ms;"
            f" the service adds {added:.2f} ms at p50 to the bare floor (target <= 3),"
            f" {pct(lat, 0.5) - pct(client_floor, 0.5):.2f} ms to its own client's"
        )
        report(
            "fan-out 8 × 20 ms, c=1 p50, what the service adds to the bare aiohttp fan-out p50"
            " (same run)",
            f"{added:.2f} ms ({pct(lat, 0.5):.2f} − {pct(bare_floor, 0.5):.2f} ms)",
            "≤ 3 ms",
            added <= 3,
        )
        print(
            f"  through aiohttp as the load client: p50 {pct(lat_aio, 0.5):6.2f} ms"
            f"  p99 {pct(lat_aio, 0.99):6.2f} ms (its own CPU is in these)"
        )
        # The first requests at c=16 open most of the 128 contributor connections (the pool holds
        # what c=4 and c=1 needed) and the load client's own: printed apart, not in the figures of
        # the steady state below, which is what a running service sees.
        errors_all = errors
        lat, errors = run(load(svc, fan, 16, 160))
        print(
            f"  c=16  n=160  p50 {pct(lat, 0.5):6.2f} ms  p99 {pct(lat, 0.99):6.2f} ms  errors {errors}"
            "  (warm-up: the contributor connection pool grows to 128)"
        )
        # The steady state, in four interleaved rounds with two floors at the same concurrency
        # and no service in the path: 16 loops of fan-outs from this process, through a bare
        # aiohttp session (the baseline's client) and through the service's own contributor
        # client. What the machine gives a fan-out at c=16 changes 2x between hours; the floors,
        # measured in the same minute, say how much of the service's p50 is the machine's. The
        # first 16 prepares of a round start in step and are not counted, as the first fan-out of
        # each floor loop is not.
        lat, errors, cpu, contributors_cpu, client_cpu, busy, total = [], 0, 0.0, 0.0, 0.0, 0.0, 0.0
        sent = 0  # with each round's first 16, whose latencies are not counted (``settle``)
        bare16: list[float] = []
        client16: list[float] = []
        bare16_cpu: list[float] = []  # this process's CPU per bare fan-out, by round
        client16_cpu: list[float] = []
        for _ in range(4):
            before = cpu_seconds(service.pid)
            before_contributors = sum(cpu_seconds(proc.pid) for proc in contributors)
            before_client = time.process_time()
            before_busy, before_total = machine_busy_seconds()
            round_lat, round_errors = run(load(svc, fan, 16, 200, settle=True))
            sent += 200 + 16
            after_busy, after_total = machine_busy_seconds()
            client_cpu += time.process_time() - before_client
            cpu += cpu_seconds(service.pid) - before
            contributors_cpu += (
                sum(cpu_seconds(proc.pid) for proc in contributors) - before_contributors
            )
            busy += after_busy - before_busy
            total += after_total - before_total
            lat += round_lat
            errors += round_errors
            floor_lat, floor_cpu = run(floor_fanouts(urls, 200, "aiohttp", 16))
            bare16 += floor_lat
            bare16_cpu.append(floor_cpu)
            floor_lat, floor_cpu = run(floor_fanouts(urls, 200, "client", 16))
            client16 += floor_lat
            client16_cpu.append(floor_cpu)
        per = 1000 / sent
        print(
            f"  c=16  n={len(lat)}  p50 {pct(lat, 0.5):6.2f} ms"
            f"  p99 {pct(lat, 0.99):6.2f} ms (target <= 80)  errors {errors} (target 0)"
            f"  service CPU {cpu * per:5.2f} ms per prepare"
        )
        # At c=16 the machine itself is the limit: what every process spent per prepare.
        print(
            f"        CPU per prepare: the eight contributors {contributors_cpu * per:5.2f} ms,"
            f" this load client {client_cpu * per:5.2f} ms;"
            f" machine busy {busy / total * 100:3.0f}% of {os.cpu_count()} cores"
        )
        print(
            f"  floors at c=16, no service: bare aiohttp p50 {pct(bare16, 0.5):6.2f} ms"
            f" p99 {pct(bare16, 0.99):6.2f} ms, our contributor client p50 {pct(client16, 0.5):6.2f} ms"
            f" p99 {pct(client16, 0.99):6.2f} ms"
        )
        print(
            f"  c=16  p50 ratio to the bare aiohttp floor of the same minutes:"
            f" {pct(lat, 0.5) / pct(bare16, 0.5):.2f}x"
        )
        # CPU, not latency: what the service spends on a prepare against what a bare aiohttp
        # fan-out of the same eight calls spends, both at c=16 and both from schedstat.
        bare_cpu, client_floor_cpu = statistics.mean(bare16_cpu), statistics.mean(client16_cpu)
        ratio = cpu * per / (bare_cpu * 1000)
        print(
            f"  c=16  CPU per fan-out, no service: bare aiohttp {bare_cpu * 1000:5.2f} ms,"
            f" our contributor client {client_floor_cpu * 1000:5.2f} ms;"
            f" service CPU per prepare / bare aiohttp CPU per fan-out {ratio:.2f}x (target <= 2.5)"
        )
        report(
            "fan-out 8 × 20 ms, c=16, service CPU per prepare / bare aiohttp CPU per fan-out",
            f"{ratio:.2f}x ({cpu * per:.2f} / {bare_cpu * 1000:.2f} ms)",
            "≤ 2.5x",
            ratio <= 2.5,
        )
        p99 = pct(lat, 0.99)
        report("fan-out 8 × 20 ms, c=16 p99", f"{p99:.2f} ms", "≤ 80 ms", p99 <= 80)
        report(
            "fan-out errors, c=1 and c=16", str(errors_all + errors), "0", errors_all + errors == 0
        )
        service.stop()
        procs.remove(service)
        scale_out(folder, contrib_ports, fan)
    finally:
        for proc in procs:
            proc.stop()
        shutil.rmtree(folder, ignore_errors=True)  # the SQLite file and the config


def scale_out(folder: Path, contrib_ports: list[int], fan: bytes) -> None:
    """The documented scale-out: ``--workers 2`` on the Redis store (127.0.0.1:6379, a key
    prefix of its own, deleted at the end), the same fan-out at c=16 after a warm-up."""
    prefix = f"ca-bench-{secrets.token_hex(4)}:"
    config = folder / "bench-redis.toml"
    store = [
        "[store]",
        'backend = "redis"',
        f'redis_url = "{REDIS_URL}"',
        f'key_prefix = "{prefix}"',
    ]
    config.write_text("\n".join([*store, *registrations(contrib_ports)]))
    service = start_service(config, "--workers", "2")
    try:
        svc = f"{service.url}/v1/prepare"
        lat, errors = run(load(svc, fan, 16, 160))  # both workers' contributor pools grow
        print(
            f"  --workers 2, Redis store: c=16 n=160  p50 {pct(lat, 0.5):6.2f} ms"
            f"  p99 {pct(lat, 0.99):6.2f} ms  errors {errors}  (warm-up)"
        )
        lat, errors = run(load(svc, fan, 16, 800, settle=True))
        p99 = pct(lat, 0.99)
        print(
            f"  --workers 2, Redis store: c=16 n={len(lat)}  p50 {pct(lat, 0.5):6.2f} ms"
            f"  p99 {p99:6.2f} ms (target <= 80)  errors {errors} (target 0)"
        )
        report(
            "fan-out 8 × 20 ms, c=16, --workers 2 on the Redis store: errors, p99",
            f"{errors} errors, p99 {p99:.2f} ms",
            "0 errors, ≤ 80 ms",
            errors == 0 and p99 <= 80,
        )
    finally:
        service.stop()
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{prefix}*"):
            client.delete(key)
        client.close()


if __name__ == "__main__":
    main()
