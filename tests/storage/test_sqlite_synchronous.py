"""``[store] sqlite_synchronous`` reaches the SQLite connection as ``PRAGMA synchronous``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import ValidationError

from context_assembly.config import load_settings
from context_assembly.storage import open_store
from context_assembly.storage.sqlite import SqliteStore

# What ``PRAGMA synchronous`` reads back as (SQLite's documentation of the pragma).
READ_BACK = {"normal": 1, "full": 2}


async def _synchronous(store: SqliteStore) -> int:
    """The PRAGMA as the store's own connection reads it, on the thread that owns it."""
    value: int = await store._run(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
    return value


@pytest.mark.parametrize("mode", ["normal", "full"])
async def test_the_configured_mode_reads_back_from_the_connection(
    tmp_path: Path, mode: Literal["normal", "full"]
) -> None:
    """The store opened from the settings' value runs with that ``PRAGMA synchronous``, and
    still commits a write and reads it back."""
    settings = load_settings(store={"path": str(tmp_path / "s.db"), "sqlite_synchronous": mode})
    store = await open_store(
        "sqlite",
        path=settings.store.path,
        sqlite_synchronous=settings.store.sqlite_synchronous,
    )
    try:
        assert isinstance(store, SqliteStore)
        assert await _synchronous(store) == READ_BACK[mode]
        assert await store.secret("probe", b"first") == b"first"  # a committed write
        assert await store.secret("probe", b"second") == b"first"  # read back
    finally:
        await store.aclose()


def test_normal_is_the_default_and_other_values_are_refused(tmp_path: Path) -> None:
    """Without the key the mode is ``normal``; ``off`` (which can corrupt on power loss) and
    ``extra`` are configuration errors naming the key."""
    assert load_settings(store={"path": str(tmp_path / "s.db")}).store.sqlite_synchronous == (
        "normal"
    )
    for value in ("off", "extra", "FULL"):
        with pytest.raises(ValidationError, match="sqlite_synchronous"):
            load_settings(store={"sqlite_synchronous": value})


async def test_the_store_refuses_a_mode_it_does_not_know(tmp_path: Path) -> None:
    """A caller that bypasses the settings gets a ValueError, and no SQL is built from it."""
    with pytest.raises(ValueError, match="synchronous"):
        await SqliteStore.open(tmp_path / "s.db", synchronous="off")  # type: ignore[arg-type]
