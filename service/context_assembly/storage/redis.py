"""Redis preparation store: shared state for several stateless replicas.

Layout: one Redis **hash** per preparation at ``<key_prefix>prep:<id>``, with an absolute expiry
(``PEXPIREAT``, from the record's ``expires_at``) set when it is created and never touched again:

==================  ========================================================================
field               value
==================  ========================================================================
``tenant``          owner (every operation compares it; another tenant's id looks missing)
``expires_at``      the record's expiry, unix seconds as a decimal float string
``refresh_used``    ``"0"`` / ``"1"``
``version``         data version, ``"1"`` on create, ``HINCRBY`` on each ``replace_data``
``data``            orjson bytes of the caller's dict (Lua never parses it)
``last``            orjson bytes of the main-call observation; absent until reported
``auxiliary``       orjson bytes of the repair observation; absent until reported
``r:<report_id>``   the ``[last, auxiliary]`` JSON answered for that report (idempotency)
``reports``         how many ``r:`` fields there are (``max_reports``); absent counts as 0
==================  ========================================================================

The latest pointer (``put(..., latest_of=...)``) is a small hash at
``<key_prefix>latest:<latest_of>`` (``latest_of`` is the caller's digest of tenant and scope,
never raw values) with the fields ``tenant``, ``id``, ``expires_at`` and ``data`` (``latest_data``), written by the same
``put`` script and expiring with the record (the same ``PEXPIREAT``); ``replace_data`` with
``latest_of`` replaces its ``data`` in its own script while ``id`` names the record.

Why a hash and not one JSON string: each update rewrites only the fields it changes and ``HSET``
keeps the key's TTL (a plain ``SET`` would drop it without ``KEEPTTL``), and the scripts never
decode JSON (``cjson`` would reformat numbers and turn ``[]`` into ``{}``).

Atomicity and tenancy: every operation is one Lua script (``EVALSHA``, loaded on first use by
``register_script``); Redis runs a script without interleaving other commands. Each script except
``put`` first checks, on the server, that the key exists, belongs to the tenant and is live at the
caller's ``now``, and otherwise reads and writes nothing more, so an expired record is never
recreated and another tenant's id takes the same path as an unknown one: the same script, one
round trip, the same reply (``get`` sends back no field of a record that is not the caller's).
Keys name the id alone, so ``put`` refuses an id that exists under any tenant. No script touches
the TTL (no ``PERSIST``, no ``EXPIRE``), so updates keep the record's own expiry. Every operation
but a ``put`` with a pointer touches exactly one key; that ``put`` writes the record and the
pointer, two keys in different hash slots, so it needs a single Redis server (or primary), not
Redis Cluster.

Outages: short socket and connect timeouts, no client retries (claims and puts are not idempotent
and a retry could turn a lost reply into a wrong answer), and one overall deadline per operation,
so an unreachable or hung server surfaces as ``StoreUnavailableError`` within ``deadline`` seconds
(default 0.9 s) instead of a hang. A dead pooled connection is replaced on the next checkout.

Replication caveat (redis-doc ``replication.md``): replication is asynchronous, so a failover can
lose acknowledged writes (a preparation, a claim, a usage report). Enable AOF on the primary.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Awaitable, Mapping
from typing import Any, Final, TypeVar, cast

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

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

REPORT_FIELD_PREFIX: Final = b"r:"

# Errors that mean "the store cannot serve this right now; retry later" (503). READONLY, TRYAGAIN,
# CLUSTERDOWN/MASTERDOWN happen around failovers; OOM when maxmemory is reached. LOADING is a
# ConnectionError subclass (BusyLoadingError). The builtin TimeoutError is our own deadline.
_UNAVAILABLE: Final = (
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
    OutOfMemoryError,
    OSError,
    TimeoutError,
)

# Shared liveness check. h = HMGET(key, 'tenant', 'expires_at'): h[1] is false for a missing key
# (and the `and` short-circuits before tonumber sees it).
_LIVE_LUA = """
local function live(key, tenant, now)
  local h = redis.call('HMGET', key, 'tenant', 'expires_at')
  return h[1] == tenant and tonumber(h[2]) > tonumber(now)
end
"""

# KEYS[1] record, KEYS[2] (optional) latest pointer; ARGV[1] absolute expiry in ms, ARGV[2]
# tenant, ARGV[3] id, ARGV[4] expires_at, ARGV[5] pointer data, ARGV[6..] field, value pairs. Returns 0 if the id
# already exists (EXISTS ignores logically expired keys), else creates the hash with its expiry
# and, with KEYS[2], points the pointer at it with the same expiry.
_PUT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
if KEYS[2] then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'tenant', ARGV[2], 'id', ARGV[3], 'expires_at', ARGV[4],
             'data', ARGV[5])
  redis.call('PEXPIREAT', KEYS[2], ARGV[1])
end
return 1
"""

# KEYS[1] record; ARGV tenant, now. Returns the HGETALL of a live record of the tenant (a flat
# name, value list), else an empty list, without reading anything more.
_GET_LUA = (
    _LIVE_LUA
    + """
if not live(KEYS[1], ARGV[1], ARGV[2]) then return {} end
return redis.call('HGETALL', KEYS[1])
"""
)

# KEYS[1] record, KEYS[2] (optional) latest pointer; ARGV tenant, now, data, expected version
# ('' = any), and with KEYS[2] the id and the pointer data. Returns -1 missing/expired/other tenant, 0 version mismatch,
# else the new version; with KEYS[2], the pointer's data is replaced when it names the id.
_REPLACE_LUA = (
    _LIVE_LUA
    + """
if not live(KEYS[1], ARGV[1], ARGV[2]) then return -1 end
if ARGV[4] ~= '' and redis.call('HGET', KEYS[1], 'version') ~= ARGV[4] then return 0 end
redis.call('HSET', KEYS[1], 'data', ARGV[3])
if KEYS[2] and redis.call('HGET', KEYS[2], 'id') == ARGV[5] then
  redis.call('HSET', KEYS[2], 'data', ARGV[6])
end
return redis.call('HINCRBY', KEYS[1], 'version', 1)
"""
)

# KEYS[1] record; ARGV tenant, now. Returns 'missing', 'used' or 'claimed'.
_CLAIM_LUA = (
    _LIVE_LUA
    + """
if not live(KEYS[1], ARGV[1], ARGV[2]) then return 'missing' end
if redis.call('HGET', KEYS[1], 'refresh_used') == '1' then return 'used' end
redis.call('HSET', KEYS[1], 'refresh_used', '1')
return 'claimed'
"""
)

# KEYS[1] record; ARGV tenant, now, report field ('r:<report_id>'), slot ('last'|'auxiliary'),
# observation JSON, most reports ('' = no limit). Returns {'missing'}, {'full'},
# {'duplicate', answer} or {'applied', answer}.
_USAGE_LUA = (
    _LIVE_LUA
    + """
if not live(KEYS[1], ARGV[1], ARGV[2]) then return {'missing'} end
local seen = redis.call('HGET', KEYS[1], ARGV[3])
if seen then return {'duplicate', seen} end
local held = tonumber(redis.call('HGET', KEYS[1], 'reports') or '0')
if ARGV[6] ~= '' and held >= tonumber(ARGV[6]) then return {'full'} end
redis.call('HSET', KEYS[1], 'reports', held + 1)
redis.call('HSET', KEYS[1], ARGV[4], ARGV[5])
local acc = redis.call('HMGET', KEYS[1], 'last', 'auxiliary')
local answer = '[' .. (acc[1] or 'null') .. ',' .. (acc[2] or 'null') .. ']'
redis.call('HSET', KEYS[1], ARGV[3], answer)
return {'applied', answer}
"""
)


# KEYS[1] the tenant's calibration hash; ARGV model, ratio, how many to keep. Appends the ratio
# to the model's list (JSON), keeps the newest, and returns the list.
_APPEND_RATIO_LUA = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local ratios = {}
if raw then ratios = cjson.decode(raw) end
table.insert(ratios, tonumber(ARGV[2]))
local keep = tonumber(ARGV[3])
while #ratios > keep do table.remove(ratios, 1) end
local out = cjson.encode(ratios)
redis.call('HSET', KEYS[1], ARGV[1], out)
return out
"""


class RedisStore:
    """``Store`` backed by Redis; build it with ``RedisStore.from_url(url, key_prefix=...)``."""

    def __init__(
        self, client: aioredis.Redis, *, key_prefix: str = "ca:", deadline: float = 0.9
    ) -> None:
        """Use ``client`` (which this store then owns and closes) with a per-operation deadline."""
        self._client = client
        self._prefix = key_prefix
        self._deadline = deadline
        self._put = client.register_script(_PUT_LUA)
        self._get = client.register_script(_GET_LUA)
        self._replace = client.register_script(_REPLACE_LUA)
        self._claim = client.register_script(_CLAIM_LUA)
        self._usage = client.register_script(_USAGE_LUA)
        self._append_ratio = client.register_script(_APPEND_RATIO_LUA)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        key_prefix: str = "ca:",
        socket_timeout: float = 0.4,
        deadline: float = 0.9,
    ) -> RedisStore:
        """A store with a connection pool for ``url``; connects lazily (call ``ping`` to check)."""
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 0),
            decode_responses=False,
        )
        return cls(client, key_prefix=key_prefix, deadline=deadline)

    def key(self, id: str) -> str:
        """The Redis key holding preparation ``id`` (for operators and tests)."""
        return f"{self._prefix}prep:{id}"

    async def _call(self, awaitable: Awaitable[T]) -> T:
        """Await one Redis round trip under the deadline, mapping outages to 503."""
        try:
            async with asyncio.timeout(self._deadline):
                return await awaitable
        except _UNAVAILABLE as err:
            raise StoreUnavailableError(f"Redis store unavailable: {type(err).__name__}") from err

    def latest_key(self, latest_of: str) -> str:
        """The Redis key holding the latest pointer of ``latest_of``."""
        return f"{self._prefix}latest:{latest_of}"

    async def put(
        self,
        record: PreparationRecord,
        *,
        latest_of: str | None = None,
        latest_data: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the hash and its absolute expiry (and the latest pointer) in one script; an
        existing id raises."""
        fields: list[bytes | str] = [
            "tenant",
            record.tenant,
            "expires_at",
            repr(float(record.expires_at)),
            "refresh_used",
            "1" if record.refresh_used else "0",
            "version",
            "1",
            "data",
            dump_object(record.data),
        ]
        for slot in ("last", "auxiliary"):
            blob = dump_optional(getattr(record.accounting, slot))
            if blob is not None:
                fields += [slot, blob]
        for report_id, answer in record.reports.items():
            fields += [
                REPORT_FIELD_PREFIX + report_id.encode(),
                encode_answer(dump_optional(answer.last), dump_optional(answer.auxiliary)),
            ]
        if record.reports:
            fields += ["reports", str(len(record.reports))]
        # Round up so Redis never drops the key before the record is logically expired.
        expire_ms = str(math.ceil(record.expires_at * 1000))
        keys = [self.key(record.id)]
        if latest_of is not None:
            keys.append(self.latest_key(latest_of))
        head: list[bytes | str] = [
            expire_ms,
            record.tenant,
            record.id,
            repr(float(record.expires_at)),
            dump_object(latest_data or {}),
        ]
        created = await self._call(self._put(keys=keys, args=[*head, *fields]))
        if created != 1:
            raise DuplicatePreparationIdError(f"preparation id {record.id!r} already exists")

    async def get(self, tenant: str, id: str, now: float) -> PreparationRecord | None:
        """One script: the tenant and ``now`` checks on the server, then the whole hash."""
        # decode_responses=False, so names and values are bytes.
        flat = cast(
            list[bytes],
            await self._call(self._get(keys=[self.key(id)], args=[tenant, repr(float(now))])),
        )
        if not flat:
            return None
        raw = dict(zip(flat[::2], flat[1::2], strict=True))
        expires_at = float(raw[b"expires_at"])
        reports = {
            name[len(REPORT_FIELD_PREFIX) :].decode(): decode_answer(value)
            for name, value in raw.items()
            if name.startswith(REPORT_FIELD_PREFIX)
        }
        return PreparationRecord(
            id=id,
            tenant=tenant,
            data=load_object(raw[b"data"]),
            expires_at=expires_at,
            refresh_used=raw.get(b"refresh_used") == b"1",
            version=int(raw[b"version"]),
            accounting=Accounting(
                last=load_observation(raw.get(b"last")),
                auxiliary=load_observation(raw.get(b"auxiliary")),
            ),
            reports=reports,
        )

    async def latest(self, tenant: str, latest_of: str, now: float) -> Latest | None:
        """One ``HMGET`` of the pointer; the tenant and ``now`` are checked here."""
        # decode_responses=False, so the values are bytes.
        tenant_raw, id_raw, expires_raw, data_raw = cast(
            list[bytes | None],
            await self._call(
                self._client.hmget(
                    self.latest_key(latest_of), ["tenant", "id", "expires_at", "data"]
                )
            ),
        )
        if tenant_raw != tenant.encode() or id_raw is None or expires_raw is None:
            return None
        if float(expires_raw) <= now or data_raw is None:
            return None
        return Latest(id_raw.decode(), load_object(data_raw))

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
        """Compare-and-set the data (and the pointer's) in one script; the expiry is untouched."""
        expected = "" if expected_version is None else str(int(expected_version))
        keys = [self.key(id)]
        args: list[bytes | str] = [tenant, repr(float(now)), dump_object(data), expected]
        if latest_of is not None:
            keys.append(self.latest_key(latest_of))
            args += [id, dump_object(latest_data or {})]
        result = await self._call(self._replace(keys=keys, args=args))
        return int(result) > 0

    async def claim_refresh(self, tenant: str, id: str, now: float) -> ClaimResult:
        """Test-and-set ``refresh_used`` in one script."""
        result = await self._call(self._claim(keys=[self.key(id)], args=[tenant, repr(float(now))]))
        if result == b"claimed":
            return "claimed"
        if result == b"used":
            return "used"
        return "missing"

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
        """Check liveness, dedupe by ``report_id``, count and apply, in one script."""
        checked = check_slot(slot)
        result = await self._call(
            self._usage(
                keys=[self.key(id)],
                args=[
                    tenant,
                    repr(float(now)),
                    REPORT_FIELD_PREFIX + report_id.encode(),
                    checked,
                    dump_object(observation),
                    "" if max_reports is None else str(int(max_reports)),
                ],
            )
        )
        status = result[0]
        if status == b"missing":
            return UsageResult("missing", None)
        if status == b"full":
            return UsageResult("full", None)
        accounting = decode_answer(result[1])
        if status == b"duplicate":
            return UsageResult("duplicate", accounting)
        return UsageResult("applied", accounting)

    async def secret(self, name: str, candidate: bytes) -> bytes:
        """``SET NX`` (no expiry), then ``GET``: the first replica's candidate wins."""
        key = f"{self._prefix}secret:{name}"
        await self._call(self._client.set(key, candidate, nx=True))
        value = await self._call(self._client.get(key))
        if value is None:  # deleted between the two calls: keep ours
            return candidate
        return value if isinstance(value, bytes) else value.encode()

    def calibration_key(self, tenant: str) -> str:
        """The hash of ``tenant``'s calibration ratios, one field per model (a digest of the
        tenant names it, as the latest pointers' keys do)."""
        tag = hashlib.sha256(tenant.encode()).hexdigest()[:32]
        return f"{self._prefix}calibration:{tag}"

    async def calibration(self, tenant: str, model: str, ratio: float | None = None) -> list[float]:
        """``HGET``; with ``ratio``, append it and ``HSET`` the last ``WINDOW`` in a script, so
        two reports at once both count."""
        key = self.calibration_key(tenant)
        if ratio is None:
            raw = await self._call(self._client.hget(key, model))
            return [] if raw is None else list(orjson.loads(raw))
        kept = await self._call(
            self._append_ratio(keys=[key], args=[model, repr(ratio), calibration.WINDOW])
        )
        return list(orjson.loads(cast("bytes", kept)))

    async def calibrations(self, tenant: str) -> dict[str, list[float]]:
        """``HGETALL`` of the tenant's hash."""
        raw = await self._call(self._client.hgetall(self.calibration_key(tenant)))
        return {
            (k.decode() if isinstance(k, bytes) else k): list(orjson.loads(v))
            for k, v in raw.items()
        }

    async def purge_expired(self, now: float) -> int:
        """Nothing to do: Redis deletes each key at its own ``PEXPIREAT``."""
        return 0

    async def ping(self) -> None:
        """``PING`` under the deadline."""
        await self._call(self._client.ping())

    async def aclose(self) -> None:
        """Close the connection pool; idempotent."""
        await self._client.aclose()
