"""Names the storage tests share with their fixtures (``conftest.py``), importable by a name of
their own: ``conftest`` is a different module in every test folder, and importing it by name
found another folder's when the folders were given in some orders."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from context_assembly.storage import PreparationRecord, Store

REDIS_URL = "redis://127.0.0.1:6379/15"

StoreFactory = Callable[[], Awaitable[Store]]
RecordFactory = Callable[..., PreparationRecord]
