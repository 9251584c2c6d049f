"""A large prepare on a real ``context-assembly serve`` process does not hold other requests:
its parsing and its token counting run off the event loop (``offload.py``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import orjson
import pytest
from e2e_support import ServiceFactory

from context_assembly.core.request import MAX_MESSAGES

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


def responses_items(count: int) -> bytes:
    """A prepare whose history is ``count`` small OpenAI Responses items (messages, calls and
    their outputs, as an agent loop leaves them), within the message limit."""
    items: list[dict[str, object]] = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            items.append({"role": "user", "content": [{"type": "input_text", "text": f"q {i}"}]})
        elif kind == 1:
            items.append(
                {"type": "function_call", "call_id": f"c{i}", "name": "find", "arguments": "{}"}
            )
        elif kind == 2:
            items.append({"type": "function_call_output", "call_id": f"c{i - 1}", "output": "ok"})
        else:
            items.append({"role": "assistant", "content": [{"type": "output_text", "text": "a"}]})
    return orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "max_context_tokens": 10_000_000,
            "history": items,
            "input": [{"role": "user", "content": "next?"}],
        }
    )


async def test_healthz_waits_little_while_many_messages_are_parsed(
    service_factory: ServiceFactory,
) -> None:
    """A prepare of 9,999 small Responses items (the most a request may send with its input) is
    parsed, read into neutral messages and validated in a worker thread, a few thousand items at
    a time, and answered from there too. While it is served, the slowest /healthz check waits
    less than an eighth of the prepare's own time (parsed and answered on the loop, as before,
    a check waited about a fifth of it: the whole parse)."""
    svc = service_factory(CONFIG)
    body = responses_items(MAX_MESSAGES - 1)
    waits: list[float] = []
    async with (
        httpx.AsyncClient(base_url=svc.base, timeout=60) as big,
        httpx.AsyncClient(base_url=svc.base, timeout=60) as small,
    ):
        await small.get("/healthz")  # the connection is open
        sent = time.perf_counter()
        prepare = asyncio.create_task(
            big.post("/v1/prepare", content=body, headers={"content-type": "application/json"})
        )
        while not prepare.done():  # bounded: the prepare ends (the client gives up after 60 s)
            started = time.perf_counter()
            check = await small.get("/healthz")
            assert check.status_code == 200
            waits.append(time.perf_counter() - started)
        response = await prepare
        took = time.perf_counter() - sent
    assert response.status_code == 200, response.text
    assert len(waits) >= 3
    assert max(waits) < took / 8, (max(waits), took)
