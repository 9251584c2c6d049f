"""The contributor helper: signatures, replay window, deadline, packet dispatch, and end to end with
the real service calling it over loopback."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from client_support import SECRET, async_client_for, build_app, prepare_body, serve_in_thread
from context_assembly_client import StaleError
from context_assembly_client.contributor import (
    TIMEOUT_HEADER,
    ContributePacket,
    ContributionAnswer,
    RevisionPacket,
    make_contributor_app,
)
from context_assembly_client.types import Block

from context_assembly.contributors.calls import TIMEOUT_HEADER as SERVICE_TIMEOUT_HEADER
from context_assembly.contributors.signing import sign_headers

OTHER_SECRET = "whsec_" + "b3RoZXItc2VjcmV0LW5vdC10aGUtcmlnaHQtb25l"
PACKET: dict[str, Any] = {
    "type": "contribute",
    "preparation_id": "prep_1",
    "source": "mem",
    "model": "gpt-4o-mini",
    "input": [{"role": "user", "content": "what is due?"}],
    "data_budget_tokens": 2048,
    "source_token_limit": None,
    "scope": {
        "account_id": "acct",
        "connector_accounts": {},
        "task_id": None,
        "principal": None,
        "identities": [],
        "roles": [],
    },
    "deadline_unix_ms": 0,
}
REVISION_PACKET = {"type": "revision", "source": "mem", "scope": PACKET["scope"]}


def contribute(packet: ContributePacket) -> dict[str, Any]:
    """A plain (sync) contributor: one block echoing the question and the scope's account."""
    question = packet.input[-1].content
    return {
        "revision": "r1",
        "blocks": [{"id": "due", "text": f"{packet.scope.account_id}: {question}", "priority": 3}],
    }


def signed(body: bytes, secret: str | list[str] = SECRET, **sign: Any) -> dict[str, str]:
    """Headers the service itself would send for ``body`` (its own signer)."""
    return {"content-type": "application/json", **sign_headers(secret, "msg_1", body, **sign)}


async def post(app: Any, body: bytes, headers: dict[str, str]) -> httpx.Response:
    """POST ``body`` to the ASGI ``app`` in-process."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://contrib") as http:
        return await http.post("/", content=body, headers=headers)


BODY = orjson.dumps(PACKET)


class TestSignatures:
    async def test_service_signature_is_accepted(self) -> None:
        """A packet signed by the service's own signer is answered 200 with the blocks, as JSON."""
        response = await post(make_contributor_app(contribute, secret=SECRET), BODY, signed(BODY))
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.json() == {
            "revision": "r1",
            "blocks": [
                {
                    "id": "due",
                    "text": "acct: what is due?",
                    "priority": 3,
                    "protected": False,
                    "dependencies": [],
                }
            ],
        }

    async def test_one_good_signature_among_several_is_enough(self) -> None:
        """During a key rotation the header carries several signatures; one valid one suffices."""
        headers = signed(BODY, [OTHER_SECRET, SECRET])
        assert len(headers["webhook-signature"].split()) == 2
        response = await post(make_contributor_app(contribute, secret=SECRET), BODY, headers)
        assert response.status_code == 200

    async def test_receiver_may_hold_several_secrets(self) -> None:
        """A contributor configured with old and new secrets accepts either."""
        app = make_contributor_app(contribute, secret=[OTHER_SECRET, SECRET])
        assert (await post(app, BODY, signed(BODY))).status_code == 200

    async def test_forged_signature_is_401(self) -> None:
        """A signature made with another secret is refused with 401."""
        app = make_contributor_app(contribute, secret=SECRET)
        response = await post(app, BODY, signed(BODY, OTHER_SECRET))
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/json"

    async def test_tampered_body_is_401(self) -> None:
        """A valid signature of a different body is refused with 401."""
        app = make_contributor_app(contribute, secret=SECRET)
        tampered = BODY.replace(b"acct", b"evil")
        assert (await post(app, tampered, signed(BODY))).status_code == 401

    @pytest.mark.parametrize("dropped", ["webhook-id", "webhook-timestamp", "webhook-signature"])
    async def test_missing_header_is_401(self, dropped: str) -> None:
        """Each of the three Standard Webhooks headers is required when a secret is set."""
        headers = signed(BODY)
        del headers[dropped]
        app = make_contributor_app(contribute, secret=SECRET)
        assert (await post(app, BODY, headers)).status_code == 401

    async def test_unsigned_call_is_401_when_a_secret_is_set(self) -> None:
        """A call with no signature headers at all is refused."""
        app = make_contributor_app(contribute, secret=SECRET)
        response = await post(app, BODY, {"content-type": "application/json"})
        assert response.status_code == 401

    @pytest.mark.parametrize("offset", [-301, 301], ids=["replayed", "from-the-future"])
    async def test_timestamp_outside_the_window_is_401(self, offset: int) -> None:
        """A correct signature whose timestamp is more than 300 s from now is refused."""
        when = datetime.now(UTC) + timedelta(seconds=offset)
        app = make_contributor_app(contribute, secret=SECRET, tolerance_seconds=300)
        response = await post(app, BODY, signed(BODY, now=when))
        assert response.status_code == 401
        assert "window" in response.json()["error"]

    async def test_timestamp_inside_the_window_is_accepted(self) -> None:
        """A signature a little old but inside the window is accepted."""
        when = datetime.now(UTC) - timedelta(seconds=200)
        app = make_contributor_app(contribute, secret=SECRET, tolerance_seconds=300)
        assert (await post(app, BODY, signed(BODY, now=when))).status_code == 200

    def test_bad_secret_is_refused_at_construction(self) -> None:
        """A secret that is not whsec_ + base64 fails when the app is made, not on the first call."""
        with pytest.raises(ValueError, match="whsec_"):
            make_contributor_app(contribute, secret="whsec_not base64!")

    async def test_without_a_secret_unsigned_calls_pass(self) -> None:
        """With no secret configured (a loopback sidecar), unsigned calls are served."""
        app = make_contributor_app(contribute)
        assert (await post(app, BODY, {"content-type": "application/json"})).status_code == 200


class TestDeadline:
    async def test_slow_async_function_is_cancelled_at_the_deadline(self) -> None:
        """An async function still running at X-Contributor-Timeout-Ms is cancelled and the answer is 504."""
        cancelled = asyncio.Event()

        async def slow(packet: ContributePacket) -> dict[str, Any]:
            try:
                await asyncio.Event().wait()  # never set: only the deadline ends this
            finally:
                cancelled.set()
            raise AssertionError("unreachable")

        app = make_contributor_app(slow, secret=SECRET)
        response = await post(app, BODY, {**signed(BODY), "X-Contributor-Timeout-Ms": "150"})
        assert response.status_code == 504
        assert cancelled.is_set()  # cancelled by the deadline: nothing else ends its wait

    async def test_slow_sync_function_is_abandoned_at_the_deadline(self) -> None:
        """A blocking function still running at the deadline gets 504; its thread is let go:
        the answer comes while the function is still blocked."""
        release = threading.Event()
        entered, finished = threading.Event(), threading.Event()

        def slow(packet: ContributePacket) -> dict[str, Any]:
            entered.set()
            release.wait(timeout=30)  # bounded: the test releases it once answered
            finished.set()
            return {"revision": "late", "blocks": []}

        app = make_contributor_app(slow)
        try:
            response = await post(app, BODY, {"X-Contributor-Timeout-Ms": "150"})
            still_blocked = entered.is_set() and not finished.is_set()
        finally:
            release.set()  # let the abandoned worker thread finish
        assert response.status_code == 504
        assert still_blocked

    def test_header_name_is_the_services(self) -> None:
        """The helper reads the header the service sends (header names are case-insensitive)."""
        assert TIMEOUT_HEADER == SERVICE_TIMEOUT_HEADER.lower()

    async def test_fast_function_answers_within_the_deadline(self) -> None:
        """A function that finishes before the deadline is answered normally."""
        app = make_contributor_app(contribute)
        response = await post(app, BODY, {"X-Contributor-Timeout-Ms": "5000"})
        assert response.status_code == 200

    async def test_malformed_deadline_header_is_400(self) -> None:
        """A deadline header that is not integer milliseconds is a bad request."""
        app = make_contributor_app(contribute)
        response = await post(app, BODY, {"X-Contributor-Timeout-Ms": "soon"})
        assert response.status_code == 400


class TestDispatch:
    async def test_revision_packet_uses_the_revision_function(self) -> None:
        """A revision packet is answered {revision} from the revision function, not from contribute."""
        seen: list[RevisionPacket] = []

        async def revision(packet: RevisionPacket) -> str:
            seen.append(packet)
            return "r9"

        def never(packet: ContributePacket) -> dict[str, Any]:
            raise AssertionError("contribute must not run for a revision packet")

        app = make_contributor_app(never, revision=revision, secret=SECRET)
        body = orjson.dumps(REVISION_PACKET)
        response = await post(app, body, signed(body))
        assert response.status_code == 200
        assert response.json() == {"revision": "r9"}
        assert seen[0].scope.account_id == "acct"

    async def test_revision_packet_falls_back_to_contribute(self) -> None:
        """Without a revision function, contribute gets a revision stand-in packet and its revision is answered."""
        seen: list[ContributePacket] = []

        def remember(packet: ContributePacket) -> dict[str, Any]:
            seen.append(packet)
            return {"revision": "r1", "blocks": [{"id": "x", "text": "unused"}]}

        body = orjson.dumps(REVISION_PACKET)
        response = await post(make_contributor_app(remember), body, {})
        assert response.json() == {"revision": "r1"}
        assert (seen[0].type, seen[0].source, seen[0].input) == ("revision", "mem", [])
        assert seen[0].scope.account_id == "acct"

    async def test_pydantic_answer_and_async_function(self) -> None:
        """An async function may return a ContributionAnswer model."""

        async def typed(packet: ContributePacket) -> ContributionAnswer:
            return ContributionAnswer(revision=7, blocks=[Block(id="a", text="t", projection="p")])

        response = await post(make_contributor_app(typed), BODY, {})
        assert response.json()["revision"] == 7
        assert response.json()["blocks"][0]["projection"] == "p"

    @pytest.mark.parametrize(
        ("body", "status"),
        [
            (b"{not json", 400),
            (b"[1, 2]", 400),
            (orjson.dumps({"type": "gossip"}), 400),
            (orjson.dumps({"type": "contribute", "source": "mem"}), 400),
        ],
        ids=["bad-json", "not-an-object", "unknown-type", "incomplete-packet"],
    )
    async def test_bad_packets_are_400(self, body: bytes, status: int) -> None:
        """Invalid JSON, a non-object, an unknown type or a malformed packet are 400 with a JSON body."""
        response = await post(make_contributor_app(contribute), body, {})
        assert response.status_code == status
        assert "error" in response.json()

    async def test_failing_or_malformed_function_is_500(self) -> None:
        """A function that raises, or returns something that is not {revision, blocks}, gives 500."""

        def broken(packet: ContributePacket) -> dict[str, Any]:
            raise RuntimeError("database down")

        def malformed(packet: ContributePacket) -> dict[str, Any]:
            return {"blocks": "nope"}

        for fn in (broken, malformed):
            response = await post(make_contributor_app(fn), BODY, {})
            assert response.status_code == 500
            assert "database" not in response.text

    async def test_get_is_405(self) -> None:
        """Only POST is served."""
        transport = httpx.ASGITransport(app=make_contributor_app(contribute))
        async with httpx.AsyncClient(transport=transport, base_url="http://contrib") as http:
            response = await http.get("/")
        assert response.status_code == 405
        assert response.headers["allow"] == "POST"

    async def test_oversized_body_is_413(self) -> None:
        """A body over max_body_bytes is refused with 413."""
        app = make_contributor_app(contribute, max_body_bytes=64)
        assert (await post(app, BODY, {})).status_code == 413


class TestEndToEnd:
    async def test_service_calls_the_helper_over_loopback(self, tmp_path: Path) -> None:
        """The real service signs and calls a helper app served by uvicorn; the manifest shows its blocks
        and validate re-queries its revision."""
        revision = {"value": "r1"}

        async def memory(packet: ContributePacket) -> dict[str, Any]:
            blocks = [{"id": "pinned", "text": "The A42 receipt is pending.", "protected": True}]
            if packet.input:  # a revision check's stand-in packet has no input
                blocks.append({"id": "extra", "text": f"Asked: {packet.input[-1].content}"})
            return {"revision": revision["value"], "blocks": blocks}

        app = make_contributor_app(memory, secret=SECRET)
        with serve_in_thread(app) as url:
            service = build_app(
                tmp_path, contributors={"mem": {"url": url + "/contribute", "secret": SECRET}}
            )
            body = prepare_body(
                plugins=[{"name": "mem", "instructions": "Saved memory."}],
                contributions=[],
                contributors=[{"source": "mem", "endpoint": "mem"}],
                assembly={"timeout_ms": 5000},
            )
            async with async_client_for(service) as client:
                prep = await client.prepare(body)
                decisions = {(b.source, b.id): b.status for b in prep.selection.blocks}
                assert decisions == {("mem", "pinned"): "selected", ("mem", "extra"): "selected"}
                (source,) = prep.selection.sources
                assert (source.source, source.kind, source.status) == ("mem", "webhook", "ok")
                frame_text = orjson.dumps(prep.frame).decode()
                assert "The A42 receipt is pending." in frame_text

                valid = await client.validate(
                    prep.preparation_id, model=prep.model, frame=prep.frame
                )
                assert valid.valid
                revision["value"] = "r2"
                with pytest.raises(StaleError) as caught:
                    await client.validate(prep.preparation_id, model=prep.model, frame=prep.frame)
                assert caught.value.reasons == ["revision_changed:mem"]
