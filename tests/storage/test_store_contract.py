"""The ``Store`` contract, run for real against every backend (SQLite file and Redis)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from storage_support import RecordFactory, StoreFactory

from context_assembly.core import calibration
from context_assembly.storage import (
    Accounting,
    DuplicatePreparationIdError,
    Latest,
    PreparationRecord,
    Store,
    UsageResult,
)

MAIN = {"provider": "openai", "call": "main", "report_id": "r-main", "provider_input_tokens": 1200}
WRAP_UP = {"provider": "openai", "call": "wrap_up", "report_id": "r-wrap", "output_tokens": 0}
REPAIR = {"provider": "anthropic", "call": "repair", "report_id": "r-rep", "cached_input_tokens": 7}


async def test_put_then_get_round_trips_the_record(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """A stored record comes back equal, including awkward JSON (empty list, unicode, floats)."""
    data = {
        "manifest": {"blocks": [], "sources": {}},
        "text": "naïve – ✓ \u2028",
        "ratio": 0.1,
        "big": 2**53 + 1,
        "flag": False,
        "none": None,
    }
    record = make_record(data=data)
    await store.put(record)
    got = await store.get("acme", record.id, now)
    assert got == record
    assert got is not None and got.data == data
    assert got.version == 1 and not got.refresh_used
    assert got.accounting == Accounting(None, None) and got.reports == {}


async def test_put_keeps_given_accounting_and_reports(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """Accounting and per-report answers given to ``put`` are stored and answered for duplicates."""
    answered = Accounting(last=MAIN, auxiliary=None)
    record = make_record(refresh_used=True, accounting=answered, reports={"r-main": answered})
    await store.put(record)
    assert await store.get("acme", record.id, now) == record
    again = await store.record_usage("acme", record.id, "r-main", "last", WRAP_UP, now)
    assert again == UsageResult("duplicate", answered)
    assert await store.claim_refresh("acme", record.id, now) == "used"


async def test_put_ignores_a_caller_supplied_version(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """A new record always starts at data version 1."""
    record = make_record(version=9)
    await store.put(record)
    got = await store.get("acme", record.id, now)
    assert got is not None and got.version == 1


async def test_a_put_that_returned_is_seen_by_every_instance(
    store_factory: StoreFactory, make_record: RecordFactory, now: float
) -> None:
    """``put`` stores the record before it returns: another instance on the same backing (a
    replica, a restarted process) reads it straight away, without any flush or wait."""
    first, second = await store_factory(), await store_factory()
    for _ in range(10):
        record = make_record()
        await first.put(record)
        assert await second.get("acme", record.id, now) == record


async def test_put_refuses_an_existing_id_even_for_another_tenant(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """Id collisions are bugs: ``put`` raises and leaves the first record untouched."""
    record = make_record()
    await store.put(record)
    with pytest.raises(DuplicatePreparationIdError):
        await store.put(make_record(id=record.id, tenant="globex", data={"other": 1}))
    assert await store.get("acme", record.id, now) == record
    assert await store.get("globex", record.id, now) is None


async def test_another_tenant_sees_and_changes_nothing(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """Every operation by another tenant behaves as for an unknown id and changes nothing."""
    record = make_record()
    await store.put(record)
    assert await store.get("globex", record.id, now) is None
    assert await store.replace_data("globex", record.id, {"x": 1}, now) is False
    assert await store.claim_refresh("globex", record.id, now) == "missing"
    result = await store.record_usage("globex", record.id, "r1", "last", MAIN, now)
    assert result == UsageResult("missing", None)
    assert await store.get("acme", record.id, now) == record


async def test_unknown_id_is_missing_everywhere(store: Store, now: float) -> None:
    """An id that was never stored is ``None`` / ``False`` / ``missing`` and is not created."""
    assert await store.get("acme", "prep_nope", now) is None
    assert await store.replace_data("acme", "prep_nope", {"x": 1}, now) is False
    assert await store.claim_refresh("acme", "prep_nope", now) == "missing"
    result = await store.record_usage("acme", "prep_nope", "r1", "last", MAIN, now)
    assert result == UsageResult("missing", None)
    assert await store.get("acme", "prep_nope", now) is None


async def test_record_is_live_until_expires_at_and_gone_from_then(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """Expiry is exclusive: visible just before ``expires_at``, invisible at it."""
    record = make_record()
    await store.put(record)
    assert await store.get("acme", record.id, record.expires_at - 0.001) == record
    assert await store.get("acme", record.id, record.expires_at) is None
    assert await store.get("acme", record.id, record.expires_at + 60) is None


async def test_updates_after_expiry_change_nothing(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """Replace, claim and usage on an expired record report it missing and write nothing."""
    record = make_record()
    await store.put(record)
    late = record.expires_at + 1
    assert await store.replace_data("acme", record.id, {"x": 1}, late) is False
    assert await store.claim_refresh("acme", record.id, late) == "missing"
    result = await store.record_usage("acme", record.id, "r1", "last", MAIN, late)
    assert result == UsageResult("missing", None)
    # Seen from a time when it was still live, the record is exactly as stored.
    assert await store.get("acme", record.id, now) == record


async def test_usage_applies_then_answers_duplicates_identically(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """The same report_id twice changes nothing and gets the same answer, whatever it carries."""
    record = make_record()
    await store.put(record)
    first = await store.record_usage("acme", record.id, "r-main", "last", MAIN, now)
    assert first == UsageResult("applied", Accounting(last=MAIN, auxiliary=None))
    second = await store.record_usage("acme", record.id, "r-main", "last", WRAP_UP, now)
    assert second == UsageResult("duplicate", first.accounting)
    got = await store.get("acme", record.id, now)
    assert got is not None
    assert got.accounting == Accounting(last=MAIN, auxiliary=None)
    assert got.reports == {"r-main": Accounting(last=MAIN, auxiliary=None)}


async def test_duplicate_answers_the_accounting_as_it_was_then(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """A repeated report gets its original answer, not the accounting as it is now."""
    record = make_record()
    await store.put(record)
    await store.record_usage("acme", record.id, "r-main", "last", MAIN, now)
    later = await store.record_usage("acme", record.id, "r-wrap", "last", WRAP_UP, now)
    assert later.accounting == Accounting(last=WRAP_UP, auxiliary=None)
    replay = await store.record_usage("acme", record.id, "r-main", "last", MAIN, now)
    assert replay == UsageResult("duplicate", Accounting(last=MAIN, auxiliary=None))
    got = await store.get("acme", record.id, now)
    assert got is not None and got.accounting.last == WRAP_UP


async def test_repair_goes_to_auxiliary_and_never_overwrites_last(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """An auxiliary (repair) observation leaves ``last`` alone, before and after a main report."""
    record = make_record()
    await store.put(record)
    only_repair = await store.record_usage("acme", record.id, "r-rep", "auxiliary", REPAIR, now)
    assert only_repair == UsageResult("applied", Accounting(last=None, auxiliary=REPAIR))
    main = await store.record_usage("acme", record.id, "r-main", "last", MAIN, now)
    assert main.accounting == Accounting(last=MAIN, auxiliary=REPAIR)
    repair2 = {**REPAIR, "report_id": "r-rep2", "cached_input_tokens": 0}
    again = await store.record_usage("acme", record.id, "r-rep2", "auxiliary", repair2, now)
    assert again.accounting == Accounting(last=MAIN, auxiliary=repair2)
    got = await store.get("acme", record.id, now)
    assert got is not None and got.accounting == Accounting(last=MAIN, auxiliary=repair2)


async def test_unknown_slot_is_refused(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """A slot other than ``last``/``auxiliary`` is a caller bug and never reaches the backend."""
    record = make_record()
    await store.put(record)
    with pytest.raises(ValueError, match="slot"):
        await store.record_usage("acme", record.id, "r1", "data", MAIN, now)  # type: ignore[arg-type]
    assert await store.get("acme", record.id, now) == record


async def test_report_ids_with_separator_characters_stay_distinct(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """Report ids are opaque: colons, prefixes of field names and unicode do not collide."""
    record = make_record()
    await store.put(record)
    ids = ["r:1", "r", "last", "tenant", "data", "ü/✓", ""]
    for index, report_id in enumerate(ids):
        result = await store.record_usage("acme", record.id, report_id, "last", {"n": index}, now)
        assert result.status == "applied", report_id
    got = await store.get("acme", record.id, now)
    assert got is not None
    assert got.tenant == "acme" and got.data == record.data
    assert set(got.reports) == set(ids)
    assert got.accounting.last == {"n": len(ids) - 1}


async def test_same_report_concurrently_applies_once(
    store_factory: StoreFactory, make_record: RecordFactory, now: float
) -> None:
    """Three concurrent copies of one report on two replicas: one applied, all answer the same."""
    first, second = await store_factory(), await store_factory()
    record = make_record()
    await first.put(record)
    results = await asyncio.gather(
        *(
            s.record_usage("acme", record.id, "r-main", "last", MAIN, now)
            for s in (first, second, first)
        )
    )
    assert sorted(r.status for r in results) == ["applied", "duplicate", "duplicate"]
    assert [r.accounting for r in results] == [Accounting(last=MAIN, auxiliary=None)] * 3


async def test_concurrent_distinct_reports_lose_no_update(
    store_factory: StoreFactory, make_record: RecordFactory, now: float
) -> None:
    """Twenty distinct reports racing on two replicas are all applied and all remembered."""
    stores = [await store_factory(), await store_factory()]
    record = make_record()
    await stores[0].put(record)
    results = await asyncio.gather(
        *(
            stores[i % 2].record_usage("acme", record.id, f"r{i}", "last", {"i": i}, now)
            for i in range(20)
        )
    )
    assert all(r.status == "applied" for r in results)
    got = await stores[1].get("acme", record.id, now)
    assert got is not None and set(got.reports) == {f"r{i}" for i in range(20)}


async def test_reports_stop_at_max_reports_even_when_racing(
    store_factory: StoreFactory, make_record: RecordFactory, now: float
) -> None:
    """With ``max_reports`` 5, twelve distinct reports racing on two replicas: five applied,
    seven ``full`` that change nothing; an applied id still answers as a duplicate; records
    given reports by ``put`` count them."""
    stores = [await store_factory(), await store_factory()]
    record = make_record()
    await stores[0].put(record)
    results = await asyncio.gather(
        *(
            stores[i % 2].record_usage(
                "acme", record.id, f"r{i}", "last", {"i": i}, now, max_reports=5
            )
            for i in range(12)
        )
    )
    assert sorted(r.status for r in results) == ["applied"] * 5 + ["full"] * 7
    assert all(r.accounting is None for r in results if r.status == "full")
    got = await stores[1].get("acme", record.id, now)
    applied = {f"r{i}" for i, r in enumerate(results) if r.status == "applied"}
    assert got is not None and set(got.reports) == applied
    repeat = await stores[0].record_usage(
        "acme", record.id, sorted(applied)[0], "last", MAIN, now, max_reports=5
    )
    assert repeat.status == "duplicate"
    assert (await stores[0].record_usage("acme", record.id, "r-new", "last", MAIN, now)).status == (
        "applied"
    ), "without max_reports there is no limit"

    answered = Accounting(last=MAIN, auxiliary=None)
    given = make_record(reports={"a": answered, "b": answered})
    await stores[0].put(given)
    assert (
        await stores[1].record_usage("acme", given.id, "c", "last", MAIN, now, max_reports=2)
    ).status == "full"


async def test_claim_refresh_succeeds_exactly_once_under_concurrency(
    store_factory: StoreFactory, make_record: RecordFactory, now: float
) -> None:
    """Twenty concurrent claims spread over two replicas yield one ``claimed`` and 19 ``used``."""
    stores = [await store_factory(), await store_factory()]
    record = make_record()
    await stores[0].put(record)
    results = await asyncio.gather(
        *(stores[i % 2].claim_refresh("acme", record.id, now) for i in range(20))
    )
    assert results.count("claimed") == 1
    assert results.count("used") == 19
    got = await stores[0].get("acme", record.id, now)
    assert got is not None and got.refresh_used
    assert await stores[1].claim_refresh("acme", record.id, now) == "used"


async def test_replace_data_swaps_data_bumps_version_and_keeps_the_rest(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """``replace_data`` changes data and version only: expiry, claim and accounting stay."""
    record = make_record()
    await store.put(record)
    await store.claim_refresh("acme", record.id, now)
    await store.record_usage("acme", record.id, "r-main", "last", MAIN, now)
    assert await store.replace_data("acme", record.id, {"attempt": 2, "blocks": []}, now)
    got = await store.get("acme", record.id, now)
    assert got is not None
    assert got.data == {"attempt": 2, "blocks": []}
    assert got.version == 2
    assert got.expires_at == record.expires_at
    assert got.refresh_used
    assert got.accounting == Accounting(last=MAIN, auxiliary=None)
    assert await store.get("acme", record.id, record.expires_at) is None


async def test_replace_data_compare_and_set_on_version(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """With ``expected_version`` only the writer holding the current version wins."""
    record = make_record()
    await store.put(record)
    assert await store.replace_data("acme", record.id, {"v": 2}, now, expected_version=1)
    assert not await store.replace_data("acme", record.id, {"v": "stale"}, now, expected_version=1)
    assert await store.replace_data("acme", record.id, {"v": 3}, now, expected_version=2)
    got = await store.get("acme", record.id, now)
    assert got is not None and got.data == {"v": 3} and got.version == 3


async def test_concurrent_compare_and_set_has_one_winner(
    store_factory: StoreFactory, make_record: RecordFactory, now: float
) -> None:
    """Ten replicas replacing from the same version: exactly one succeeds."""
    stores = [await store_factory(), await store_factory()]
    record = make_record()
    await stores[0].put(record)
    results = await asyncio.gather(
        *(
            stores[i % 2].replace_data("acme", record.id, {"w": i}, now, expected_version=1)
            for i in range(10)
        )
    )
    assert results.count(True) == 1
    got = await stores[0].get("acme", record.id, now)
    assert got is not None and got.version == 2 and got.data == {"w": results.index(True)}


async def test_records_are_independent(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """Claims and reports on one preparation do not touch another."""
    one, two = make_record(), make_record()
    await store.put(one)
    await store.put(two)
    await store.claim_refresh("acme", one.id, now)
    await store.record_usage("acme", one.id, "r-main", "last", MAIN, now)
    assert await store.get("acme", two.id, now) == two
    assert await store.claim_refresh("acme", two.id, now) == "claimed"


async def test_purge_keeps_live_records(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """Housekeeping never removes a live record, and an expired one stays invisible after it."""
    live = make_record()
    expired = make_record(expires_at=now + 10)
    await store.put(live)
    await store.put(expired)
    purged = await store.purge_expired(now + 20)
    assert purged >= 0
    assert await store.get("acme", live.id, now + 20) == live
    assert await store.get("acme", expired.id, now + 20) is None


async def test_ping_answers(store: Store) -> None:
    """A reachable backend answers ``ping`` without raising."""
    await store.ping()


def test_records_refuse_missing_owner_or_unbounded_expiry() -> None:
    """A record without id/tenant or with a non-finite expiry cannot be built."""
    with pytest.raises(ValueError):
        PreparationRecord(id="", tenant="acme", data={}, expires_at=1.0)
    with pytest.raises(ValueError):
        PreparationRecord(id="p", tenant="", data={}, expires_at=1.0)
    with pytest.raises(ValueError):
        PreparationRecord(id="p", tenant="acme", data={}, expires_at=float("inf"))


async def test_latest_points_at_the_last_put_of_a_key_for_its_tenant_only(
    store_factory: StoreFactory, make_record: RecordFactory, now: float
) -> None:
    """``put(..., latest_of=k)`` makes the record the latest of ``k``, seen by another instance
    on the same backing (a replica); other keys, other tenants and puts without ``latest_of``
    do not move it."""
    first, second = await store_factory(), await store_factory()
    key, other_key = f"k-{uuid.uuid4().hex}", f"k-{uuid.uuid4().hex}"
    assert await second.latest("acme", key, now) is None
    one, two = make_record(), make_record()
    await first.put(one, latest_of=key, latest_data={"turn": 1, "digests": ["a", "b"]})
    assert await second.latest("acme", key, now) == Latest(
        one.id, {"turn": 1, "digests": ["a", "b"]}
    )
    await second.put(two, latest_of=key)
    await first.put(make_record(), latest_of=other_key, latest_data={"turn": 9})
    await first.put(make_record())
    assert await first.latest("acme", key, now) == Latest(two.id, {})
    assert await first.latest("globex", key, now) is None
    await first.put(make_record(tenant="globex"), latest_of=f"g-{key}")
    assert await first.latest("acme", f"g-{key}", now) is None


async def test_latest_expires_with_its_record(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """The pointer lives as long as the record it names, and no longer."""
    key = f"k-{uuid.uuid4().hex}"
    record = make_record(expires_at=now + 30)
    await store.put(record, latest_of=key)
    assert await store.latest("acme", key, now + 29) == Latest(record.id, {})
    assert await store.latest("acme", key, now + 30) is None


async def test_a_refused_put_leaves_the_latest_pointer_alone(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """A duplicate id writes nothing: not the record, not the pointer."""
    key = f"k-{uuid.uuid4().hex}"
    record = make_record()
    await store.put(record, latest_of=key)
    with pytest.raises(DuplicatePreparationIdError):
        await store.put(make_record(id=record.id), latest_of=f"x-{key}")
    assert await store.latest("acme", f"x-{key}", now) is None
    assert await store.latest("acme", key, now) == Latest(record.id, {})


async def test_replace_data_moves_the_pointer_data_only_while_it_names_the_record(
    store: Store, make_record: RecordFactory, now: float
) -> None:
    """A successful ``replace_data`` with ``latest_of`` replaces the pointer's data when the
    pointer names that record; a refused swap, or a pointer a later ``put`` moved, is left
    alone."""
    key = f"k-{uuid.uuid4().hex}"
    record = make_record()
    await store.put(record, latest_of=key, latest_data={"turn": 1})
    assert not await store.replace_data(
        "acme", record.id, {"v": 2}, now, expected_version=7, latest_of=key, latest_data={"t": 0}
    )
    assert await store.latest("acme", key, now) == Latest(record.id, {"turn": 1})
    assert await store.replace_data(
        "acme", record.id, {"v": 2}, now, latest_of=key, latest_data={"turn": 2}
    )
    assert await store.latest("acme", key, now) == Latest(record.id, {"turn": 2})
    later = make_record()
    await store.put(later, latest_of=key, latest_data={"turn": 3})
    assert await store.replace_data(
        "acme", record.id, {"v": 3}, now, latest_of=key, latest_data={"turn": 4}
    )
    assert await store.latest("acme", key, now) == Latest(later.id, {"turn": 3})
    got = await store.get("acme", record.id, now)
    assert got is not None and got.data == {"v": 3}


async def test_a_secret_is_kept_by_the_first_caller_for_every_instance(
    store_factory: StoreFactory,
) -> None:
    """The first candidate of a name is stored; every instance, racing or later, reads it; other
    names are independent."""
    first, second = await store_factory(), await store_factory()
    answers = await asyncio.gather(
        *(store.secret("cache-key", bytes([n]) * 32) for n, store in enumerate([first, second] * 4))
    )
    assert len(set(answers)) == 1 and answers[0] in {bytes([n]) * 32 for n in range(8)}
    assert await second.secret("cache-key", b"later" * 8) == answers[0]
    assert await first.secret("other", b"x" * 32) == b"x" * 32


async def test_calibration_ratios_are_kept_per_tenant_and_model_for_every_instance(
    store_factory: StoreFactory,
) -> None:
    """Concurrent reports on two instances all count; the newest ``WINDOW`` are kept, per tenant
    and model; another tenant sees none of them."""
    first, second = await store_factory(), await store_factory()
    assert await first.calibration("acme", "claude-sonnet-4-5") == []
    racing = [0.5 + n / 1000 for n in range(40)]
    await asyncio.gather(
        *(
            store.calibration("acme", "claude-sonnet-4-5", ratio)
            for ratio, store in zip(racing, [first, second] * 20, strict=True)
        )
    )
    assert sorted(await first.calibration("acme", "claude-sonnet-4-5")) == racing
    later = [0.6 + n / 1000 for n in range(20)]
    for ratio in later:
        await second.calibration("acme", "claude-sonnet-4-5", ratio)
    kept = await first.calibration("acme", "claude-sonnet-4-5")
    assert len(kept) == calibration.WINDOW
    assert kept[-20:] == later and set(kept[:30]) <= set(racing)
    await first.calibration("acme", "gemini-2.5-pro", 0.75)
    assert await second.calibrations("acme") == {
        "claude-sonnet-4-5": kept,
        "gemini-2.5-pro": [0.75],
    }
    assert await second.calibrations("other") == {}
    assert await second.calibration("other", "claude-sonnet-4-5") == []
