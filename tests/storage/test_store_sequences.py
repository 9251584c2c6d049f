"""Hypothesis: random sequences of lifecycle calls on one record agree with a tiny model."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_support import REDIS_URL

from context_assembly.storage import (
    Accounting,
    PreparationRecord,
    Store,
    UsageResult,
    open_store,
)
from hypothesis_budget import examples

NOW = 1_900_000_000.0  # far future of the real clock, so Redis keys live through the test
EXPIRES_AT = NOW + 3600

usage_op = st.tuples(
    st.just("usage"),
    st.sampled_from(["a", "b", "c", "d"]),
    st.sampled_from(["last", "auxiliary"]),
    st.integers(0, 3),
)
claim_op = st.tuples(st.just("claim"))
replace_op = st.tuples(st.just("replace"), st.none() | st.integers(0, 4))
late_op = st.tuples(st.just("late_usage"), st.sampled_from(["a", "e"]))
programs = st.lists(st.one_of(usage_op, claim_op, replace_op, late_op), max_size=25)


@dataclass
class Model:
    """What the record should hold after each call."""

    last: dict[str, Any] | None = None
    auxiliary: dict[str, Any] | None = None
    answers: dict[str, Accounting] = field(default_factory=dict)
    refresh_used: bool = False
    version: int = 1
    data: dict[str, Any] = field(default_factory=lambda: {"v": 1})


async def run_program(store: Store, program: list[tuple[Any, ...]]) -> None:
    """Play ``program`` against a fresh record and check each answer and the final state."""
    rid = f"prep_{uuid.uuid4().hex}"
    await store.put(PreparationRecord(id=rid, tenant="acme", data={"v": 1}, expires_at=EXPIRES_AT))
    model = Model()
    for op in program:
        if op[0] == "usage":
            _, report_id, slot, value = op
            observation = {"report_id": report_id, "value": value}
            result = await store.record_usage("acme", rid, report_id, slot, observation, NOW)
            if report_id in model.answers:
                assert result == UsageResult("duplicate", model.answers[report_id])
            else:
                setattr(model, slot, observation)
                model.answers[report_id] = Accounting(model.last, model.auxiliary)
                assert result == UsageResult("applied", model.answers[report_id])
        elif op[0] == "claim":
            expected = "used" if model.refresh_used else "claimed"
            assert await store.claim_refresh("acme", rid, NOW) == expected
            model.refresh_used = True
        elif op[0] == "replace":
            expected_version = op[1]
            data = {"v": model.version + 1}
            ok = await store.replace_data("acme", rid, data, NOW, expected_version)
            assert ok == (expected_version in (None, model.version))
            if ok:
                model.version += 1
                model.data = data
        else:
            result = await store.record_usage("acme", rid, op[1], "last", {"late": 1}, EXPIRES_AT)
            assert result == UsageResult("missing", None)
    got = await store.get("acme", rid, NOW)
    assert got is not None
    assert got.accounting == Accounting(model.last, model.auxiliary)
    assert dict(got.reports) == model.answers
    assert (got.refresh_used, got.version, got.data) == (
        model.refresh_used,
        model.version,
        model.data,
    )
    assert got.expires_at == EXPIRES_AT


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
# Function-scoped fixtures are shared by all examples on purpose: every example uses a fresh
# record id, and the prefix/file only need cleaning once per test.
@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(program=programs)
def test_usage_claim_and_replace_sequences_match_the_model(
    backend: str, program: list[tuple[Any, ...]], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Any sequence of reports (with repeats), claims, replacements and late reports matches the model."""

    prefix = request.getfixturevalue("redis_prefix") if backend == "redis" else ""

    async def scenario() -> None:
        if backend == "sqlite":
            store = await open_store("sqlite", path=tmp_path / "seq.db")
        else:
            store = await open_store("redis", redis_url=REDIS_URL, key_prefix=prefix)
        try:
            await run_program(store, program)
        finally:
            await store.aclose()

    asyncio.run(scenario())
