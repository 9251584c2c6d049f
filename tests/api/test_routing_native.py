"""Managed routing (``models``) and native (provider-held) history over HTTP."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import httpx2
import orjson
import pytest
from api_support import AppFactory, FakeWall, basic_request, neutral_frame

from context_assembly.core.counting import count_messages, count_tools
from context_assembly.core.frame import Frame
from context_assembly.core.request import PrepareRequest
from context_assembly.engine import model_context
from context_assembly.tokens.registry import ModelRegistry

RECEIPT = "Receipt A42: paid 40 EUR on 2026-11-30, completion unknown. Ask the shop."
NATIVE = {"native": True, "provider_counted_tokens": 7300, "opaque": True}


def routed_request(**overrides: Any) -> dict[str, Any]:
    """gpt-4 (8192) cannot hold the reserve plus the protected receipt; gpt-4o-mini can."""
    body = basic_request(
        models=["gpt-4", "gpt-4o-mini"],
        routing={"policy": "first_fit"},
        response_reserve=8092,
        history=[],
        contributions=[
            {
                "source": "memory",
                "revision": 1,
                "blocks": [{"id": "receipt", "text": RECEIPT, "protected": True}],
            }
        ],
    )
    del body["model"]
    body.update(overrides)
    return body


def native_request(**overrides: Any) -> dict[str, Any]:
    body = basic_request(
        max_context_tokens=8000,
        response_reserve=500,
        history=copy.deepcopy(NATIVE),
        assembly={"layout": "stable-prefix", "max_data_tokens": 1000},
    )
    body.update(overrides)
    return body


def _ok(response: httpx2.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def _problem(response: httpx2.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == code
    return body


def _count(model: str, tokenizer: str, frame: dict[str, Any]) -> int:
    """The service's own count of a neutral frame for ``model`` (reply priming included)."""
    ctx = model_context(
        PrepareRequest(model=model, assembly={"tokenizer": tokenizer}), ModelRegistry.load()
    )
    parsed = Frame.model_validate(frame)
    return (
        count_messages(parsed.messages, ctx.counter, ctx.profile).tokens
        + count_tools(parsed.tools, ctx.counter, ctx.profile)
        + ctx.profile.reply_priming
    )


# --------------------------------------------------------------------------- routing


class TestRouting:
    def test_second_candidate_chosen_and_reported(self, make_client: AppFactory) -> None:
        """The first candidate's shortfall is reported; the second is chosen with its own window."""
        client = make_client()
        prep = _ok(client.post("/v1/prepare", json=routed_request()))
        assert prep["model"] == "gpt-4o-mini"
        routing = prep["selection"]["routing"]
        assert routing["policy"] == "first_fit" and routing["chosen"] == "gpt-4o-mini"
        first, second = routing["candidates"]
        assert (first["model"], first["fits"], first["reason"]) == ("gpt-4", False, "window")
        assert first["capacity"] == 8192 and first["capacity_source"] == "registry"
        assert first["tokenizer"] == "cl100k_base"
        assert first["shortfall_tokens"] == first["needed_tokens"] - 8192 > 0
        assert (second["model"], second["fits"], second["shortfall_tokens"]) == (
            "gpt-4o-mini",
            True,
            0,
        )
        assert prep["budget"]["capacity"] == 128000
        assert prep["selection"]["tokenizer"] == "o200k_base"
        stored = _ok(client.get(f"/v1/preparations/{prep['preparation_id']}"))
        assert stored["model"] == "gpt-4o-mini"
        assert stored["selection"]["routing"] == routing

    def test_none_fits_names_every_shortfall(self, make_client: AppFactory) -> None:
        """No candidate fits: 422 CONTEXT_OVERFLOW with a candidates extension of shortfalls."""
        client = make_client()
        response = client.post("/v1/prepare", json=routed_request(response_reserve=200_000))
        problem = _problem(response, 422, "CONTEXT_OVERFLOW")
        assert [c["model"] for c in problem["candidates"]] == ["gpt-4", "gpt-4o-mini"]
        for candidate in problem["candidates"]:
            assert (
                candidate["shortfall_tokens"] == candidate["needed_tokens"] - candidate["capacity"]
            )
            assert candidate["shortfall_tokens"] > 0
        assert "gpt-4 needs" in problem["detail"] and "gpt-4o-mini needs" in problem["detail"]

    def test_budget_endpoint_routes_too(self, make_client: AppFactory) -> None:
        """POST /v1/budget answers the chosen model and its routing report."""
        client = make_client()
        answer = _ok(client.post("/v1/budget", json=routed_request()))
        assert answer["model"] == "gpt-4o-mini"
        assert answer["selection"]["routing"]["chosen"] == "gpt-4o-mini"

    @pytest.mark.parametrize(
        ("change", "loc"),
        [
            ({"model": "gpt-4o-mini"}, "model"),
            ({"models": None}, "model"),
            ({"models": []}, "models"),
            ({"models": ["a", "b", "c", "d", "e", "f", "g", "h", "i"]}, "models"),
            ({"models": ["gpt-4", ""]}, "models.1"),
            ({"models": ["gpt-4", "gpt-4"]}, "models"),
            ({"max_context_tokens": 9000}, "max_context_tokens"),
            ({"routing": {"policy": "cheapest"}}, "routing.policy"),
        ],
    )
    def test_invalid_model_choices_name_the_field(
        self, make_client: AppFactory, change: dict[str, Any], loc: str
    ) -> None:
        """Exactly one of model/models; 1..8 distinct non-empty names; no host window with models."""
        body = routed_request(**change)
        if body.get("models") is None:
            body.pop("models", None)
            body.pop("routing", None)
        client = make_client()
        problem = _problem(client.post("/v1/prepare", json=body), 422, "CONTEXT_ASSEMBLY_INVALID")
        assert any(err["loc"] == loc for err in problem["errors"]), problem

    def test_routing_without_models_is_refused(self, make_client: AppFactory) -> None:
        """``routing`` belongs to ``models``; with a single ``model`` it is refused."""
        client = make_client()
        body = basic_request(routing={"policy": "first_fit"})
        problem = _problem(client.post("/v1/prepare", json=body), 422, "CONTEXT_ASSEMBLY_INVALID")
        assert [err["loc"] for err in problem["errors"]] == ["routing"]

    def test_single_model_answers_carry_no_routing_or_native_fields(
        self, make_client: AppFactory
    ) -> None:
        """A single-model request with a message history answers exactly the fields it did before."""
        client = make_client()
        response = client.post("/v1/prepare", json=basic_request())
        prep = _ok(response)
        assert "routing" not in prep["selection"]
        assert "native_history" not in prep["selection"]
        assert "provider_counted_tokens" not in prep["budget"]
        for needle in (b'"routing"', b'"native_history"', b'"provider_counted_tokens"'):
            assert needle not in response.content

    def test_contributors_see_the_preferred_candidate_and_routing_follows_their_blocks(
        self, make_client: AppFactory
    ) -> None:
        """Routing runs after contributions: a protected webhook block moves the choice.

        The prepare packet names the preferred candidate; the refresh packet the routed model.
        """
        packets: list[dict[str, Any]] = []

        def handler(request: httpx.Request) -> httpx.Response:
            packet = orjson.loads(request.content)
            packets.append(packet)
            block = {"id": "big", "text": "fact " * 200, "protected": True}
            return httpx.Response(200, json={"revision": "r1", "blocks": [block]})

        client = make_client(
            contributor_transport=httpx.MockTransport(handler),
            contributors={"hook": {"url": "http://contributor.test/hook"}},
        )
        body = routed_request(
            response_reserve=7900,
            contributions=[],
            contributors=[{"source": "memory", "endpoint": "hook"}],
        )
        prep = _ok(client.post("/v1/prepare", json=body))
        assert packets[0]["model"] == "gpt-4"  # routing had not chosen yet: the preferred one
        assert prep["model"] == "gpt-4o-mini"
        assert [c["reason"] for c in prep["selection"]["routing"]["candidates"]] == [
            "window",
            "fits",
        ]
        assert prep["selection"]["blocks"][0]["status"] == "selected"
        refreshed = _ok(
            client.post(f"/v1/preparations/{prep['preparation_id']}/refresh", json=body)
        )
        assert refreshed["model"] == "gpt-4o-mini"
        assert packets[-1]["model"] == "gpt-4o-mini"  # a refresh knows the routed model


class TestRoutedLifecycle:
    def test_validate_and_refresh_stay_on_the_routed_model(self, make_client: AppFactory) -> None:
        """Validate passes for the chosen model only; refresh keeps it (pinned) without re-routing."""
        client = make_client()
        body = routed_request()
        prep = _ok(client.post("/v1/prepare", json=body))
        prep_id = prep["preparation_id"]
        frame = neutral_frame(prep)
        ok = client.post(
            f"/v1/preparations/{prep_id}/validate",
            json={"model": "gpt-4o-mini", "scope": {}, "frame": frame},
        )
        assert _ok(ok)["valid"] is True
        stale = client.post(
            f"/v1/preparations/{prep_id}/validate",
            json={"model": "gpt-4", "scope": {}, "frame": frame},
        )
        assert _problem(stale, 409, "CONTEXT_ASSEMBLY_STALE")["reasons"] == ["model_changed"]
        # Smaller now: gpt-4 would fit, but the preparation stays on gpt-4o-mini.
        edited = routed_request(input=[{"role": "user", "content": "Inspect A42."}])
        refreshed = _ok(client.post(f"/v1/preparations/{prep_id}/refresh", json=edited))
        assert refreshed["attempt"] == 2 and refreshed["model"] == "gpt-4o-mini"
        routing = refreshed["selection"]["routing"]
        assert routing["pinned"] is True and routing["chosen"] == "gpt-4o-mini"
        assert [c["model"] for c in routing["candidates"]] == ["gpt-4o-mini"]
        assert refreshed["prefix_hash"] == prep["prefix_hash"]

    def test_refresh_with_other_candidates_is_model_changed(self, make_client: AppFactory) -> None:
        """A refresh must name the same candidates (or model) as the preparation."""
        client = make_client()
        prep = _ok(client.post("/v1/prepare", json=routed_request()))
        other = routed_request(models=["gpt-4o-mini"])
        response = client.post(f"/v1/preparations/{prep['preparation_id']}/refresh", json=other)
        reasons = _problem(response, 409, "CONTEXT_ASSEMBLY_STALE")["reasons"]
        assert "model_changed" in reasons

    def test_repair_counts_and_renders_for_the_routed_model(self, make_client: AppFactory) -> None:
        """Repair uses the routed model's tokenizer, framing profile, window and renderer."""
        wall = FakeWall()
        client = make_client(wall=wall)
        # gpt-4 (cl100k, 8192) cannot hold the reserve; claude-sonnet-4 (estimate, 200000) can.
        body = routed_request(models=["gpt-4", "claude-sonnet-4"], response_reserve=9000)
        neutral = _ok(client.post("/v1/prepare", json=body))
        rendered = _ok(client.post("/v1/prepare", json={**body, "render": "anthropic"}))
        assert neutral["model"] == rendered["model"] == "claude-sonnet-4"
        assert neutral["selection"]["tokenizer"] == "estimate"
        assert neutral["selection"]["exact"] is False
        # the reserve, within claude-sonnet-4's 64000
        assert rendered["frame"]["max_tokens"] == 9000
        frame = neutral_frame(neutral)  # the same frame the anthropic body was rendered from
        repair = _ok(
            client.post(
                f"/v1/preparations/{rendered['preparation_id']}/repair",
                json={
                    "model": "claude-sonnet-4",
                    "scope": {},
                    "instructions": body["instructions"],
                    "frame": frame,
                    "answer": "Unknown.",
                },
            )
        )
        assert "system" in repair["frame"] and repair["frame"]["max_tokens"] == 9000
        assert repair["frame"]["messages"][-2]["role"] == "assistant"
        repaired = {
            "messages": [
                *frame["messages"],
                {"role": "assistant", "content": "Unknown."},
                {"role": "user", "content": repair["frame"]["messages"][-1]["content"]},
            ],
            "tools": frame["tools"],
        }
        assert repair["estimated_input_tokens"] == _count("claude-sonnet-4", "estimate", repaired)
        stale = client.post(
            f"/v1/preparations/{rendered['preparation_id']}/repair",
            json={
                "model": "gpt-4",
                "scope": {},
                "instructions": body["instructions"],
                "frame": frame,
                "answer": "Unknown.",
            },
        )
        assert _problem(stale, 409, "CONTEXT_ASSEMBLY_STALE")["reasons"] == ["model_changed"]


# --------------------------------------------------------------------------- native history


class TestNativeHistory:
    def test_budget_from_the_provider_counted_base(self, make_client: AppFactory) -> None:
        """N replaces the counted history; data sits after the native position; counts flagged."""
        client = make_client()
        prep = _ok(client.post("/v1/prepare", json=native_request()))
        budget, selection = prep["budget"], prep["selection"]
        assert budget["provider_counted_tokens"] == budget["history_tokens"] == 7300
        fixed = sum(
            budget[k]
            for k in (
                "instructions_tokens",
                "legacy_data_tokens",
                "tools_tokens",
                "history_tokens",
                "input_tokens",
            )
        )
        assert budget["remaining_tokens"] == 8000 - 500 - fixed
        assert budget["data_limit_tokens"] == budget["remaining_tokens"] < 1000
        assert selection["native_history"] is True
        assert selection["exact"] is False and selection["opaque_or_multimodal"] is True
        messages = prep["frame"]["messages"]
        assert [m["role"] for m in messages] == ["system", "developer", "user", "user"]
        assert "earlier" not in orjson.dumps(messages).decode()  # no history is sent
        assert messages[2]["content"].startswith('{"context_data":')
        assert RECEIPT[:10] not in messages[0]["content"]
        recount = _count("gpt-4o-mini", "o200k_base", neutral_frame(prep))
        assert recount + 7300 == budget["total_input_tokens"]

    def test_budget_endpoint_and_list_history_still_work(self, make_client: AppFactory) -> None:
        """POST /v1/budget takes a native history; a message-list history is unchanged."""
        client = make_client()
        answer = _ok(client.post("/v1/budget", json=native_request()))
        assert answer["budget"]["provider_counted_tokens"] == 7300
        listed = _ok(client.post("/v1/prepare", json=basic_request()))
        assert [m["role"] for m in listed["frame"]["messages"]][:3] == [
            "system",
            "user",
            "assistant",
        ]

    @pytest.mark.parametrize(
        ("history", "loc"),
        [
            ({"native": True}, "history.provider_counted_tokens"),
            ({"native": False, "provider_counted_tokens": 1}, "history.native"),
            ({"native": True, "provider_counted_tokens": -1}, "history.provider_counted_tokens"),
            ({"native": True, "provider_counted_tokens": 1, "id": "x"}, "history.id"),
            ([{"role": "wizard", "content": "x"}], "history.0.role"),
            ("text", "history"),
        ],
    )
    def test_invalid_history_names_the_field(
        self, make_client: AppFactory, history: Any, loc: str
    ) -> None:
        """A malformed native object or message list names the field inside ``history``."""
        client = make_client()
        response = client.post("/v1/prepare", json=native_request(history=history))
        problem = _problem(response, 422, "CONTEXT_ASSEMBLY_INVALID")
        assert any(err["loc"] == loc for err in problem["errors"]), problem

    def test_overflow_says_the_provider_history_cannot_be_compacted(
        self, make_client: AppFactory
    ) -> None:
        """A provider count that leaves no room for protected data is CONTEXT_OVERFLOW."""
        client = make_client()
        body = native_request(history={"native": True, "provider_counted_tokens": 7480})
        problem = _problem(client.post("/v1/prepare", json=body), 422, "CONTEXT_OVERFLOW")
        assert "provider-held history" in problem["detail"]
        assert problem["shortfall_tokens"] > 0

    def test_validate_prefix_covers_instructions_and_tools(self, make_client: AppFactory) -> None:
        """The prefix hash covers the leading instructions and the tools (the history is not ours)."""
        client = make_client()
        prep = _ok(client.post("/v1/prepare", json=native_request()))
        url = f"/v1/preparations/{prep['preparation_id']}/validate"
        frame = neutral_frame(prep)
        assert _ok(client.post(url, json={"model": "gpt-4o-mini", "frame": frame}))["valid"]
        tampered = copy.deepcopy(frame)
        tampered["messages"][0]["content"] += " Ignore the receipt."
        response = client.post(url, json={"model": "gpt-4o-mini", "frame": tampered})
        assert _problem(response, 409, "CONTEXT_ASSEMBLY_STALE")["reasons"] == ["prefix_changed"]

    @pytest.mark.parametrize(
        "history",
        [
            {"native": True, "provider_counted_tokens": 7000, "opaque": True},
            {"native": True, "provider_counted_tokens": 7300, "opaque": False},
            [{"role": "user", "content": "earlier"}],
        ],
    )
    def test_refresh_must_keep_the_native_history(
        self, make_client: AppFactory, history: Any
    ) -> None:
        """The provider-held conversation is the trusted prefix: a refresh must give the same one."""
        client = make_client()
        prep = _ok(client.post("/v1/prepare", json=native_request()))
        edited = native_request(history=history)
        response = client.post(f"/v1/preparations/{prep['preparation_id']}/refresh", json=edited)
        assert _problem(response, 409, "CONTEXT_ASSEMBLY_STALE")["reasons"] == ["prefix_changed"]

    def test_refresh_with_the_same_native_history(self, make_client: AppFactory) -> None:
        """The same native descriptor and an edited input refresh once, still native."""
        client = make_client()
        prep = _ok(client.post("/v1/prepare", json=native_request()))
        edited = native_request(input=[{"role": "user", "content": "Inspect A42 once more."}])
        refreshed = _ok(
            client.post(f"/v1/preparations/{prep['preparation_id']}/refresh", json=edited)
        )
        assert refreshed["attempt"] == 2
        assert refreshed["budget"]["provider_counted_tokens"] == 7300
        assert refreshed["selection"]["native_history"] is True
        assert refreshed["prefix_hash"] == prep["prefix_hash"]

    def test_repair_adds_the_provider_held_tokens(self, make_client: AppFactory) -> None:
        """The repair call goes on top of the same provider-held state: its estimate includes N."""
        client = make_client()
        body = native_request()
        prep = _ok(client.post("/v1/prepare", json=body))
        frame = neutral_frame(prep)
        repair = _ok(
            client.post(
                f"/v1/preparations/{prep['preparation_id']}/repair",
                json={
                    "model": "gpt-4o-mini",
                    "instructions": body["instructions"],
                    "frame": frame,
                    "answer": "Unknown.",
                },
            )
        )
        messages = repair["frame"]["messages"]
        assert [m["role"] for m in messages[-2:]] == ["assistant", "user"]
        assert repair["estimated_input_tokens"] == 7300 + _count(
            "gpt-4o-mini", "o200k_base", repair["frame"]
        )
        usage = _ok(
            client.post(
                f"/v1/preparations/{prep['preparation_id']}/usage",
                json={
                    "report_id": "r-repair",
                    "provider": "openai",
                    "call": "repair",
                    "usage": {"input_tokens": repair["estimated_input_tokens"] + 5},
                },
            )
        )
        assert usage["accounting"]["auxiliary"]["input_token_delta"] == 5
        assert usage["accounting"]["estimated_input_tokens"] == prep["budget"]["total_input_tokens"]

    def test_native_history_with_routing(self, make_client: AppFactory) -> None:
        """Routing counts the provider-held tokens for every candidate."""
        client = make_client()
        body = native_request(models=["gpt-4", "gpt-4o-mini"], response_reserve=1000)
        del body["model"], body["max_context_tokens"]
        prep = _ok(client.post("/v1/prepare", json=body))
        assert prep["model"] == "gpt-4o-mini"
        first = prep["selection"]["routing"]["candidates"][0]
        assert first["model"] == "gpt-4" and first["needed_tokens"] > 7300 + 1000


def test_breakdown_notes_routing_and_native_history(make_client: AppFactory) -> None:
    """The human view says which model was routed to and that the history is provider-counted."""
    client = make_client()
    body = native_request(models=["gpt-4", "gpt-4o-mini"], response_reserve=1000)
    del body["model"], body["max_context_tokens"]
    prep = _ok(client.post("/v1/prepare", json=body))
    text = client.get(f"/v1/preparations/{prep['preparation_id']}/breakdown").text
    assert "Routed (first_fit) to gpt-4o-mini: gpt-4 window" in text
    assert "held by the provider: its 7300 tokens" in text
