"""Contributors that misbehave at the HTTP level, against real loopback servers.

Each case is a way an HTTP client can go wrong: an endless header line must be cut at the head
cap, a second response in the same read must not be taken for the answer to a later request,
informational responses before the answer are not failures, idle connections are released, and
TLS is verified against the URL's host.
"""

from __future__ import annotations

import asyncio
import ssl

import pytest
import trustme
from faults import FaultServer, fan_out, registered

from context_assembly.contributors import ContributorClient, ContributorTarget, PacketFields
from context_assembly.contributors.ssrf import CheckedTarget

MIB = 1024 * 1024


async def test_an_endless_header_line_is_cut_at_the_head_cap(
    client: ContributorClient, fields: PacketFields
) -> None:
    """A 300 MiB header line is refused once it passes the line limit: an error well before the
    deadline, the connection closed, and only what the socket buffers hold was ever sent."""
    async with FaultServer("long_header", size=300 * MIB) as server:
        outcomes = await fan_out(client, fields, [registered(server)], timeout=30.0)
        assert (outcomes[0].status, outcomes[0].cause) == ("error", "HTTP protocol error")
        await asyncio.wait_for(server.peer_closed.wait(), timeout=5.0)
    assert server.bytes_sent < 16 * MIB


async def test_a_second_response_in_the_same_read_is_not_a_later_answer(
    client: ContributorClient, fields: PacketFields
) -> None:
    """A contributor that writes two responses for one request: the first is the answer, and the
    next call gets the answer to its own request (the connection with the extra bytes is not
    reused)."""
    async with FaultServer("two_answers") as server:
        first = await fan_out(client, fields, [registered(server)], timeout=5.0)
        second = await fan_out(client, fields, [registered(server)], timeout=5.0)
    assert [o.status for o in first + second] == ["ok", "ok"]
    assert [first[0].revision, second[0].revision] == ["r1", "r1"]
    assert len(server.requests) == 2 and server.connections == 2


async def test_informational_responses_before_the_answer_are_not_failures(
    client: ContributorClient, fields: PacketFields
) -> None:
    """``100 Continue`` and ``103 Early Hints`` before the final ``200`` are skipped."""
    async with FaultServer("informational") as server:
        outcomes = await fan_out(client, fields, [registered(server)], timeout=5.0)
        again = await fan_out(client, fields, [registered(server)], timeout=5.0)  # pooled
    assert [(o.status, o.revision) for o in outcomes + again] == [("ok", "r1"), ("ok", "r1")]


async def test_idle_connections_to_endpoints_that_are_gone_are_released(
    fields: PacketFields,
) -> None:
    """Twenty contributors answered once and never called again: each idle connection is closed
    by the client after the keep-alive time (the servers see the close), none kept for ever."""
    async with ContributorClient(keepalive_seconds=0.5) as client:
        hooks = [await FaultServer().__aenter__() for _ in range(20)]
        try:
            targets = [registered(h, f"s{i}") for i, h in enumerate(hooks)]
            outcomes = await fan_out(client, fields, targets, timeout=5.0)
            assert [o.status for o in outcomes] == ["ok"] * 20
            await asyncio.wait_for(
                asyncio.gather(*(h.peer_closed.wait() for h in hooks)), timeout=0.5 + 5.0
            )
        finally:
            for hook in hooks:
                await hook.__aexit__(None, None, None)


@pytest.mark.parametrize(("host", "status"), [("contributor.test", "ok"), ("wrong.test", "error")])
async def test_tls_checks_the_certificate_against_the_url_host(
    fields: PacketFields, host: str, status: str
) -> None:
    """An inline HTTPS URL pinned to 127.0.0.1 is verified against its host name, not the
    address dialled: a certificate for ``contributor.test`` serves that name only."""
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("contributor.test").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    async with (
        ContributorClient(ssl_context=client_tls) as client,
        FaultServer(tls=server_tls) as server,
    ):
        url = f"https://{host}:{server.port}/contribute"
        pin = CheckedTarget(url, "https", host, server.port, ("127.0.0.1",))
        target = ContributorTarget(source="memory", url=url, kind="inline", checked=pin)
        outcomes = await fan_out(client, fields, [target], timeout=10.0)
    assert outcomes[0].status == status
    if status == "error":
        assert outcomes[0].cause == "TLS certificate verification failed"
