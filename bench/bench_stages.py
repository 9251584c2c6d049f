"""Where a fan-out prepare's CPU goes inside a running service, stage by stage.

Starts the eight loopback contributors of ``bench_service.py`` (each its own process,
answering in 20 ms) and the service, in a process of its own whose synchronous prepare stages
are wrapped in thread-CPU timers (``time.thread_time_ns`` before and after each call: what the
event loop's thread itself spent, not the time it was preempted or waiting). Then sends
prepares at concurrency 16 and at 1 and prints, per stage, the CPU per call, the calls per
prepare and the stage's share of the service's whole CPU per prepare (all its threads, from
/proc, as ``bench_service.py`` reads it).

Why: a step measured warm in a tight loop costs a half to a quarter of what it costs in the
service under load, where the eight contributor processes, the load client and the service share
two cores and every cache is cold again after each wait. Optimise what
this table shows, not what a micro-benchmark shows.

The timers cost 1–2 µs per call (two clock reads; the figure is printed); the async parts
(the fan-out itself, the HTTP layers) are what is left of the whole once the stages are taken
out. Bounded: fixed request counts, loopback only, every process stopped at the end.
Run: ``.venv/bin/python bench/bench_stages.py [--n16 3000] [--n1 300]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import load_client
import loopback
from context_assembly_client.testing import ServedProcess

# (module, owner attribute or "", function name): the synchronous steps of one prepare.
STAGES = (
    ("context_assembly.preparations.operations", "", "plan_sources"),
    ("context_assembly.preparations.operations", "", "new_preparation_id"),
    ("context_assembly.preparations.targets", "", "check_blocks"),
    ("context_assembly.preparations.targets", "", "raise_for_failures"),
    ("context_assembly.preparations.targets", "", "materialised_inputs"),
    ("context_assembly.offload", "", "run_assembly"),
    ("context_assembly.preparations.operations", "", "to_response"),
    ("context_assembly.preparations.operations", "Prepared", "of"),
    ("context_assembly.preparations.operations", "", "record_of"),
    ("context_assembly.preparations.record", "StoredPreparation", "dump"),
    ("context_assembly.storage.sqlite", "", "_write"),
    ("context_assembly.metrics", "Metrics", "observe_preparation"),
)
OUT_ENV = "CA_BENCH_STAGES_OUT"


def _timed(fn: Callable[..., Any], tally: list[int]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            tally[0] += 1
            tally[1] += time.thread_time_ns() - started

    return wrapper


def serve_with_timers(argv: list[str]) -> None:
    """The service with its stages timed; the tallies go to ``$CA_BENCH_STAGES_OUT`` at exit."""
    import importlib

    from context_assembly.cli import main

    tallies: dict[str, list[int]] = {}
    for module_name, owner_name, name in STAGES:
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        tally = tallies[f"{owner_name}.{name}" if owner_name else name] = [0, 0]
        # Functions and methods alike: ``Prepared.of`` comes back as the class's bound
        # classmethod, which the wrapper calls as the class did.
        setattr(owner, name, _timed(getattr(owner, name), tally))

    def write(*_: object) -> None:
        Path(os.environ[OUT_ENV]).write_text(json.dumps(tallies))
        os._exit(0)

    def reset(*_: object) -> None:
        for tally in tallies.values():
            tally[0] = tally[1] = 0

    # uvicorn restores this handler when it has shut down, and raises SIGTERM again.
    signal.signal(signal.SIGTERM, write)
    signal.signal(signal.SIGUSR1, reset)  # the warm-up is over
    main(argv)
    write()


def timer_overhead_us() -> float:
    tally = [0, 0]
    noop = _timed(lambda: None, tally)
    started = time.perf_counter_ns()
    for _ in range(20_000):
        noop()
    return (time.perf_counter_ns() - started) / 20_000 / 1000


def run(n16: int, n1: int) -> None:
    procs: list[ServedProcess] = []
    folder = Path(tempfile.mkdtemp(prefix="ca-stages-"))
    try:
        contributors, config = loopback.start_contributors(folder)
        procs += contributors
        print(f"timer cost ~{timer_overhead_us():.2f} µs per timed call (included below)")
        body = loopback.fanout_request(8)
        for concurrency, total in ((16, n16), (1, n1)):
            out = folder / f"stages-{concurrency}.json"
            service = ServedProcess(
                [sys.executable, str(Path(__file__).resolve()), "--serve-with-timers", "serve",
                 "--port", "{port}", "--config", str(config)],
                env={**os.environ, OUT_ENV: str(out)},
            )  # fmt: skip
            url = f"{service.url}/v1/prepare"
            try:
                load_client.run(load_client.load(url, body, 16, 480))  # connections, caches
                service.proc.send_signal(signal.SIGUSR1)
                time.sleep(0.2)
                before = load_client.cpu_seconds(service.pid)
                latencies, errors = load_client.run(load_client.load(url, body, concurrency, total))
                cpu_us = (load_client.cpu_seconds(service.pid) - before) / len(latencies) * 1e6
            finally:
                service.stop()
            tallies = json.loads(out.read_text())
            print(
                f"c={concurrency}: {total} prepares, p50 {load_client.pct(latencies, 0.5):.2f} ms,"
                f" errors {errors}, service CPU {cpu_us:.0f} µs per prepare"
            )
            print(f"  {'stage':34s} {'µs/call':>8s} {'calls':>6s} {'µs/prep':>8s} {'share':>6s}")
            staged = 0.0
            rows = []
            for name, (calls, ns) in tallies.items():
                if calls:
                    per_prepare = ns / 1000 / total
                    staged += per_prepare
                    rows.append((per_prepare, name, ns / calls / 1000, calls / total))
            for per_prepare, name, per_call, calls in sorted(rows, reverse=True):
                print(
                    f"  {name:34s} {per_call:8.1f} {calls:6.1f} {per_prepare:8.1f}"
                    f" {per_prepare / cpu_us * 100:5.1f}%"
                )
            print(
                f"  {'the rest (fan-out, HTTP, loop)':34s} {'':8s} {'':6s}"
                f" {cpu_us - staged:8.1f} {(cpu_us - staged) / cpu_us * 100:5.1f}%"
            )
    finally:
        for proc in procs:
            proc.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-with-timers":
        serve_with_timers(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n16", type=int, default=3000, help="prepares at concurrency 16")
    parser.add_argument("--n1", type=int, default=300, help="prepares at concurrency 1")
    args = parser.parse_args()
    run(args.n16, args.n1)


if __name__ == "__main__":
    main()
