"""SQLite preparation store: the embedded default (one file, one service process).

Execution model: one connection, owned by one dedicated worker thread (a single-thread executor).
Every operation, ``put`` included, is one function run on that thread, and every write is one
short ``BEGIN IMMEDIATE`` transaction that has committed when the operation returns: a ``put``
that returned is in the file, and a ``200`` from prepare means its record is stored. Operations
of this process never interleave; writers in other processes sharing the file are serialised by
SQLite's write lock (waiting up to ``busy_timeout``). A cancelled caller does not cut a
transaction in half: the function still runs to its ``COMMIT``/``ROLLBACK`` on the worker thread.
SQLite checkpoints the WAL on that connection by itself (``wal_autocheckpoint``).

``ping`` is the one exception: it reads the file on a second connection, on the event loop, so a
readiness probe answers at once even while the worker thread waits for the write lock.

Durability and safety (SQLite's documentation of write-ahead logging and of ``PRAGMA
synchronous``): WAL journal, ``synchronous`` as configured (``[store] sqlite_synchronous``):
``NORMAL`` by default (cannot corrupt in WAL mode; a committed transaction survives a crash of the
process, a power loss or an OS crash may lose the last ones), ``FULL`` to keep those too, at an
fsync of the WAL per commit (docs/decisions.md, Storage); busy timeout 5 s by default.
WAL needs shared memory, so the file must be on a local disk. Versions 3.7.0–3.51.2 have the
WAL-reset bug that can corrupt a database written by several processes at once (fixed in 3.51.3,
backported to 3.50.7 and 3.44.6): the settings validator refuses several workers on SQLite
(``config.py``), so one service process writes the file.

Schema (``PRAGMA user_version`` = 4; an older file gains the tables it lacks on open):

- ``preparations(id PK, tenant, expires_at REAL, refresh_used, version, data, last, auxiliary)``;
  ``data`` and the two observations are orjson bytes (observations NULL until reported).
- ``usage_reports(preparation_id, report_id, answer)``, PK ``(preparation_id, report_id)``;
  ``answer`` is the ``[last, auxiliary]`` JSON answered for that report.
- ``latest(tenant, scope_key, preparation_id, expires_at, data)``, PK ``(tenant, scope_key)``:
  the pointer ``put(..., latest_of=...)`` writes in the record's transaction, with its expiry
  and ``latest_data`` (orjson bytes).
- ``secrets(name PK, value)``: the server secrets (schema 3).
- ``calibration(tenant, model, ratios)``, PK ``(tenant, model)``: the estimate's kept ratios
  (``core/calibration.py``), an orjson list (schema 4).

Every lookup is one primary-key read that also matches the tenant and the expiry
(``id = ? AND tenant = ? AND expires_at > ?``), so another tenant's id and an unknown id take the
same path. Expired rows stay invisible until ``purge_expired`` deletes them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

import orjson

from context_assembly.core import calibration
from context_assembly.errors import StoreUnavailableError
from context_assembly.storage.base import (
    Accounting,
    ClaimResult,
    DuplicatePreparationIdError,
    Latest,
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

SCHEMA_VERSION = 4

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
)

# Added in schema version 2 (created in a fresh file, and on open of a version 1 file).
_LATEST = """
    CREATE TABLE IF NOT EXISTS latest (
        tenant         TEXT NOT NULL,
        scope_key      TEXT NOT NULL,
        preparation_id TEXT NOT NULL,
        expires_at     REAL NOT NULL,
        data           BLOB NOT NULL,
        PRIMARY KEY (tenant, scope_key)
    ) WITHOUT ROWID
"""

# Added in schema version 3 (created in a fresh file, and on open of an older file).
_SECRETS = """
    CREATE TABLE IF NOT EXISTS secrets (
        name  TEXT PRIMARY KEY,
        value BLOB NOT NULL
    ) WITHOUT ROWID
"""

# Added in schema version 4 (created in a fresh file, and on open of an older file).
_CALIBRATION = """
    CREATE TABLE IF NOT EXISTS calibration (
        tenant TEXT NOT NULL,
        model  TEXT NOT NULL,
        ratios BLOB NOT NULL,
        PRIMARY KEY (tenant, model)
    ) WITHOUT ROWID
"""

# The columns a slot may name; the slot is checked against this map before it reaches SQL text.
_SLOT_COLUMN: dict[Slot, str] = {"last": "last", "auxiliary": "auxiliary"}

_LIVE = "id = ? AND tenant = ? AND expires_at > ?"

Synchronous = Literal["normal", "full"]
# ``[store] sqlite_synchronous`` to the PRAGMA's keyword: only these reach SQL text.
_SYNCHRONOUS: dict[str, str] = {"normal": "NORMAL", "full": "FULL"}


class SqliteStore:
    """``Store`` backed by one SQLite file; create it with ``await SqliteStore.open(path)``."""

    def __init__(
        self,
        executor: concurrent.futures.ThreadPoolExecutor,
        conn: sqlite3.Connection,
        probe: sqlite3.Connection,
    ):
        """Wrap an already opened connection that belongs to ``executor``'s only thread, and the
        connection ``ping`` reads on the event loop."""
        self._executor = executor
        self._conn = conn
        self._probe = probe
        self._closed = False

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = 5000,
        synchronous: Synchronous = "normal",
    ) -> SqliteStore:
        """Open (creating if needed) the database file, switch it to WAL, set ``PRAGMA
        synchronous`` and ensure the schema."""
        if synchronous not in _SYNCHRONOUS:
            raise ValueError("synchronous must be 'normal' or 'full'")
        executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="context-assembly-sqlite"
        )
        connect = functools.partial(_connect, os.fspath(path), busy_timeout_ms, synchronous)
        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(executor, connect)
        except sqlite3.Error as err:
            executor.shutdown(wait=False)
            raise StoreUnavailableError(f"cannot open SQLite store: {err}") from err
        except BaseException:
            executor.shutdown(wait=False)
            raise
        try:
            probe = _connect_probe(os.fspath(path))
        except sqlite3.Error as err:
            await loop.run_in_executor(executor, conn.close)
            executor.shutdown(wait=False)
            raise StoreUnavailableError(f"cannot open SQLite store: {err}") from err
        return cls(executor, conn, probe)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
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

    async def put(
        self,
        record: PreparationRecord,
        *,
        latest_of: str | None = None,
        latest_data: Mapping[str, Any] | None = None,
    ) -> None:
        """Insert a new record, its reports and (with ``latest_of``) the latest pointer in one
        transaction, committed when this returns; an existing id (whatever its tenant) raises
        ``DuplicatePreparationIdError``."""
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
        pointer = None
        if latest_of is not None:
            pointer = (
                record.tenant,
                latest_of,
                record.id,
                float(record.expires_at),
                dump_object(latest_data or {}),
            )

        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO preparations"
                " (id, tenant, expires_at, refresh_used, version, data, last, auxiliary)"
                " VALUES (?, ?, ?, ?, 1, ?, ?, ?)",
                row,
            )
            conn.executemany(
                "INSERT INTO usage_reports (preparation_id, report_id, answer) VALUES (?, ?, ?)",
                reports,
            )
            if pointer is not None:
                conn.execute(
                    "INSERT OR REPLACE INTO latest"
                    " (tenant, scope_key, preparation_id, expires_at, data) VALUES (?, ?, ?, ?, ?)",
                    pointer,
                )

        try:
            await self._run(functools.partial(_write, insert))
        except sqlite3.IntegrityError as err:
            raise DuplicatePreparationIdError(
                f"preparation id {record.id!r} already exists"
            ) from err

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

    async def latest(self, tenant: str, latest_of: str, now: float) -> Latest | None:
        """One primary-key read of the pointer, live at ``now``."""

        def read(conn: sqlite3.Connection) -> tuple[str, bytes] | None:
            row = conn.execute(
                "SELECT preparation_id, data FROM latest"
                " WHERE tenant = ? AND scope_key = ? AND expires_at > ?",
                (tenant, latest_of, now),
            ).fetchone()
            return None if row is None else (str(row[0]), row[1])

        found = await self._run(read)
        return None if found is None else Latest(found[0], load_object(found[1]))

    async def replace_data(
        self,
        tenant: str,
        id: str,
        data: Mapping[str, Any],
        now: float,
        expected_version: int | None = None,
        *,
        latest_of: str | None = None,
        latest_data: Mapping[str, Any] | None = None,
    ) -> bool:
        """One conditional ``UPDATE`` (new data, version + 1, expiry untouched) and, with
        ``latest_of``, the pointer's data when it still names this record."""
        blob = dump_object(data)
        pointer = None if latest_of is None else dump_object(latest_data or {})

        def update(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE preparations SET data = ?, version = version + 1"
                f" WHERE {_LIVE} AND (? IS NULL OR version = ?)",
                (blob, id, tenant, now, expected_version, expected_version),
            )
            if cursor.rowcount != 1:
                return False
            if pointer is not None:
                conn.execute(
                    "UPDATE latest SET data = ?"
                    " WHERE tenant = ? AND scope_key = ? AND preparation_id = ?",
                    (pointer, tenant, latest_of, id),
                )
            return True

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

    async def secret(self, name: str, candidate: bytes) -> bytes:
        """Insert ``candidate`` unless ``name`` exists, then read the stored value, in one
        write transaction."""

        def keep(conn: sqlite3.Connection) -> bytes:
            conn.execute(
                "INSERT OR IGNORE INTO secrets (name, value) VALUES (?, ?)", (name, candidate)
            )
            (value,) = conn.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()
            return bytes(value)

        return await self._run(functools.partial(_write, keep))

    async def calibration(self, tenant: str, model: str, ratio: float | None = None) -> list[float]:
        """Read the ratios, and with ``ratio`` append it and keep the last ``WINDOW``, in one
        write transaction (so two reports at once both count)."""

        def keep(conn: sqlite3.Connection) -> list[float]:
            row = conn.execute(
                "SELECT ratios FROM calibration WHERE tenant = ? AND model = ?", (tenant, model)
            ).fetchone()
            ratios: list[float] = [] if row is None else orjson.loads(row[0])
            if ratio is None:
                return ratios
            ratios = [*ratios, ratio][-calibration.WINDOW :]
            conn.execute(
                "INSERT OR REPLACE INTO calibration (tenant, model, ratios) VALUES (?, ?, ?)",
                (tenant, model, orjson.dumps(ratios)),
            )
            return ratios

        if ratio is None:
            return await self._run(keep)
        return await self._run(functools.partial(_write, keep))

    async def calibrations(self, tenant: str) -> dict[str, list[float]]:
        """One read of the tenant's rows."""

        def read(conn: sqlite3.Connection) -> dict[str, list[float]]:
            rows = conn.execute(
                "SELECT model, ratios FROM calibration WHERE tenant = ?", (tenant,)
            ).fetchall()
            return {model: orjson.loads(ratios) for model, ratios in rows}

        return await self._run(read)

    async def purge_expired(self, now: float) -> int:
        """Delete expired records and their reports in one transaction; returns records deleted."""

        def purge(conn: sqlite3.Connection) -> int:
            conn.execute(
                "DELETE FROM usage_reports WHERE preparation_id IN"
                " (SELECT id FROM preparations WHERE expires_at <= ?)",
                (now,),
            )
            conn.execute("DELETE FROM latest WHERE expires_at <= ?", (now,))
            return conn.execute("DELETE FROM preparations WHERE expires_at <= ?", (now,)).rowcount

        return await self._run(functools.partial(_write, purge))

    async def ping(self) -> None:
        """Return when the file answers a read. Runs on the event loop on its own connection,
        which never waits for a lock (a read in WAL mode takes none a writer holds), so it
        answers at once even while the worker thread waits for the write lock (a readiness
        probe with a 1 s timeout would otherwise see the 5 s ``busy_timeout``)."""
        if self._closed:
            raise StoreUnavailableError("the SQLite store is closed")
        try:
            self._probe.execute("PRAGMA schema_version").fetchone()  # from the file
        except sqlite3.Error as err:
            raise StoreUnavailableError(f"SQLite store unavailable: {err}") from err

    async def aclose(self) -> None:
        """Close the connection on its thread (after queued work), then stop the thread;
        idempotent."""
        if self._closed:
            return
        self._closed = True
        self._probe.close()
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
        conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[synchronous]}")
        _write(_ensure_schema, conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _connect_probe(path: str) -> sqlite3.Connection:
    """``ping``'s connection: used on the event loop, never waits for a lock."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout = 0")
    except BaseException:
        conn.close()
        raise
    return conn


def _ensure_schema(conn: sqlite3.Connection) -> None:
    """Create the tables in a fresh file, add the tables a version 1, 2 or 3 file lacks; refuse
    a file written by a newer schema."""
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version == SCHEMA_VERSION:
        return
    if version not in (0, 1, 2, 3):
        raise sqlite3.OperationalError(
            f"database schema version {version} is not {SCHEMA_VERSION}; refusing to touch it"
        )
    if version == 0:
        for statement in _SCHEMA:
            conn.execute(statement)
    conn.execute(_LATEST)
    conn.execute(_SECRETS)
    conn.execute(_CALIBRATION)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


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
