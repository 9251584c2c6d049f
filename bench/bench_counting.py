"""Benchmark: what the count cache costs on a miss and saves on a hit (not a test; prints medians).

Compares, in one process and on the same generated corpus (2,048 unique texts of 500–2,000
characters, half prose from Python's pydoc topics, half JSON records):

* raw    ``len(encoding.encode_ordinary(text))`` straight on tiktoken (o200k_base);
* cold   ``CachedCounter(TiktokenCounter("o200k_base"))`` with an empty cache: every call
         misses, so this is tiktoken plus hashing, locking and storing the count;
* warm   the same counter again: every call hits;
* estimate  ``estimate_tokens`` for the models without a public tokenizer.

raw and cold alternate order on each repetition; each figure is the median [min..max] over the
repetitions. Target: cold/raw ≤ 1.2. Run: ``.venv/bin/python bench/bench_counting.py``.
"""

from __future__ import annotations

import gc
import pydoc_data.topics
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable

import orjson

from context_assembly.tokens.counter import CachedCounter, TiktokenCounter
from context_assembly.tokens.encodings import get_encoding
from context_assembly.tokens.estimate import estimate_tokens

TEXTS = 2048
REPETITIONS = 7
SEED = 7


def make_corpus(count: int = TEXTS, seed: int = SEED) -> list[str]:
    """Unique texts of 500–2,000 chars: prose slices and JSON records, alternating."""
    rng = random.Random(seed)
    prose = "\n\n".join(pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics))
    texts: list[str] = []
    for i in range(count):
        size = rng.randint(500, 2000)
        if i % 2 == 0:
            start = rng.randrange(0, len(prose) - size)
            text = prose[start : start + size]
        else:
            records: list[str] = []
            while sum(len(r) for r in records) < size:
                record = {
                    "id": str(uuid.UUID(int=rng.getrandbits(128))),
                    "score": round(rng.uniform(0, 1000), 3),
                    "active": rng.random() < 0.5,
                    "note": prose[
                        (k := rng.randrange(0, len(prose) - 80)) : k + rng.randint(10, 80)
                    ],
                }
                records.append(orjson.dumps(record, option=orjson.OPT_INDENT_2).decode())
            text = ("[" + ",\n".join(records) + "]")[:size]
        texts.append(f"{i} {text}")  # the prefix keeps every text unique, so cold never hits
    return texts


def timed(run: Callable[[], int]) -> tuple[float, int]:
    gc.collect()
    start = time.perf_counter_ns()
    total = run()
    return (time.perf_counter_ns() - start) / 1e9, total


def summary(values: list[float], scale: float, unit: str) -> str:
    scaled = [v * scale for v in values]
    return f"{statistics.median(scaled):9.2f} {unit} [{min(scaled):.2f}..{max(scaled):.2f}]"


def main() -> int:
    started = time.perf_counter()
    build_start = time.perf_counter()
    encoding = get_encoding("o200k_base")
    build_seconds = time.perf_counter() - build_start
    encode = encoding.encode_ordinary
    texts = make_corpus()
    megabytes = sum(len(t.encode()) for t in texts) / 1e6

    def raw() -> int:
        return sum(len(encode(t)) for t in texts)

    results: dict[str, list[float]] = {"raw": [], "cold": [], "warm": [], "estimate": []}
    paired_ratios: list[float] = []
    exact_total = raw()  # warm-up pass; also the reference total
    for repetition in range(REPETITIONS):
        counter = CachedCounter(TiktokenCounter("o200k_base"))

        def cold(counter: CachedCounter = counter) -> int:
            return sum(counter.count(t) for t in texts)

        order = [("raw", raw), ("cold", cold)]
        if repetition % 2:
            order.reverse()
        seconds: dict[str, float] = {}
        for name, run in order:
            seconds[name], total = timed(run)
            assert total == exact_total, (name, total, exact_total)
        info = counter.cache_info()
        assert info.misses == len(texts) and info.hits == 0, info
        seconds["warm"], total = timed(cold)
        assert total == exact_total and counter.cache_info().hits == len(texts)
        seconds["estimate"], _ = timed(lambda: sum(estimate_tokens(t) for t in texts))
        for name, value in seconds.items():
            results[name].append(value)
        paired_ratios.append(seconds["cold"] / seconds["raw"])

    per_call = 1e6 / len(texts)
    print(f"python {sys.version.split()[0]}; o200k_base built in {build_seconds:.2f} s")
    print(
        f"corpus: {len(texts)} texts, {megabytes:.2f} MB, {exact_total} o200k tokens; "
        f"{REPETITIONS} repetitions, raw/cold order alternating"
    )
    print(f"{'variant':9s} {'per call':>24s}   {'whole pass':>26s}   MB/s")
    for name, values in results.items():
        throughput = statistics.median(megabytes / v for v in values)
        print(
            f"{name:9s} {summary(values, per_call, 'µs')}   {summary(values, 1e3, 'ms')}   {throughput:6.1f}"
        )
    ratio = statistics.median(paired_ratios)
    print(
        f"cold/raw (median of paired ratios): {ratio:.3f} "
        f"[{min(paired_ratios):.3f}..{max(paired_ratios):.3f}]  target <= 1.2: "
        f"{'OK' if ratio <= 1.2 else 'MISSED'}"
    )
    warm_ratio = statistics.median(results["warm"]) / statistics.median(results["raw"])
    print(f"warm/raw: {warm_ratio:.4f}  (a hit costs {warm_ratio * 100:.1f}% of counting)")
    print(f"total run time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
