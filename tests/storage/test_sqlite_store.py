"""SQLite-only behaviour: file settings, housekeeping, a busy database, lifecycle and versions."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from storage_support import RecordFactory

from context_assembly.errors import StoreUnavailableError
from context_assembly.storage import (
    Accounting,
    DuplicatePreparationIdError,
    PreparationRecord,
    open_store,
)
from context_assembly.storage import sqlite as sqlite_store
from context_assembly.storage.sqlite import _SCHEMA, SCHEMA_VERSION, SqliteStore

OBS = {"provider": "openai", "call": "main", "provider_input_tokens": 10}
# How long a test waits for the store's worker thread to begin a write: a hang guard only.
WORKER_BOUND = 5.0

T = TypeVar("T")


def _announce_writes(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """An event the store's worker thread sets as it begins a write transaction, just before
    its ``BEGIN IMMEDIATE`` (which waits for a lock another connection holds): a test that
    waits on it knows its operation holds the worker thread."""
    loop = asyncio.get_running_loop()
    began = asyncio.Event()
    write = sqlite_store._write

    def announcing(fn: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
        loop.call_soon_threadsafe(began.set)
        return write(fn, conn)

    monkeypatch.setattr(sqlite_store, "_write", announcing)
    return began


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


async def test_a_version_1_file_gains_the_latest_table_and_keeps_its_records(
    tmp_path: Path, now: float
) -> None:
    """A file written before the latest pointer existed opens as the current version with its
    records, the pointer, the secrets and the calibration."""
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    for statement in _SCHEMA:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute(
        "INSERT INTO preparations (id, tenant, expires_at, data) VALUES (?, ?, ?, ?)",
        ("prep_old", "acme", now + 60, b"{}"),
    )
    conn.commit()
    conn.close()
    store = await open_store("sqlite", path=path)
    try:
        got = await store.get("acme", "prep_old", now)
        assert got is not None and got.data == {}
        record = PreparationRecord(id="prep_new", tenant="acme", data={}, expires_at=now + 60)
        await store.put(record, latest_of="k")
        latest = await store.latest("acme", "k", now)
        assert latest is not None and latest.id == "prep_new"
        assert await store.secret("s", b"k" * 32) == b"k" * 32
        assert await store.calibration("acme", "m", 0.5) == [0.5]
    finally:
        await store.aclose()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    check.close()


async def test_open_store_checks_its_arguments() -> None:
    """Each backend needs its location, and unknown backends are refused."""
    with pytest.raises(ValueError, match="path"):
        await open_store("sqlite")
    with pytest.raises(ValueError, match="redis_url"):
        await open_store("redis")
    with pytest.raises(ValueError, match="unknown"):
        await open_store("memory")  # type: ignore[arg-type]


def _outside_ids(path: Path) -> set[str]:
    """The ids another process sees in the file now."""
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM preparations")}
    finally:
        conn.close()


async def test_a_put_is_in_the_file_when_it_returns(
    tmp_path: Path, make_record: RecordFactory
) -> None:
    """Each record is committed before ``put`` returns: another connection sees it at once."""
    path = tmp_path / "s.db"
    store = await open_store("sqlite", path=path)
    try:
        written: set[str] = set()
        for _ in range(20):
            record = make_record()
            await store.put(record)
            written.add(record.id)
            assert _outside_ids(path) == written
    finally:
        await store.aclose()


async def test_an_id_already_in_the_file_is_refused_by_put(
    tmp_path: Path, make_record: RecordFactory, now: float
) -> None:
    """An id another process (or an earlier process on the same file) wrote makes ``put`` raise before it returns,
    and the first record stays as it was."""
    path = tmp_path / "s.db"
    other = await SqliteStore.open(path)
    store = await SqliteStore.open(path)
    try:
        first = make_record()
        await other.put(first)
        with pytest.raises(DuplicatePreparationIdError):
            await store.put(make_record(id=first.id, data={"other": 1}))
        with pytest.raises(DuplicatePreparationIdError):
            await store.put(make_record(id=first.id, tenant="globex"))
        assert await store.get("acme", first.id, now) == first
        assert _outside_ids(path) == {first.id}
    finally:
        await store.aclose()
        await other.aclose()


async def test_put_waits_for_a_held_write_lock_instead_of_failing(
    tmp_path: Path, make_record: RecordFactory, now: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another process holds the write lock, ``put`` waits (up to the busy timeout)
    instead of failing, and returns once its record is committed."""
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, busy_timeout_ms=5000)
    began = _announce_writes(monkeypatch)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        record = make_record()
        pending = asyncio.ensure_future(store.put(record))
        await asyncio.wait_for(began.wait(), timeout=WORKER_BOUND)
        assert not pending.done()  # waiting on the thread, not failed
        assert _outside_ids(path) == set()
        blocker.execute("COMMIT")
        await asyncio.wait_for(pending, timeout=5)
        assert _outside_ids(path) == {record.id}
        assert await store.get("acme", record.id, now) is not None
    finally:
        blocker.close()
        await store.aclose()


async def test_a_put_that_cannot_write_raises_and_stores_nothing(
    tmp_path: Path, make_record: RecordFactory, now: float
) -> None:
    """A write lock held past the busy timeout makes ``put`` raise ``StoreUnavailableError``
    (a 503, never a 200) and leaves no record; once the lock is free the same put succeeds."""
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, busy_timeout_ms=50)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        record = make_record()
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailableError, match="database is locked"):
            await store.put(record)
        blocker.execute("ROLLBACK")
        assert _outside_ids(path) == set()
        assert await store.get("acme", record.id, now) is None
        await store.put(record)
        assert _outside_ids(path) == {record.id}
    finally:
        blocker.close()
        await store.aclose()


async def test_a_cancelled_put_does_not_cut_its_transaction(
    tmp_path: Path, make_record: RecordFactory, now: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller cancelled while its put waits for the lock (its client went away) leaves the
    transaction to run whole on the worker thread: the record is written, reports and all."""
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, busy_timeout_ms=5000)
    began = _announce_writes(monkeypatch)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        answered = Accounting(last=OBS, auxiliary=None)
        record = make_record(reports={"a": answered, "b": answered})
        blocker.execute("BEGIN IMMEDIATE")
        pending = asyncio.ensure_future(store.put(record))
        await asyncio.wait_for(began.wait(), timeout=WORKER_BOUND)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        blocker.execute("COMMIT")
        got = await store.get("acme", record.id, now)  # queued behind the put on the thread
        assert got is not None and set(got.reports) == {"a", "b"}
    finally:
        blocker.close()
        await store.aclose()


async def test_ping_answers_while_a_write_waits_for_the_lock(
    tmp_path: Path, make_record: RecordFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A readiness probe never queues behind a write waiting for the lock (it would wait the
    5 s busy timeout): ``ping`` returns while the put is still waiting on the worker thread."""
    path = tmp_path / "s.db"
    store = await SqliteStore.open(path, busy_timeout_ms=5000)
    began = _announce_writes(monkeypatch)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        pending = asyncio.ensure_future(store.put(make_record()))
        await asyncio.wait_for(began.wait(), timeout=WORKER_BOUND)  # the put holds the thread
        await asyncio.wait_for(store.ping(), timeout=4)  # well inside the busy timeout
        assert not pending.done()  # ping did not wait for the write
        blocker.execute("COMMIT")
        await asyncio.wait_for(pending, timeout=5)
        await store.ping()
    finally:
        blocker.close()
        await store.aclose()
