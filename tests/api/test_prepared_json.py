"""The prepare answer and its record (preparations.Prepared): the answer is the model's JSON,
the record's copy is that minus the frame with its block reports packed as rows, and the decision
tally the metrics count is the same as counting the answer's reports.

Every successful self-contained conformance request is assembled twice through one memo (cold,
then warm): a memoised turn must answer and record exactly what a fresh one does.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from context_assembly.core.memo import AssemblyMemo
from context_assembly.core.request import PrepareRequest
from context_assembly.core.result import unpack_block_rows
from context_assembly.core.sources import materialised_inputs, plan_sources
from context_assembly.engine import run_assembly, to_response
from context_assembly.preparations import Prepared
from context_assembly.preparations.record import shape_hash, stored_response
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
    memo = AssemblyMemo()
    for _turn in ("cold", "warm"):
        assembly, ctx = run_assembly(
            request, setups, inputs, now=now, tenant="t", registry=REGISTRY, memo=memo
        )
        response = to_response(request, assembly, ctx, preparation_id="prep_x", expires_at=now)
        prepared = Prepared.of(response, assembly)
        expected = orjson.loads(response.model_dump_json())
        assert orjson.loads(prepared.body) == expected
        del expected["frame"]
        stored = orjson.loads(orjson.dumps(prepared.stored))  # as a store writes and reads it
        assert "blocks" not in stored["selection"]
        assert len(unpack_block_rows(stored["selection"]["block_rows_z"])) == len(
            expected["selection"]["blocks"]
        )
        assert stored_response(stored) == expected
        # The decisions the metrics count are those of the answer, whichever turn served them.
        assert sorted(prepared.decisions) == sorted(
            Counter((b["status"], b["reason"]) for b in expected["selection"]["blocks"]).items()
        )
        # A record written before the compact form (reports as objects) reads the same.
        assert stored_response(expected) == expected
    assert memo.info()[0] >= 1, "the second turn was served from the memo"
    # The shape hash from the assembly's block digests is the one refresh computes afresh.
    assert shape_hash(request, dict(assembly.block_digests)) == shape_hash(request)


def test_a_record_of_128_blocks_is_small_and_reads_back_whole(make_client: Any) -> None:
    """The record packs its block reports (one SQLite page for 128 blocks, no overflow pages to
    write) and the stored view unpacks them to exactly what the answer said."""
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
    store = client.app.state.preparations.store  # type: ignore[attr-defined]
    record = client.portal.call(store.get, "default", prep_id, 0.0)  # type: ignore[attr-defined]
    assert len(orjson.dumps(record.data)) < 4000
    assert "blocks" not in record.data["response"]["selection"]
    view = client.get(f"/v1/preparations/{prep_id}").json()
    assert view["selection"]["blocks"] == answer["selection"]["blocks"]
    assert {b["status"] for b in view["selection"]["blocks"]} == {"selected", "omitted"}


def test_contributed_blocks_arrive_with_their_digest(make_client: Any) -> None:
    """A webhook source's blocks are digested as its answer arrives; the digest is the one the
    assembly would compute (``memo.blocks_digest``), and a failed source carries none."""
    import httpx

    from context_assembly.core.memo import blocks_digest
    from context_assembly.core.sources import plan_sources

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/bad"):
            return httpx.Response(500)
        blocks = [{"id": f"b{i}", "text": f"fact {i}", "priority": i} for i in range(3)]
        return httpx.Response(200, json={"revision": "r1", "blocks": blocks})

    client = make_client(
        contributor_transport=httpx.MockTransport(handler),
        contributors={
            "good": {"url": "http://contributor.test/good"},
            "bad": {"url": "http://contributor.test/bad", "failure_policy": "omit"},
        },
    )
    request = PrepareRequest.model_validate(
        {
            "model": "gpt-4o-mini",
            "plugins": [{"name": "docs"}, {"name": "notes"}],
            "contributors": [
                {"source": "docs", "endpoint": "good"},
                {"source": "notes", "endpoint": "bad"},
            ],
        }
    )
    service = client.app.state.preparations  # type: ignore[attr-defined]

    async def collect() -> Any:
        return await service.contributors.collect(
            "default", request, plan_sources(request), "prep_x", budget_ms=1000, attempt=1
        )

    collected = client.portal.call(collect)  # type: ignore[attr-defined]
    by_source = {item.setup.source: item for item in collected.inputs}
    assert by_source["docs"].digest == blocks_digest(by_source["docs"].blocks)
    assert len(by_source["docs"].blocks) == 3
    assert by_source["notes"].failed and by_source["notes"].digest is None
