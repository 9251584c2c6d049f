"""A large prepare on a real ``context-assembly serve`` process does not hold other requests:
its token counting runs off the event loop (``offload.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson
import pytest
from e2e_support import ServiceFactory

pytestmark = pytest.mark.e2e

CONFIG = """
[store]
backend = "sqlite"
path = "{db}"

[limits]
max_body_bytes = 16777216
"""


def four_mb_prepare() -> bytes:
    words = " ".join(f"word-{i % 9973}" for i in range(500_000))[: 4 * 1024 * 1024]
    return orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "instructions": "Be exact.",
            "input": [{"role": "user", "content": words}],
        }
    )


def worker_threads_cpu_ns(pid: int) -> int:
    """The CPU time, in ns, of process ``pid``'s threads other than its main thread (the event
    loop's), from the kernel's per-thread accounting (``/proc/<pid>/task/<tid>/schedstat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        if task.name == str(pid):
            continue
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # the thread ended while we looked
    return total


async def test_healthz_is_answered_while_a_4mb_prepare_is_counted_off_the_loop(
    service_factory: ServiceFactory,
) -> None:
    """While a prepare whose input is one 4 MB string is counted (and refused: 1.3 M tokens do
    not fit the window), /healthz is answered: at least one check starts and ends while a
    worker thread is counting (the threads beside the event loop's gain CPU time across it)
    and the prepare is still unanswered. Counted on the loop, no check could be answered
    while the count runs, and no other thread would be busy."""
    svc = service_factory(CONFIG)
    body = four_mb_prepare()
    pid = svc.proc.pid
    async with (
        httpx.AsyncClient(base_url=svc.base, timeout=60) as big,
        httpx.AsyncClient(base_url=svc.base, timeout=60) as small,
    ):
        await small.get("/healthz")  # the connection is open
        prepare = asyncio.create_task(
            big.post("/v1/prepare", content=body, headers={"content-type": "application/json"})
        )
        during_count = 0
        while not prepare.done():  # bounded: the prepare ends (the client gives up after 60 s)
            before = worker_threads_cpu_ns(pid)
            check = await small.get("/healthz")
            assert check.status_code == 200
            if worker_threads_cpu_ns(pid) > before and not prepare.done():
                during_count += 1
        response = await prepare
    assert response.status_code == 422
    assert response.json()["code"] == "CONTEXT_OVERFLOW"
    assert response.json()["needed_tokens"] > 1_000_000  # the whole input was counted
    assert during_count >= 1, "no check was answered while a worker thread counted"
