"""A bug of the service's own code inside a contributor call, through the app: the prepare answers
as the source's failure policy says for an ``error`` call (omitted under ``omit``, a 502 under
``fail``), and ``/metrics`` counts it in ``context_assembly_internal_errors_total``."""

from __future__ import annotations

from typing import Any, NoReturn

import httpx
import pytest
from api_support import AppFactory, basic_request
from prometheus_client.parser import text_string_to_metric_families

from context_assembly.contributors import calls

MARKER = "ZZ-block-text-ZZ"


def _internal_errors(client: Any) -> dict[str, float]:
    """``context_assembly_internal_errors_total`` by ``where``, as the app's ``/metrics`` says."""
    text = client.get("/metrics").text
    return {
        sample.labels["where"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "context_assembly_internal_errors_total"
    }


def _buggy(*args: Any, **kwargs: Any) -> NoReturn:
    raise RuntimeError(f"cannot handle {MARKER}")


@pytest.mark.parametrize(("policy", "status"), [("omit", 200), ("fail", 502)])
def test_a_bug_in_a_contributor_call_answers_by_the_policy_and_is_counted(
    make_client: AppFactory, monkeypatch: pytest.MonkeyPatch, policy: str, status: int
) -> None:
    """The call settles as ``error``: under ``omit`` the prepare answers 200 without the source, under ``fail`` it is a 502 naming it; either way the bug is
    counted once at ``contribute``, and no answer quotes the exception's message."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"revision": "r1", "blocks": [{"id": "a", "text": "x"}]})

    client = make_client(
        contributor_transport=httpx.MockTransport(handler),
        contributors={"hook": {"url": "http://contributor.test/hook", "failure_policy": policy}},
    )
    body = basic_request(contributors=[{"source": "docs", "endpoint": "hook"}])
    body["plugins"] = [*body["plugins"], {"name": "docs"}]
    before = _internal_errors(client)
    assert set(before) == {"contribute", "revision"}
    monkeypatch.setattr(calls, "_answer_outcome", _buggy)  # after the real exchange
    response = client.post("/v1/prepare", json=body)
    assert response.status_code == status, response.text
    assert MARKER not in response.text
    if status == 200:
        [docs] = [s for s in response.json()["selection"]["sources"] if s["source"] == "docs"]
        assert (docs["status"], docs["block_count"]) == ("error", 0)
        assert not [b for b in response.json()["selection"]["blocks"] if b["source"] == "docs"]
    else:
        problem = response.json()
        assert (problem["source"], problem["contributor_status"]) == ("docs", "error")
        assert problem["cause"] == "unexpected RuntimeError"
    after = _internal_errors(client)
    assert after == {**before, "contribute": before["contribute"] + 1}
