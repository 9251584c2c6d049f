"""Both clients against the real app in-process: every operation round trip, and its errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from client_support import (
    API_KEY,
    async_client_for,
    auth_settings,
    build_app,
    prepare_body,
    sync_client_for,
)
from context_assembly_client import (
    AssemblyOverflowError,
    AsyncClient,
    AuthenticationError,
    Client,
    ContextOverflowError,
    ContributorFailedError,
    ContributorUrlRejectedError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    StaleError,
    usage_from_openai,
)
from context_assembly_client.types import (
    AssemblyOptions,
    Block,
    Contribution,
    Frame,
    Message,
    Plugin,
    PreparationView,
    PrepareRequest,
    PrepareResponse,
)

OPENAI_CHAT = {
    "id": "chatcmpl-1",
    "usage": {
        "prompt_tokens": 120,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 64},
    },
}


def typed_request() -> PrepareRequest:
    """The same request as ``prepare_body()``, built from the client's models."""
    return PrepareRequest(
        model="gpt-4o-mini",
        instructions="Be exact.",
        plugins=[Plugin(name="memory", instructions="Saved entries.")],
        contributions=[
            Contribution(
                source="memory",
                revision=1,
                blocks=[
                    Block(id="receipt", text="Receipt A42: completion unknown.", protected=True),
                    Block(id="note", text="A note about A42.", priority=5),
                ],
            )
        ],
        history=[Message(role="user", content="earlier"), Message(role="assistant", content="ok")],
        input=[Message(role="user", content="Inspect receipt A42.")],
        assembly=AssemblyOptions(layout="stable-prefix"),
    )


def assert_prepared(prep: PrepareResponse) -> None:
    """A prepare answer of ``typed_request()``: both memory blocks selected, hashes present."""
    decisions = {(b.source, b.id): b.status for b in prep.selection.blocks}
    assert decisions == {("memory", "receipt"): "selected", ("memory", "note"): "selected"}
    assert prep.preparation_id.startswith("prep_")
    assert prep.fingerprint.startswith("sha256:")
    assert prep.layout == "stable-prefix"
    assert prep.attempt == 1


class TestAsyncRoundTrip:
    async def test_every_operation_round_trips(self, aclient: AsyncClient) -> None:
        """prepare, get, budget, validate, refresh, repair, usage, breakdown, models and health answer typed models."""
        models = await aclient.models()
        assert "gpt-4o-mini" in {m.name for m in models.models}
        assert (await aclient.health()).status == "ok"

        prep = await aclient.prepare(typed_request())
        assert_prepared(prep)

        budget = await aclient.budget(prepare_body())
        assert budget.model == "gpt-4o-mini"
        assert budget.budget.data_tokens > 0

        view = await aclient.get_preparation(prep.preparation_id)
        assert isinstance(view, PreparationView)
        assert (view.fingerprint, view.attempt, view.refresh_used) == (prep.fingerprint, 1, False)

        valid = await aclient.validate(prep.preparation_id, model=prep.model, frame=prep.frame)
        assert valid.valid is True
        assert valid.preparation_id == prep.preparation_id

        edited = prepare_body(input=[{"role": "user", "content": "Inspect receipt A43 instead."}])
        refreshed = await aclient.refresh(prep.preparation_id, edited)
        assert refreshed.attempt == 2
        assert refreshed.preparation_id == prep.preparation_id

        repaired = await aclient.repair(
            prep.preparation_id,
            model="gpt-4o-mini",
            instructions="Be exact.",
            frame=Frame.model_validate(refreshed.frame),
            answer="A42 is unknown",
            schema={"type": "object", "properties": {"status": {"type": "string"}}},
        )
        assert repaired.frame["messages"][-2] == {"role": "assistant", "content": "A42 is unknown"}
        assert repaired.estimated_input_tokens > 0

        provider, usage = usage_from_openai(OPENAI_CHAT)
        first = await aclient.report_usage(
            prep.preparation_id, report_id="chatcmpl-1", provider=provider, usage=usage
        )
        again = await aclient.report_usage(
            prep.preparation_id, report_id="chatcmpl-1", provider=provider, usage=usage
        )
        assert first.accounting.last is not None
        assert first.accounting.last.provider_input_tokens == 120
        assert first.accounting.last.cached_input_tokens == 64
        assert again == first

        text = await aclient.breakdown(prep.preparation_id)
        html = await aclient.breakdown(prep.preparation_id, html=True)
        assert prep.preparation_id in text
        assert "<html" in html.lower()
        assert "<html" not in text.lower()
        timeline = await aclient.timeline(prep.preparation_id)
        assert [t.preparation_id for t in timeline.turns][-1] == prep.preparation_id
        assert timeline.turns[-1].cached_input_tokens == 64
        assert first.accounting.last.expected_cached_tokens == 0

    async def test_refresh_twice_is_stale_with_reasons(self, aclient: AsyncClient) -> None:
        """A second refresh raises StaleError carrying the problem's reasons (refresh_used)."""
        prep = await aclient.prepare(prepare_body())
        await aclient.refresh(prep.preparation_id, prepare_body())
        with pytest.raises(StaleError) as caught:
            await aclient.refresh(prep.preparation_id, prepare_body())
        err = caught.value
        assert err.reasons == ["refresh_used"]
        assert (err.status_code, err.code) == (409, "CONTEXT_ASSEMBLY_STALE")
        assert err.problem["reasons"] == ["refresh_used"]
        assert err.request_id

    async def test_validate_with_an_edited_frame_is_stale(self, aclient: AsyncClient) -> None:
        """validate of a frame whose current input changed raises StaleError(input_changed)."""
        prep = await aclient.prepare(prepare_body())
        frame = Frame.model_validate(prep.frame)
        edited = frame.model_copy(
            update={"messages": [*frame.messages[:-1], Message(role="user", content="other")]}
        )
        with pytest.raises(StaleError) as caught:
            await aclient.validate(prep.preparation_id, model=prep.model, frame=edited)
        assert caught.value.reasons == ["input_changed"]

    async def test_unknown_id_is_not_found(self, aclient: AsyncClient) -> None:
        """An unknown preparation id raises NotFoundError, on reads and on lifecycle calls."""
        with pytest.raises(NotFoundError) as caught:
            await aclient.get_preparation("prep_does_not_exist")
        assert caught.value.status_code == 404
        with pytest.raises(NotFoundError):
            await aclient.validate("prep_does_not_exist", model="gpt-4o-mini", frame={})

    @pytest.mark.parametrize(
        ("body", "error"),
        [
            (prepare_body(assembly={"timeout_ms": 0}), InvalidRequestError),
            (
                prepare_body(contributors=[{"source": "nowhere", "endpoint": "nowhere"}]),
                InvalidRequestError,
            ),
            (prepare_body(assembly={"max_data_tokens": 5}), AssemblyOverflowError),
            (prepare_body(max_context_tokens=200, response_reserve=150), ContextOverflowError),
            (
                prepare_body(
                    contributors=[{"source": "memory", "url": "http://169.254.169.254/x"}],
                    contributions=[],
                ),
                ContributorUrlRejectedError,
            ),
        ],
        ids=["range", "unknown-source", "protected-overflow", "window-overflow", "url-rejected"],
    )
    async def test_request_errors_raise_their_class(
        self, aclient: AsyncClient, body: dict[str, Any], error: type[Exception]
    ) -> None:
        """Each refused prepare raises the exception class of its problem code."""
        with pytest.raises(error) as caught:
            await aclient.prepare(body)
        assert caught.value.problem["code"] == caught.value.code  # type: ignore[attr-defined]

    async def test_failing_registered_contributor_raises_contributor_failed(
        self, tmp_path: Path
    ) -> None:
        """A registered contributor that refuses connections gives ContributorFailedError naming it."""
        app = build_app(tmp_path, contributors={"memory": {"url": "http://127.0.0.1:9/"}})
        async with async_client_for(app) as aclient:
            body = prepare_body(contributors=[{"source": "memory", "endpoint": "memory"}])
            body["contributions"] = []
            with pytest.raises(ContributorFailedError) as caught:
                await aclient.prepare(body)
        assert caught.value.source == "memory"
        assert caught.value.status_code == 502

    async def test_body_over_the_limit_is_payload_too_large(self, tmp_path: Path) -> None:
        """A body over the configured limit raises PayloadTooLargeError."""
        app = build_app(tmp_path, limits={"max_body_bytes": 2048})
        async with async_client_for(app) as aclient:
            with pytest.raises(PayloadTooLargeError) as caught:
                await aclient.prepare(prepare_body(instructions="x" * 4096))
        assert caught.value.status_code == 413

    async def test_api_key_auth(self, tmp_path: Path) -> None:
        """With API-key auth, no key and a wrong key raise AuthenticationError; the right key works."""
        app = build_app(tmp_path, **auth_settings())
        async with async_client_for(app) as anonymous:
            with pytest.raises(AuthenticationError) as caught:
                await anonymous.prepare(prepare_body())
            assert caught.value.code == "UNAUTHENTICATED"
        async with async_client_for(app, api_key="not-the-key") as wrong:
            with pytest.raises(AuthenticationError):
                await wrong.get_preparation("prep_x")
        async with async_client_for(app, api_key=API_KEY) as keyed:
            prep = await keyed.prepare(prepare_body())
            assert (await keyed.get_preparation(prep.preparation_id)).model == "gpt-4o-mini"


class TestSyncRoundTrip:
    def test_every_operation_round_trips(self, client: Client) -> None:
        """The blocking client does the same lifecycle against the app behind TestClient."""
        assert "gpt-4o-mini" in {m.name for m in client.models().models}
        assert client.health().status == "ok"
        prep = client.prepare(typed_request())
        assert_prepared(prep)
        assert client.budget(typed_request()).pending_sources == []
        assert client.get_preparation(prep.preparation_id).fingerprint == prep.fingerprint
        assert client.validate(prep.preparation_id, model=prep.model, frame=prep.frame).valid
        refreshed = client.refresh(prep.preparation_id, typed_request())
        assert refreshed.attempt == 2
        repaired = client.repair(
            prep.preparation_id,
            model="gpt-4o-mini",
            instructions="Be exact.",
            frame=refreshed.frame,
            answer="done",
        )
        assert repaired.frame["messages"][-2]["content"] == "done"
        usage = client.report_usage(
            prep.preparation_id,
            report_id="r-1",
            provider="normalized",
            usage={"provider_input_tokens": 90, "output_tokens": 3},
            call="wrap_up",
        )
        assert usage.accounting.last is not None
        assert usage.accounting.last.call == "wrap_up"
        assert prep.preparation_id in client.breakdown(prep.preparation_id)

    def test_errors_raise_their_class(self, client: Client) -> None:
        """The blocking client raises the same classes: StaleError, InvalidRequestError, NotFoundError."""
        prep = client.prepare(prepare_body())
        client.refresh(prep.preparation_id, prepare_body())
        with pytest.raises(StaleError) as stale:
            client.refresh(prep.preparation_id, prepare_body())
        assert stale.value.reasons == ["refresh_used"]
        with pytest.raises(InvalidRequestError):
            client.prepare({"model": ""})
        with pytest.raises(NotFoundError):
            client.breakdown("prep_missing")

    def test_api_key_auth(self, tmp_path: Path) -> None:
        """The blocking client sends its key as a bearer token; without one it is refused."""
        app = build_app(tmp_path, **auth_settings())
        with sync_client_for(app) as anonymous, pytest.raises(AuthenticationError):
            anonymous.prepare(prepare_body())
        with sync_client_for(app, api_key=API_KEY) as keyed:
            assert keyed.prepare(prepare_body()).model == "gpt-4o-mini"


def test_a_typed_request_takes_provider_shaped_messages(client: Client) -> None:
    """The client's request model takes history and input in a provider's own shape, as the
    document says, and the service reads them: an OpenAI Chat tool call and its answer reach
    the frame beside neutral messages."""
    request = PrepareRequest(
        model="gpt-4o-mini",
        render="openai-chat",
        history=[
            {"role": "user", "content": "Look up A42."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"id": "A42"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "A42: 3 items"},
        ],
        input=[{"role": "user", "content": [{"type": "text", "text": "Summarise it."}]}],
    )
    assert request.history is not None and isinstance(request.history, list)
    assert isinstance(request.history[0], Message)  # a neutral message stays a model
    assert isinstance(request.history[1], dict)  # a provider's shape is sent as written
    prep = client.prepare(request)
    messages = prep.frame["messages"] if isinstance(prep.frame, dict) else None
    assert messages is not None
    calls = [m for m in messages if m.get("tool_calls")]
    assert calls[0]["tool_calls"][0]["function"]["name"] == "lookup"
    assert messages[-1]["content"] == [{"type": "text", "text": "Summarise it."}]
    assert messages[-2] == {"role": "tool", "tool_call_id": "call_1", "content": "A42: 3 items"}
