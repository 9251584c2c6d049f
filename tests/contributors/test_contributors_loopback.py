"""Contributor calls against real loopback fault servers: deadline, faults, caps, pinning."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from doubles import SECRET, RecordingResolver
from faults import CAP, DEADLINE, FaultServer, closed_port, fan_out, registered, servers
from standardwebhooks import Webhook

from context_assembly.contributors import (
    TIMEOUT_HEADER,
    ContributorClient,
    ContributorOutcome,
    ContributorTarget,
    PacketFields,
    UrlPolicy,
    check_url,
    contribute_all,
    raise_for_failures,
)
from context_assembly.contributors.client import PinRefusedError
from context_assembly.errors import AssemblyTimeoutError, ContributorFailedError


async def test_eight_contributors_answer_concurrently(
    client: ContributorClient, fields: PacketFields
) -> None:
    """Eight contributors that answer only once all eight have been called all answer: the calls
    run at once (one after the other, the first would wait for the others until the deadline
    and all eight would time out)."""
    everyone_called = asyncio.Event()
    async with servers(8, gate=everyone_called) as hooks:

        async def open_gate() -> None:
            await asyncio.gather(*(h.request_seen.wait() for h in hooks))
            everyone_called.set()

        opener = asyncio.ensure_future(open_gate())
        targets = [registered(s, f"s{i}") for i, s in enumerate(hooks)]
        outcomes = await fan_out(client, fields, targets, timeout=30.0)
        opener.cancel()
    assert [o.status for o in outcomes] == ["ok"] * 8
    assert [o.source for o in outcomes] == [f"s{i}" for i in range(8)]
    assert all(o.revision == "r1" and o.blocks[0].id == "a" for o in outcomes)


@pytest.mark.parametrize(
    ("behaviour", "phase"),
    [
        ("hang", "waiting for the response headers"),
        ("slow_headers", "waiting for the response headers"),
        ("drip", "reading the body"),
    ],
)
async def test_hung_and_dripping_contributors_are_cut_at_the_deadline(
    client: ContributorClient, fields: PacketFields, behaviour: Any, phase: str
) -> None:
    """A server that never answers, or drips headers or body bytes, is cut by the one deadline:
    the outcome is ``timeout`` with the phase it cut, and the connection is closed by the
    client, not left to the server."""
    async with FaultServer(behaviour, interval=0.05) as server:
        outcomes = await fan_out(client, fields, [registered(server)])
        assert outcomes[0].status == "timeout"
        assert outcomes[0].cause == f"deadline reached while {phase}"
        await asyncio.wait_for(server.peer_closed.wait(), timeout=5.0)  # bounded: a hang guard


async def test_connection_reset_is_an_error(
    client: ContributorClient, fields: PacketFields
) -> None:
    """A contributor that resets the connection fails fast with an error, not a timeout."""
    async with FaultServer("reset") as server:
        outcomes = await fan_out(client, fields, [registered(server)])
    assert outcomes[0].status == "error"
    assert outcomes[0].cause in {"connection reset", "server closed the connection"}


async def test_connection_refused_is_an_error(
    client: ContributorClient, fields: PacketFields
) -> None:
    """Nothing listening on the port is a fast connect-refused error."""
    target = ContributorTarget(source="memory", url=f"http://127.0.0.1:{closed_port()}/c")
    outcomes = await fan_out(client, fields, [target])
    assert (outcomes[0].status, outcomes[0].cause) == ("error", "connect refused")


@pytest.mark.parametrize(("declare", "cause"), [(False, "body over the"), (True, "Content-Length")])
async def test_oversize_bodies_are_cut_as_too_large(
    client: ContributorClient, fields: PacketFields, declare: bool, cause: str
) -> None:
    """A 10 MiB body is too_large, chunked (cut while streaming) or with an honest Content-Length."""
    async with FaultServer("oversize", declare=declare) as server:
        outcomes = await fan_out(client, fields, [registered(server)], timeout=2.0)
        assert outcomes[0].status == "too_large"
        assert outcomes[0].cause is not None and outcomes[0].cause.startswith(cause)
        await asyncio.wait_for(server.peer_closed.wait(), timeout=5.0)  # bounded: a hang guard
    assert server.bytes_sent < 10 * 1024 * 1024


async def test_invalid_json_is_invalid(client: ContributorClient, fields: PacketFields) -> None:
    """A 200 whose body is not JSON is invalid."""
    async with FaultServer("invalid_json") as server:
        outcomes = await fan_out(client, fields, [registered(server)])
    assert (outcomes[0].status, outcomes[0].cause) == ("invalid", "invalid JSON at char 1")


async def test_redirect_to_a_private_address_is_not_followed(
    client: ContributorClient, fields: PacketFields
) -> None:
    """A 302 to http://10.0.0.1 is an error; exactly one request was made and nothing followed it."""
    async with FaultServer("redirect", location="http://10.0.0.1/") as server:
        outcomes = await fan_out(client, fields, [registered(server)])
    assert (outcomes[0].status, outcomes[0].cause) == ("error", "HTTP 302 redirect (not followed)")
    assert len(server.requests) == 1


async def test_server_sees_the_deadline_header_and_a_valid_signature(
    client: ContributorClient, fields: PacketFields
) -> None:
    """On the wire the contributor gets the remaining ms (≤ the timeout) and a verifiable signature."""
    async with FaultServer() as server:
        await fan_out(client, fields, [registered(server, secret=SECRET)])
    request = server.requests[0]
    assert 1 <= int(request.headers[TIMEOUT_HEADER.lower()]) <= DEADLINE * 1000
    assert request.headers["content-type"] == "application/json"
    packet = Webhook(SECRET).verify(request.body, request.headers)
    assert packet["type"] == "contribute" and packet["source"] == "memory"


async def test_failure_policy_over_a_mixed_fan_out(
    client: ContributorClient, fields: PacketFields
) -> None:
    """Omit-policy failures stay in the outcomes; a fail-policy timeout raises 504 naming it.
    Both hung calls end at the one deadline, their connections closed."""
    async with (
        FaultServer() as good,
        FaultServer("hang") as hung,
        FaultServer("invalid_json") as bad,
        FaultServer("hang") as optional_hung,
    ):
        targets = [
            registered(good, "good"),
            registered(hung, "hung"),
            registered(bad, "bad", failure_policy="omit"),
            registered(optional_hung, "optional", failure_policy="omit"),
        ]
        outcomes = await fan_out(client, fields, targets)
        closed = (hung.peer_closed.wait(), optional_hung.peer_closed.wait())
        await asyncio.wait_for(asyncio.gather(*closed), timeout=5.0)  # bounded: a hang guard
    assert [o.status for o in outcomes] == ["ok", "timeout", "invalid", "timeout"]
    assert {o.cause for o in outcomes if o.status == "timeout"} == {
        "deadline reached while waiting for the response headers"
    }
    with pytest.raises(AssemblyTimeoutError) as info:
        raise_for_failures(outcomes, targets)
    assert info.value.extensions["sources"] == ["hung"]
    # Making the invalid one required turns the failure into a 502 that keeps its cause.
    strict = [*targets[:2], registered(bad, "bad"), targets[3]]
    with pytest.raises(ContributorFailedError) as failed:
        raise_for_failures(outcomes, strict)
    assert failed.value.extensions["cause"] == "invalid JSON at char 1"


async def test_a_late_answer_changes_nothing(
    client: ContributorClient, fields: PacketFields
) -> None:
    """An answer that arrives after the deadline is ignored: the settled outcomes stay as returned.
    The server holds its answer until the fan-out has returned, then sends it."""
    baseline = set(asyncio.all_tasks())
    late = asyncio.Event()
    async with FaultServer(gate=late) as server:
        outcomes = await fan_out(client, fields, [registered(server)])
        snapshot = list(outcomes)
        assert outcomes[0].status == "timeout"
        assert outcomes[0].cause == "deadline reached while waiting for the response headers"
        # No task of the fan-out outlives it: only the fault server's own handler may still run.
        leftover = set(asyncio.all_tasks()) - baseline - {asyncio.current_task()}
        assert all("_accept" in repr(t.get_coro()) for t in leftover)
        late.set()  # the server answers now, after the deadline
        await asyncio.wait_for(server.answered.wait(), timeout=5.0)  # bounded: a hang guard
        await asyncio.wait_for(server.peer_closed.wait(), timeout=5.0)
    assert outcomes == snapshot
    assert (
        outcomes[0].status == "timeout"
        and outcomes[0].revision is None
        and outcomes[0].blocks == ()
    )


async def test_calls_carry_the_client_default_headers(
    client: ContributorClient, fields: PacketFields
) -> None:
    """Every call sends the client's defaults: no compressed answer is asked for (the cap
    counts wire bytes), JSON is accepted, and the service names itself."""
    async with FaultServer() as server:
        outcomes = await fan_out(client, fields, [registered(server)])
    assert outcomes[0].status == "ok"
    headers = server.requests[0].headers
    assert headers["accept-encoding"] == "identity"
    assert headers["accept"] == "application/json"
    assert headers["user-agent"] == "context-assembly"
    assert headers["content-type"] == "application/json"


async def test_keep_alive_connections_are_reused(
    client: ContributorClient, fields: PacketFields
) -> None:
    """Consecutive fan-outs to one contributor reuse the pooled connection."""
    async with FaultServer() as server:
        for _ in range(3):
            outcomes = await fan_out(client, fields, [registered(server)])
            assert outcomes[0].status == "ok"
    assert len(server.requests) == 3
    assert server.connections == 1


async def test_inline_target_connects_only_to_its_pinned_address(
    client: ContributorClient, fields: PacketFields
) -> None:
    """An inline name is connected through the address checked once, never resolved again."""
    async with FaultServer() as server:
        host = "contributor.invalid"  # no real DNS can answer this name (RFC 6761)
        resolver = RecordingResolver({host: ["127.0.0.1"]}, later={host: ["10.0.0.1"]})
        policy = UrlPolicy(allow=[f"http://{host}:{server.port}/"], allow_private=True)
        url = f"http://{host}:{server.port}/contribute"
        checked = await check_url(url, policy, resolver, source="memory")
        target = ContributorTarget(source="memory", url=url, kind="inline", checked=checked)
        first = await fan_out(client, fields, [target])
        second = await fan_out(client, fields, [target])
    assert [first[0].status, second[0].status] == ["ok", "ok"]
    assert resolver.calls == [(host, server.port)]
    assert server.requests[0].headers["host"] == f"{host}:{server.port}"


async def test_an_inline_url_that_does_not_match_its_pin_never_connects(
    client: ContributorClient,
) -> None:
    """A call whose URL differs from its checked target is refused before any connection."""
    async with FaultServer() as server:
        policy = UrlPolicy(allow=[f"http://127.0.0.1:{server.port}/"], allow_private=True)
        checked = await check_url(server.url, policy, source="memory")
        with pytest.raises(PinRefusedError, match="checked target"):
            await client.post(f"http://localhost:{server.port}/contribute", b"{}", {}, checked)
    assert server.requests == []


async def test_cancelling_the_fan_out_closes_the_contributor_connections(
    client: ContributorClient, fields: PacketFields
) -> None:
    """When the caller goes away mid-call, the outbound call is cancelled and its connection closed."""
    async with FaultServer("hang") as server:
        task = asyncio.ensure_future(fan_out(client, fields, [registered(server)], timeout=10.0))
        await asyncio.wait_for(server.request_seen.wait(), timeout=5.0)  # bounded: a hang guard
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.peer_closed.wait(), timeout=5.0)  # bounded: a hang guard


# Every fault fixture with its expected outcome, and what each failure policy makes of it.
FAULT_MATRIX = [
    (
        {"behaviour": "ok", "delay": 1.0},
        "timeout",
        AssemblyTimeoutError,
    ),  # latency past the deadline
    ({"behaviour": "drip"}, "timeout", AssemblyTimeoutError),
    ({"behaviour": "slow_headers", "interval": 0.2}, "timeout", AssemblyTimeoutError),
    ({"behaviour": "reset"}, "error", ContributorFailedError),
    ({"behaviour": "oversize"}, "too_large", ContributorFailedError),
    ({"behaviour": "invalid_json"}, "invalid", ContributorFailedError),
    ({"behaviour": "ok", "status": 500}, "error", ContributorFailedError),
]


@pytest.mark.parametrize(("fault", "status", "error"), FAULT_MATRIX, ids=lambda v: str(v))
@pytest.mark.parametrize("policy", ["fail", "omit"])
async def test_every_fault_under_both_failure_policies(
    client: ContributorClient,
    fields: PacketFields,
    fault: dict[str, Any],
    status: str,
    error: type[Exception],
    policy: str,
) -> None:
    """Each fault settles with its status (a slow one cut by the deadline, its connection
    closed); 'fail' raises its error, 'omit' keeps going."""
    async with FaultServer(**fault) as server:
        target = registered(server, failure_policy=policy)
        outcomes = await fan_out(client, fields, [target])
        if status == "timeout":
            assert outcomes[0].cause is not None
            assert outcomes[0].cause.startswith("deadline reached while ")
            await asyncio.wait_for(server.peer_closed.wait(), timeout=5.0)  # bounded: a guard
    assert [o.status for o in outcomes] == [status]
    if policy == "fail":
        with pytest.raises(error) as info:
            raise_for_failures(outcomes, [target])
        assert "memory" in str(info.value)
    else:
        raise_for_failures(outcomes, [target])  # omit: the manifest reports it, nothing raises


async def test_a_failing_check_fails_the_fan_out_and_closes_the_connections(
    client: ContributorClient, fields: PacketFields
) -> None:
    """A ``check`` that raises fails the fan-out with its exception; the calls still under way
    are cancelled and their connections closed (the hung contributors see the close)."""

    def fail(outcome: ContributorOutcome) -> ContributorOutcome:
        raise RuntimeError("boom")

    async with FaultServer() as quick, servers(2, behaviour="hang") as hooks:
        targets = [registered(quick, "quick")] + [
            registered(s, f"s{i}") for i, s in enumerate(hooks)
        ]
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="boom"):
            await contribute_all(client, targets, fields, started + 30.0, CAP, check=fail)
        await asyncio.wait_for(asyncio.gather(*(h.peer_closed.wait() for h in hooks)), 5.0)


async def test_fail_fast_ends_the_fan_out_at_the_first_hard_failure(
    client: ContributorClient, fields: PacketFields
) -> None:
    """With ``fail_fast``, a ``fail``-policy contributor answering 500 fails the fan-out at once,
    naming it, instead of waiting for a hung ``omit`` contributor's far deadline; the hung call
    is cancelled and its connection closed."""
    async with FaultServer(status=500) as broken, FaultServer("hang") as hung:
        targets = [registered(broken, "broken"), registered(hung, "slow", failure_policy="omit")]
        started = time.monotonic()
        call = contribute_all(client, targets, fields, started + 60.0, CAP, fail_fast=True)
        with pytest.raises(ContributorFailedError) as info:
            await asyncio.wait_for(call, timeout=30.0)
        await asyncio.wait_for(hung.peer_closed.wait(), timeout=5.0)
    assert info.value.extensions["source"] == "broken"
    assert [c["source"] for c in info.value.extensions["contributors"]] == ["broken"]
