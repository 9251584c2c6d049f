"""A/B of the service against another git revision, in one run on the same contributors.

A change worth a few percent of a prepare's CPU cannot be read off two runs of
``bench_service.py``: this machine's speed moves more than that within the hour. Here the service
of the working tree (B) and the service of ``--base`` (A, checked out into a temporary git
worktree and run with ``PYTHONPATH`` pointing at it, on the same virtualenv) serve the fan-out
prepare of ``bench_service.py`` side by side, against the same eight loopback contributors, in
interleaved rounds that take the six orders of the three services in turn (a service's place in
a round moved its figures by several percent in trials). A third service, a second copy of A (the control),
runs in the same rounds: its ratio to A is what two processes of the same code differ by on this
machine, and a B/A ratio inside that spread says nothing.

Per concurrency it prints the median over rounds of the per-round ratios: p50 latency and the
service's CPU per prepare (``/proc`` schedstat, all threads). Each service has its own SQLite file.
The base runs on this virtualenv's packages: a revision that needs other dependencies is not
comparable this way.

``--workload inline`` compares the 128-block inline prepare of ``bench_service.py`` (a repeated
turn, no contributor called) instead of the fan-out.

    .venv/bin/python bench/bench_ab.py --base HEAD~1 [--rounds 6] [--concurrency 1,16]
        [--workload fanout|inline]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import load_client
import loopback
from context_assembly_client import testing
from context_assembly_client.testing import ServedProcess

ROOT = loopback.HERE.parent
REQUESTS = {1: 100, 16: 480}  # prepares per service per round, by concurrency


@dataclass
class Service:
    name: str
    process: ServedProcess
    url: str
    p50: dict[int, list[float]] = field(default_factory=dict)
    cpu: dict[int, list[float]] = field(default_factory=dict)


def worktree(base: str, folder: Path) -> Path:
    """``base`` checked out (detached) under ``folder``."""
    path = folder / "base"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), base],
        check=True,
    )
    return path


def start_service(name: str, source: Path, config: Path, folder: Path) -> Service:
    """A service of the code under ``source`` (a ``service/`` folder) with its own SQLite file."""
    own = folder / f"{name}.toml"
    own.write_text(config.read_text().replace("bench.db", f"{name}.db"))
    process = testing.start_service(own, env={"PYTHONPATH": str(source)})
    return Service(name, process, f"{process.url}/v1/prepare")


def ratio(numerators: list[float], denominators: list[float]) -> float:
    """The median of the per-round ratios."""
    return statistics.median(n / d for n, d in zip(numerators, denominators, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision to compare with (A)")
    parser.add_argument("--rounds", type=int, default=6, help="a multiple of 6 balances the orders")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated: 1 and/or 16")
    parser.add_argument(
        "--workload",
        choices=("fanout", "inline"),
        default="fanout",
        help="the fan-out prepare to 8 contributors, or the 128-block inline prepare",
    )
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]
    if any(level not in REQUESTS for level in levels):
        parser.error(f"--concurrency takes {sorted(REQUESTS)}")

    folder = Path(tempfile.mkdtemp(prefix="ca-ab-"))
    procs: list[ServedProcess] = []
    base_tree: Path | None = None
    try:
        base_tree = worktree(args.base, folder)
        contributors, config = loopback.start_contributors(folder)
        procs += contributors
        services = [
            start_service("A", base_tree / "service", config, folder),
            start_service("A2", base_tree / "service", config, folder),
            start_service("B", ROOT / "service", config, folder),
        ]
        procs += [service.process for service in services]
        orders = list(itertools.permutations(services))
        body = (
            loopback.fanout_request(8) if args.workload == "fanout" else loopback.inline_request()
        )
        for service in services:  # connections, caches
            load_client.run(load_client.load(service.url, body, 16, 480))
            load_client.run(load_client.load(service.url, body, 1, 50))
        for level in levels:
            total = REQUESTS[level]
            for round_ in range(args.rounds):
                order = orders[round_ % len(orders)]
                for service in order:
                    before = load_client.cpu_seconds(service.process.pid)
                    latencies, errors = load_client.run(
                        load_client.load(service.url, body, level, total)
                    )
                    if errors:
                        raise RuntimeError(f"{service.name}: {errors} failed prepares")
                    cpu_ms = (load_client.cpu_seconds(service.process.pid) - before) / total * 1000
                    service.p50.setdefault(level, []).append(load_client.pct(latencies, 0.5))
                    service.cpu.setdefault(level, []).append(cpu_ms)
            a, a2, b = services
            print(
                f"c={level:<2} {args.rounds} rounds of {total}: p50 A {statistics.median(a.p50[level]):.2f}"
                f" ms, B {statistics.median(b.p50[level]):.2f} ms; CPU per prepare"
                f" A {statistics.median(a.cpu[level]):.2f} ms, B {statistics.median(b.cpu[level]):.2f} ms"
            )
            print(
                f"      B/A  p50 {ratio(b.p50[level], a.p50[level]):.3f}x"
                f"  CPU {ratio(b.cpu[level], a.cpu[level]):.3f}x"
            )
            print(
                f"      control A2/A (same code)  p50 {ratio(a2.p50[level], a.p50[level]):.3f}x"
                f"  CPU {ratio(a2.cpu[level], a.cpu[level]):.3f}x"
            )
    finally:
        for proc in procs:
            proc.stop()
        if base_tree is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)],
                check=False,
            )
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
