"""Preparation storage: the ``Store`` protocol and its SQLite and Redis backends.

Build a store once at startup with ``await open_store(...)``, share it, and ``aclose()`` it on
shutdown. The contract every backend keeps is written in ``storage.base``.
"""

from __future__ import annotations

import os
from typing import Literal

from context_assembly.storage.base import (
    Accounting,
    ClaimResult,
    DuplicatePreparationIdError,
    Latest,
    Observation,
    PreparationRecord,
    Slot,
    Store,
    UsageResult,
    UsageStatus,
)

__all__ = [
    "Accounting",
    "ClaimResult",
    "DuplicatePreparationIdError",
    "Latest",
    "Observation",
    "PreparationRecord",
    "Slot",
    "Store",
    "UsageResult",
    "UsageStatus",
    "open_store",
]


async def open_store(
    backend: Literal["sqlite", "redis"],
    *,
    path: str | os.PathLike[str] | None = None,
    redis_url: str | None = None,
    key_prefix: str = "ca:",
    sqlite_synchronous: Literal["normal", "full"] = "normal",
) -> Store:
    """Open the configured backend.

    ``sqlite`` needs ``path`` and opens the file now (creating it and its schema; failures raise
    ``StoreUnavailableError``), with ``PRAGMA synchronous`` set to ``sqlite_synchronous``.
    ``redis`` needs ``redis_url`` and connects lazily: call ``ping()`` to check reachability.
    Backends are imported here so that a SQLite deployment never imports the Redis client.
    """
    if backend == "sqlite":
        if path is None:
            raise ValueError("the sqlite store needs a path")
        from context_assembly.storage.sqlite import SqliteStore

        return await SqliteStore.open(path, synchronous=sqlite_synchronous)
    if backend == "redis":
        if redis_url is None:
            raise ValueError("the redis store needs a redis_url")
        from context_assembly.storage.redis import RedisStore

        return RedisStore.from_url(redis_url, key_prefix=key_prefix)
    raise ValueError(f"unknown store backend {backend!r}")
