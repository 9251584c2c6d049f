"""A misspelt member of a request body is refused with the nearest member the body has at that
place: the 422 problem's detail and its error say ``did you mean 'instructions'?``, on every
route that reads a body, at the top level and below it."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import AppFactory, basic_request

HINT = "Extra inputs are not permitted; did you mean {!r}?"


def _refused(answer: Any, loc: str, meant: str) -> dict[str, Any]:
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = answer.json()
    assert problem["code"] == "CONTEXT_ASSEMBLY_INVALID"
    said = HINT.format(meant)
    assert problem["detail"].startswith(f"invalid request: {loc}: {said}"), problem["detail"]
    assert {"loc": loc, "msg": said, "type": "extra_forbidden"} in problem["errors"]
    return problem


@pytest.mark.parametrize("route", ["/v1/prepare", "/v1/budget"])
def test_a_misspelt_top_level_field_names_the_nearest(make_client: AppFactory, route: str) -> None:
    client = make_client()
    body = basic_request()
    body["instuctions"] = body.pop("instructions")
    _refused(client.post(route, json=body), "instuctions", "instructions")


@pytest.mark.parametrize(
    ("change", "loc", "meant"),
    [
        (lambda b: b["assembly"].update(layot="legacy"), "assembly.layot", "layout"),
        (
            lambda b: b["contributions"][0]["blocks"][1].update(priorty=3),
            "contributions.0.blocks.1.priorty",
            "priority",
        ),
        (lambda b: b["history"][0].update(contnt="x"), "history.0.contnt", "content"),
        (
            lambda b: b["plugins"][0].update(instrutions="x"),
            "plugins.0.instrutions",
            "instructions",
        ),
        (
            lambda b: b.update(assembly={"history_policy": {"mdoe": "drop_oldest"}}),
            "assembly.history_policy.mdoe",
            "mode",
        ),
    ],
)
def test_a_misspelt_nested_field_names_the_nearest_at_its_place(
    make_client: AppFactory, change: Any, loc: str, meant: str
) -> None:
    client = make_client()
    body = basic_request()
    change(body)
    _refused(client.post("/v1/prepare", json=body), loc, meant)


def test_the_misspelling_comes_first_when_it_left_a_field_missing(
    make_client: AppFactory,
) -> None:
    """A misspelt required member leaves it missing too: the detail names the misspelling,
    which says what to fix, and the errors list both."""
    client = make_client()
    prep = client.post("/v1/prepare", json=basic_request()).json()
    body = {"repot_id": "r1", "provider": "openai", "usage": {"prompt_tokens": 1}}
    answer = client.post(f"/v1/preparations/{prep['preparation_id']}/usage", json=body)
    problem = _refused(answer, "repot_id", "report_id")
    assert any(e["loc"] == "report_id" and e["type"] == "missing" for e in problem["errors"])


def test_a_member_near_no_field_is_refused_as_before(make_client: AppFactory) -> None:
    client = make_client()
    answer = client.post("/v1/prepare", json={**basic_request(), "zzzzzz": 1})
    assert answer.status_code == 422
    assert answer.json()["detail"] == "invalid request: zzzzzz: Extra inputs are not permitted"
