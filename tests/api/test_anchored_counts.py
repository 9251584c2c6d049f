"""Counts anchored on the previous turn's usage report (core/anchor.py), through the real app on
a real SQLite file: the part of a frame that repeats the previous one counts as the provider
counted it, only what changed is estimated, and a frame is refused for overflow only when the
anchored count says so."""

from __future__ import annotations

import secrets
from typing import Any

from api_support import KEYS, AppFactory

MODEL = "claude-sonnet-4-5"  # counted with the conservative estimate
PROSE = "The quarterly report lists revenue by region and the notes explain each change. "


def body(history: list[dict[str, Any]], question: str, scope: str, **fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "instructions": "You are a careful analyst.",
        "history": history,
        "input": [{"role": "user", "content": question}],
        "assembly": {"layout": "stable-prefix"},
        "render": "anthropic",
        "response_reserve": 1000,
        "scope": {"task_id": scope},
        **fields,
    }


def usage(client: Any, prep_id: str, input_tokens: int, call: str = "main") -> None:
    payload = {
        "report_id": secrets.token_hex(4),
        "provider": "anthropic",
        "call": call,
        "usage": {"input_tokens": input_tokens, "output_tokens": 10},
    }
    response = client.post(f"/v1/preparations/{prep_id}/usage", json=payload)
    assert response.status_code == 200, response.text


def exchange(number: int, words: int = 40) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {number}: " + PROSE * words},
        {"role": "assistant", "content": f"answer {number}: " + PROSE * words},
    ]


def test_the_repeated_part_counts_as_the_provider_counted_it(make_client: AppFactory) -> None:
    client = make_client()
    scope = secrets.token_hex(4)
    first = client.post("/v1/prepare", json=body(exchange(1), "question 2", scope)).json()
    assert first["budget"]["count_source"] == "estimate"
    assert first["budget"]["estimated_tokens"] == first["budget"]["total_input_tokens"]
    provider = first["budget"]["total_input_tokens"] // 2  # the estimate is well over
    usage(client, first["preparation_id"], provider)
    history = [*exchange(1), {"role": "user", "content": "question 2"}]
    history.append({"role": "assistant", "content": "answer 2"})
    second = client.post("/v1/prepare", json=body(history, "question 3", scope)).json()
    budget = second["budget"]
    anchored = budget["anchored"]
    assert budget["count_source"] == "anchored"
    assert anchored["preparation_id"] == first["preparation_id"]
    assert anchored["whole"] is True and anchored["shared_messages"] == 3
    assert anchored["counted_tokens"] == provider
    assert budget["total_input_tokens"] == provider + budget["estimated_tokens"]
    terms = sum(
        budget[k]
        for k in (
            "instructions_tokens",
            "legacy_data_tokens",
            "tools_tokens",
            "history_tokens",
            "input_tokens",
            "data_tokens",
        )
    )
    assert budget["total_input_tokens"] == terms - anchored["correction_tokens"]


def test_a_changed_history_anchors_only_its_shared_part(make_client: AppFactory) -> None:
    client = make_client()
    scope = secrets.token_hex(4)
    first = client.post("/v1/prepare", json=body([*exchange(1), *exchange(2)], "q", scope)).json()
    usage(client, first["preparation_id"], 300)
    edited = [*exchange(1), {"role": "user", "content": "another question"}]
    edited.append({"role": "assistant", "content": "another answer"})
    second = client.post("/v1/prepare", json=body(edited, "q", scope)).json()
    anchored = second["budget"]["anchored"]
    assert anchored["whole"] is False and anchored["shared_messages"] == 2
    assert anchored["counted_tokens"] == min(anchored["estimated_tokens"], 300)


def test_without_a_main_usage_report_or_with_a_changed_head_nothing_is_anchored(
    make_client: AppFactory,
) -> None:
    client = make_client()
    scope = secrets.token_hex(4)
    first = client.post("/v1/prepare", json=body(exchange(1), "q", scope)).json()
    usage(client, first["preparation_id"], 100, call="wrap_up")  # another frame's count
    second = client.post("/v1/prepare", json=body(exchange(1), "q", scope)).json()
    assert second["budget"]["count_source"] == "estimate"
    usage(client, second["preparation_id"], 100)
    other = body(exchange(1), "q", scope, instructions="Other instructions.")
    third = client.post("/v1/prepare", json=other).json()
    assert third["budget"]["count_source"] == "estimate"


def test_exact_counts_are_not_anchored(make_client: AppFactory) -> None:
    client = make_client()
    scope = secrets.token_hex(4)
    first = client.post("/v1/prepare", json=body(exchange(1), "q", scope, model="gpt-4o")).json()
    assert first["budget"]["count_source"] == "exact"
    assert first["budget"]["estimated_tokens"] == 0
    usage(client, first["preparation_id"], 10)
    second = client.post("/v1/prepare", json=body(exchange(1), "q", scope, model="gpt-4o")).json()
    assert second["budget"]["count_source"] == "exact"


def test_only_a_count_that_is_surely_over_the_window_is_refused(
    make_client: AppFactory,
) -> None:
    """An estimate over the window that would fit were its estimated part half its size is not
    refused: the frame carries the protected data only and says so; the provider's count (its
    usage report) then anchors the next turn, and an anchored count over the window is refused.
    An estimate over the window even at half its size is refused."""
    client = make_client()
    scope = secrets.token_hex(4)
    history = exchange(1, words=60)
    first = client.post("/v1/prepare", json=body(history, "q", scope)).json()
    estimate = first["budget"]["total_input_tokens"]
    window = estimate + 1000 - 200  # 200 short of the estimate plus the reserve
    grown = [*history, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    optional = [
        {"source": "notes", "revision": 1, "blocks": [{"id": "n1", "text": "an optional note"}]}
    ]
    fields = {
        "max_context_tokens": window,
        "plugins": [{"name": "notes", "instructions": "Notes."}],
        "contributions": optional,
    }
    uncertain = client.post("/v1/prepare", json=body(grown, "q2", secrets.token_hex(4), **fields))
    assert uncertain.status_code == 200, uncertain.text
    answer = uncertain.json()
    assert [w["code"] for w in answer["selection"]["warnings"]] == ["estimate_over_window"]
    assert answer["budget"]["data_tokens"] == 0  # no optional data into an uncertain window
    assert "an optional note" not in str(answer["frame"])
    surely = body(grown, "q2", secrets.token_hex(4), max_context_tokens=estimate // 3)
    refused = client.post("/v1/prepare", json=surely)
    assert refused.status_code == 422
    assert refused.json()["code"] == "CONTEXT_OVERFLOW"
    usage(client, first["preparation_id"], estimate // 2)
    taken = client.post("/v1/prepare", json=body(grown, "q2", scope, max_context_tokens=window))
    assert taken.status_code == 200, taken.text
    assert taken.json()["budget"]["count_source"] == "anchored"
    assert "warnings" not in taken.json()["selection"]
    # The provider counted the whole window for that frame: the anchored count is over it.
    usage(client, taken.json()["preparation_id"], window)
    over = client.post("/v1/prepare", json=body(grown, "q2", scope, max_context_tokens=window))
    assert over.status_code == 422
    assert over.json()["code"] == "CONTEXT_OVERFLOW"


def test_drop_oldest_that_cannot_free_enough_by_the_estimate_is_not_a_refusal(
    make_client: AppFactory,
) -> None:
    """With `drop_oldest`, an estimate over the window that dropping cannot bring under it (the
    latest turn alone is over) is taken as without it: not refused while the provider's count
    may fit, with `estimate_over_window`; the history is not dropped for an estimate."""
    client = make_client()
    latest = [{"role": "user", "content": "q: " + PROSE * 60}]
    first = client.post("/v1/prepare", json=body(latest, "more", secrets.token_hex(4))).json()
    window = first["budget"]["total_input_tokens"] + 1000 - 200
    request = body(
        latest,
        "more",
        secrets.token_hex(4),
        max_context_tokens=window,
        assembly={"layout": "stable-prefix", "history_policy": {"mode": "drop_oldest"}},
    )
    answer = client.post("/v1/prepare", json=request)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert [w["code"] for w in got["selection"]["warnings"]] == ["estimate_over_window"]
    assert got["budget"]["history_dropped_messages"] == 0


def test_reports_calibrate_the_estimate_per_model_and_show_in_the_models_list(
    make_client: AppFactory,
) -> None:
    """Each main report of an estimated frame keeps the ratio of the provider's count to the
    estimate; from five on, a new conversation's estimate is multiplied by the bounded factor
    (the largest ratio plus a tenth), and GET /v1/models shows it."""
    client = make_client()
    ratios = [0.50, 0.55, 0.52, 0.58, 0.51]
    for ratio in ratios:
        prep = client.post("/v1/prepare", json=body(exchange(1), "q", secrets.token_hex(4))).json()
        assert prep["budget"]["count_source"] == "estimate"
        usage(client, prep["preparation_id"], round(prep["budget"]["total_input_tokens"] * ratio))
    listed = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    calibration = listed[MODEL]["calibration"]
    assert calibration["reports"] == 5
    assert calibration["factor"] == round(max(ratios) * 1.1, 2)
    assert listed["gpt-4o"]["calibration"] is None  # exact: nothing to calibrate
    fresh = client.post("/v1/prepare", json=body(exchange(1), "q", secrets.token_hex(4))).json()
    budget = fresh["budget"]
    assert budget["count_source"] == "calibrated"
    assert budget["calibration_factor"] == calibration["factor"]
    estimate = prep["budget"]["total_input_tokens"]  # the same body, uncalibrated
    assert estimate * max(ratios) <= budget["total_input_tokens"] < estimate


def test_calibration_is_per_tenant(make_client: AppFactory) -> None:
    client = make_client(auth=True)
    headers = {name: {"Authorization": f"Bearer {key}"} for name, key in KEYS.items()}
    first, second = list(headers)[:2]
    for _ in range(5):
        prep = client.post(
            "/v1/prepare", json=body(exchange(1), "q", secrets.token_hex(4)), headers=headers[first]
        ).json()
        payload = {
            "report_id": secrets.token_hex(4),
            "provider": "anthropic",
            "usage": {
                "input_tokens": prep["budget"]["total_input_tokens"] // 2,
                "output_tokens": 1,
            },
        }
        response = client.post(
            f"/v1/preparations/{prep['preparation_id']}/usage", json=payload, headers=headers[first]
        )
        assert response.status_code == 200
    mine = client.get("/v1/models", headers=headers[first]).json()["models"]
    theirs = client.get("/v1/models", headers=headers[second]).json()["models"]
    anonymous = client.get("/v1/models").json()["models"]
    assert next(m for m in mine if m["name"] == MODEL)["calibration"]["reports"] == 5
    assert next(m for m in theirs if m["name"] == MODEL)["calibration"]["reports"] == 0
    assert next(m for m in anonymous if m["name"] == MODEL)["calibration"] is None
