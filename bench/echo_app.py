"""The baselines of bench_service.py: a bare FastAPI app that parses the same prepare request
model and echoes it back (what any typed FastAPI endpoint pays for the same payload).

``/v1/prepare`` only echoes. ``/v1/prepare-stored`` also writes the body to a SQLite file before
answering, as a prepare writes its record: WAL journal, ``synchronous=NORMAL``, one committed
insert on a single worker thread. It is the floor of an endpoint whose ``200`` means stored. The
file is ``ECHO_DB`` (a temporary file by default).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

from context_assembly.core.request import PrepareRequest

_writer = ThreadPoolExecutor(max_workers=1)
_conn: sqlite3.Connection | None = None


def _open() -> sqlite3.Connection:
    path = os.environ.get("ECHO_DB") or os.path.join(tempfile.mkdtemp(), "echo.db")
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS bodies (id INTEGER PRIMARY KEY, body BLOB)")
    return conn


def _insert(body: bytes) -> None:
    assert _conn is not None
    _conn.execute("BEGIN IMMEDIATE")
    _conn.execute("INSERT INTO bodies (body) VALUES (?)", (body,))
    _conn.execute("COMMIT")


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    global _conn
    _conn = await asyncio.get_running_loop().run_in_executor(_writer, _open)
    yield
    _conn.close()


app = FastAPI(lifespan=lifespan)


@app.post("/v1/prepare")
async def echo(body: PrepareRequest) -> PrepareRequest:
    return body


@app.post("/v1/prepare-stored")
async def echo_stored(body: PrepareRequest, request: Request) -> PrepareRequest:
    raw = await request.body()
    await asyncio.get_running_loop().run_in_executor(_writer, _insert, raw)
    return body
