"""The fan-out on idle keep-alive connections (``calls._Burst``) against real loopback servers.

A contributor with an idle connection gets its request written at once and its answer handled by
callbacks, with one timer for the fan-out; a contributor without one goes through
``_contribute_one`` (a task, a new connection). Every fault must settle the same way on both
paths: same status, same cause, within the same deadline, with the connection closed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from faults import DEADLINE, SLACK, FaultServer, fan_out, registered, servers

from context_assembly.contributors import (
    ContributorOutcome,
    ContributorTarget,
    PacketFields,
    calls,
    create_client,
)
from context_assembly.contributors.client import contributor_limits

# Each fault, as FaultServer settings applied after the connection is pooled.
FAULTS: list[dict[str, Any]] = [
    {"behaviour": "ok", "delay": 1.0},
    {"behaviour": "hang"},
    {"behaviour": "slow_headers", "interval": 0.05},
    {"behaviour": "drip", "interval": 0.05},
    {"behaviour": "reset"},
    {"behaviour": "oversize", "declare": False},
    {"behaviour": "oversize", "declare": True},
    {"behaviour": "invalid_json"},
    {"behaviour": "ok", "status": 500},
    {"behaviour": "ok", "status": 504},
    {"behaviour": "redirect"},
    {"behaviour": "ok", "content_type": "text/plain"},
    {"behaviour": "ok", "body": b'{"revision": "r1", "blocks": [{"id": 5}]}'},
]
SAME_CAUSE = {"connection reset", "server closed the connection"}  # a reset reads as either


@pytest.fixture
def per_call(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources that went through ``_contribute_one`` (the per-call path), in order."""
    seen: list[str] = []
    original = calls._contribute_one

    async def counted(client: Any, target: ContributorTarget, *args: Any) -> ContributorOutcome:
        seen.append(target.source)
        return await original(client, target, *args)

    monkeypatch.setattr(calls, "_contribute_one", counted)
    return seen


async def pooled(client: httpx.AsyncClient, fields: PacketFields, server: FaultServer) -> None:
    """One good exchange with a server still answering ``ok``, so that its connection is idle in
    the pool; the next requests on it meet whatever the server is set to afterwards."""
    outcomes, _ = await fan_out(client, fields, [registered(server)], timeout=2.0)
    assert outcomes[0].status == "ok"
    server.peer_closed.clear()
    server.request_seen.clear()


async def settle(fault: dict[str, Any], warm: bool, fields: PacketFields) -> tuple[Any, ...]:
    """The outcome of one call to a server with ``fault``, on a new or a pooled connection."""
    async with create_client() as client, FaultServer() as server:
        if warm:
            await pooled(client, fields, server)
        for name, value in fault.items():
            setattr(server, name, value)
        outcomes, elapsed = await fan_out(client, fields, [registered(server)])
        outcome = outcomes[0]
        assert elapsed <= DEADLINE + SLACK
        if (outcome.cause or "").startswith("deadline reached"):
            assert elapsed >= DEADLINE - 0.01
        cut = outcome.status in ("timeout", "error", "too_large") or "content-type" in (
            outcome.cause or ""
        )
        if cut and fault["behaviour"] != "reset":  # (a reset is the server's own close)
            # A call cut before its answer was read in full: its connection is closed.
            await asyncio.wait_for(server.peer_closed.wait(), timeout=1.0)
        return outcome.status, outcome.cause, outcome.revision, outcome.blocks


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
async def test_a_pooled_connection_settles_every_fault_as_a_new_one_does(
    fault: dict[str, Any], fields: PacketFields, per_call: list[str]
) -> None:
    cold = await settle(fault, False, fields)
    assert per_call == ["memory"]  # a new connection: the per-call path
    per_call.clear()
    warm = await settle(fault, True, fields)
    if fault["behaviour"] == "reset":
        # Nothing of an answer before the reset: it may be the keep-alive race, so the request
        # is sent once more on a new connection (the per-call path), which is reset too.
        assert per_call == ["memory", "memory"]
        assert warm[0] == cold[0] == "error" and {warm[1], cold[1]} <= SAME_CAUSE
    else:
        assert per_call == ["memory"]  # the warm-up only: the call itself was on the pool
        assert warm == cold


async def test_eight_pooled_contributors_answer_in_one_burst(
    client: httpx.AsyncClient, fields: PacketFields, per_call: list[str]
) -> None:
    async with servers(8, delay=0.1) as hooks:
        targets = [registered(s, f"s{i}") for i, s in enumerate(hooks)]
        await fan_out(client, fields, targets, timeout=1.0)
        assert sorted(per_call) == sorted(t.source for t in targets)
        per_call.clear()
        checked: list[str] = []

        def check(outcome: ContributorOutcome) -> ContributorOutcome:
            checked.append(outcome.source)
            return outcome

        outcomes, elapsed = await fan_out(client, fields, targets, timeout=1.0, check=check)
    assert per_call == []
    assert [o.source for o in outcomes] == [t.source for t in targets]  # target order
    assert all(o.status == "ok" and o.blocks[0].id == "a" for o in outcomes)
    assert all(100 <= o.duration_ms < 200 for o in outcomes)
    assert sorted(checked) == sorted(t.source for t in targets) and elapsed < 0.2
    assert all(s.connections == 1 for s in hooks)


async def test_a_late_answer_on_a_pooled_connection_changes_nothing(
    client: httpx.AsyncClient, fields: PacketFields
) -> None:
    baseline = set(asyncio.all_tasks())
    async with FaultServer() as server:
        await pooled(client, fields, server)
        server.delay = DEADLINE + 0.15
        server.answered.clear()
        outcomes, elapsed = await fan_out(client, fields, [registered(server)])
        snapshot = list(outcomes)
        assert outcomes[0].status == "timeout" and elapsed <= DEADLINE + SLACK
        leftover = set(asyncio.all_tasks()) - baseline - {asyncio.current_task()}
        assert all("_accept" in repr(t.get_coro()) for t in leftover)
        await asyncio.wait_for(server.answered.wait(), timeout=2.0)
        await asyncio.wait_for(server.peer_closed.wait(), timeout=1.0)
    assert outcomes == snapshot


async def test_cancelling_a_pooled_fan_out_closes_its_connections_and_frees_the_slots(
    fields: PacketFields,
) -> None:
    """One connection slot in all: if a cancelled fan-out kept it, the next call would wait."""
    async with create_client(limits=contributor_limits(1)) as client:
        async with FaultServer() as server:
            await pooled(client, fields, server)
            server.behaviour = "hang"
            server.request_seen.clear()
            task = asyncio.ensure_future(
                fan_out(client, fields, [registered(server)], timeout=10.0)
            )
            await asyncio.wait_for(server.request_seen.wait(), timeout=2.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(server.peer_closed.wait(), timeout=1.0)
            server.behaviour = "ok"
            outcomes, _ = await fan_out(client, fields, [registered(server)], timeout=1.0)
        assert outcomes[0].status == "ok"


async def test_with_every_slot_taken_a_pooled_call_waits_for_one(
    fields: PacketFields, per_call: list[str]
) -> None:
    """Two contributors, one connection slot: the second call waits for the first to end."""
    async with create_client(limits=contributor_limits(1)) as client:
        async with servers(2, delay=0.05) as hooks:
            targets = [registered(s, f"s{i}") for i, s in enumerate(hooks)]
            for hook in hooks:
                await pooled(client, fields, hook)
            per_call.clear()
            outcomes, elapsed = await fan_out(client, fields, targets, timeout=1.0)
    assert [o.status for o in outcomes] == ["ok", "ok"]
    assert per_call == ["s1"]  # no slot free for it: the per-call path, which waits
    assert elapsed >= 0.1  # one after the other


async def test_a_failing_check_fails_the_fan_out_and_closes_the_connections(
    client: httpx.AsyncClient, fields: PacketFields
) -> None:
    async with FaultServer() as good, FaultServer() as hung:
        for server in (good, hung):
            await pooled(client, fields, server)
        hung.behaviour = "hang"

        def check(outcome: ContributorOutcome) -> ContributorOutcome:
            raise RuntimeError("check failed")

        started = time.monotonic()
        with pytest.raises(RuntimeError, match="check failed"):
            await fan_out(client, fields, [registered(good, "a"), registered(hung, "b")], timeout=5.0,
                          check=check)  # fmt: skip
        assert time.monotonic() - started < 1.0
        await asyncio.wait_for(hung.peer_closed.wait(), timeout=1.0)
