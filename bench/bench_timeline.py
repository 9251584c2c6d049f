"""Benchmark: the timeline of a conversation of heavy turns.

A conversation of 50 turns in one scope, each record about 0.9 MB (2,000 inline blocks with long
ids, whose reports the manifest keeps, and a history of 1,500 messages, whose hashes the record
keeps), prepared through the in-process app on a real SQLite file. Then ``GET .../timeline``
(JSON) of the newest turn, timed: the page reads each of the 50 records from the store and shows
its turn part (``record.TurnRecord``). For comparison, the same pages with every record read and
validated whole (``StoredPreparation.read``, as the timeline read them before), and the time
the 50 records' data take to read each way, apart from the store; and the same for 50 records of
the version 1 shape whose manifest is packed (``tests/storage/fixtures``, with 4,000 block
reports), which a whole read unpacks.

Bounded: one app, one conversation, in-process. Run:
``.venv/bin/python bench/bench_timeline.py [pages]``.
"""

from __future__ import annotations

import base64
import copy
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from fastapi.testclient import TestClient
from figures import report

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.preparations import record, turns
from context_assembly.storage import PreparationRecord

TURNS = 50
PACKED = Path(__file__).parents[1] / "tests/storage/fixtures/record-v1-packed-rows.json"
BLOCKS = 2000
HISTORY = [
    {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(1500)
]


def body(number: int) -> dict[str, Any]:
    blocks = [
        {"id": f"turn{number}-block{i:05d}-" + "x" * 200, "text": f"fact {i}"}
        for i in range(BLOCKS)
    ]
    return {
        "model": "gpt-4o-mini",
        "plugins": [{"name": "notes"}],
        "contributions": [{"source": "notes", "revision": number, "blocks": blocks}],
        "assembly": {"max_blocks": BLOCKS},
        "scope": {"task_id": "bench-timeline"},
        "history": HISTORY,
        "input": [{"role": "user", "content": f"question {number}"}],
    }


class Whole:
    """Every record read and validated whole, as the timeline read them before."""

    read = staticmethod(record.StoredPreparation.read)


def pages(client: TestClient, path: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        answer = client.get(path, headers={"Accept": "application/json"})
        times.append(time.perf_counter() - started)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["turns"]) == TURNS
    return times


async def stored(client: TestClient, ids: list[str]) -> list[PreparationRecord]:
    """The records of ``ids``, as the store gives them."""
    app: Any = client.app
    service = app.state.preparations
    found = [await service.store.get("default", i, service.clock.wall()) for i in ids]
    return [r for r in found if r is not None]


def reads(read: Callable[[PreparationRecord], object], records: list[PreparationRecord]) -> float:
    """The best of five times, in ms, ``read`` takes over ``records``."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for found in records:
            read(found)
        best = min(best, time.perf_counter() - started)
    return best * 1000


def packed_records() -> list[PreparationRecord]:
    """50 records of the version 1 shape with a packed manifest of 4,000 block reports."""
    fixture = orjson.loads(PACKED.read_bytes())["record"]
    rows: list[list[object]] = [
        ["notes", f"block-{i:05d}-" + "x" * 60, "selected", "fits", 10, 10, None, 0, False, []]
        for i in range(4000)
    ]
    data = copy.deepcopy(fixture["data"])
    packed = base64.b64encode(zlib.compress(orjson.dumps(rows))).decode()
    data["response"]["selection"][record.PACKED_ROWS] = packed
    return [PreparationRecord(**{**fixture, "data": data}) for _ in range(TURNS)]


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    with tempfile.TemporaryDirectory() as folder:
        settings = load_settings(store={"path": str(Path(folder) / "bench.db")})
        with TestClient(create_app(settings)) as client:
            ids = []
            for number in range(TURNS):
                answer = client.post("/v1/prepare", json=body(number))
                assert answer.status_code == 200, answer.text
                ids.append(answer.json()["preparation_id"])
            last = ids[-1]
            size = len(client.get(f"/v1/preparations/{last}").content)
            path = f"/v1/preparations/{last}/timeline"
            pages(client, path, 2)  # warm
            now = pages(client, path, count)
            vars(turns)["TurnRecord"] = Whole
            try:
                before = pages(client, path, count)
            finally:
                vars(turns)["TurnRecord"] = record.TurnRecord
            assert client.portal is not None
            records = client.portal.call(stored, client, ids)
    part_ms = reads(record.TurnRecord.read, records)
    whole_ms = reads(record.StoredPreparation.read, records)
    packed = packed_records()
    packed_part_ms = reads(record.TurnRecord.read, packed)
    packed_whole_ms = reads(record.StoredPreparation.read, packed)
    p50_now, p50_before = statistics.median(now) * 1000, statistics.median(before) * 1000
    print(f"{TURNS} turns, a record's view about {size / 1e6:.2f} MB; {count} pages each")
    print(f"turn part only:       p50 {p50_now:7.1f} ms, max {max(now) * 1000:7.1f} ms")
    print(f"whole records (old):  p50 {p50_before:7.1f} ms, max {max(before) * 1000:7.1f} ms")
    print(f"reading the 50 records' data: turn part {part_ms:.1f} ms, whole {whole_ms:.1f} ms")
    print(
        f"50 packed version 1 records: turn part {packed_part_ms:.1f} ms, "
        f"whole {packed_whole_ms:.1f} ms"
    )
    report(
        "timeline JSON of 50 heavy turns, p50 (whole-record reads for comparison)",
        f"{p50_now:.0f} ms (whole records: {p50_before:.0f} ms)",
        "",
        None,
    )
    report(
        "reading 50 heavy records for the timeline: turn part (whole records)",
        f"{part_ms:.1f} ms ({whole_ms:.1f} ms)",
        "",
        None,
    )
    report(
        "reading 50 packed version 1 records for the timeline: turn part (whole records)",
        f"{packed_part_ms:.1f} ms ({packed_whole_ms:.1f} ms)",
        "",
        None,
    )


if __name__ == "__main__":
    main()
