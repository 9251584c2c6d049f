"""Store lookup benchmark: another tenant's existing id against an unknown id, on both stores.

A lookup must not tell the two apart, by its answer or by its time. For each store (a SQLite file
in a temporary folder, and the Redis on 127.0.0.1:6379 under a fresh key prefix) it puts one
record the size of a prepare's, then times ``get`` by another tenant on that record's id and on
an id never stored, interleaved in rounds so that a drift of the machine moves both, and prints
the median and p90 of each and the difference of the medians. The owner's own ``get`` is printed
for scale.
Run: ``.venv/bin/python bench/bench_store_lookup.py``.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import redis

from context_assembly.storage import PreparationRecord, Store, open_store

REDIS_URL = "redis://127.0.0.1:6379/15"
ROUNDS = 40
PER_ROUND = 100


def make_record(now: float) -> PreparationRecord:
    """A record with a manifest of 128 blocks, about what a 128-block prepare stores."""
    blocks = [{"id": f"memory/b{i}", "tokens": 40 + i % 17, "hash": "h" * 16} for i in range(128)]
    return PreparationRecord(
        id=f"prep_{uuid.uuid4().hex}",
        tenant="acme",
        data={"manifest": {"blocks": blocks}, "hash": "x" * 64},
        expires_at=now + 3600,
    )


async def time_gets(store: Store, tenant: str, id: str, now: float) -> float:
    """Microseconds per ``get`` over one round."""
    started = time.perf_counter()
    for _ in range(PER_ROUND):
        await store.get(tenant, id, now)
    return (time.perf_counter() - started) / PER_ROUND * 1e6


async def measure(name: str, store: Store) -> None:
    now = time.time()
    record = make_record(now)
    await store.put(record)
    unknown = f"prep_{uuid.uuid4().hex}"
    cases = {
        "own": ("acme", record.id),
        "foreign": ("globex", record.id),
        "unknown": ("acme", unknown),
    }
    for tenant, id in cases.values():  # warm up (scripts loaded, pages cached)
        await time_gets(store, tenant, id, now)
    samples: dict[str, list[float]] = {case: [] for case in cases}
    for _ in range(ROUNDS):
        for case, (tenant, id) in cases.items():
            samples[case].append(await time_gets(store, tenant, id, now))
    for case, values in samples.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"{name:7} {case:8} median {statistics.median(values):7.1f} µs  p90 {p90:7.1f} µs")
    gap = statistics.median(samples["foreign"]) - statistics.median(samples["unknown"])
    print(f"{name:7} foreign - unknown (medians): {gap:+.1f} µs")


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        sqlite = await open_store("sqlite", path=Path(folder) / "bench.db")
        try:
            await measure("sqlite", sqlite)
        finally:
            await sqlite.aclose()
    prefix = f"ca-bench:{uuid.uuid4().hex}:"
    store = await open_store("redis", redis_url=REDIS_URL, key_prefix=prefix)
    try:
        await measure("redis", store)
    finally:
        await store.aclose()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=prefix + "*"))
        if keys:
            client.delete(*keys)
        client.close()


if __name__ == "__main__":
    asyncio.run(main())
