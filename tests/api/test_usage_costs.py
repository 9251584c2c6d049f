"""Each usage report priced per bucket at the model's price (preparations/costs.py), through the
real app on a real SQLite file: the Sonnet 4.5 public rates by hand, the time to live of cache
writes from the report or from the plan, no price, no cost; and each cache miss of a main call
priced by its cause (the tokens it billed again, at their rate over the cache read rate)."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from api_support import AppFactory, FakeWall
from page_support import new_scope, next_history, ok, tool, turn_body
from page_support import prepare as prepare_turn

from context_assembly.lifecycle_models import MissCause
from context_assembly.preparations import turns
from context_assembly.preparations.record import StoredTurn


def prepare(client: Any, model: str, **fields: Any) -> str:
    body = {"model": model, "input": [{"role": "user", "content": "hi"}], **fields}
    response = client.post("/v1/prepare", json=body)
    assert response.status_code == 200, response.text
    return str(response.json()["preparation_id"])


def report(
    client: Any, prep_id: str, usage: dict[str, Any], provider: str = "anthropic"
) -> dict[str, Any]:
    payload = {"report_id": secrets.token_hex(4), "provider": provider, "usage": usage}
    response = client.post(f"/v1/preparations/{prep_id}/usage", json=payload)
    assert response.status_code == 200, response.text
    return response.json()["accounting"]["last"]  # type: ignore[no-any-return]


def test_a_sonnet_4_5_report_with_all_four_buckets_costs_the_public_rates(
    make_client: AppFactory,
) -> None:
    """$3 input, $0.30 cache read, $3.75 5-minute write, $6 1-hour write, $15 output per
    million tokens."""
    client = make_client()
    prep_id = prepare(client, "claude-sonnet-4-5-20250929")
    usage = {
        "input_tokens": 1234,
        "cache_read_input_tokens": 48_000,
        "cache_creation_input_tokens": 6500,
        "cache_creation": {"ephemeral_5m_input_tokens": 2500, "ephemeral_1h_input_tokens": 4000},
        "output_tokens": 789,
    }
    cost = report(client, prep_id, usage)["cost"]
    by_hand = {
        "uncached_input": 1234 * 3 / 1e6,
        "cache_read": 48_000 * 0.30 / 1e6,
        "cache_write_5m": 2500 * 3.75 / 1e6,
        "cache_write_1h": 4000 * 6 / 1e6,
        "output": 789 * 15 / 1e6,
    }
    for bucket, dollars in by_hand.items():
        assert cost[bucket] == pytest.approx(dollars, abs=1e-9), bucket
    assert cost["total"] == pytest.approx(0.063312, abs=1e-9)
    assert cost["total"] == pytest.approx(sum(by_hand.values()), abs=1e-9)
    assert (cost["currency"], cost["price"], cost["price_source"]) == (
        "USD",
        "claude-sonnet-4-5",
        "shipped",
    )
    shown = client.get(f"/v1/preparations/{prep_id}").json()["accounting"]["last"]["cost"]
    assert shown == cost


@pytest.mark.parametrize(("ttl", "bucket"), [("5m", "cache_write_5m"), ("1h", "cache_write_1h")])
def test_writes_without_a_split_take_the_plans_time_to_live(
    make_client: AppFactory, ttl: str, bucket: str
) -> None:
    client = make_client()
    prep_id = prepare(client, "claude-sonnet-4-5", render="anthropic", cache={"ttl": ttl})
    usage = {"input_tokens": 10, "cache_creation_input_tokens": 1000, "output_tokens": 1}
    cost = report(client, prep_id, usage)["cost"]
    rate = 3.75 if ttl == "5m" else 6.0
    assert cost[bucket] == pytest.approx(1000 * rate / 1e6, abs=1e-9)


def test_a_model_without_a_price_costs_null(make_client: AppFactory) -> None:
    client = make_client()
    prep_id = prepare(client, "gemini-2.5-pro")
    observed = report(
        client, prep_id, {"promptTokenCount": 10, "candidatesTokenCount": 2}, "google"
    )
    assert observed["cost"] is None
    assert observed["provider_input_tokens"] == 10


def test_the_timeline_shows_each_turns_cost_and_their_total(make_client: AppFactory) -> None:
    client = make_client()
    scope = {"task_id": secrets.token_hex(4)}
    usage = {"input_tokens": 1000, "cache_read_input_tokens": 9000, "output_tokens": 100}
    costs = []
    ids = []
    for _ in range(2):
        prep_id = prepare(client, "claude-sonnet-4-5", scope=scope)
        ids.append(prep_id)
        costs.append(report(client, prep_id, usage)["cost"]["total"])
    unreported = prepare(client, "claude-sonnet-4-5", scope=scope)
    path = f"/v1/preparations/{unreported}/timeline"
    data = client.get(path, headers={"Accept": "application/json"}).json()
    assert [t["cost"] for t in data["turns"]] == [*costs, None]
    assert data["cost"] == pytest.approx(sum(costs), abs=1e-9)
    assert costs[0] == pytest.approx((1000 * 3 + 9000 * 0.3 + 100 * 15) / 1e6, abs=1e-9)
    text = client.get(path, headers={"Accept": "text/plain"}).text
    assert f"cost of these turns: {sum(costs):.4f} USD" in text
    html = client.get(path, headers={"Accept": "text/html"}).text
    assert f"These turns cost {sum(costs):.4f} USD." in html


def _anthropic(read: int, written: int) -> dict[str, Any]:
    """A main call's Anthropic usage: ``read`` tokens from the cache, ``written`` to it (for 5
    minutes, the plan's time to live), 100 uncached and 5 output."""
    return {
        "input_tokens": 100,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": written,
        "output_tokens": 5,
    }


WRITE_OVER_READ = (3.75 - 0.30) / 1e6  # Sonnet 4.5: a 5-minute write against a cache read


def test_each_miss_is_priced_by_its_cause_in_the_usage_answer_and_the_timeline(
    make_client: AppFactory,
) -> None:
    """Turn 2 edits a tool (cause ``tools``), turn 3's provider reads nothing of a kept prefix
    (``provider``), turn 4 comes after the 5-minute lifetime (``expired``); each re-billed what
    it could have read (the smaller of its and the previous turn's cacheable tokens, or the
    expected figure) and its miss costs those tokens as 5-minute writes instead of cache reads.
    A turn without a miss re-bills 0 and its miss costs 0; a wrap-up report names no miss."""
    wall = FakeWall()
    client = make_client(wall=wall)
    body = turn_body(new_scope())
    plans, answers = [], []
    for number in range(1, 6):
        if number == 2:
            body = {**body, "tools": [tool("search", 210), tool("fetch")]}
        wall.now += 600 if number == 4 else 60
        prep = prepare_turn(client, body)
        plan = prep["selection"]["cache"]
        plans.append(plan)
        read = plans[-2]["cacheable_tokens"] if number == 5 else 0
        written = plan["cacheable_tokens"] - read
        payload = {"report_id": "main", "provider": "anthropic", "usage": _anthropic(read, written)}
        answers.append(
            ok(client.post(f"/v1/preparations/{prep['preparation_id']}/usage", json=payload))
        )
        body = next_history(body, number)
    last = [answer["accounting"]["last"] for answer in answers]
    assert [o["miss_cause"] for o in last] == [None, "tools", "provider", "expired", None]
    cacheable = [plan["cacheable_tokens"] for plan in plans]
    expected = [o["expected_cached_tokens"] for o in last]
    rebilled = [
        0,
        min(cacheable[1], cacheable[0]),
        expected[2],
        min(cacheable[3], cacheable[2]),
        0,
    ]
    assert expected[2] > 0 and all(r > 0 for r in rebilled[1:4])
    assert [o["rebilled_tokens"] for o in last] == rebilled
    for observed, tokens in zip(last, rebilled, strict=True):
        assert observed["cost"]["miss"] == pytest.approx(tokens * WRITE_OVER_READ, abs=1e-9)
    prep_id = answers[-1]["preparation_id"]
    data = client.get(
        f"/v1/preparations/{prep_id}/timeline", headers={"Accept": "application/json"}
    ).json()
    assert [t["rebilled_tokens"] for t in data["turns"]] == rebilled
    assert [t["miss_cost"] for t in data["turns"]] == [o["cost"]["miss"] for o in last]
    assert data["miss_cost"] == pytest.approx(sum(rebilled) * WRITE_OVER_READ, abs=1e-8)
    wrap_up = {"report_id": "wrap", "provider": "anthropic", "call": "wrap_up"}
    answer = ok(
        client.post(
            f"/v1/preparations/{prep_id}/usage", json={**wrap_up, "usage": _anthropic(0, 0)}
        )
    )
    observed = answer["accounting"]["last"]
    assert (observed["miss_cause"], observed["rebilled_tokens"], observed["cost"]["miss"]) == (
        None,
        None,
        None,
    )
    turn = client.get(
        f"/v1/preparations/{prep_id}/timeline", headers={"Accept": "application/json"}
    ).json()["turns"][-1]
    assert (turn["rebilled_tokens"], turn["miss_cost"]) == (None, None)


def test_a_miss_on_a_model_without_a_price_has_no_miss_cost(make_client: AppFactory) -> None:
    """The tokens are re-billed all the same; their price is unknown, so it is null."""
    wall = FakeWall()
    client = make_client(wall=wall)
    body = turn_body(new_scope(), model="gemini-2.5-pro", render="gemini")
    ids = []
    for number in range(1, 3):
        if number == 2:
            body = {**body, "tools": [tool("search", 210), tool("fetch")]}
        wall.now += 60
        ids.append(prepare_turn(client, body)["preparation_id"])
        body = next_history(body, number)
    usage = {"promptTokenCount": 3000, "candidatesTokenCount": 2}
    payload = {"report_id": "main", "provider": "google", "usage": usage}
    observed = ok(client.post(f"/v1/preparations/{ids[-1]}/usage", json=payload))
    last = observed["accounting"]["last"]
    assert last["cost"] is None and last["miss_cause"] == "tools"
    assert last["rebilled_tokens"] == 0  # gemini: no cache the service models


def _turn(**fields: Any) -> StoredTurn:
    """A record's turn part: prefix kept, 3,000 cacheable tokens after 2,000 a minute before,
    within a 5-minute lifetime (2,000 expected)."""
    report = {"prefix_kept": True, "cacheable_tokens": 3000, "first_change": None}
    report.update(fields.pop("report", {}))
    base: dict[str, Any] = {
        "digests": {"model": "m", "layout": "l", "tools": [], "instructions": "i", "history": []},
        "report": report,
        "created_at": 0.0,
        "expected_cached_tokens": 2000,
        "expected_reason": "cached",
        "since_previous_seconds": 60.0,
        "lifetime_seconds": 300.0,
        "previous_cacheable_tokens": 2000,
        **fields,
    }
    return StoredTurn.model_validate(base)


CHANGED = {"prefix_kept": False, "first_change": {"part": "instructions", "index": None}}


@pytest.mark.parametrize(
    ("part", "reported", "unread", "cause", "tokens"),
    [
        (_turn(), 2000, 1500, None, 0),
        (_turn(), 500, 1500, "provider", 1500),
        (_turn(), 500, 1000, "provider", 1000),  # no more than the input not read
        (_turn(), 0, None, "provider", 2000),  # a report without its input: no bound
        (_turn(report=CHANGED, expected_cached_tokens=0, expected_reason="prefix_changed"),
         0, 5000, "instructions", 2000),
        (_turn(report=CHANGED, expected_cached_tokens=0, expected_reason="prefix_changed",
               since_previous_seconds=400.0), 0, 5000, "instructions", 0),  # expired anyway
        (_turn(expected_cached_tokens=0, expected_reason="expired", since_previous_seconds=400.0),
         100, 5000, "expired", 1900),
        (_turn(expected_cached_tokens=0, expected_reason="expired", previous_cacheable_tokens=None),
         0, 5000, "expired", None),  # a record from before the figure was kept
        (None, 0, 5000, None, None),
    ],
)  # fmt: skip
def test_what_a_miss_billed_again(
    part: StoredTurn | None, reported: int | None, unread: int | None, cause: MissCause | None,
    tokens: int | None,
) -> None:  # fmt: skip
    """What the call would have read without its miss (the expected figure for the provider's,
    the smaller cacheable figure for an expired cache or a changed prefix within the lifetime)
    less what it read, no more than the input it paid for otherwise."""
    assert turns.rebilled(part, reported, unread) == turns.Rebilled(cause, tokens)
