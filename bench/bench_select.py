"""Selection benchmark: 128 and 2,048 blocks with dependency chains, warm and cold counts.

Warm: every block's count is already in the count cache (the next turn of a conversation).
Cold: a fresh cache, so every block is tokenized (o200k_base) during selection.
Prints medians and p90 of ``select()`` wall time (validation is timed on its own line), and the
baseline of the same run: tokenizing the same texts once with raw tiktoken (what any exact
selector must at least pay when cold; cold selection also counts every projection and, once, the
whole rendered message, so it tokenizes about twice the text).
Run: ``make bench`` or ``.venv/bin/python bench/bench_select.py``.
"""

from __future__ import annotations

import random
import statistics
import time
from datetime import UTC, datetime

from context_assembly.core.blocks import SourceBlocks, build_graph
from context_assembly.core.request import AssemblyOptions, Block
from context_assembly.core.select import select
from context_assembly.tokens.counter import CachedCounter, CountCache, TiktokenCounter
from context_assembly.tokens.encodings import get_encoding
from context_assembly.tokens.registry import ModelRegistry

NOW = datetime(2026, 12, 2, 12, tzinfo=UTC)
WORDS = "receipt account export backup policy incident glossary customer ticket queue worker storage".split()


def make_blocks(n: int, seed: int = 7) -> list[SourceBlocks]:
    """n blocks over 4 sources; chains of dependencies (each block may depend on 1-2 earlier ones)."""
    rnd = random.Random(seed)
    sources = ["memory", "docs", "notes", "tasks"]
    per: dict[str, list[Block]] = {s: [] for s in sources}
    qids: list[str] = []
    for i in range(n):
        source = sources[i % 4]
        deps = []
        if qids and rnd.random() < 0.6:
            deps = sorted(
                {qids[-1 - rnd.randrange(min(len(qids), 8))] for _ in range(rnd.randint(1, 2))}
            )
        text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(20, 120))) + f" #{i}"
        per[source].append(
            Block(
                id=f"b{i}",
                text=text,
                priority=rnd.randint(-50, 50) * 10,
                dependencies=deps,
                projection=text[:40] if rnd.random() < 0.5 else None,
            )
        )
        qids.append(f"{source}/b{i}")
    return [SourceBlocks(s, tuple(per[s])) for s in sources]


def run(n: int, reps: int, limit: int) -> None:
    groups = make_blocks(n)
    options = AssemblyOptions(max_blocks=2048)
    profile = ModelRegistry.load().lookup("gpt-4o")
    assert profile is not None
    sources = [g.source for g in groups]
    texts = [b.text for g in groups for b in g.blocks]
    encode = get_encoding("o200k_base").encode_ordinary

    graph = build_graph(groups, options)

    def once(counter: CachedCounter) -> float:
        started = time.perf_counter()
        select(
            graph,
            sources,
            now=NOW,
            data_limit=limit,
            max_data_tokens=limit,
            source_limits={"docs": limit // 3},
            counter=counter,
            profile=profile,
        )
        return time.perf_counter() - started

    def validate() -> float:
        started = time.perf_counter()
        build_graph(groups, options)
        return time.perf_counter() - started

    warm_counter = CachedCounter(TiktokenCounter("o200k_base"), cache=CountCache())
    once(warm_counter)
    warm, cold, raw, valid = [], [], [], []
    for _ in range(reps):  # interleave the variants so machine noise hits all of them alike
        valid.append(validate())
        warm.append(once(warm_counter))
        cold.append(once(CachedCounter(TiktokenCounter("o200k_base"), cache=CountCache())))
        started = time.perf_counter()
        for text in texts:
            encode(text)
        raw.append(time.perf_counter() - started)

    def fmt(xs: list[float]) -> str:
        xs = sorted(xs)
        return f"p50 {statistics.median(xs) * 1000:7.2f} ms  p90 {xs[int(len(xs) * 0.9) - 1] * 1000:7.2f} ms"

    print(f"{n} blocks, data limit {limit} tokens:")
    print(f"  validate (block rules, graph, cycles): {fmt(valid)}")
    print(f"  select, warm counts: {fmt(warm)}")
    print(f"  select, cold counts: {fmt(cold)}")
    print(
        f"raw tiktoken over the same {n} texts: {fmt(raw)}   cold/raw {statistics.median(cold) / statistics.median(raw):.2f}x"
    )


if __name__ == "__main__":
    run(128, 30, 8_000)
    run(2048, 15, 8_000)  # a typical budget: most blocks are decided by the exact early reject
    run(2048, 15, 60_000)  # a large budget: ~735 blocks enter, every one through the full path
