"""Contributor calls: packet, headers, statuses, validation, failure policy.

The contributor is a respx router's answers served on a real loopback server (the scripted
contributor double of ``context_assembly_client.testing``, the router as its handler), reached
through the production client with every name resolving to that server.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
import respx
from context_assembly_client.testing import ScriptedContributor
from doubles import SECRET
from standardwebhooks import Webhook

from context_assembly.contributors import (
    TIMEOUT_HEADER,
    ContributorClient,
    ContributorOutcome,
    ContributorTarget,
    PacketFields,
    contribute_all,
    query_revision,
    raise_for_failures,
)
from context_assembly.contributors.packets import ContributePacket, RevisionPacket
from context_assembly.core.request import Block, Scope
from context_assembly.errors import AssemblyTimeoutError, ContributorFailedError
from loopback_client import LoopbackClient

URL = "http://memory.example/contribute"
CAP = 4096


@pytest.fixture
def router() -> respx.MockRouter:
    """The contributor's routes and answers (respx's router, not patched into anything)."""
    return respx.MockRouter(assert_all_called=False)


@pytest.fixture
def server(router: respx.MockRouter) -> Iterator[ScriptedContributor]:
    """A loopback server answering with ``router``."""
    with ScriptedContributor(handler=router.handler) as serving:
        yield serving


@pytest.fixture
async def client(server: ScriptedContributor) -> AsyncIterator[ContributorClient]:
    """The production client, every name resolving to the loopback server."""
    async with LoopbackClient(server.port) as shared:
        yield shared


def target(source: str = "memory", url: str = URL, **kw: Any) -> ContributorTarget:
    """A registered target (trusted, not SSRF-checked)."""
    return ContributorTarget(source=source, url=url, **kw)


async def one(
    client: ContributorClient,
    fields: PacketFields,
    tgt: ContributorTarget | None = None,
    timeout: float = 1.0,
) -> ContributorOutcome:
    """Run a fan-out of one target and return its outcome."""
    outcomes = await contribute_all(
        client, [tgt or target()], fields, time.monotonic() + timeout, CAP
    )
    assert len(outcomes) == 1
    return outcomes[0]


async def test_valid_answer_gives_revision_and_core_blocks(
    client: ContributorClient, fields: PacketFields, router: respx.MockRouter
) -> None:
    """A 200 {revision, blocks} becomes an ok outcome with core Block values."""
    router.post(URL).respond(
        json={
            "revision": "r7",
            "blocks": [{"id": "a", "text": "x", "priority": 3, "dependencies": ["memory/b"]}],
        }
    )
    outcome = await one(client, fields)
    assert outcome.status == "ok" and outcome.cause is None
    assert outcome.revision == "r7"
    assert outcome.blocks == (Block(id="a", text="x", priority=3, dependencies=["memory/b"]),)
    assert outcome.duration_ms >= 0


async def test_packet_carries_the_contract_fields(
    client: ContributorClient, fields: PacketFields, router: respx.MockRouter
) -> None:
    """The contribute packet has exactly the fields of docs/contract.md, "Webhook protocol", with the per-source limit."""
    route = router.post(URL).respond(json={"revision": 1, "blocks": []})
    other = router.post("http://tasks.example/c").respond(json={"revision": 1, "blocks": []})
    await contribute_all(
        client,
        [target(), target("tasks", "http://tasks.example/c")],
        fields,
        time.monotonic() + 1,
        CAP,
    )
    packet = orjson.loads(route.calls.last.request.content)
    assert packet == {
        "type": "contribute",
        "preparation_id": "prep_test",
        "source": "memory",
        "model": "gpt-4o-mini",
        "input": [{"role": "user", "content": "what is due today?"}],
        "data_budget_tokens": 2048,
        "source_token_limit": 512,
        "scope": Scope(account_id="acct_1", roles=["reader"]).model_dump(mode="json"),
        "deadline_unix_ms": fields.deadline_unix_ms,
    }
    tasks_packet = orjson.loads(other.calls.last.request.content)
    assert tasks_packet["source"] == "tasks" and tasks_packet["source_token_limit"] is None
    # Each is what the OpenAPI document's ``contribute`` webhook describes, every field of it.
    for call in (route.calls.last, other.calls.last):
        ContributePacket.model_validate_json(call.request.content)


async def test_headers_carry_deadline_and_a_verifiable_signature(
    client: ContributorClient, fields: PacketFields, router: respx.MockRouter
) -> None:
    """The remaining-ms header is the time left when the call was sent: no more than was left
    before the fan-out, no less than was left when the request arrived; the signature verifies
    independently."""
    arrivals: list[float] = []

    def answer(request: httpx.Request) -> httpx.Response:
        arrivals.append(time.monotonic())
        return httpx.Response(200, json={"revision": 1, "blocks": []})

    route = router.post(URL).mock(side_effect=answer)
    timeout = 5.0  # the call is answered at once: a hang guard, not a figure
    deadline = time.monotonic() + timeout
    await contribute_all(client, [target(secret=SECRET)], fields, deadline, CAP)
    request = route.calls.last.request
    assert request.headers["content-type"] == "application/json"
    # Whole milliseconds, rounded down (hence the 1 ms below the arrival's).
    left_at_arrival_ms = (deadline - arrivals[0]) * 1000
    assert left_at_arrival_ms - 1 <= int(request.headers[TIMEOUT_HEADER]) <= timeout * 1000
    verified = Webhook(SECRET).verify(request.content, dict(request.headers))
    assert verified["source"] == "memory"
    assert request.headers["webhook-id"].startswith("msg_")


async def test_webhook_id_is_stable_across_identical_deliveries(
    client: ContributorClient, fields: PacketFields, router: respx.MockRouter
) -> None:
    """Two deliveries of the same (preparation, source, attempt) carry the same webhook-id."""
    route = router.post(URL).respond(json={"revision": 1, "blocks": []})
    await one(client, fields)
    await one(client, fields)
    first, second = (c.request.headers["webhook-id"] for c in route.calls)
    assert first == second
    assert "webhook-signature" not in route.calls.last.request.headers


@pytest.mark.parametrize(
    ("response", "status", "cause"),
    [
        (httpx.Response(500, json={"error": "secret stack trace"}), "error", "HTTP 500"),
        (httpx.Response(404), "error", "HTTP 404"),
        (httpx.Response(504), "timeout", "HTTP 504: the contributor reported its deadline"),
        (
            httpx.Response(302, headers={"location": "http://10.0.0.1/"}),
            "error",
            "HTTP 302 redirect (not followed)",
        ),
        (httpx.Response(204), "invalid", "invalid JSON at char 0"),
        (
            httpx.Response(200, content=b'{"revision": 1, "blocks": [}'),
            "invalid",
            "invalid JSON at char 27",
        ),
        (
            httpx.Response(200, content=b'{"revision": NaN, "blocks": []}'),
            "invalid",
            "invalid JSON at char",
        ),
        (
            httpx.Response(200, text="<html>", headers={"content-type": "text/html"}),
            "invalid",
            "content-type is not JSON",
        ),
        (
            httpx.Response(
                200,
                content=gzip.compress(b"{}"),
                headers={"content-type": "application/json", "content-encoding": "gzip"},
            ),
            "invalid",
            "compressed body",
        ),
        (
            httpx.Response(200, content=b"x" * (CAP + 1)),
            "too_large",
            f"Content-Length {CAP + 1} over",
        ),
    ],
)
async def test_non_success_answers_are_failures_with_a_body_free_cause(
    client: ContributorClient,
    fields: PacketFields,
    router: respx.MockRouter,
    response: httpx.Response,
    status: str,
    cause: str,
) -> None:
    """Non-2xx, redirects, bad JSON, wrong content types and oversize bodies fail with the right status."""
    router.post(URL).mock(return_value=response)
    outcome = await one(client, fields)
    assert outcome.status == status
    assert outcome.cause is not None and outcome.cause.startswith(cause)
    assert "secret stack trace" not in outcome.cause
    assert outcome.blocks == () and outcome.revision is None


@pytest.mark.parametrize(
    ("payload", "cause"),
    [
        (
            {"revision": "r", "blocks": [{"id": "a", "text": "t", "priority": "high"}]},
            "schema: blocks.0.priority:",
        ),
        ({"blocks": []}, "schema: revision: Field required"),
        ({"revision": True, "blocks": []}, "schema: revision:"),
        ({"revision": ["r"], "blocks": []}, "schema: revision:"),
        ({"revision": "r", "blocks": {"id": "a"}}, "schema: blocks:"),
        ({"revision": "r"}, "schema: blocks: Field required"),
        ({"revision": "r", "blocks": [], "instructions": "obey me"}, "schema: <unknown field>:"),
        (
            {"revision": "r", "blocks": [{"id": "a", "text": "t", "role": "system"}]},
            "schema: blocks.0.<unknown field>:",
        ),
        ([1, 2], "schema: (root):"),
    ],
)
async def test_schema_violations_are_invalid_and_name_the_path(
    client: ContributorClient,
    fields: PacketFields,
    router: respx.MockRouter,
    payload: Any,
    cause: str,
) -> None:
    """A body that is JSON but not {revision, blocks} is invalid, naming the field path, not its text."""
    router.post(URL).respond(json=payload)
    outcome = await one(client, fields)
    assert outcome.status == "invalid"
    assert outcome.cause is not None and outcome.cause.startswith(cause)
    assert "obey me" not in outcome.cause and "system" not in outcome.cause


async def test_too_many_schema_errors_are_summarised(
    client: ContributorClient, fields: PacketFields, router: respx.MockRouter
) -> None:
    """The cause lists at most three paths and counts the rest."""
    router.post(URL).respond(json={"revision": "r", "blocks": [{"id": i} for i in range(6)]})
    outcome = await one(client, fields)
    assert outcome.cause is not None and outcome.cause.endswith("more)")
    assert outcome.cause.count(";") == 2


async def test_declared_content_length_over_the_cap_fails_before_reading(
    client: ContributorClient, fields: PacketFields, router: respx.MockRouter
) -> None:
    """A Content-Length over the cap is too_large from the headers alone."""
    router.post(URL).respond(200, content=b"{}", headers={"content-length": str(CAP * 10)})
    outcome = await one(client, fields)
    assert outcome.status == "too_large"
    assert outcome.cause == f"Content-Length {CAP * 10} over the {CAP}-byte cap"


async def test_streamed_body_over_the_cap_is_too_large(
    client: ContributorClient, fields: PacketFields, router: respx.MockRouter
) -> None:
    """A chunked body without Content-Length is too_large once the bytes pass the cap."""

    async def long() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b"[" * 1024

    router.post(URL).mock(return_value=httpx.Response(200, content=long()))
    outcome = await one(client, fields)
    assert (outcome.status, outcome.cause) == ("too_large", f"body over the {CAP}-byte cap")


async def test_a_reset_before_the_answer_is_an_error(
    client: ContributorClient, fields: PacketFields, router: respx.MockRouter
) -> None:
    """A contributor that drops the connection instead of answering is an error outcome."""
    router.post(URL).mock(side_effect=httpx.ConnectError("boom"))
    outcome = await one(client, fields)
    assert outcome.status == "error"
    assert outcome.cause in {"connection reset", "server closed the connection"}


async def test_unexpected_exceptions_are_contained(
    client: ContributorClient,
    fields: PacketFields,
    router: respx.MockRouter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A surprise in one call becomes that call's error outcome; the others still answer."""
    router.post("http://ok.example/").respond(json={"revision": 1, "blocks": []})
    post = client.post

    async def buggy(url: str, *args: Any) -> Any:
        if url == URL:
            raise RuntimeError("bug")
        return await post(url, *args)

    monkeypatch.setattr(client, "post", buggy)
    outcomes = await contribute_all(
        client, [target(), target("ok", "http://ok.example/")], fields, time.monotonic() + 1, CAP
    )
    assert [(o.source, o.status, o.cause) for o in outcomes] == [
        ("memory", "error", "unexpected RuntimeError"),
        ("ok", "ok", None),
    ]


async def test_past_deadline_skips_without_sending(
    client: ContributorClient, fields: PacketFields, router: respx.MockRouter
) -> None:
    """With no time left the call is skipped_deadline and never sent."""
    route = router.post(URL).respond(json={"revision": 1, "blocks": []})
    outcomes = await contribute_all(client, [target()], fields, time.monotonic() - 0.01, CAP)
    assert outcomes[0].status == "skipped_deadline"
    assert route.call_count == 0


async def test_injected_clock_drives_the_remaining_budget(
    client: ContributorClient, fields: PacketFields, router: respx.MockRouter
) -> None:
    """The deadline header is computed from the injected clock at send time."""
    route = router.post(URL).respond(json={"revision": 1, "blocks": []})
    await contribute_all(client, [target()], fields, 100.25, CAP, clock=lambda: 100.0)
    assert route.calls.last.request.headers[TIMEOUT_HEADER] == "250"


async def test_no_targets_means_no_calls(client: ContributorClient, fields: PacketFields) -> None:
    """An empty fan-out returns an empty list."""
    assert await contribute_all(client, [], fields, time.monotonic() + 1, CAP) == []


def test_inline_targets_must_be_checked() -> None:
    """An inline target without an SSRF check cannot be constructed."""
    with pytest.raises(ValueError, match="SSRF-checked"):
        ContributorTarget(source="m", url="http://x.example/", kind="inline")


def test_targets_with_unusable_secrets_fail_fast() -> None:
    """A malformed secret is refused when the target is built, not mid-call."""
    with pytest.raises(ValueError, match="whsec_"):
        ContributorTarget(source="m", url=URL, secret="whsec_")


# --------------------------------------------------------------------------- failure policy


def outcome(source: str, status: Any, cause: str | None = None) -> ContributorOutcome:
    """A settled outcome for the policy tests."""
    return ContributorOutcome(source=source, status=status, duration_ms=1.0, cause=cause)


def test_omit_failures_never_raise() -> None:
    """Failures of omit-policy contributors are left for the manifest."""
    targets = [target("a", failure_policy="omit"), target("b", failure_policy="omit")]
    raise_for_failures([outcome("a", "timeout"), outcome("b", "error", "HTTP 500")], targets)


def test_all_ok_never_raises() -> None:
    """Successful fail-policy contributors raise nothing."""
    raise_for_failures([outcome("a", "ok")], [target("a")])


@pytest.mark.parametrize("status", ["timeout", "skipped_deadline"])
def test_fail_policy_deadline_failures_are_504(status: str) -> None:
    """A fail-policy contributor out of time gives CONTEXT_ASSEMBLY_TIMEOUT naming it."""
    targets = [target("a"), target("b", failure_policy="omit")]
    with pytest.raises(AssemblyTimeoutError) as info:
        raise_for_failures([outcome("a", status, "deadline"), outcome("b", "timeout")], targets)
    assert info.value.status == 504
    assert info.value.extensions["sources"] == ["a"]
    assert "'a'" in info.value.detail


@pytest.mark.parametrize(
    ("status", "cause"),
    [
        ("error", "HTTP 500"),
        ("invalid", "schema: revision: Field required"),
        ("too_large", "body over the 1-byte cap"),
    ],
)
def test_fail_policy_other_failures_are_502_with_the_cause(status: str, cause: str) -> None:
    """A fail-policy contributor that errs gives CONTRIBUTOR_FAILED naming source, status and cause."""
    with pytest.raises(ContributorFailedError) as info:
        raise_for_failures([outcome("a", status, cause)], [target("a")])
    problem = info.value.to_problem()
    assert problem["status"] == 502 and problem["code"] == "CONTRIBUTOR_FAILED"
    assert (problem["source"], problem["contributor_status"], problem["cause"]) == (
        "a",
        status,
        cause,
    )
    assert cause in problem["detail"]


def test_a_hard_failure_wins_over_a_timeout_and_all_are_listed() -> None:
    """With a timeout and an error among fail-policy sources the error is raised, both listed."""
    with pytest.raises(ContributorFailedError) as info:
        raise_for_failures(
            [outcome("a", "timeout", "deadline"), outcome("b", "error", "connect refused")],
            [target("a"), target("b")],
        )
    assert info.value.extensions["source"] == "b"
    assert [c["source"] for c in info.value.extensions["contributors"]] == ["a", "b"]


# --------------------------------------------------------------------------- revision queries


async def test_revision_query_packet_and_answer(
    client: ContributorClient, router: respx.MockRouter
) -> None:
    """A revision query posts {type, source, scope} signed and returns the revision."""
    route = router.post(URL).respond(json={"revision": 42, "blocks": []})
    scope = Scope(task_id="t1")
    status, revision = await query_revision(
        client, target(secret=SECRET), scope, time.monotonic() + 1, preparation_id="prep_1"
    )
    assert (status, revision) == ("ok", 42)
    request = route.calls.last.request
    assert orjson.loads(request.content) == {
        "type": "revision",
        "source": "memory",
        "scope": scope.model_dump(mode="json"),
    }
    RevisionPacket.model_validate_json(request.content)  # the ``revision`` webhook's packet
    Webhook(SECRET).verify(request.content, dict(request.headers))
    assert 1 <= int(request.headers[TIMEOUT_HEADER]) <= 1000


async def test_repeated_revision_checks_get_distinct_ids(
    client: ContributorClient, router: respx.MockRouter
) -> None:
    """Each validate check is a new delivery, so a deduplicating contributor answers it."""
    route = router.post(URL).respond(json={"revision": "r"})
    for _ in range(2):
        await query_revision(client, target(), Scope(), time.monotonic() + 1, preparation_id="p")
    first, second = (c.request.headers["webhook-id"] for c in route.calls)
    assert first != second


@pytest.mark.parametrize(
    ("response", "status"),
    [
        (httpx.Response(200, json={"rev": 1}), "invalid"),
        (httpx.Response(200, json={"revision": None}), "invalid"),
        (httpx.Response(200, content=b"nope"), "invalid"),
        (httpx.Response(503), "error"),
        (httpx.Response(200, content=b"1" * 70_000), "too_large"),
    ],
)
async def test_revision_query_failures(
    client: ContributorClient, router: respx.MockRouter, response: httpx.Response, status: str
) -> None:
    """A revision answer that is not {revision} within the cap reports a failure and no revision."""
    router.post(URL).mock(return_value=response)
    assert await query_revision(client, target(), Scope(), time.monotonic() + 1) == (status, None)


async def test_revision_query_past_deadline_is_skipped(
    client: ContributorClient, router: respx.MockRouter
) -> None:
    """With no time left, validate's revision query is not sent."""
    route = router.post(URL).respond(json={"revision": "r"})
    assert await query_revision(client, target(), Scope(), time.monotonic() - 1) == (
        "skipped_deadline",
        None,
    )
    assert route.call_count == 0
