"""Durability end to end: what the service acknowledged survives a SIGKILL, on both stores.

A real service process serves agents that prepare, report the usage of each call, and prepare
again; it is killed (SIGKILL, no shutdown at all) right after the last acknowledgement, and a new
process on the same SQLite file or Redis prefix must find every acknowledged preparation and
every acknowledged usage report in its accounting.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis as redis_lib
from e2e_support import Service, ServiceFactory

pytestmark = pytest.mark.e2e

AGENTS = 4
TURNS = 50  # AGENTS * TURNS = 200 prepares
REDIS_URL = "redis://127.0.0.1:6379/14"


def prepare_body(agent: int, turn: int) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "instructions": "Be brief.",
        "plugins": [{"name": "memory"}],
        "contributions": [
            {
                "source": "memory",
                "revision": turn + 1,
                "blocks": [{"id": f"a{agent}", "text": f"fact {agent}.{turn}"}],
            }
        ],
        "input": [{"role": "user", "content": f"turn {turn}"}],
    }


async def run_agents(svc: Service) -> tuple[list[str], dict[str, int]]:
    """Every agent prepares, reports that call's usage, and prepares again, ``TURNS`` times; its
    last prepare gets no report (the process is killed first). Returns the acknowledged ids and,
    per id, the ``prompt_tokens`` of its acknowledged report."""
    prepared: list[str] = []
    reported: dict[str, int] = {}

    async def agent(client: httpx.AsyncClient, number: int) -> None:
        for turn in range(TURNS):
            answer = await client.post("/v1/prepare", json=prepare_body(number, turn))
            assert answer.status_code == 200, answer.text
            prep_id = answer.json()["preparation_id"]
            prepared.append(prep_id)
            if turn == TURNS - 1:
                return  # the last acknowledgement of this agent is a prepare
            tokens = 1000 * number + turn + 1
            usage = {
                "report_id": f"r-{prep_id}",
                "provider": "openai",
                "usage": {"prompt_tokens": tokens, "completion_tokens": 7},
            }
            answer = await client.post(f"/v1/preparations/{prep_id}/usage", json=usage)
            assert answer.status_code == 200, answer.text
            reported[prep_id] = tokens

    async with httpx.AsyncClient(base_url=svc.base, timeout=10) as client:
        await asyncio.gather(*(agent(client, n) for n in range(AGENTS)))
    return prepared, reported


def kill_run_and_check(service_factory: ServiceFactory, config: str) -> None:
    svc = service_factory(config)
    prepared, reported = asyncio.run(run_agents(svc))
    svc.proc.kill()  # right after the last acknowledgement: no shutdown, nothing flushed
    svc.proc.wait(10)
    assert len(prepared) == AGENTS * TURNS
    assert len(reported) == AGENTS * (TURNS - 1)

    again = service_factory(svc.config.read_text())  # the same file or prefix, a new process
    missing: list[str] = []
    wrong: list[str] = []
    with httpx.Client(base_url=again.base, timeout=10) as client:
        for prep_id in prepared:
            view = client.get(f"/v1/preparations/{prep_id}")
            if view.status_code != 200:
                missing.append(prep_id)
                continue
            last = view.json()["accounting"]["last"]
            if prep_id in reported:
                if last is None or last["provider_input_tokens"] != reported[prep_id]:
                    wrong.append(prep_id)
            elif last is not None:
                wrong.append(prep_id)
    assert missing == [], f"{len(missing)} acknowledged preparations lost"
    assert wrong == [], f"{len(wrong)} accountings without their acknowledged report"


def test_sqlite_keeps_everything_acknowledged_through_a_sigkill(
    service_factory: ServiceFactory,
) -> None:
    """SQLite: every acknowledged prepare and usage report is in the file after a SIGKILL."""
    kill_run_and_check(service_factory, '[store]\nbackend = "sqlite"\npath = "{db}"\n')


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    prefix = f"ca-e2e-{secrets.token_hex(4)}:"
    yield prefix
    cleanup = redis_lib.Redis.from_url(REDIS_URL)
    try:
        for key in cleanup.scan_iter(f"{prefix}*"):
            cleanup.delete(key)
    finally:
        cleanup.close()


def test_redis_keeps_everything_acknowledged_through_a_sigkill(
    service_factory: ServiceFactory, redis_prefix: str
) -> None:
    """Redis: every acknowledged prepare and usage report is there after a SIGKILL."""
    config = (
        f'[store]\nbackend = "redis"\nredis_url = "{REDIS_URL}"\nkey_prefix = "{redis_prefix}"\n'
    )
    kill_run_and_check(service_factory, config)
