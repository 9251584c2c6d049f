"""Each usage report priced per bucket at the model's price (preparations/costs.py), through the
real app on a real SQLite file: the Sonnet 4.5 public rates by hand, the time to live of cache
writes from the report or from the plan, and no price, no cost."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from api_support import AppFactory


def prepare(client: Any, model: str, **fields: Any) -> str:
    body = {"model": model, "input": [{"role": "user", "content": "hi"}], **fields}
    response = client.post("/v1/prepare", json=body)
    assert response.status_code == 200, response.text
    return str(response.json()["preparation_id"])


def report(client: Any, prep_id: str, usage: dict[str, Any], provider: str = "anthropic") -> dict:
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
