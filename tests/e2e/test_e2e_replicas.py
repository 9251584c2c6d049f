"""Scale-out end to end: replicas sharing Redis, and the service through a Redis outage."""

from __future__ import annotations

import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_lib
from context_assembly_client.testing import ServedProcess
from e2e_support import ServiceFactory

pytestmark = pytest.mark.e2e


def redis_config(url: str, prefix: str) -> str:
    return f'[store]\nbackend = "redis"\nredis_url = "{url}"\nkey_prefix = "{prefix}"\n'


def prepare_body() -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "instructions": "Be exact.",
        "plugins": [{"name": "memory"}],
        "contributions": [
            {
                "source": "memory",
                "revision": 1,
                "blocks": [{"id": "a", "text": "fact a", "protected": True}],
            }
        ],
        "input": [{"role": "user", "content": "hi"}],
    }


def test_two_replicas_share_preparations_and_survive_one_dying(
    service_factory: ServiceFactory,
) -> None:
    """Prepare on A; validate, usage, breakdown and refresh on B; kill A and keep going on B."""
    prefix = f"ca-e2e-{secrets.token_hex(4)}:"
    config = redis_config("redis://127.0.0.1:6379/14", prefix)
    cleanup = redis_lib.Redis.from_url("redis://127.0.0.1:6379/14")
    try:
        _replicas(service_factory, config)
    finally:
        for key in cleanup.scan_iter(f"{prefix}*"):
            cleanup.delete(key)
        cleanup.close()


def _replicas(service_factory: ServiceFactory, config: str) -> None:
    a = service_factory(config)
    b = service_factory(config)
    with httpx.Client(timeout=5) as client:
        acknowledged = []
        for _ in range(3):
            prep = client.post(f"{a.base}/v1/prepare", json=prepare_body())
            assert prep.status_code == 200, prep.text
            acknowledged.append(prep.json())
        first = acknowledged[0]
        pid = first["preparation_id"]
        frame = {"messages": first["frame"]["messages"], "tools": first["frame"]["tools"]}
        assert (
            client.post(
                f"{b.base}/v1/preparations/{pid}/validate",
                json={"model": "gpt-4o-mini", "frame": frame},
            ).status_code
            == 200
        )
        usage = {"report_id": "r1", "provider": "openai", "usage": {"prompt_tokens": 50}}
        assert client.post(f"{b.base}/v1/preparations/{pid}/usage", json=usage).status_code == 200
        assert "memory/a" in client.get(f"{b.base}/v1/preparations/{pid}/breakdown").text
        a.stop()  # replica A goes away; nothing it acknowledged may be lost
        for prep in acknowledged:
            view = client.get(f"{b.base}/v1/preparations/{prep['preparation_id']}")
            assert view.status_code == 200
            assert view.json()["fingerprint"] == prep["fingerprint"]
        refreshed = client.post(f"{b.base}/v1/preparations/{pid}/refresh", json=prepare_body())
        assert refreshed.status_code == 200 and refreshed.json()["attempt"] == 2
        again = client.post(f"{b.base}/v1/preparations/{pid}/usage", json=usage)
        assert again.json()["accounting"]["last"]["provider_input_tokens"] == 50
        assert client.post(f"{b.base}/v1/preparations/{pid}/refresh", json=prepare_body()).json()[
            "reasons"
        ] == ["refresh_used"]


def _start_redis(folder: Path) -> ServedProcess:
    """A ``redis-server`` of the test's own on a free port, ready once it takes connections."""
    exe = shutil.which("redis-server")
    assert exe is not None, (
        "redis-server is needed for the outage test (.ci/ensure-redis installs it)"
    )
    command = [exe, "--port", "{port}", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", str(folder)]  # fmt: skip
    return ServedProcess(command, ready=None)


def test_redis_outage_gives_503_fast_and_recovers(
    service_factory: ServiceFactory, tmp_path: Path
) -> None:
    """Redis stopped: /readyz and store calls answer 503 STORE_UNAVAILABLE (an answer, not a
    hang: the client gives up after 30 s); once Redis is back the service is ready again and
    prepares, with no restart."""
    redis = _start_redis(tmp_path)
    try:
        svc = service_factory(redis_config(f"redis://127.0.0.1:{redis.port}/0", "ca-outage:"))
        with httpx.Client(base_url=svc.base, timeout=30) as client:
            assert client.get("/readyz").status_code == 200
            pid = client.post("/v1/prepare", json=prepare_body()).json()["preparation_id"]
            redis.stop()
            for call in (
                lambda: client.get("/readyz"),
                lambda: client.post("/v1/prepare", json=prepare_body()),
                lambda: client.get(f"/v1/preparations/{pid}"),
            ):
                response = call()
                assert response.status_code == 503, response.text
                assert response.headers["content-type"] == "application/problem+json"
                assert response.json()["code"] == "STORE_UNAVAILABLE"
            redis.restart()  # the same port
            # Bounded polling: a pooled connection to the stopped Redis may fail once before the
            # client replaces it; 20 s is a hang guard, not a promise of speed.
            back = time.monotonic() + 20
            while client.get("/readyz").status_code != 200:
                if time.monotonic() > back:
                    pytest.fail("not ready again after Redis returned")
                time.sleep(0.05)
            assert client.post("/v1/prepare", json=prepare_body()).status_code == 200
    finally:
        redis.stop()


def test_turns_alternating_between_replicas_find_the_previous_turn(
    service_factory: ServiceFactory,
) -> None:
    """The previous-turn pointer lives in Redis: turn N on replica A, turn N+1 on replica B,
    and every turn after the first keeps the prefix of the one before (found, not named)."""
    prefix = f"ca-e2e-{secrets.token_hex(4)}:"
    config = redis_config("redis://127.0.0.1:6379/14", prefix)
    cleanup = redis_lib.Redis.from_url("redis://127.0.0.1:6379/14")
    try:
        replicas = [service_factory(config), service_factory(config)]
        fields: dict[str, Any] = {
            **prepare_body(),
            "model": "claude-sonnet-4-5",
            "render": "anthropic",
            "assembly": {"layout": "stable-prefix"},
            "scope": {"task_id": f"t-{secrets.token_hex(4)}"},
            "cache": {"breakpoints": True},
            "history": [],
        }
        reports, ids = [], []
        with httpx.Client(timeout=5) as client:
            for number in range(6):
                replica = replicas[number % 2]
                answer = client.post(f"{replica.base}/v1/prepare", json=fields)
                assert answer.status_code == 200, answer.text
                reports.append(answer.json()["selection"]["cache"])
                ids.append(answer.json()["preparation_id"])
                fields["history"] = [
                    *fields["history"],
                    {"role": "user", "content": f"question {number}"},
                    {"role": "assistant", "content": f"answer {number}"},
                ]
            timeline = client.get(
                f"{replicas[0].base}/v1/preparations/{ids[-1]}/timeline",
                headers={"accept": "application/json"},
            )
        assert reports[0]["prefix_kept"] is None
        assert [r["previous_preparation_id"] for r in reports[1:]] == ids[:-1]
        assert all(r["prefix_kept"] is True for r in reports[1:])
        assert [t["preparation_id"] for t in timeline.json()["turns"]] == ids
    finally:
        for key in cleanup.scan_iter(f"{prefix}*"):
            cleanup.delete(key)
        cleanup.close()
