"""A large prepare on a real ``context-assembly serve`` process does not hold other requests:
its token counting runs off the event loop (``offload.py``)."""

from __future__ import annotations

import asyncio
import time

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


async def test_healthz_keeps_answering_while_a_4mb_prepare_is_counted(
    service_factory: ServiceFactory,
) -> None:
    """While a prepare whose input is one 4 MB string is counted (and refused: 1.3 M tokens do
    not fit the window), /healthz answers back to back: its slowest answer is under half of
    the prepare's time (on the loop, one check waited for the whole count)."""
    svc = service_factory(CONFIG)
    body = four_mb_prepare()
    done = asyncio.Event()
    checks: list[float] = []

    async def poll(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            started = time.perf_counter()
            assert (await client.get("/healthz")).status_code == 200
            checks.append(time.perf_counter() - started)

    async with (
        httpx.AsyncClient(base_url=svc.base, timeout=60) as big,
        httpx.AsyncClient(base_url=svc.base, timeout=60) as small,
    ):
        await small.get("/healthz")  # the connection is open
        poller = asyncio.create_task(poll(small))
        started = time.perf_counter()
        response = await big.post(
            "/v1/prepare", content=body, headers={"content-type": "application/json"}
        )
        took = time.perf_counter() - started
        done.set()
        await poller
    assert response.status_code == 422
    assert response.json()["code"] == "CONTEXT_OVERFLOW"
    assert response.json()["needed_tokens"] > 1_000_000  # the whole input was counted
    assert len(checks) >= 2
    assert max(checks) < took / 2, (max(checks), took)
