"""The prepare answer and its record (preparations.Prepared): the answer is the model's JSON,
the record's copy is that minus the frame (block reports as the answer's objects), and the
decision tally the metrics count is the same as counting the answer's reports.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from context_assembly.core.request import PrepareRequest
from context_assembly.core.sources import materialised_inputs, plan_sources
from context_assembly.engine import run_assembly, to_response
from context_assembly.preparations import Prepared
from context_assembly.preparations.record import StoredResponse
from context_assembly.tokens.registry import ModelRegistry

CASES = Path(__file__).resolve().parents[1] / "conformance" / "cases"
REGISTRY = ModelRegistry.load()


def _cases() -> list[Any]:
    params = []
    for path in sorted(CASES.glob("*.json")):
        case = json.loads(path.read_text(encoding="utf-8"))
        if "error" in case["expect"] or case["request"].get("contributors") or "xfail" in case:
            continue
        params.append(pytest.param(case, id=path.stem))
    assert len(params) > 30
    return params


@pytest.mark.parametrize("case", _cases())
def test_the_answer_and_the_record_are_the_models_json(case: dict[str, Any]) -> None:
    request = PrepareRequest.model_validate(case["request"])
    now = datetime.fromisoformat(case.get("now", "2026-12-02T12:00:00Z"))
    setups = plan_sources(request)
    inputs = materialised_inputs(request, setups)
    assembly, ctx = run_assembly(request, setups, inputs, now=now, tenant="t", registry=REGISTRY)
    response = to_response(request, assembly, ctx, preparation_id="prep_x", expires_at=now)
    prepared = Prepared.of(response)
    expected = orjson.loads(response.model_dump_json())
    assert orjson.loads(prepared.body) == expected
    del expected["frame"]
    stored = orjson.loads(orjson.dumps(prepared.stored.dump()))  # as a store writes and reads it
    assert stored == expected
    assert StoredResponse.model_validate(stored).model_dump(mode="json") == expected
    # The decisions the metrics count are those of the answer.
    assert sorted(prepared.decisions) == sorted(
        Counter((b["status"], b["reason"]) for b in expected["selection"]["blocks"]).items()
    )


def test_a_record_of_128_blocks_reads_back_whole(make_client: Any) -> None:
    """The record keeps the block reports as the answer's objects, and the stored view gives
    exactly what the answer said."""
    blocks = [
        {"id": f"entry-{i}", "text": f"Entry {i}: the export job finished. " * 3, "priority": i % 7}
        for i in range(128)
    ]
    body = {
        "model": "gpt-4o-mini",
        "plugins": [{"name": "memory"}],
        "contributions": [{"source": "memory", "revision": 1, "blocks": blocks}],
        "assembly": {"max_data_tokens": 2000},
        "input": [{"role": "user", "content": "What finished?"}],
    }
    client = make_client()
    answer = client.post("/v1/prepare", json=body).json()
    prep_id = answer["preparation_id"]
    store = client.app.state.preparations.store
    record = client.portal.call(store.get, "default", prep_id, 0.0)
    assert "frame" not in record.data["response"]
    assert record.data["response"]["selection"]["blocks"] == answer["selection"]["blocks"]
    view = client.get(f"/v1/preparations/{prep_id}").json()
    assert view["selection"]["blocks"] == answer["selection"]["blocks"]
    assert {b["status"] for b in view["selection"]["blocks"]} == {"selected", "omitted"}
