"""SQLite-only behaviour: file settings, housekeeping, a busy database, lifecycle and versions."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog.testing
from storage_support import RecordFactory

from context_assembly.errors import StoreUnavailableError
from context_assembly.storage import open_store
from context_assembly.storage import sqlite as sqlite_module
from context_assembly.storage.sqlite import SCHEMA_VERSION, SqliteStore, wal_multiprocess_safe

OBS = {"provider": "openai", "call": "main", "provider_input_tokens": 10}


async def test_file_is_in_wal_mode_with_the_current_schema(tmp_path: Path) -> None:
    """Opening a fresh file switches it to WAL and stamps the schema version."""
    path = tmp_path / "s.db"
    store = await open_store("sqlite", path=path)
    await store.aclose()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()


async def test_records_survive_reopening_the_file(
    tmp_path: Path, make_record: RecordFactory, now: float
) -> None:
    """What one store instance wrote, the next one opened on the same file reads back."""
    path = tmp_path / "s.db"
    record = make_record()
    first = await open_store("sqlite", path=path)
    await first.put(record)
    await first.record_usage("acme", record.id, "r1", "last", OBS, now)
    await first.aclose()
    second = await open_store("sqlite", path=path)
    try:
        got = await second.get("acme", record.id, now)
        assert got is not None and got.accounting.last == OBS and set(got.reports) == {"r1"}
    finally:
        await second.aclose()


async def test_purge_deletes_expired_records_and_their_reports(
    tmp_path: Path, make_record: RecordFactory, now: float
) -> None:
    """``purge_expired`` counts and removes expired rows, reports included, and keeps live ones."""
    path = tmp_path / "s.db"
    store = await open_store("sqlite", path=path)
    try:
        expired, live = make_record(expires_at=now + 5), make_record()
        await store.put(expired)
        await store.put(live)
        await store.record_usage("acme", expired.id, "r1", "last", OBS, now)
        await store.record_usage("acme", live.id, "r1", "last", OBS, now)
        assert await store.purge_expired(now + 5) == 1
        assert await store.purge_expired(now + 5) == 0
        assert await store.get("acme", live.id, now + 5) is not None
    finally:
        await store.aclose()
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT preparation_id FROM usage_reports").fetchall()
        assert rows == [(live.id,)]
    finally:
        conn.close()


async def test_busy_database_raises_store_unavailable(
    tmp_path: Path, make_record: RecordFactory, now: float
) -> None:
    """A writer held past the busy timeout surfaces as ``StoreUnavailableError``, not a hang."""
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, busy_timeout_ms=50)
    record = make_record()
    await store.put(record)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailableError):
            await store.record_usage("acme", record.id, "r1", "last", OBS, now)
        blocker.execute("ROLLBACK")
        result = await store.record_usage("acme", record.id, "r1", "last", OBS, now)
        assert result.status == "applied"
    finally:
        blocker.close()
        await store.aclose()


async def test_closed_store_refuses_work_and_closes_twice(tmp_path: Path, now: float) -> None:
    """After ``aclose`` every call raises ``StoreUnavailableError``; closing again is harmless."""
    store = await open_store("sqlite", path=tmp_path / "s.db")
    await store.aclose()
    await store.aclose()
    with pytest.raises(StoreUnavailableError):
        await store.get("acme", "prep_x", now)
    with pytest.raises(StoreUnavailableError):
        await store.ping()


async def test_unopenable_path_raises_store_unavailable(tmp_path: Path) -> None:
    """A path that cannot be a database file (a directory) fails with ``StoreUnavailableError``."""
    with pytest.raises(StoreUnavailableError):
        await open_store("sqlite", path=tmp_path)


async def test_file_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    """The store does not write into a file stamped with a schema version it does not know."""
    path = tmp_path / "s.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreUnavailableError, match="schema version"):
        await open_store("sqlite", path=path)


@pytest.mark.parametrize(
    ("version", "safe"),
    [
        ((3, 40, 1), False),  # Debian 12 / our Python build
        ((3, 44, 5), False),
        ((3, 44, 6), True),  # backport
        ((3, 45, 0), False),
        ((3, 50, 6), False),
        ((3, 50, 7), True),  # backport
        ((3, 51, 1), False),  # pysqlite3-binary 0.5.4.post2
        ((3, 51, 2), False),
        ((3, 51, 3), True),  # the fix
        ((3, 52, 1), True),
    ],
)
def test_wal_reset_bug_versions(version: tuple[int, int, int], safe: bool) -> None:
    """Only 3.51.3+ and the 3.50.7 / 3.44.6 backport lines count as safe for several writers."""
    assert wal_multiprocess_safe(version) is safe


async def test_open_store_checks_its_arguments() -> None:
    """Each backend needs its location, and unknown backends are refused."""
    with pytest.raises(ValueError, match="path"):
        await open_store("sqlite")
    with pytest.raises(ValueError, match="redis_url"):
        await open_store("redis")
    with pytest.raises(ValueError, match="unknown"):
        await open_store("memory")  # type: ignore[arg-type]


async def test_put_waits_for_a_held_write_lock_instead_of_failing(
    tmp_path: Path, make_record: RecordFactory, now: float
) -> None:
    """The inline put never waits; when the lock is held it goes to the worker thread, which
    waits up to the busy timeout like every other write, and the record is there afterwards."""
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, busy_timeout_ms=5000)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        record = make_record()
        pending = asyncio.ensure_future(store.put(record))
        await asyncio.sleep(0.2)
        assert not pending.done()  # waiting on the thread, not failed
        blocker.execute("COMMIT")
        await asyncio.wait_for(pending, timeout=5)
        assert await store.get("acme", record.id, now) is not None
    finally:
        blocker.close()
        await store.aclose()


async def test_inline_puts_are_checkpointed_on_the_worker_thread(
    tmp_path: Path, make_record: RecordFactory, now: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every CHECKPOINT_EVERY inline puts one PASSIVE checkpoint runs, off the event loop."""
    monkeypatch.setattr(sqlite_module, "CHECKPOINT_EVERY", 4)
    threads: list[str] = []
    original = sqlite_module._checkpoint

    def spy(conn: sqlite3.Connection) -> None:
        threads.append(threading.current_thread().name)
        original(conn)

    monkeypatch.setattr(sqlite_module, "_checkpoint", spy)
    store = await SqliteStore.open(tmp_path / "s.db")
    try:
        records = [make_record() for _ in range(12)]
        for record in records:
            await store.put(record)
            await asyncio.sleep(0.01)  # let a scheduled checkpoint run
        assert len(threads) == 3
        assert all(name.startswith("context-assembly-sqlite") for name in threads)
        for record in records:
            assert await store.get("acme", record.id, now) is not None
    finally:
        await store.aclose()


# ---------------------------------------------------------------- the write delay


def _outside_ids(path: Path) -> set[str]:
    """The ids another process sees in the file now."""
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM preparations")}
    finally:
        conn.close()


def _spy_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Each write of held rows: the thread it ran on and how many rows it inserted."""
    writes: list[tuple[str, int]] = []
    original = sqlite_module._insert_rows

    def spy(rows: list[tuple[object, ...]], conn: sqlite3.Connection) -> None:
        writes.append((threading.current_thread().name, len(rows)))
        original(rows, conn)

    monkeypatch.setattr(sqlite_module, "_insert_rows", spy)
    return writes


async def _until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` for up to five seconds."""
    deadline = asyncio.get_running_loop().time() + 5
    while not condition() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)


async def test_delayed_records_are_held_then_written_together(
    tmp_path: Path, make_record: RecordFactory, now: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a write delay, ``put`` holds the record: this store sees it at once, another process
    once the delay has passed, and the records put meanwhile go in one write, on the loop's own
    connection when the write lock is free."""
    writes = _spy_writes(monkeypatch)
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, write_delay=0.05)
    try:
        records = [make_record() for _ in range(5)]
        for record in records:
            await store.put(record)
        assert _outside_ids(path) == set()  # held: no write yet
        await _until(lambda: bool(_outside_ids(path)))
        assert _outside_ids(path) == {r.id for r in records}
        assert writes == [(threading.current_thread().name, 5)]
        for record in records:
            assert await store.get("acme", record.id, now) == record
    finally:
        await store.aclose()


async def test_held_records_wait_on_the_worker_thread_while_the_lock_is_taken(
    tmp_path: Path, make_record: RecordFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When another writer holds the lock, the loop does not wait: the held rows go to the
    worker thread, which waits up to the busy timeout, and are written once the lock is free."""
    writes = _spy_writes(monkeypatch)
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, busy_timeout_ms=5000, write_delay=0.01)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        record = make_record()
        await store.put(record)
        await asyncio.sleep(0.2)  # the delay has passed: the inline write failed at once
        assert _outside_ids(path) == set()
        blocker.execute("COMMIT")
        await _until(lambda: bool(_outside_ids(path)))
        assert _outside_ids(path) == {record.id}
        loop_thread = threading.current_thread().name
        assert [name for name, _ in writes][:1] == [loop_thread]  # tried inline first, refused
        assert writes[-1][0].startswith("context-assembly-sqlite") and writes[-1][1] == 1
    finally:
        blocker.close()
        await store.aclose()


async def test_every_other_operation_writes_the_held_records_first(
    tmp_path: Path, make_record: RecordFactory, now: float
) -> None:
    """A read, a claim or a usage report right after ``put`` sees the record (it is written
    first), and ``flush`` makes it visible to another process without waiting for the delay."""
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, write_delay=1.0)
    try:
        first, second, third = make_record(), make_record(), make_record()
        await store.put(first)
        assert await store.get("acme", first.id, now) == first
        await store.put(second)
        assert await store.claim_refresh("acme", second.id, now) == "claimed"
        await store.put(third)
        result = await store.record_usage("acme", third.id, "r1", "last", OBS, now)
        assert result.status == "applied"
        fourth = make_record()
        await store.put(fourth)
        assert fourth.id not in _outside_ids(path)
        await store.flush()
        assert _outside_ids(path) == {first.id, second.id, third.id, fourth.id}
    finally:
        await store.aclose()


async def test_a_held_id_and_a_written_id_are_both_duplicates(
    tmp_path: Path, make_record: RecordFactory
) -> None:
    """``put`` refuses an id that it holds and one that it has written, as without delay."""
    from context_assembly.storage import DuplicatePreparationIdError

    store = await SqliteStore.open(tmp_path / "s.db", write_delay=1.0)
    try:
        record = make_record()
        await store.put(record)
        with pytest.raises(DuplicatePreparationIdError):
            await store.put(record)
        await store.flush()
        with pytest.raises(DuplicatePreparationIdError):
            await store.put(record)
    finally:
        await store.aclose()


async def test_an_id_already_in_the_file_from_elsewhere_is_refused_when_written(
    tmp_path: Path, make_record: RecordFactory, now: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held ``put`` does not read the file for its id: an id another store wrote is refused
    by the primary key when the held rows are written. That row is dropped and logged, the
    first record is kept, and the rows held with it are written."""
    captured = structlog.testing.CapturingLogger()
    monkeypatch.setattr(sqlite_module, "log", captured)
    path = tmp_path / "s.db"
    other = await SqliteStore.open(path)
    store = await SqliteStore.open(path, write_delay=1.0)
    try:
        first = make_record()
        await other.put(first)
        copy = make_record(id=first.id, data={"other": 1})
        beside = make_record()
        await store.put(copy)  # accepted: held, not checked against the file
        await store.put(beside)
        await store.flush()
        assert await store.get("acme", first.id, now) == first
        assert await store.get("acme", beside.id, now) == beside
        assert _outside_ids(path) == {first.id, beside.id}
        assert [(c.method_name, c.args, c.kwargs) for c in captured.calls] == [
            ("error", ("store_duplicate_id_dropped",), {"preparation_id": first.id})
        ]
    finally:
        await store.aclose()
        await other.aclose()


async def test_the_ids_a_store_refuses_from_memory_are_bounded(
    tmp_path: Path, make_record: RecordFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ids a store has written are remembered up to ``RECENT_IDS``, oldest forgotten first;
    a forgotten one is refused when written instead (the test above)."""
    from context_assembly.storage import DuplicatePreparationIdError

    monkeypatch.setattr(sqlite_module, "RECENT_IDS", 2)
    monkeypatch.setattr(sqlite_module, "log", structlog.testing.CapturingLogger())
    store = await SqliteStore.open(tmp_path / "s.db", write_delay=1.0)
    try:
        records = [make_record() for _ in range(3)]
        for record in records:
            await store.put(record)
            await store.flush()
        for record in records[1:]:
            with pytest.raises(DuplicatePreparationIdError):
                await store.put(record)
        await store.put(records[0])  # forgotten: held again, then refused by the file
        await store.flush()
    finally:
        await store.aclose()


async def test_a_failed_write_keeps_the_records_and_fails_every_call_until_it_succeeds(
    tmp_path: Path, make_record: RecordFactory, now: float
) -> None:
    """While the file refuses the write of held records, nothing is lost: they stay held and
    are retried, and every call (a new ``put`` too) answers ``StoreUnavailableError``, as it
    would without the delay. Once the file takes writes again, the held records are there."""
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, busy_timeout_ms=50, write_delay=0.01)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        held = make_record()
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        await store.put(held)
        with pytest.raises(StoreUnavailableError) as refused:
            await store.get("acme", held.id, now)
        assert str(refused.value).startswith("SQLite store unavailable: database is locked")
        with pytest.raises(StoreUnavailableError):
            await store.put(make_record())
        with pytest.raises(StoreUnavailableError):
            await store.ping()
        blocker.execute("ROLLBACK")
        assert await store.get("acme", held.id, now) == held
        later = make_record()
        await store.put(later)  # the failure is over: held again, written in the background
        await store.flush()
        assert _outside_ids(path) == {held.id, later.id}
    finally:
        blocker.close()
        await store.aclose()


async def test_aclose_writes_what_is_held(tmp_path: Path, make_record: RecordFactory) -> None:
    """A clean shutdown loses nothing: ``aclose`` writes the held records before closing."""
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, write_delay=1.0)
    records = [make_record() for _ in range(3)]
    for record in records:
        await store.put(record)
    await store.aclose()
    assert _outside_ids(path) == {r.id for r in records}


async def test_a_cancelled_reader_does_not_cut_the_write_of_held_records(
    tmp_path: Path, make_record: RecordFactory, now: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call cancelled while the held records are being written (its client went away) leaves
    that write to finish and to settle: the records are written once and no longer held."""
    calls: list[int] = []
    original = sqlite_module._insert_rows

    def spy(rows: list[tuple[object, ...]], conn: sqlite3.Connection) -> None:
        calls.append(len(rows))
        original(rows, conn)

    monkeypatch.setattr(sqlite_module, "_insert_rows", spy)
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, write_delay=1.0)
    try:
        record = make_record()
        await store.put(record)
        reader = asyncio.ensure_future(store.get("acme", record.id, now))
        await asyncio.sleep(0)  # the reader has started the write and waits for it
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        await store.flush()  # nothing left to write: the cancelled reader's write completed
        assert calls == [1]
        assert _outside_ids(path) == {record.id}
    finally:
        await store.aclose()


async def test_the_write_delay_is_bounded() -> None:
    """A delay beyond one second (or negative) is refused when the store opens."""
    for delay in (-0.001, 1.5):
        with pytest.raises(ValueError, match="write_delay"):
            await SqliteStore.open("unused.db", write_delay=delay)


async def test_ping_answers_at_once_while_held_records_wait_for_the_lock(
    tmp_path: Path, make_record: RecordFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A readiness probe never waits for the write lock (it would wait the 5 s busy timeout):
    ready while the held records' write has waited briefly, unavailable once it has waited over
    ``STALLED_SECONDS``, ready again once they are written."""
    monkeypatch.setattr(sqlite_module, "STALLED_SECONDS", 0.3)
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, busy_timeout_ms=5000, write_delay=0.01)
    blocker = sqlite3.connect(path, isolation_level=None)

    async def timed_ping() -> float:
        started = time.perf_counter()
        await store.ping()
        return time.perf_counter() - started

    try:
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        await store.put(make_record())
        await asyncio.sleep(0.1)  # the held write is on the worker thread, waiting for the lock
        assert await timed_ping() < 0.05
        await asyncio.sleep(0.3)
        started = time.perf_counter()
        with pytest.raises(StoreUnavailableError, match=r"waited over 0\.3 s for the write lock"):
            await store.ping()
        assert time.perf_counter() - started < 0.05
        blocker.execute("COMMIT")
        await _until(lambda: bool(_outside_ids(path)))
        assert await timed_ping() < 0.05
    finally:
        blocker.close()
        await store.aclose()
