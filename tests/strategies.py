"""Hypothesis strategies for block sets with dependency graphs (shared by the property tests)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from hypothesis import strategies as st

from context_assembly.core.blocks import SourceBlocks
from context_assembly.core.request import Block

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
PAST = "2026-12-01T00:00:00Z"
FUTURE = "2027-01-01T00:00:00Z"
WORDS = ["alpha", "beta", "gamma", "delta", "receipt", "A42", "{", "}", '"q"', "é", "日本", "🙂"]


@dataclass(frozen=True)
class Scenario:
    sources: tuple[str, ...]
    groups: tuple[SourceBlocks, ...]
    data_limit: int
    max_data_tokens: int
    source_limits: dict[str, int]


@st.composite
def scenarios(draw: st.DrawFn, max_blocks: int = 14, protected: bool = True) -> Scenario:
    """A few sources with blocks whose dependencies only point backwards (so no cycles)."""
    sources = tuple(
        draw(
            st.lists(st.sampled_from(["mem", "docs", "notes"]), min_size=1, max_size=3, unique=True)
        )
    )
    count = draw(st.integers(1, max_blocks))
    qids: list[str] = []
    per_source: dict[str, list[Block]] = {s: [] for s in sources}
    for index in range(count):
        source = draw(st.sampled_from(sources))
        block_id = f"b{index}"
        deps: list[str] = []
        if len(qids) > 0 and draw(st.booleans()):
            deps = draw(st.lists(st.sampled_from(qids), max_size=2, unique=True))
        if draw(st.integers(0, 20)) == 0:
            deps.append(f"{source}/ghost{index}")  # a missing dependency
        words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=40))
        projection = None
        if draw(st.booleans()):
            projection = " ".join(words[: max(1, len(words) // 4)])
        expires = draw(st.sampled_from([None, None, None, FUTURE, PAST]))
        per_source[source].append(
            Block(
                id=block_id,
                text=" ".join(words),
                priority=draw(st.integers(-3, 3)) * 100,
                protected=protected and draw(st.integers(0, 12)) == 0,
                dependencies=deps,
                expires_at=expires,
                projection=projection,
            )
        )
        qids.append(f"{source}/{block_id}")
    max_data = draw(st.integers(0, 400))
    data_limit = draw(st.integers(0, max_data))
    limits = {s: draw(st.integers(0, 300)) for s in sources if draw(st.booleans())}
    groups = tuple(SourceBlocks(s, tuple(per_source[s])) for s in sources)
    return Scenario(sources, groups, data_limit, max_data, limits)
