"""SQLite preparation store: the embedded default (one file, one service process).

Threading: one connection, owned by one dedicated worker thread (a single-thread executor). Every
operation is one function run on that thread, so operations of this process never interleave, and
each write is one short ``BEGIN IMMEDIATE`` transaction, so writers in other processes sharing the
file are serialised by SQLite's write lock (waiting up to ``busy_timeout``). A cancelled caller
does not cut a transaction in half: the function still runs to its ``COMMIT``/``ROLLBACK`` on the
worker thread.

The one exception is ``put``, the write of every prepare: it first runs on the event loop, on a
second connection that never waits (``busy_timeout = 0``) and never checkpoints
(``wal_autocheckpoint = 0``). Measured on the project machine, that insert is ~35 µs, against
~160 µs for the hop to the worker thread and back, and the hop's wake-ups were what a prepare
waited for under load. When the write lock is taken (the worker thread or another process is
writing) the insert fails at once and the same insert goes to the worker thread, which waits as
every write does. Every ``CHECKPOINT_EVERY`` rows inserted inline the worker thread runs a
``PASSIVE`` checkpoint (it fsyncs, so never on the loop); writers do not wait for it.

Write delay (``write_delay``, from ``store.write_delay_ms``; 10 ms in the service): a new record is
not written in its ``put``. The store checks that its id is new to it (not held, not among the
``RECENT_IDS`` it wrote last), holds the row in memory and, at most ``write_delay`` later, writes
every held row in one transaction, on the loop's connection like an inline put (on the worker
thread when the lock is taken). One insert of a prepare's record cost ~75 µs of the loop's time in
the service (~12 small writes and 6 lock calls per transaction), ten in one transaction ~30 µs
each; and the write happens between requests, not inside one. Every other operation writes what
is held first (``flush``), so this process always sees its records; another process sharing the
file sees them at most ``write_delay`` later, or after ``flush``. When a write fails the rows stay held and are retried;
until one succeeds, ``put`` and every other operation answer ``StoreUnavailableError`` as they
would without the delay. What a clean shutdown holds is written by ``aclose``; a crash of the
process loses the records of its last ``write_delay`` (with ``synchronous=NORMAL``, a power loss
already loses the last transactions). ``write_delay = 0`` writes each record in its ``put``.

What a held ``put`` does not do is read the file for its id: that read was ~30 µs of every
prepare's ~0.9 ms in the service (a read transaction: two lock calls and a page read), 3% of the
inline prepare's p50 in an A/B, for an event that cannot happen. Ids are 144 random bits
(``new_preparation_id``); a collision is a bug, and the bug a check can catch (a generator that
repeats itself) repeats ids this store put: those are refused at once (``_held``, ``_recent``). An
id already in the file from elsewhere (another process, an earlier run) is refused by the primary
key when the held rows are written: that row is dropped and logged (``store_duplicate_id_dropped``)
and the first record is kept, as for an id another process inserts while a row is held.

Durability and safety (docs: sqlite.org/wal.html): WAL journal, ``synchronous=NORMAL`` (cannot
corrupt in WAL mode; may lose the last transactions on power loss), busy timeout 5 s by default.
WAL needs shared memory, so the file must be on a local disk. Versions 3.7.0–3.51.2 have the
WAL-reset bug that can corrupt a database written by several processes at once; see
``wal_multiprocess_safe`` (the settings validator should refuse several workers unless it holds).

Schema (``PRAGMA user_version`` = 1):

- ``preparations(id PK, tenant, expires_at REAL, refresh_used, version, data, last, auxiliary)``;
  ``data`` and the two observations are orjson bytes (observations NULL until reported).
- ``usage_reports(preparation_id, report_id, answer)``, PK ``(preparation_id, report_id)``;
  ``answer`` is the ``[last, auxiliary]`` JSON answered for that report.

Expired rows stay invisible (every query filters ``expires_at > now``) until ``purge_expired``
deletes them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import structlog

from context_assembly.errors import StoreUnavailableError
from context_assembly.storage.base import (
    Accounting,
    ClaimResult,
    DuplicatePreparationIdError,
    Observation,
    PreparationRecord,
    Slot,
    UsageResult,
)
from context_assembly.storage.codec import (
    check_slot,
    decode_answer,
    dump_object,
    dump_optional,
    encode_answer,
    load_object,
    load_observation,
)

T = TypeVar("T")
Row = tuple[object, ...]

log = structlog.get_logger("context_assembly.store")

CHECKPOINT_EVERY = 256
RETRY_SECONDS = 1.0  # a failed write of held rows is tried again after this (and on any call)
STALLED_SECONDS = 1.0  # a write of held rows waiting longer for the lock makes ``ping`` fail
RECENT_IDS = 16_384  # ids of the last rows written from held puts, refused by ``put`` (~2.5 MB)

SCHEMA_VERSION = 1

_SCHEMA = (
    """
    CREATE TABLE preparations (
        id           TEXT    PRIMARY KEY,
        tenant       TEXT    NOT NULL,
        expires_at   REAL    NOT NULL,
        refresh_used INTEGER NOT NULL DEFAULT 0,
        version      INTEGER NOT NULL DEFAULT 1,
        data         BLOB    NOT NULL,
        last         BLOB,
        auxiliary    BLOB
    )
    """,
    "CREATE INDEX preparations_expires_at ON preparations (expires_at)",
    """
    CREATE TABLE usage_reports (
        preparation_id TEXT NOT NULL,
        report_id      TEXT NOT NULL,
        answer         BLOB NOT NULL,
        PRIMARY KEY (preparation_id, report_id)
    ) WITHOUT ROWID
    """,
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)

# The columns a slot may name; the slot is checked against this map before it reaches SQL text.
_SLOT_COLUMN: dict[Slot, str] = {"last": "last", "auxiliary": "auxiliary"}

_LIVE = "id = ? AND tenant = ? AND expires_at > ?"


def wal_multiprocess_safe(version: tuple[int, int, int] = sqlite3.sqlite_version_info) -> bool:
    """Whether this SQLite is free of the WAL-reset bug (sqlite.org/wal.html#walresetbug).

    Fixed in 3.51.3, with backports 3.50.7 and 3.44.6; every version from 3.7.0 to 3.51.2 is
    otherwise affected when several processes write or checkpoint at once.
    """
    if version >= (3, 51, 3):
        return True
    if (3, 50, 7) <= version < (3, 51, 0):
        return True
    return (3, 44, 6) <= version < (3, 45, 0)


class SqliteStore:
    """``Store`` backed by one SQLite file; create it with ``await SqliteStore.open(path)``."""

    def __init__(
        self,
        executor: concurrent.futures.ThreadPoolExecutor,
        conn: sqlite3.Connection,
        fast: sqlite3.Connection | None = None,
        *,
        write_delay: float = 0.0,
    ):
        """Wrap an already opened connection that belongs to ``executor``'s only thread, and the
        loop's non-waiting connection for ``put`` (``None``: every put goes to the thread, at
        once). ``write_delay`` (seconds): how long a new record may be held before it is written
        with the others held (0: each in its ``put``)."""
        self._executor = executor
        self._conn = conn
        self._fast = fast
        self._inline_writes = 0
        self._checkpoint: asyncio.Future[Any] | None = None
        self._closed = False
        self._write_delay = write_delay if fast is not None else 0.0
        self._held: dict[str, Row] = {}  # id → row of a record put but not yet written
        # Ids of the last rows written from ``_held``, oldest first (as an ordered set).
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Task[None] | None = None  # the write of the held rows under way
        self._writing_since = 0.0  # when it started (the loop's clock)
        self._failure: str | None = None  # why the last write of held rows failed

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = 5000,
        synchronous: str = "NORMAL",
        write_delay: float = 0.0,
    ) -> SqliteStore:
        """Open (creating if needed) the database file, switch it to WAL and ensure the schema."""
        if synchronous not in {"NORMAL", "FULL"}:
            raise ValueError("synchronous must be NORMAL or FULL")
        if not 0 <= write_delay <= 1:
            raise ValueError("write_delay must be between 0 and 1 second")
        executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="context-assembly-sqlite"
        )
        connect = functools.partial(_connect, os.fspath(path), busy_timeout_ms, synchronous)
        try:
            conn = await asyncio.get_running_loop().run_in_executor(executor, connect)
        except sqlite3.Error as err:
            executor.shutdown(wait=False)
            raise StoreUnavailableError(f"cannot open SQLite store: {err}") from err
        except BaseException:
            executor.shutdown(wait=False)
            raise
        try:
            fast = _connect_fast(os.fspath(path), synchronous)
        except sqlite3.Error:
            fast = None  # every put goes to the worker thread, as every other operation does
        return cls(executor, conn, fast, write_delay=write_delay)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` on the worker thread after the held rows, so that it sees them."""
        if self._held:
            await self.flush()
        return await self._submit(fn)

    async def _submit(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` on the worker thread, mapping a busy or broken database to 503."""
        if self._closed:
            raise StoreUnavailableError("the SQLite store is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, self._conn)
        except sqlite3.OperationalError as err:
            # "database is locked" after busy_timeout, disk I/O errors, a vanished file…
            raise StoreUnavailableError(f"SQLite store unavailable: {err}") from err
        except RuntimeError as err:
            # The executor was shut down by a concurrent aclose().
            if self._closed:
                raise StoreUnavailableError("the SQLite store is closed") from err
            raise

    async def put(self, record: PreparationRecord) -> None:
        """Insert a new record and its reports in one transaction; an existing id raises."""
        row = (
            record.id,
            record.tenant,
            float(record.expires_at),
            int(record.refresh_used),
            dump_object(record.data),
            dump_optional(record.accounting.last),
            dump_optional(record.accounting.auxiliary),
        )
        reports = [
            (
                record.id,
                report_id,
                encode_answer(dump_optional(answer.last), dump_optional(answer.auxiliary)),
            )
            for report_id, answer in record.reports.items()
        ]

        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(_INSERT_PREPARATION, row)
            conn.executemany(
                "INSERT INTO usage_reports (preparation_id, report_id, answer) VALUES (?, ?, ?)",
                reports,
            )

        if self._write_delay and not reports:
            await self._hold(record.id, row)
            return
        if record.id in self._held:
            raise DuplicatePreparationIdError(f"preparation id {record.id!r} already exists")
        # A new preparation has no reports (the common case): its one INSERT is a transaction
        # of its own on the autocommit connection, without BEGIN and COMMIT round trips.
        write = (
            functools.partial(_write, insert)
            if reports
            else functools.partial(_execute, _INSERT_PREPARATION, row)
        )
        try:
            if not self._put_inline(write):
                await self._run(write)
        except sqlite3.IntegrityError as err:
            raise DuplicatePreparationIdError(
                f"preparation id {record.id!r} already exists"
            ) from err

    async def _hold(self, id: str, row: Row) -> None:
        """Hold a new record's row for the next write of held rows (see the module's notes)."""
        if self._closed:
            raise StoreUnavailableError("the SQLite store is closed")
        if self._failure is not None:
            await self.flush()  # the file failed last time: fail now as a direct write would
        # Not a read of the file: an id in it from elsewhere is refused when written (see the
        # module's notes on the write delay).
        if id in self._held or id in self._recent:
            raise DuplicatePreparationIdError(f"preparation id {id!r} already exists")
        self._held[id] = row
        if self._timer is None and self._writing is None:
            self._timer = asyncio.get_running_loop().call_later(self._write_delay, self._start)

    def _start(self) -> None:
        """Write the held rows now: in one transaction on the loop's connection when the write
        lock is free (a moment of the loop's time, ~30 µs a row in a batch of ten), else on the
        worker thread, which waits for the lock (``_write_held``). The timer's callback."""
        self._timer = None
        if not self._held or self._writing is not None or self._closed:
            return
        rows = dict(self._held)
        if self._put_inline(functools.partial(_insert_rows, list(rows.values())), len(rows)):
            self._written(rows)
            return
        loop = asyncio.get_running_loop()
        self._writing_since = loop.time()
        self._writing = loop.create_task(self._write_held())

    def _written(self, rows: Mapping[str, Row]) -> None:
        """``rows`` (a snapshot of the held ones) have committed: no longer held, no failure."""
        recent = self._recent
        for id in rows:
            del self._held[id]
            recent[id] = None
        while len(recent) > RECENT_IDS:
            recent.popitem(last=False)
        self._failure = None

    async def _write_held(self) -> None:
        """Write the rows held now in one transaction; they stay held until it has committed."""
        rows = dict(self._held)
        try:
            await self._submit(functools.partial(_insert_rows, list(rows.values())))
        except (StoreUnavailableError, sqlite3.Error) as err:
            # ``_submit`` names the store in what it raises; other SQLite errors it lets by.
            named = isinstance(err, StoreUnavailableError)
            self._failure = str(err) if named else f"SQLite store unavailable: {err}"
            log.error("store_write_failed", held=len(self._held), error_type=type(err).__name__)
        else:
            self._written(rows)
        finally:
            self._writing = None
        if self._held and self._timer is None and not self._closed:
            delay = RETRY_SECONDS if self._failure is not None else self._write_delay
            self._timer = asyncio.get_running_loop().call_later(delay, self._start)

    async def flush(self) -> None:
        """Write every held record now (``StoreUnavailableError`` when that fails): afterwards
        another process sharing the file sees them too. Every other operation does this first."""
        while self._held:
            if self._writing is None:
                if self._timer is not None:
                    self._timer.cancel()
                self._start()
            if self._writing is not None:
                # Shielded: a caller cancelled while waiting does not cut the write of the others.
                await asyncio.shield(self._writing)
                if self._failure is not None:
                    raise StoreUnavailableError(self._failure)
            elif self._closed:
                raise StoreUnavailableError("the SQLite store is closed")

    def _put_inline(self, write: Callable[[sqlite3.Connection], object], rows: int = 1) -> bool:
        """Try the write (of ``rows`` records) on the loop's connection; False when it must go
        to the worker thread."""
        if self._fast is None or self._closed:
            return False
        try:
            write(self._fast)
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error:
            return False  # busy (the write lock is held) or anything else: the thread decides
        self._inline_writes += rows
        if self._inline_writes >= CHECKPOINT_EVERY and (
            self._checkpoint is None or self._checkpoint.done()
        ):
            self._inline_writes = 0
            loop = asyncio.get_running_loop()
            self._checkpoint = loop.run_in_executor(self._executor, _checkpoint, self._conn)
        return True

    async def get(self, tenant: str, id: str, now: float) -> PreparationRecord | None:
        """Read the live record and its reports from one read snapshot."""

        def read(conn: sqlite3.Connection) -> PreparationRecord | None:
            conn.execute("BEGIN")
            try:
                row = conn.execute(
                    "SELECT expires_at, refresh_used, version, data, last, auxiliary"
                    f" FROM preparations WHERE {_LIVE}",
                    (id, tenant, now),
                ).fetchone()
                if row is None:
                    return None
                reports = conn.execute(
                    "SELECT report_id, answer FROM usage_reports WHERE preparation_id = ?",
                    (id,),
                ).fetchall()
            finally:
                conn.execute("COMMIT")
            expires_at, refresh_used, version, data, last, auxiliary = row
            return PreparationRecord(
                id=id,
                tenant=tenant,
                data=load_object(data),
                expires_at=expires_at,
                refresh_used=bool(refresh_used),
                version=version,
                accounting=Accounting(
                    last=load_observation(last), auxiliary=load_observation(auxiliary)
                ),
                reports={report_id: decode_answer(answer) for report_id, answer in reports},
            )

        return await self._run(read)

    async def replace_data(
        self,
        tenant: str,
        id: str,
        data: Mapping[str, Any],
        now: float,
        expected_version: int | None = None,
    ) -> bool:
        """One conditional ``UPDATE``: new data, version + 1, expiry untouched."""
        blob = dump_object(data)

        def update(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE preparations SET data = ?, version = version + 1"
                f" WHERE {_LIVE} AND (? IS NULL OR version = ?)",
                (blob, id, tenant, now, expected_version, expected_version),
            )
            return cursor.rowcount == 1

        return await self._run(functools.partial(_write, update))

    async def claim_refresh(self, tenant: str, id: str, now: float) -> ClaimResult:
        """Read and set ``refresh_used`` inside one ``BEGIN IMMEDIATE`` transaction."""

        def claim(conn: sqlite3.Connection) -> ClaimResult:
            row = conn.execute(
                f"SELECT refresh_used FROM preparations WHERE {_LIVE}", (id, tenant, now)
            ).fetchone()
            if row is None:
                return "missing"
            if row[0]:
                return "used"
            conn.execute("UPDATE preparations SET refresh_used = 1 WHERE id = ?", (id,))
            return "claimed"

        return await self._run(functools.partial(_write, claim))

    async def record_usage(
        self,
        tenant: str,
        id: str,
        report_id: str,
        slot: Slot,
        observation: Observation,
        now: float,
        max_reports: int | None = None,
    ) -> UsageResult:
        """Check liveness, dedupe by ``report_id``, count and apply, all in one ``BEGIN
        IMMEDIATE``."""
        column = _SLOT_COLUMN[check_slot(slot)]
        blob = dump_object(observation)

        def apply(conn: sqlite3.Connection) -> UsageResult:
            row = conn.execute(
                f"SELECT last, auxiliary FROM preparations WHERE {_LIVE}", (id, tenant, now)
            ).fetchone()
            if row is None:
                return UsageResult("missing", None)
            seen = conn.execute(
                "SELECT answer FROM usage_reports WHERE preparation_id = ? AND report_id = ?",
                (id, report_id),
            ).fetchone()
            if seen is not None:
                return UsageResult("duplicate", decode_answer(seen[0]))
            if max_reports is not None:
                (held,) = conn.execute(
                    "SELECT COUNT(*) FROM usage_reports WHERE preparation_id = ?", (id,)
                ).fetchone()
                if held >= max_reports:
                    return UsageResult("full", None)
            last, auxiliary = row
            if column == "last":
                last = blob
            else:
                auxiliary = blob
            conn.execute(f"UPDATE preparations SET {column} = ? WHERE id = ?", (blob, id))
            answer = encode_answer(last, auxiliary)
            conn.execute(
                "INSERT INTO usage_reports (preparation_id, report_id, answer) VALUES (?, ?, ?)",
                (id, report_id, answer),
            )
            return UsageResult("applied", decode_answer(answer))

        return await self._run(functools.partial(_write, apply))

    async def purge_expired(self, now: float) -> int:
        """Delete expired records and their reports in one transaction; returns records deleted."""

        def purge(conn: sqlite3.Connection) -> int:
            conn.execute(
                "DELETE FROM usage_reports WHERE preparation_id IN"
                " (SELECT id FROM preparations WHERE expires_at <= ?)",
                (now,),
            )
            return conn.execute("DELETE FROM preparations WHERE expires_at <= ?", (now,)).rowcount

        return await self._run(functools.partial(_write, purge))

    async def ping(self) -> None:
        """Ready when the file answers a read and the held records are being written: answers
        at once, never waiting for the write lock (a readiness probe with a 1 s timeout would
        otherwise see a 5 s ``busy_timeout``). Unavailable when the last write of held records
        failed, or when one has waited for the lock over ``STALLED_SECONDS``."""
        if self._closed:
            raise StoreUnavailableError("the SQLite store is closed")
        if self._failure is not None:
            raise StoreUnavailableError(self._failure)
        loop = asyncio.get_running_loop()
        if self._writing is not None and loop.time() - self._writing_since > STALLED_SECONDS:
            raise StoreUnavailableError(
                f"SQLite store unavailable: held records have waited over {STALLED_SECONDS:g} s"
                " for the write lock"
            )

        def check(conn: sqlite3.Connection) -> None:
            conn.execute("PRAGMA schema_version").fetchone()  # from the file, not the handle

        if self._fast is None:
            await self._submit(check)  # no loop connection: the worker's (a read waits for no lock)
            return
        try:
            check(self._fast)  # a read in WAL mode takes no lock a writer holds
        except sqlite3.Error as err:
            raise StoreUnavailableError(f"SQLite store unavailable: {err}") from err

    async def aclose(self) -> None:
        """Write what is held, close the connection on its thread (after queued work), then
        stop the thread."""
        if self._closed:
            return
        try:
            await self.flush()
        except StoreUnavailableError as err:
            log.error(
                "store_records_not_written", records=len(self._held), error_type=type(err).__name__
            )
        if self._timer is not None:  # the retry a failed flush scheduled: nothing left to run it
            self._timer.cancel()
            self._timer = None
        self._closed = True
        if self._fast is not None:
            self._fast.close()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._conn.close)
        finally:
            self._executor.shutdown(wait=False)


def _connect(path: str, busy_timeout_ms: int, synchronous: str) -> sqlite3.Connection:
    """Open the connection on the worker thread and bring the file to the current schema."""
    # isolation_level=None: autocommit, so the transactions below are exactly the ones we BEGIN.
    conn = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"could not switch {path!r} to WAL (got {mode!r})")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        _write(_ensure_schema, conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _connect_fast(path: str, synchronous: str) -> sqlite3.Connection:
    """The loop's connection for inline inserts: never waits for a lock, never checkpoints.

    Opened after ``_connect`` made the file WAL and current, so it only sets its own pragmas.
    """
    conn = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
    except BaseException:
        conn.close()
        raise
    return conn


def _checkpoint(conn: sqlite3.Connection) -> None:
    """A ``PASSIVE`` checkpoint on the worker thread (a failure is retried next time)."""
    try:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    except sqlite3.Error:
        pass


def _ensure_schema(conn: sqlite3.Connection) -> None:
    """Create the tables in a fresh file; refuse a file written by a newer schema."""
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version == SCHEMA_VERSION:
        return
    if version != 0:
        raise sqlite3.OperationalError(
            f"database schema version {version} is not {SCHEMA_VERSION}; refusing to touch it"
        )
    for statement in _SCHEMA:
        conn.execute(statement)


_INSERT_PREPARATION = (
    "INSERT INTO preparations"
    " (id, tenant, expires_at, refresh_used, version, data, last, auxiliary)"
    " VALUES (?, ?, ?, ?, 1, ?, ?, ?)"
)


def _insert_rows(rows: Sequence[Row], conn: sqlite3.Connection) -> None:
    """Insert held rows in one transaction. An id already in the file (a collision of two random
    ids, written by another process or an earlier run) must not cost the others: then each row
    is inserted on its own and such a row is dropped and logged."""
    try:
        _write(lambda c: c.executemany(_INSERT_PREPARATION, rows), conn)
    except sqlite3.IntegrityError:
        for row in rows:
            try:
                _execute(_INSERT_PREPARATION, row, conn)
            except sqlite3.IntegrityError:
                log.error("store_duplicate_id_dropped", preparation_id=row[0])


def _execute(statement: str, params: tuple[object, ...], conn: sqlite3.Connection) -> None:
    """One statement, atomic on its own (the connections are in autocommit mode)."""
    conn.execute(statement, params)


def _write(fn: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
    """Run ``fn`` inside one ``BEGIN IMMEDIATE`` transaction: commit on return, roll back on error.

    ``IMMEDIATE`` takes the write lock up front, so a read-then-write never fails half way with
    ``SQLITE_BUSY`` on lock upgrade; other writers wait up to ``busy_timeout``.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result
