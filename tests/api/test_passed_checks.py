"""The record of contributor answers that passed the block rules changes no outcome.

``preparations.targets.check_and_digest`` skips the per-source rules for blocks that already
passed them under the same ``max_block_characters``. Turn after turn, with one record shared by
every turn, each answer must get exactly the outcome (status, cause, blocks) and digest that the
rules run afresh give it — including answers that break a rule, a limit that shrinks under the same
blocks, the same blocks under another source, and a record that fills up and is cleared.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_assembly.contributors.calls import ContributorOutcome
from context_assembly.core.blocks import check_source_blocks
from context_assembly.core.memo import blocks_digest
from context_assembly.core.request import Block, PrepareRequest
from context_assembly.preparations import targets
from context_assembly.preparations.targets import PassedChecks, check_and_digest, check_blocks
from hypothesis_budget import examples

PROPERTY = settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
WORDS = ["alpha", "beta", "é", "日本", "🙂", "x" * 30]


BREAKS: list[dict[str, Any]] = [
    {"id": ""},
    {"id": "a\x01"},
    {"priority": 1001},
    {"dependencies": ["unqualified"]},
    {"dependencies": ["mem/"]},
    {"expires_at": "tomorrow"},
]


@st.composite
def blocks(draw: st.DrawFn) -> tuple[Block, ...]:
    """A few valid blocks, sometimes with one rule broken (id, priority, dependency, expiry, a
    duplicate id); the text and projection limit is the caller's."""
    count = draw(st.integers(0, 5))
    out: list[Block] = []
    for index in range(count):
        text = " ".join(draw(st.lists(st.sampled_from(WORDS), max_size=6)))
        out.append(
            Block(
                id=f"b{index}",
                text=text,
                priority=draw(st.sampled_from([0, -1000, 1000])),
                dependencies=draw(st.lists(st.sampled_from(["mem/b0", "docs/b1"]), max_size=2)),
                expires_at=draw(st.sampled_from([None, "2027-01-01T00:00:00Z"])),
                projection=draw(st.sampled_from([None, text[:5], text + "!"])),
            )
        )
    if out and draw(st.integers(0, 3)) == 0:
        index = draw(st.integers(0, len(out) - 1))
        change = draw(st.sampled_from([*BREAKS, {"id": "b0"}]))
        out[index] = out[index].model_copy(update=change)
    return tuple(out)


def _request(limit: int) -> PrepareRequest:
    return PrepareRequest.model_validate(
        {"model": "gpt-4o-mini", "assembly": {"max_block_characters": limit}}
    )


Turn = tuple[str, str, tuple[Block, ...], int]


@st.composite
def turns(draw: st.DrawFn) -> list[Turn]:
    """Answers drawn from a small pool of block sets, each under any source, status and limit, so
    the same blocks come back under another limit or source as often as under the same ones."""
    pool = draw(st.lists(blocks(), min_size=1, max_size=4))
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from(["mem", "docs"]),
                st.sampled_from(["ok", "ok", "ok", "timeout"]),
                st.sampled_from(pool),
                st.sampled_from([1, 10, 40, 65_536]),
            ),
            min_size=1,
            max_size=16,
        )
    )


@PROPERTY
@given(turns=turns(), bound=st.sampled_from([2, 1_000]))
def test_a_recorded_pass_gives_the_outcome_the_rules_give(
    turns: list[Turn], bound: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(targets, "MAX_PASSED_CHECKS", bound)
        passed: PassedChecks = set()
        for source, status, blocks_, limit in turns:
            outcome = ContributorOutcome(source, status, 3.0, None, blocks_)  # type: ignore[arg-type]
            request = _request(limit)
            digests: dict[str, bytes] = {}
            got = check_and_digest(outcome, request, digests, passed)
            expected = check_blocks(outcome, request)
            assert got == expected
            if expected.ok:
                assert digests == {source: blocks_digest(blocks_)}
            else:
                assert digests == {}
            assert len(passed) <= bound


def test_a_pass_is_recorded_and_reused_and_a_smaller_limit_checks_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The record is used (the rules do not run for a recorded pass) and keyed on the limit."""
    runs: list[str] = []

    def counted(source: str, *args: object) -> None:
        runs.append(source)
        check_source_blocks(source, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(targets, "check_source_blocks", counted)
    passed: PassedChecks = set()
    outcome = ContributorOutcome("mem", "ok", 1.0, None, (Block(id="a", text="y" * 20),))
    assert check_and_digest(outcome, _request(100), {}, passed) == outcome
    assert check_and_digest(outcome, _request(100), {}, passed) == outcome
    assert runs == ["mem"] and len(passed) == 1
    # Another limit is another key: the rules run and name the failure, which is not recorded.
    for _ in range(2):
        failed = check_and_digest(outcome, _request(10), {}, passed)
        assert failed.status == "invalid" and "max_block_characters 10" in (failed.cause or "")
    assert runs == ["mem"] * 3 and len(passed) == 1
    # The same blocks under another source are checked for that source.
    assert check_and_digest(replace(outcome, source="docs"), _request(100), {}, passed).ok
    assert runs == ["mem"] * 3 + ["docs"] and len(passed) == 2
