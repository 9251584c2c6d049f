"""What the served-process benchmarks run against on loopback: the processes they start (the
loopback contributors, each its own process, with the service's TOML registering them, and the
FastAPI echo of bench/echo_app.py) and the prepare requests they send (the 128-block inline
prepare, the fan-out to the registered contributors). bench_service.py measures with them, and
bench_ab.py, bench_cache.py, bench_conversation.py, bench_inprocess.py, bench_load.py and
bench_stages.py reuse them.
"""

from __future__ import annotations

from pathlib import Path

import orjson
from context_assembly_client.testing import ServedProcess, Step, start_app, start_contributor

HERE = Path(__file__).resolve().parent


BLOCKS = [
    {"id": f"{{source}}-{i}", "text": f"fact {i} from {{source}} " * 8, "priority": i}
    for i in range(4)
]
"""The loopback contributors' answer: four blocks named after the packet's source."""


def start_loopback_contributor(delay_ms: int) -> ServedProcess:
    """A loopback contributor: the scripted double (``context_assembly_client.testing``) in a
    process of its own on uvloop, answering every call after ``delay_ms`` with ``BLOCKS``."""
    return start_contributor(default=Step(delay=delay_ms / 1000, blocks=BLOCKS), uvloop=True)


def start_contributors(folder: Path, n: int = 8) -> tuple[list[ServedProcess], Path]:
    """``n`` loopback contributors (each its own process) answering in 20 ms and the service's
    TOML in ``folder`` registering them as ``c0``.., with its SQLite file there too."""
    procs: list[ServedProcess] = []
    try:
        for _ in range(n):
            procs.append(start_loopback_contributor(20))
    except BaseException:
        for proc in procs:
            proc.stop()  # the caller never saw them
        raise
    config = folder / "bench.toml"
    store = ["[store]", f'path = "{folder / "bench.db"}"']
    config.write_text("\n".join([*store, *registrations([proc.port for proc in procs])]))
    return procs, config


def start_echo(folder: Path) -> ServedProcess:
    """The FastAPI echo (bench/echo_app.py) under uvicorn on uvloop and httptools, its SQLite
    file in ``folder``."""
    return start_app(
        "echo_app:app", "--loop", "uvloop", "--http", "httptools", app_dir=HERE,
        env={"ECHO_DB": str(folder / "echo.db")},
    )  # fmt: skip


def registrations(ports: list[int]) -> list[str]:
    """TOML lines registering the contributors on ``ports`` as ``c0``..."""
    lines = [""]
    for i, port in enumerate(ports):
        lines += [f"[contributors.c{i}]", f'url = "http://127.0.0.1:{port}/c{i}"', ""]
    return lines


def inline_request(turn: int | None = None) -> bytes:
    """The 128-block inline prepare; with ``turn``, entry 0 names that turn, so each turn has a
    block whose count is not cached yet."""
    blocks = [
        {
            "id": f"entry-{i}",
            "text": f"Entry {i}: the export job for account {i} finished; details follow. " * 2,
            "priority": (i * 37) % 200 - 100,
            "dependencies": [f"memory/entry-{i - 1}"] if i % 5 else [],
        }
        for i in range(128)
    ]
    if turn is not None:
        blocks[0]["text"] = f"Turn {turn}: a new entry arrived. " + str(blocks[0]["text"])
    body = {
        "model": "gpt-4o-mini",
        "instructions": "Be exact.",
        "assembly": {"max_data_tokens": 8000, "layout": "stable-prefix"},
        "plugins": [{"name": "memory", "instructions": "Saved entries."}],
        "contributions": [{"source": "memory", "revision": 1, "blocks": blocks}],
        "input": [{"role": "user", "content": "What finished?"}],
    }
    return orjson.dumps(body)


def fanout_request(n: int) -> bytes:
    names = [f"c{i}" for i in range(n)]
    return orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "instructions": "Be exact.",
            "assembly": {"max_data_tokens": 4000, "timeout_ms": 2000},
            "plugins": [{"name": name} for name in names],
            "contributors": [{"source": name, "endpoint": name} for name in names],
            "input": [{"role": "user", "content": "What finished?"}],
        }
    )
