"""Redis-only behaviour: the key's own TTL, no recreation after a real expiry, and outages."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from storage_support import REDIS_URL, RecordFactory

from context_assembly.errors import StoreUnavailableError
from context_assembly.storage import PreparationRecord, UsageResult, open_store
from context_assembly.storage.redis import RedisStore
from hypothesis_budget import examples

OBS = {"provider": "openai", "call": "main", "provider_input_tokens": 10}
# The store's per-operation deadline (0.9 s by default) plus room for a loaded machine: past this
# an outage counts as a hang.
BOUND = 0.9 + 2.0


@pytest.fixture
async def rstore(redis_prefix: str) -> AsyncIterator[RedisStore]:
    """A Redis store under the test's own prefix; fails (never skips) when Redis is down."""
    store = RedisStore.from_url(REDIS_URL, key_prefix=redis_prefix)
    await store.ping()
    yield store
    await store.aclose()


async def wait_until_gone(raw: redis.Redis, key: str) -> None:
    """Poll (bounded, 5 s) until Redis's own expiry has removed ``key``: that is what is tested."""
    deadline = time.monotonic() + 5
    while raw.exists(key):
        assert time.monotonic() < deadline, f"{key} still exists after its TTL"
        await asyncio.sleep(0.02)


async def test_record_is_one_hash_under_the_prefix_with_absolute_expiry(
    rstore: RedisStore, raw_redis: redis.Redis, make_record: RecordFactory, redis_prefix: str
) -> None:
    """``put`` writes one hash at ``<prefix>prep:<id>`` expiring at ``expires_at`` (ms, rounded up)."""
    record = make_record(expires_at=1_900_000_000.0005)
    await rstore.put(record)
    key = f"{redis_prefix}prep:{record.id}"
    assert rstore.key(record.id) == key
    assert raw_redis.type(key) == b"hash"
    assert raw_redis.pexpiretime(key) == math.ceil(record.expires_at * 1000)
    assert raw_redis.hget(key, "tenant") == b"acme"


tenants = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(owner=tenants, other=tenants)
def test_another_tenants_id_takes_the_path_of_an_unknown_id(
    owner: str, other: str, redis_prefix: str, now: float
) -> None:
    """Every lookup by another tenant of an existing id issues the same commands as for an
    unknown id (one script call, one round trip each) and gets the same reply back from Redis:
    no field of the record leaves the server, so nothing (answer, traffic, time) tells them
    apart."""
    assume(owner != other)
    asyncio.run(_trace_both(owner, other, redis_prefix, now))


async def _trace_both(owner: str, other: str, prefix: str, now: float) -> None:
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=False)
    store = RedisStore(client, key_prefix=prefix)
    issued: list[tuple[tuple[object, ...], object]] = []
    send = client.execute_command

    async def spy(*args: Any, **options: Any) -> Any:
        reply = await send(*args, **options)
        issued.append((args, reply))
        return reply

    client.execute_command = spy  # type: ignore[method-assign]

    async def trace(id: str) -> list[tuple[tuple[object, ...], object]]:
        issued.clear()
        assert await store.get(other, id, now) is None
        assert await store.replace_data(other, id, {"x": 1}, now) is False
        assert await store.claim_refresh(other, id, now) == "missing"
        usage = await store.record_usage(other, id, "r1", "last", OBS, now, max_reports=5)
        assert usage == UsageResult("missing", None)
        key = store.key(id)
        return [(tuple("<key>" if a == key else a for a in args), r) for args, r in issued]

    try:
        record = PreparationRecord(
            id=f"prep_{uuid.uuid4().hex}", tenant=owner, data={"m": [1, 2]}, expires_at=now + 60
        )
        await store.put(record)
        unknown = f"prep_{uuid.uuid4().hex}"
        await trace(unknown)  # the first use of each script loads it (SCRIPT LOAD)
        foreign, absent = await trace(record.id), await trace(unknown)
        assert foreign == absent
        assert [args[0] for args, _ in foreign] == ["EVALSHA"] * 4
        assert await store.get(owner, record.id, now) == record
    finally:
        await store.aclose()


async def test_updates_keep_the_keys_expiry(
    rstore: RedisStore, raw_redis: redis.Redis, make_record: RecordFactory, now: float
) -> None:
    """Usage, a duplicate, a claim and a data replacement leave the absolute expiry unchanged."""
    record = make_record()
    await rstore.put(record)
    key = rstore.key(record.id)
    before = raw_redis.pexpiretime(key)
    assert before > 0
    assert (
        await rstore.record_usage("acme", record.id, "r1", "last", OBS, now)
    ).status == "applied"
    assert (
        await rstore.record_usage("acme", record.id, "r1", "last", OBS, now)
    ).status == "duplicate"
    assert (
        await rstore.record_usage("acme", record.id, "r2", "auxiliary", OBS, now)
    ).status == "applied"
    assert await rstore.claim_refresh("acme", record.id, now) == "claimed"
    assert await rstore.replace_data("acme", record.id, {"attempt": 2}, now)
    assert raw_redis.pexpiretime(key) == before


async def test_key_expires_by_itself_and_usage_does_not_recreate_it(
    rstore: RedisStore, raw_redis: redis.Redis, make_record: RecordFactory, now: float
) -> None:
    """Once Redis has expired the key, every update is ``missing`` and the key stays absent."""
    record = make_record(expires_at=time.time() + 0.3)
    await rstore.put(record)
    key = rstore.key(record.id)
    assert raw_redis.exists(key)
    await wait_until_gone(raw_redis, key)
    # ``now`` is from before the expiry: only Redis's own TTL makes the record missing here.
    assert await rstore.get("acme", record.id, now) is None
    assert await rstore.record_usage("acme", record.id, "r1", "last", OBS, now) == UsageResult(
        "missing", None
    )
    assert await rstore.claim_refresh("acme", record.id, now) == "missing"
    assert await rstore.replace_data("acme", record.id, {"x": 1}, now) is False
    assert not raw_redis.exists(key)


async def test_forced_expiry_is_never_undone_by_a_report(
    rstore: RedisStore, raw_redis: redis.Redis, make_record: RecordFactory, now: float
) -> None:
    """After ``PEXPIRE key 1`` a usage report answers ``missing`` and writes no key."""
    record = make_record()
    await rstore.put(record)
    key = rstore.key(record.id)
    raw_redis.pexpire(key, 1)
    await wait_until_gone(raw_redis, key)
    result = await rstore.record_usage("acme", record.id, "r1", "auxiliary", OBS, now)
    assert result == UsageResult("missing", None)
    assert not raw_redis.exists(key)


async def test_put_with_a_past_expiry_stores_nothing_visible(
    rstore: RedisStore, raw_redis: redis.Redis, make_record: RecordFactory, now: float
) -> None:
    """A record already expired when stored is dropped by Redis at once."""
    record = make_record(expires_at=now - 10)
    await rstore.put(record)
    assert not raw_redis.exists(rstore.key(record.id))
    assert await rstore.get("acme", record.id, now - 20) is None


async def test_closed_port_raises_store_unavailable_quickly() -> None:
    """Nothing listening on the port: ``ping`` and ``get`` raise 503-class errors, not hangs."""
    store = await open_store("redis", redis_url="redis://127.0.0.1:1/0")
    try:
        async with asyncio.timeout(BOUND):
            with pytest.raises(StoreUnavailableError):
                await store.ping()
        async with asyncio.timeout(BOUND):
            with pytest.raises(StoreUnavailableError):
                await store.get("acme", "prep_x", time.time())
    finally:
        await store.aclose()


async def test_server_that_never_answers_raises_store_unavailable_not_a_hang() -> None:
    """A hung server (accepts, never replies) surfaces as ``StoreUnavailableError`` by the
    store's deadline, not as a hang."""
    writers: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        while await reader.read(4096):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = await open_store("redis", redis_url=f"redis://127.0.0.1:{port}/0")
    try:
        async with asyncio.timeout(BOUND):
            with pytest.raises(StoreUnavailableError):
                await store.ping()
        async with asyncio.timeout(BOUND):
            with pytest.raises(StoreUnavailableError):
                await store.claim_refresh("acme", "prep_x", time.time())
    finally:
        await store.aclose()
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_purge_is_left_to_redis(
    rstore: RedisStore, make_record: RecordFactory, now: float
) -> None:
    """Redis expires keys itself, so housekeeping reports nothing purged."""
    await rstore.put(make_record(expires_at=now + 5))
    assert await rstore.purge_expired(now + 10) == 0
