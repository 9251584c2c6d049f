"""Fixtures for the storage tests: real backends only (a SQLite file, the Redis on 127.0.0.1:6379).

Redis tests use database 15 and a key prefix unique to the test, and delete their keys afterwards,
so they never disturb anyone else's data. If Redis is unreachable the fixtures raise: the contract
suite must fail loudly, never skip.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from storage_support import REDIS_URL, RecordFactory, StoreFactory

from context_assembly.storage import PreparationRecord, Store, open_store
from context_assembly.storage.redis import RedisStore

# The contract is about what the store keeps, not how fast: a Redis operation here may take as
# long as a loaded machine needs (twenty scripts racing on two replicas under a full suite). The
# production deadline and its 503 have their own tests in test_redis_store.py.
CONTRACT_REDIS_DEADLINE = 30.0


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix no other test run uses; every key under it is deleted afterwards."""
    prefix = f"ca-test:{uuid.uuid4().hex}:"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def raw_redis() -> Iterator[redis.Redis]:
    """A plain synchronous client on the test database, to look at keys from outside the store."""
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each contract test runs once per real backend."""
    return str(request.param)


@pytest.fixture
async def store_factory(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[StoreFactory]:
    """Opens store instances that share one backing (one file, or one Redis prefix), as replicas
    or worker processes would; all are pinged on open and closed at teardown."""
    opened: list[Store] = []
    if backend == "redis":
        prefix = request.getfixturevalue("redis_prefix")

    async def factory() -> Store:
        if backend == "sqlite":
            store = await open_store("sqlite", path=tmp_path / "store.db")
        else:
            store = RedisStore.from_url(
                REDIS_URL, key_prefix=prefix, deadline=CONTRACT_REDIS_DEADLINE
            )
        opened.append(store)
        # Fails the test (StoreUnavailableError) when the backend is not there: never a skip.
        await store.ping()
        return store

    yield factory
    for store in opened:
        await store.aclose()


@pytest.fixture
async def store(store_factory: StoreFactory) -> Store:
    """One store instance of the backend under test."""
    return await store_factory()


@pytest.fixture
def now() -> float:
    """The test's notion of the current time (real time, so Redis's own TTLs agree with it)."""
    return time.time()


@pytest.fixture
def make_record(now: float) -> RecordFactory:
    """Builds a record owned by ``acme`` that expires in an hour, with a fresh unguessable id."""

    def factory(**overrides: Any) -> PreparationRecord:
        fields: dict[str, Any] = {
            "id": f"prep_{uuid.uuid4().hex}",
            "tenant": "acme",
            "data": {"manifest": {"blocks": [{"id": "memory/a", "tokens": 12}]}, "hash": "x"},
            "expires_at": now + 3600,
        }
        fields.update(overrides)
        return PreparationRecord(**fields)

    return factory
