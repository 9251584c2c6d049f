"""The preparation lifecycle over HTTP (in-process app, real SQLite): docs/contract.md, "Lifecycle"."""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import httpx
import orjson
import pytest
from api_support import KEYS, AppFactory, FakeWall, basic_request, neutral_frame


def _prepare(client: Any, body: dict[str, Any] | None = None, **headers: str) -> dict[str, Any]:
    response = client.post("/v1/prepare", json=body or basic_request(), headers=headers)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def _hooked(
    make_client: AppFactory, handler: Any, policy: str | None = None, **client_kw: Any
) -> tuple[Any, dict[str, Any]]:
    """A client whose registered contributor ``hook`` answers through ``handler``, and a prepare
    request naming it as the source ``docs``."""
    hook = {"url": "http://contributor.test/hook", **({"failure_policy": policy} if policy else {})}
    client = make_client(
        contributor_transport=httpx.MockTransport(handler), contributors={"hook": hook}, **client_kw
    )
    body = basic_request(contributors=[{"source": "docs", "endpoint": "hook"}])
    body["plugins"] = [*body["plugins"], {"name": "docs"}]
    return client, body


def _report(
    client: Any, prep_id: str, report_id: str, provider: str, call: str, usage: Any
) -> httpx.Response:
    response: httpx.Response = client.post(
        f"/v1/preparations/{prep_id}/usage",
        json={"report_id": report_id, "provider": provider, "call": call, "usage": usage},
    )
    return response


def _validate(client: Any, prep: dict[str, Any], **changes: Any) -> httpx.Response:
    body = {"model": "gpt-4o-mini", "scope": {}, "frame": neutral_frame(prep)}
    body.update(changes)
    response: httpx.Response = client.post(
        f"/v1/preparations/{prep['preparation_id']}/validate", json=body
    )
    return response


class TestValidate:
    def test_unchanged_frame_is_valid(self, make_client: AppFactory) -> None:
        """The frame exactly as prepared validates with 200 {valid: true}."""
        client = make_client()
        prep = _prepare(client)
        response = _validate(client, prep)
        assert response.status_code == 200
        assert response.json()["valid"] is True

    def test_each_stale_reason_is_reported(self, make_client: AppFactory) -> None:
        """Model, scope, prefix, input and expiry changes each give their own 409 reason."""
        wall = FakeWall()
        client = make_client(wall=wall)
        prep = _prepare(client)
        frame = neutral_frame(prep)
        cases: list[tuple[dict[str, Any], str]] = []
        cases.append(({"model": "gpt-4o"}, "model_changed"))
        cases.append(({"scope": {"account_id": "other"}}, "scope_changed"))
        edited_prefix = copy.deepcopy(frame)
        edited_prefix["messages"][1]["content"] = "tampered history"
        cases.append(({"frame": edited_prefix}, "prefix_changed"))
        edited_input = copy.deepcopy(frame)
        edited_input["messages"][-1]["content"] = "another question"
        cases.append(({"frame": edited_input}, "input_changed"))
        resorted = copy.deepcopy(frame)
        resorted["tools"] = [{"name": "late_tool", "description": "", "parameters": {}}]
        cases.append(({"frame": resorted}, "prefix_changed"))
        for changes, reason in cases:
            response = _validate(client, prep, **changes)
            assert response.status_code == 409, (reason, response.text)
            problem = response.json()
            assert problem["code"] == "CONTEXT_ASSEMBLY_STALE"
            assert problem["reasons"] == [reason]
            assert response.headers["content-type"] == "application/problem+json"
        wall.now += 1900  # past the selected note's expires_at (12:30Z), within the record TTL
        expired = _validate(client, prep)
        assert expired.status_code == 409
        assert expired.json()["reasons"] == ["expired:memory/note"]

    def test_revision_unavailable_when_the_contributor_fails_the_query(
        self, make_client: AppFactory
    ) -> None:
        """A webhook whose revision query fails makes validate answer revision_unavailable:<source>."""
        calls: list[str] = []

        def handler(request: httpx.Request) -> httpx.Response:
            packet = orjson.loads(request.content)
            calls.append(packet["type"])
            if packet["type"] == "revision":
                return httpx.Response(500)
            return httpx.Response(
                200, json={"revision": "r1", "blocks": [{"id": "x", "text": "hi"}]}
            )

        client, body = _hooked(make_client, handler)
        prep = _prepare(client, body)
        response = _validate(client, prep)
        assert response.status_code == 409
        assert response.json()["reasons"] == ["revision_unavailable:docs"]
        assert calls == ["contribute", "revision"]


class TestRefreshRepair:
    def test_refresh_once_then_refresh_used(self, make_client: AppFactory) -> None:
        """An edited input refreshes once (attempt 2, same id); a second refresh is 409 refresh_used."""
        client = make_client()
        body = basic_request()
        prep = _prepare(client, body)
        edited = basic_request(input=[{"role": "user", "content": "Inspect receipt A42, briefly."}])
        first = client.post(f"/v1/preparations/{prep['preparation_id']}/refresh", json=edited)
        assert first.status_code == 200, first.text
        assert first.json()["attempt"] == 2
        assert first.json()["preparation_id"] == prep["preparation_id"]
        assert first.json()["input_hash"] != prep["input_hash"]
        second = client.post(f"/v1/preparations/{prep['preparation_id']}/refresh", json=edited)
        assert second.status_code == 409
        assert second.json()["reasons"] == ["refresh_used"]
        # The stored view now describes the refreshed frame: validate accepts it.
        assert _validate(client, first.json()).status_code == 200

    def test_failed_refresh_uses_up_the_attempt(self, make_client: AppFactory) -> None:
        """A refresh that changes the trusted prefix fails with 409 and still uses the one refresh."""
        client = make_client()
        prep = _prepare(client)
        tampered = basic_request(instructions="New host prompt.")
        failed = client.post(f"/v1/preparations/{prep['preparation_id']}/refresh", json=tampered)
        assert failed.status_code == 409
        assert failed.json()["reasons"] == ["prefix_changed"]
        again = client.post(
            f"/v1/preparations/{prep['preparation_id']}/refresh", json=basic_request()
        )
        assert again.json()["reasons"] == ["refresh_used"]

    def test_repair_with_changed_instructions_is_stale(self, make_client: AppFactory) -> None:
        """repair with the original instructions answers a frame; changed instructions answer 409."""
        client = make_client()
        body = basic_request()
        prep = _prepare(client, body)
        path = f"/v1/preparations/{prep['preparation_id']}/repair"
        repair = {
            "model": "gpt-4o-mini",
            "instructions": body["instructions"],
            "frame": neutral_frame(prep),
            "answer": "A42: unknown",
            "schema": {"type": "object"},
        }
        ok = client.post(path, json=repair)
        assert ok.status_code == 200, ok.text
        messages = ok.json()["frame"]["messages"]
        assert messages[-2] == {"role": "assistant", "content": "A42: unknown"}
        assert messages[-1]["role"] == "user" and '"type":"object"' in messages[-1]["content"]
        stale = client.post(path, json={**repair, "instructions": "Changed host prompt."})
        assert stale.status_code == 409
        assert stale.json()["reasons"] == ["instructions_changed"]

    def test_a_write_during_the_repair_check_is_not_undone(self, make_client: AppFactory) -> None:
        """While repair awaits a revision query, another call rewrites the record (a refresh
        does): the repair checks the frame again against what the record holds then (409 here),
        and leaves that write as it is. Without the compare and set it would answer 200 and
        write the old record back."""
        writes: list[int] = []
        app_state: dict[str, Any] = {}

        async def handler(request: httpx.Request) -> httpx.Response:
            packet = orjson.loads(request.content)
            if packet["type"] == "revision" and not writes:
                store = app_state["store"]
                record = await store.get("default", app_state["id"], app_state["now"]())
                response = {**record.data["response"], "input_hash": "sha256:refreshed"}
                changed = {**record.data, "response": {**response, "attempt": 2}}
                assert await store.replace_data("default", record.id, changed, app_state["now"]())
                writes.append(record.version + 1)
            return httpx.Response(
                200, json={"revision": "r1", "blocks": [{"id": "x", "text": "hi"}]}
            )

        client, body = _hooked(make_client, handler)
        prep = _prepare(client, body)
        preparations = client.app.state.preparations
        app_state.update(
            store=preparations.store, id=prep["preparation_id"], now=preparations.clock.wall
        )
        repair = {
            "model": "gpt-4o-mini",
            "instructions": body["instructions"],
            "frame": neutral_frame(prep),
            "answer": "A42: unknown",
        }
        path = f"/v1/preparations/{prep['preparation_id']}/repair"
        stale = client.post(path, json=repair)
        assert stale.status_code == 409, stale.text
        assert stale.json()["reasons"] == ["input_changed"]
        view = client.get(f"/v1/preparations/{prep['preparation_id']}").json()
        assert view["attempt"] == 2 and view["input_hash"] == "sha256:refreshed", "the write stays"
        assert writes == [2]

    def test_a_repair_written_during_a_refresh_is_kept(self, make_client: AppFactory) -> None:
        """A repair's estimate written while a refresh awaits its contributors survives the
        refresh's write (compare and set, then carried over): a later repair usage report is
        compared with it."""
        contributes: list[str] = []
        app_state: dict[str, Any] = {}

        async def handler(request: httpx.Request) -> httpx.Response:
            packet = orjson.loads(request.content)
            if packet["type"] == "contribute":
                contributes.append(packet["preparation_id"])
                if len(contributes) == 2:  # the refresh's call: a repair writes meanwhile
                    store, now = app_state["store"], app_state["now"]
                    record = await store.get("default", packet["preparation_id"], now())
                    repaired = {**record.data, "repair_estimated_input_tokens": 777}
                    assert await store.replace_data("default", record.id, repaired, now())
            return httpx.Response(
                200, json={"revision": "r1", "blocks": [{"id": "x", "text": "hi"}]}
            )

        client, body = _hooked(make_client, handler)
        preparations = client.app.state.preparations
        app_state.update(store=preparations.store, now=preparations.clock.wall)
        prep = _prepare(client, body)
        edited = {**body, "input": [{"role": "user", "content": "Inspect receipt A42, briefly."}]}
        refreshed = client.post(f"/v1/preparations/{prep['preparation_id']}/refresh", json=edited)
        assert refreshed.status_code == 200, refreshed.text
        assert len(contributes) == 2
        usage = _report(
            client, prep["preparation_id"], "rep", "openai", "repair", {"prompt_tokens": 1000}
        )
        assert usage.json()["accounting"]["auxiliary"]["input_token_delta"] == 1000 - 777
        view = client.get(f"/v1/preparations/{prep['preparation_id']}").json()
        assert view["attempt"] == 2, "the refresh's own data was written"

    def test_a_refused_refresh_says_what_the_body_must_be(self, make_client: AppFactory) -> None:
        """A refresh body shaped {model, scope, history, input} cannot be laid out again: the 409
        says the whole prepare request is expected."""
        client = make_client()
        body = basic_request()
        prep = _prepare(client, body)
        short = {key: body[key] for key in ("model", "history", "input")}
        refused = client.post(f"/v1/preparations/{prep['preparation_id']}/refresh", json=short)
        assert refused.status_code == 409
        assert refused.json()["reasons"] == ["prefix_changed"]
        assert "whole prepare request" in refused.json()["detail"]


class TestUsage:
    REPORTS: ClassVar[list[tuple[str, dict[str, Any], tuple[int, int, int | None, int]]]] = [
        (
            "openai",
            {
                "prompt_tokens": 200,
                "completion_tokens": 9,
                "prompt_tokens_details": {"cached_tokens": 128},
            },
            (200, 128, None, 9),
        ),
        (
            "anthropic",
            {
                "input_tokens": 20,
                "cache_read_input_tokens": 150,
                "cache_creation_input_tokens": 30,
                "output_tokens": 7,
            },
            (200, 150, 30, 7),
        ),
        (
            "google",
            {
                "usageMetadata": {
                    "promptTokenCount": 200,
                    "cachedContentTokenCount": 0,
                    "candidatesTokenCount": 11,
                }
            },
            (200, 0, None, 11),
        ),
    ]

    def test_usage_fills_accounting_per_provider(self, make_client: AppFactory) -> None:
        """OpenAI, Anthropic and Gemini usage objects fill 'last' as docs/contract.md, "Accounting", says."""
        client = make_client()
        for provider, usage, (total, cached, creation, output) in self.REPORTS:
            prep = _prepare(client)
            estimate = prep["budget"]["total_input_tokens"]
            response = client.post(
                f"/v1/preparations/{prep['preparation_id']}/usage",
                json={
                    "report_id": f"r-{provider}",
                    "provider": provider,
                    "call": "main",
                    "usage": usage,
                },
            )
            assert response.status_code == 200, response.text
            last = response.json()["accounting"]["last"]
            assert (
                last["provider_input_tokens"],
                last["cached_input_tokens"],
                last["cache_creation_input_tokens"],
                last["output_tokens"],
            ) == (total, cached, creation, output)
            assert last["input_token_delta"] == total - estimate
            assert response.json()["accounting"]["auxiliary"] is None

    def test_the_response_id_and_cache_diagnostics_are_kept_with_the_observation(
        self, make_client: AppFactory
    ) -> None:
        """A report's optional ``response_id`` and ``diagnostics`` (the provider's cache
        diagnostics object, as received) are stored in the observation and shown by the
        preparation; a report without them shows ``null``."""
        client = make_client()
        diagnostics = {"cache_miss_reason": {"type": "system_changed"}}
        prep = _prepare(client)
        path = f"/v1/preparations/{prep['preparation_id']}/usage"
        body = {
            "report_id": "r1",
            "provider": "anthropic",
            "usage": {"input_tokens": 100},
            "response_id": "msg_01",
            "diagnostics": diagnostics,
        }
        answer = client.post(path, json=body)
        assert answer.status_code == 200, answer.text
        last = answer.json()["accounting"]["last"]
        assert (last["response_id"], last["diagnostics"]) == ("msg_01", diagnostics)
        view = client.get(f"/v1/preparations/{prep['preparation_id']}").json()
        assert view["accounting"]["last"]["diagnostics"] == diagnostics
        other = _prepare(client)
        plain = _report(
            client, other["preparation_id"], "r2", "openai", "main", {"prompt_tokens": 5}
        )
        assert plain.json()["accounting"]["last"]["response_id"] is None
        assert plain.json()["accounting"]["last"]["diagnostics"] is None
        bad = client.post(path, json={**body, "report_id": "r3", "response_id": ""})
        assert bad.status_code == 422 and "response_id" in bad.text

    def test_same_report_id_twice_changes_nothing_and_repair_is_auxiliary(
        self, make_client: AppFactory
    ) -> None:
        """A repeated report_id answers the same; a repair report goes to auxiliary, never 'last'."""
        client = make_client()
        prep = _prepare(client)
        path = f"/v1/preparations/{prep['preparation_id']}/usage"
        main = {
            "report_id": "r1",
            "provider": "openai",
            "call": "main",
            "usage": {"prompt_tokens": 100},
        }
        first = client.post(path, json=main)
        again = client.post(path, json={**main, "usage": {"prompt_tokens": 999}})
        assert again.json() == first.json()
        repair = client.post(
            path,
            json={
                "report_id": "r2",
                "provider": "openai",
                "call": "repair",
                "usage": {"prompt_tokens": 300},
            },
        )
        accounting = repair.json()["accounting"]
        assert accounting["last"]["provider_input_tokens"] == 100
        assert accounting["auxiliary"]["provider_input_tokens"] == 300
        view = client.get(f"/v1/preparations/{prep['preparation_id']}").json()
        assert view["accounting"] == accounting

    def test_a_repeat_is_answered_from_the_record_and_observed_once(
        self, make_client: AppFactory
    ) -> None:
        """A repeated report_id answers the first answer even with a body that would now be
        refused, and the delta histogram counts the report once."""
        client = make_client()
        prep = _prepare(client)
        path = f"/v1/preparations/{prep['preparation_id']}/usage"
        main = {"report_id": "r1", "provider": "anthropic", "call": "main"}
        first = client.post(path, json={**main, "usage": {"input_tokens": 100}})
        assert first.status_code == 200, first.text
        for usage in ({"input_tokens": 5}, {"input_tokens": -1}):
            again = client.post(path, json={**main, "usage": usage})
            assert again.status_code == 200 and again.json() == first.json()
        metrics = client.get("/metrics").text
        assert 'context_assembly_usage_input_token_delta_count{provider="anthropic"} 1.0' in metrics

    def test_reports_per_preparation_are_limited(self, make_client: AppFactory) -> None:
        """Past limits.max_usage_reports a new report_id is refused with 422 naming the limit;
        the reports already applied still answer as before."""
        client = make_client(limits={"max_usage_reports": 2})
        prep = _prepare(client)
        prep_id = prep["preparation_id"]
        answers = [
            _report(client, prep_id, report_id, "openai", "main", {"prompt_tokens": 10})
            for report_id in ("r1", "r2", "r3")
        ]
        assert [a.status_code for a in answers] == [200, 200, 422]
        problem = answers[2].json()
        assert problem["code"] == "CONTEXT_ASSEMBLY_INVALID"
        assert "limits.max_usage_reports" in problem["detail"]
        assert problem["max_usage_reports"] == 2
        repeat = _report(client, prep_id, "r2", "openai", "main", {})
        assert repeat.status_code == 200 and repeat.json() == answers[1].json()

    def test_counts_adding_up_past_max_count_are_refused(self, make_client: AppFactory) -> None:
        """Anthropic parts whose sum is past 2^53 - 1 (here past 64 bits, more than the store
        can write) answer 422 naming the usage object."""
        client = make_client()
        prep = _prepare(client)
        usage = {"input_tokens": 2**64 - 1, "cache_read_input_tokens": 10}
        response = _report(client, prep["preparation_id"], "big", "anthropic", "main", usage)
        assert response.status_code == 422, response.text
        assert response.json()["field"] == "usage.input_tokens"


def test_the_record_keeps_no_contributor_instructions(
    make_client: AppFactory, tmp_path: Any
) -> None:
    """A contributor's ``instructions`` (host text) never reach the SQLite file; what validate
    needs (source and endpoint) does."""

    def handler(request: httpx.Request) -> httpx.Response:
        packet = orjson.loads(request.content)
        if packet["type"] == "revision":
            return httpx.Response(200, json={"revision": "r1", "blocks": []})
        return httpx.Response(200, json={"revision": "r1", "blocks": [{"id": "x", "text": "hi"}]})

    path = tmp_path / "plain.db"
    client = make_client(
        contributor_transport=httpx.MockTransport(handler),
        contributors={"hook": {"url": "http://contributor.test/hook"}},
        store={"path": str(path)},
    )
    body = basic_request(
        contributors=[{"source": "docs", "endpoint": "hook", "instructions": "CONTRIB-INSTR-5e1d"}]
    )
    body["plugins"] = [*body["plugins"], {"name": "docs"}]
    prep = _prepare(client, body)
    assert _validate(client, prep).status_code == 200
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("plain.db*"))
    assert b'"endpoint":"hook"' in stored
    assert b"CONTRIB-INSTR" not in stored


class TestTenancy:
    def test_another_tenant_cannot_touch_a_preparation(self, make_client: AppFactory) -> None:
        """Tenant B gets 404 (exactly like an unknown id) for every call on tenant A's preparation."""
        client = make_client(auth=True)
        a = {"Authorization": f"Bearer {KEYS['acme']}"}
        b = {"X-API-Key": KEYS["globex"]}
        prep = _prepare(client, None, **a)
        pid = prep["preparation_id"]
        calls = [
            ("GET", f"/v1/preparations/{pid}", None),
            ("GET", f"/v1/preparations/{pid}/breakdown", None),
            (
                "POST",
                f"/v1/preparations/{pid}/validate",
                {"model": "gpt-4o-mini", "frame": neutral_frame(prep)},
            ),
            ("POST", f"/v1/preparations/{pid}/refresh", basic_request()),
            (
                "POST",
                f"/v1/preparations/{pid}/repair",
                {
                    "model": "gpt-4o-mini",
                    "instructions": "Be exact.",
                    "frame": neutral_frame(prep),
                    "answer": "x",
                },
            ),
            (
                "POST",
                f"/v1/preparations/{pid}/usage",
                {"report_id": "r", "provider": "openai", "usage": {}},
            ),
        ]
        for method, path, body in calls:
            other = client.request(method, path, json=body, headers=b)
            unknown = client.request(
                method, path.replace(pid, "prep_unknown"), json=body, headers=b
            )
            assert other.status_code == 404, (path, other.text)
            assert other.json()["code"] == "NOT_FOUND"
            assert {
                k: v
                for k, v in other.json().items()
                if k not in {"instance", "detail", "preparation_id"}
            } == {
                k: v
                for k, v in unknown.json().items()
                if k not in {"instance", "detail", "preparation_id"}
            }
        # The owner still can (and A's refresh was not used up by B's attempt).
        assert client.get(f"/v1/preparations/{pid}", headers=a).status_code == 200
        assert (
            client.post(
                f"/v1/preparations/{pid}/refresh", json=basic_request(), headers=a
            ).status_code
            == 200
        )

    def test_missing_or_wrong_key_is_401(self, make_client: AppFactory) -> None:
        """No key or an unknown key answers 401 UNAUTHENTICATED problem+json."""
        client = make_client(auth=True)
        for headers in ({}, {"Authorization": "Bearer nope"}):
            response = client.post("/v1/prepare", json=basic_request(), headers=headers)
            assert response.status_code == 401
            assert response.json()["code"] == "UNAUTHENTICATED"


def test_a_source_omitted_at_prepare_is_not_checked_on_validate(make_client: AppFactory) -> None:
    """A webhook that failed under 'omit' entered nothing, so validate does not query its revision."""
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        packet = orjson.loads(request.content)
        calls.append(packet["type"])
        if packet["type"] == "contribute":
            return httpx.Response(500)
        return httpx.Response(200, json={"revision": "r9", "blocks": []})

    client, body = _hooked(make_client, handler, "omit")
    prep = _prepare(client, body)
    assert prep["selection"]["sources"][0]["status"] == "error"
    response = _validate(client, prep)
    assert response.status_code == 200, response.text
    assert calls == ["contribute"]


def test_blocks_breaking_the_rules_are_an_invalid_contribution(make_client: AppFactory) -> None:
    """A contributor whose blocks break §5.1 is 'invalid': omit drops it, fail answers 502."""
    bad = {
        "revision": "r1",
        "blocks": [{"id": "a", "text": "x"}, {"id": "a", "text": "y", "priority": 5000}],
    }

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=bad)

    for policy, status in (("omit", 200), ("fail", 502)):
        client = make_client(
            contributor_transport=httpx.MockTransport(handler),
            contributors={
                "hook": {"url": "http://contributor.test/hook", "failure_policy": policy}
            },
        )
        body = basic_request(contributors=[{"source": "docs", "endpoint": "hook"}])
        body["plugins"] = [*body["plugins"], {"name": "docs"}]
        response = client.post("/v1/prepare", json=body)
        assert response.status_code == status, response.text
        if policy == "omit":
            docs = [s for s in response.json()["selection"]["sources"] if s["source"] == "docs"]
            assert docs[0]["status"] == "invalid" and docs[0]["block_count"] == 0
        else:
            problem = response.json()
            assert problem["code"] == "CONTRIBUTOR_FAILED" and problem["source"] == "docs"
            assert "block rules" in problem["cause"]


@pytest.mark.parametrize(
    ("blocks", "rule"),
    [
        (
            [
                {"id": "a", "text": "x", "dependencies": ["docs/b"]},
                {"id": "b", "text": "y", "dependencies": ["docs/a"]},
            ],
            "dependency cycle",
        ),
        ([{"id": f"b{i}", "text": "x"} for i in range(5)], "over max_blocks 4"),
    ],
)
def test_an_answer_breaking_a_rule_alone_is_invalid_not_the_whole_prepare(
    make_client: AppFactory, blocks: list[dict[str, Any]], rule: str
) -> None:
    """A cycle among one contributor's own blocks, or more blocks than max_blocks from it
    alone, is that answer's fault: under omit the source is 'invalid' and the others enter;
    the prepare is not a 422."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"revision": "r1", "blocks": blocks})

    client, body = _hooked(make_client, handler, "omit")
    body["assembly"] = {**body["assembly"], "max_blocks": 4}
    response = client.post("/v1/prepare", json=body)
    assert response.status_code == 200, response.text
    docs = [s for s in response.json()["selection"]["sources"] if s["source"] == "docs"]
    assert docs[0]["status"] == "invalid"
    selected = {
        b["id"] for b in response.json()["selection"]["blocks"] if b["status"] == "selected"
    }
    assert "receipt" in selected


def test_refresh_with_no_time_left_follows_the_failure_policy(make_client: AppFactory) -> None:
    """A refresh whose timeout_ms is used up skips 'omit' webhooks (skipped_deadline), no 504."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"revision": "r1", "blocks": [{"id": "x", "text": "hi"}]})

    ticks = iter(range(10**6))

    def monotonic() -> float:
        return next(ticks) * 0.010  # every reading is 10 ms later

    client, body = _hooked(make_client, handler, "omit", monotonic=monotonic)
    body["assembly"] = {"timeout_ms": 20}  # the prepare's clock readings use up the allowance
    prep = _prepare(client, body)
    refreshed = client.post(f"/v1/preparations/{prep['preparation_id']}/refresh", json=body)
    assert refreshed.status_code == 200, refreshed.text
    docs = [s for s in refreshed.json()["selection"]["sources"] if s["source"] == "docs"]
    assert docs[0]["status"] == "skipped_deadline"


def test_a_long_unknown_id_is_named_once_and_cut(make_client: AppFactory) -> None:
    """An id ours could never be (60,000 characters) is a 404 like any unknown id, without a
    store lookup, naming the id cut at 128 characters: the body is not three copies of it."""
    client = make_client()
    long_id = "prep_" + "x" * 60_000
    for method, path, body in (
        ("GET", f"/v1/preparations/{long_id}", None),
        ("GET", f"/v1/preparations/{long_id}/breakdown", None),
        ("POST", f"/v1/preparations/{long_id}/refresh", basic_request()),
    ):
        response = client.request(method, path, json=body)
        assert response.status_code == 404, (path[:40], response.text[:200])
        problem = response.json()
        assert problem["code"] == "NOT_FOUND"
        assert problem["preparation_id"] == long_id[:128] + "…"
        assert len(response.content) < len(long_id) + 2_000  # the path once, in ``instance``
