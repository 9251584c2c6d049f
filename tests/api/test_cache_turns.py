"""Cache plans through the HTTP API (in-process app, real SQLite file or the real Redis): the
previous turn found by the per-tenant+scope pointer, ``selection.cache``, provider directives,
``expected_cached_tokens`` in usage reports, refresh, and the timeline."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis as redis_lib
from api_support import KEYS, AppFactory, FakeWall

REDIS_URL = "redis://127.0.0.1:6379/15"
MODEL = "claude-sonnet-4-5"  # minimum cacheable prefix 1,024 in the registry data


def tool(name: str, words: int = 20) -> dict[str, Any]:
    return {
        "name": name,
        "description": " ".join(f"{name}-word{i}" for i in range(words)),
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": MODEL,
        "instructions": "You are a careful assistant. " * 200,
        "tools": [tool("search", 200), tool("fetch", 200)],
        "history": [],
        "input": [{"role": "user", "content": "What now?"}],
        "assembly": {"layout": "stable-prefix"},
        "render": "anthropic",
        "cache": {"breakpoints": True},
        "scope": {"task_id": f"c-{secrets.token_hex(4)}"},
    }
    base.update(fields)
    return {key: value for key, value in base.items() if value is not None}


def post(client: Any, path: str, payload: dict[str, Any], **headers: str) -> dict[str, Any]:
    response = client.post(path, json=payload, headers=headers)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


Edit = Callable[[dict[str, Any]], dict[str, Any]]


def converse(
    client: Any,
    wall: FakeWall,
    fields: dict[str, Any],
    turns: int,
    change: dict[int, Edit] | None = None,
) -> list[dict[str, Any]]:
    """The answers of a ``turns``-turn conversation, a minute apart, each turn appending the
    previous exchange to the history; ``change[n]`` edits turn ``n``'s fields (and the turns
    after it keep the edit, as a host's would). No turn names its previous one."""
    answers = []
    for number in range(turns):
        if change and number in change:
            fields = change[number](fields)
        answers.append(post(client, "/v1/prepare", fields))
        wall.now += 60
        fields = {
            **fields,
            "history": [
                *fields["history"],
                {"role": "user", "content": f"question {number}"},
                {"role": "assistant", "content": f"answer {number}"},
            ],
        }
    return answers


def markers(frame: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``cache_control`` of an Anthropic body."""
    found = [t["cache_control"] for t in frame.get("tools", []) if "cache_control" in t]
    system = frame.get("system")
    if isinstance(system, list):
        found += [b["cache_control"] for b in system if "cache_control" in b]
    for message in frame.get("messages", []):
        if isinstance(message.get("content"), list):
            found += [b["cache_control"] for b in message["content"] if "cache_control" in b]
    return found


@pytest.fixture(params=["sqlite", "redis"])
def backend_client(
    request: pytest.FixtureRequest, make_client: AppFactory
) -> Iterator[tuple[Any, FakeWall]]:
    """An app on a SQLite file or on the real Redis (a key prefix of its own), with a settable
    wall clock that starts now (Redis expires keys by the real clock)."""
    wall = FakeWall(time.time())
    if request.param == "sqlite":
        yield make_client(wall=wall), wall
        return
    prefix = f"ca-test-cache-{secrets.token_hex(4)}:"
    store = {"backend": "redis", "redis_url": REDIS_URL, "key_prefix": prefix}
    try:
        yield make_client(wall=wall, store=store), wall
    finally:
        cleanup = redis_lib.Redis.from_url(REDIS_URL)
        for key in cleanup.scan_iter(f"{prefix}*"):
            cleanup.delete(key)
        cleanup.close()


def test_twenty_turns_keep_the_prefix_in_stable_prefix_and_not_in_legacy(
    backend_client: tuple[Any, FakeWall],
) -> None:
    """Each turn is compared with the scope's latest preparation (the store's pointer): in
    stable-prefix the previous prefix starts every turn; in legacy the date line opens the
    leading message, so no turn keeps it."""
    client, wall = backend_client
    stable = converse(client, wall, body(), 20)
    reports = [a["selection"]["cache"] for a in stable]
    assert reports[0]["previous_preparation_id"] is None and reports[0]["prefix_kept"] is None
    assert [r["previous_preparation_id"] for r in reports[1:]] == [
        a["preparation_id"] for a in stable[:-1]
    ]
    assert all(r["prefix_kept"] is True and r["first_change"] is None for r in reports[1:])
    legacy = converse(client, wall, body(assembly={"layout": "legacy"}), 20)
    reports = [a["selection"]["cache"] for a in legacy]
    assert all(r["prefix_kept"] is False for r in reports[1:])
    assert all(r["first_change"] == {"part": "instructions", "index": None} for r in reports[1:])


def _rewrite_history(index: int) -> Edit:
    def edit(fields: dict[str, Any]) -> dict[str, Any]:
        history = list(fields["history"])
        history[index] = {**history[index], "content": "rewritten"}
        return {**fields, "history": history}

    return edit


@pytest.mark.parametrize(
    ("edit", "first_change"),
    [
        (
            lambda f: {**f, "tools": [*f["tools"], tool("zeta")]},
            {"part": "tools", "index": 2},
        ),
        (
            lambda f: {**f, "tools": [tool("alpha"), *f["tools"]]},
            {"part": "tools", "index": 0},
        ),
        (
            lambda f: {**f, "instructions": "Other instructions. " * 200},
            {"part": "instructions", "index": None},
        ),
        (_rewrite_history(7), {"part": "history", "index": 7}),
    ],
)
def test_a_change_is_named_with_its_part_and_index(
    make_client: AppFactory, edit: Edit, first_change: dict[str, Any]
) -> None:
    """Turn 6 changes one part of the prefix: it is named with its index; the turns before
    and after keep their prefix."""
    wall = FakeWall()
    client = make_client(wall=wall)
    reports = [a["selection"]["cache"] for a in converse(client, wall, body(), 8, change={6: edit})]
    assert all(r["prefix_kept"] is True for r in reports[1:6])
    assert reports[6]["prefix_kept"] is False and reports[6]["first_change"] == first_change
    assert reports[7]["prefix_kept"] is True


def test_the_pointer_is_per_tenant_and_scope(make_client: AppFactory) -> None:
    """Another scope or another tenant starts its own chain; an explicit ``null`` is a first
    turn; an explicit id is used as given; an id no live record of the tenant has (unknown,
    another tenant's) is named with nothing to compare."""
    client = make_client(auth=True)
    acme = {"authorization": f"Bearer {KEYS['acme']}"}
    globex = {"authorization": f"Bearer {KEYS['globex']}"}
    first = post(client, "/v1/prepare", body(scope={"task_id": "a"}), **acme)
    assert first["selection"]["cache"]["previous_preparation_id"] is None
    same = post(client, "/v1/prepare", body(scope={"task_id": "a"}), **acme)
    assert same["selection"]["cache"]["previous_preparation_id"] == first["preparation_id"]
    other_scope = post(client, "/v1/prepare", body(scope={"task_id": "b"}), **acme)
    assert other_scope["selection"]["cache"]["previous_preparation_id"] is None
    other_tenant = post(client, "/v1/prepare", body(scope={"task_id": "a"}), **globex)
    assert other_tenant["selection"]["cache"]["previous_preparation_id"] is None

    def cache_with(previous: Any) -> dict[str, Any]:
        return body(
            scope={"task_id": "a"},
            cache={"breakpoints": True, "previous_preparation_id": previous},
        )

    fresh = post(client, "/v1/prepare", cache_with(None), **acme)["selection"]["cache"]
    assert fresh["previous_preparation_id"] is None and fresh["prefix_kept"] is None
    named = post(client, "/v1/prepare", cache_with(first["preparation_id"]), **acme)
    assert named["selection"]["cache"]["previous_preparation_id"] == first["preparation_id"]
    assert named["selection"]["cache"]["prefix_kept"] is True
    for unknown in ("prep_unknown", other_tenant["preparation_id"]):
        report = post(client, "/v1/prepare", cache_with(unknown), **acme)["selection"]["cache"]
        assert report["previous_preparation_id"] == unknown and report["prefix_kept"] is None


def test_anthropic_markers_follow_the_model_minimum(make_client: AppFactory) -> None:
    """Below the model's minimum (1,024 tokens here) no marker is placed and each candidate
    is reported skipped; above it the markers are placed, at most 4, each at or past the
    minimum, all with the requested ttl."""
    client = make_client()
    small = post(
        client,
        "/v1/prepare",
        body(instructions="Short.", tools=[tool("search")], cache={"breakpoints": True}),
    )
    assert markers(small["frame"]) == []
    assert small["selection"]["cache"]["breakpoints"] == []
    assert {s["reason"] for s in small["selection"]["cache"]["skipped"]} == {"below_minimum"}
    history = [
        {"role": "user", "content": "question " * 300},
        {"role": "assistant", "content": "answer"},
    ]
    large = post(
        client, "/v1/prepare", body(history=history, cache={"breakpoints": True, "ttl": "1h"})
    )
    placed = large["selection"]["cache"]["breakpoints"]
    found = markers(large["frame"])
    assert 0 < len(found) == len(placed) <= 4
    assert all(m == {"type": "ephemeral", "ttl": "1h"} for m in found)
    assert all(p["tokens"] >= 1024 and p["ttl"] == "1h" for p in placed)
    assert large["selection"]["cache"]["cacheable_tokens"] == placed[-1]["tokens"]
    plain = post(client, "/v1/prepare", body(history=history, cache=None))
    assert markers(plain["frame"]) == [] and "cache" not in plain["selection"]


@pytest.mark.parametrize("render", ["openai-chat", "openai-responses"])
def test_openai_auto_key_is_stable_per_scope_and_tenant(
    make_client: AppFactory, render: str
) -> None:
    client = make_client(auth=True)

    def key(tenant: str, conversation: str, **fields: Any) -> Any:
        payload = body(
            model="gpt-4o",
            render=render,
            cache={"key": "auto", "retention": "24h"},
            scope={"task_id": conversation},
            **fields,
        )
        answer = post(client, "/v1/prepare", payload, authorization=f"Bearer {KEYS[tenant]}")
        assert answer["frame"].get("prompt_cache_retention") == "24h"
        return answer["frame"].get("prompt_cache_key")

    turn_one = key("acme", "a")
    assert isinstance(turn_one, str) and "a" != turn_one
    assert key("acme", "a", history=[{"role": "user", "content": "more"}]) == turn_one
    assert key("acme", "b") != turn_one
    assert key("globex", "a") != turn_one
    plain = post(
        client,
        "/v1/prepare",
        body(model="gpt-4o", render=render, cache=None),
        authorization=f"Bearer {KEYS['acme']}",
    )
    assert "prompt_cache_key" not in plain["frame"]


def _usage(client: Any, prep_id: str, report_id: str, call: str = "main") -> dict[str, Any]:
    usage = {"input_tokens": 10, "cache_read_input_tokens": 900, "output_tokens": 5}
    payload = {"report_id": report_id, "provider": "anthropic", "call": call, "usage": usage}
    answer = post(client, f"/v1/preparations/{prep_id}/usage", payload)
    accounting: dict[str, Any] = answer["accounting"]
    return accounting


def test_usage_shows_expected_beside_reported_cached_tokens(make_client: AppFactory) -> None:
    """``expected_cached_tokens``: what the previous turn cached when its prefix was kept and
    it is within the cache lifetime (5 minutes by default), else 0; a repair shows none."""
    wall = FakeWall()
    client = make_client(wall=wall)
    fields = body()
    answers = converse(client, wall, fields, 2)
    first, second = (a["selection"]["cache"]["cacheable_tokens"] for a in answers)
    assert 0 < first <= second
    opening = _usage(client, answers[0]["preparation_id"], "r0")["last"]
    assert opening["expected_cached_tokens"] == 0 and opening["cached_input_tokens"] == 900
    last = _usage(client, answers[1]["preparation_id"], "r1")["last"]
    assert last["expected_cached_tokens"] == first and last["cached_input_tokens"] == 900
    repair = _usage(client, answers[1]["preparation_id"], "r2", call="repair")
    assert repair["auxiliary"]["expected_cached_tokens"] is None
    wall.now += 6 * 60  # past the 5 minute lifetime
    history = [
        {"role": "user", "content": f"question {n}"}
        if i % 2 == 0
        else {"role": "assistant", "content": f"answer {n}"}
        for n in range(2)
        for i in range(2)
    ]
    late = post(client, "/v1/prepare", {**fields, "history": history})
    assert late["selection"]["cache"]["previous_preparation_id"] == answers[1]["preparation_id"]
    assert late["selection"]["cache"]["prefix_kept"] is True
    assert _usage(client, late["preparation_id"], "r3")["last"]["expected_cached_tokens"] == 0


def test_refresh_keeps_the_original_cache_object_and_previous_turn(
    make_client: AppFactory,
) -> None:
    """A refresh body with no ``cache`` object is not refused, and answers with the original's
    plan, compared with the original's previous turn."""
    wall = FakeWall()
    client = make_client(wall=wall)
    fields = body(cache={"breakpoints": True, "ttl": "1h"})
    answers = converse(client, wall, fields, 2)
    original = answers[1]
    edited = {
        **fields,
        "history": [
            {"role": "user", "content": "question 0"},
            {"role": "assistant", "content": "answer 0"},
        ],
        "input": [{"role": "user", "content": "What now? (edited)"}],
    }
    del edited["cache"]
    path = f"/v1/preparations/{original['preparation_id']}/refresh"
    refreshed = post(client, path, edited)
    assert refreshed["attempt"] == 2
    report = refreshed["selection"]["cache"]
    assert report["previous_preparation_id"] == answers[0]["preparation_id"]
    assert report["prefix_kept"] is True
    assert report["breakpoints"] and all(b["ttl"] == "1h" for b in report["breakpoints"])
    assert markers(refreshed["frame"]) != []


def test_timeline_lists_the_turns_of_the_scope(make_client: AppFactory) -> None:
    """JSON, text and HTML views of the chain, oldest first; a turn that names a preparation
    of another scope starts a chain of its own; the breakdown links to the timeline."""
    wall = FakeWall()
    client = make_client(wall=wall)
    fields = body(cache=None)  # without ``cache`` the record keeps the turn all the same
    answers = converse(client, wall, fields, 5, change={3: lambda f: {**f, "tools": [tool("a")]}})
    ids = [a["preparation_id"] for a in answers]
    _usage(client, ids[4], "r4")
    path = f"/v1/preparations/{ids[4]}/timeline"
    timeline = client.get(path, headers={"accept": "application/json"})
    assert timeline.status_code == 200, timeline.text
    turns = timeline.json()["turns"]
    assert [t["preparation_id"] for t in turns] == ids
    assert [t["prefix_kept"] for t in turns] == [None, True, True, False, True]
    assert turns[3]["first_change"] == {
        "part": "tools",
        "index": 0,
        "change": "changed",
        "name": "a",
        "previous_name": "fetch",
        "role": None,
    }
    assert turns[4]["cached_input_tokens"] == 900 and turns[0]["cached_input_tokens"] is None
    assert all(
        t["total_input_tokens"] == a["budget"]["total_input_tokens"]
        for t, a in zip(turns, answers, strict=True)
    )
    text = client.get(path, headers={"accept": "text/plain"}).text
    numbers = [ln.split()[0] for ln in text.splitlines()[2:] if ln.startswith("   ")]
    assert numbers == ["1", "2", "3", "4", "5"]
    assert 'tool "a" in place of "fetch" (tools[0])' in text
    html = client.get(path, headers={"accept": "text/html"}).text
    assert "<svg" in html and html.count("<tr") == 1 + 5 and "tools[0]" in html
    assert "&quot;a&quot; in place of &quot;fetch&quot;" in html
    other = post(
        client,
        "/v1/prepare",
        body(cache={"previous_preparation_id": ids[4]}),
    )
    assert other["selection"]["cache"]["previous_preparation_id"] == ids[4]
    alone = client.get(
        f"/v1/preparations/{other['preparation_id']}/timeline",
        headers={"accept": "application/json"},
    ).json()["turns"]
    assert [t["preparation_id"] for t in alone] == [other["preparation_id"]]
    breakdown = client.get(f"/v1/preparations/{ids[4]}/breakdown", headers={"accept": "text/html"})
    assert 'href="timeline"' in breakdown.text
    assert client.get("/v1/preparations/prep_unknown/timeline").status_code == 404


@pytest.mark.parametrize(
    ("cache", "field"),
    [
        ({"ttl": "2h"}, "cache.ttl"),
        ({"breakpoints": "yes"}, "cache.breakpoints"),
        ({"retention": "forever"}, "cache.retention"),
        ({"previous_preparation_id": "not an id"}, "cache.previous_preparation_id"),
        ({"key": ""}, "cache.key"),
    ],
)
def test_invalid_cache_values_are_a_422_naming_the_field(
    make_client: AppFactory, cache: dict[str, Any], field: str
) -> None:
    response = make_client().post("/v1/prepare", json=body(cache=cache))
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert [e["loc"] for e in response.json()["errors"]] == [field]


def test_without_cache_the_answer_is_unchanged_but_the_turn_is_recorded(
    make_client: AppFactory,
) -> None:
    """A request without ``cache`` gets no ``selection.cache`` and no directives, yet its
    record keeps the turn: the next turn with ``cache`` is compared with it."""
    wall = FakeWall()
    client = make_client(wall=wall)
    fields = body(cache=None)
    plain = post(client, "/v1/prepare", fields)
    assert "cache" not in plain["selection"] and markers(plain["frame"]) == []
    stored = client.get(f"/v1/preparations/{plain['preparation_id']}").json()
    assert "cache" not in stored["selection"]
    wall.now += 60
    later = post(client, "/v1/prepare", {**fields, "cache": {"breakpoints": True}})
    assert later["selection"]["cache"]["previous_preparation_id"] == plain["preparation_id"]
    assert later["selection"]["cache"]["prefix_kept"] is True


def test_the_turn_after_a_refresh_is_compared_with_the_refreshed_frame(
    make_client: AppFactory,
) -> None:
    """A refresh that appended a message to the history is what was sent: the next turn,
    whose history leaves that message out, does not keep its prefix."""
    wall = FakeWall()
    client = make_client(wall=wall)
    fields = body()
    first = post(client, "/v1/prepare", fields)
    history = [{"role": "user", "content": "question 0"}, {"role": "assistant", "content": "a"}]
    refreshed_history = [*history, {"role": "user", "content": "a tool result"}]
    path = f"/v1/preparations/{first['preparation_id']}/refresh"
    post(client, path, {**fields, "history": refreshed_history})
    wall.now += 60
    after = post(client, "/v1/prepare", {**fields, "history": [*history, *history]})
    report = after["selection"]["cache"]
    assert report["previous_preparation_id"] == first["preparation_id"]
    assert report["prefix_kept"] is False
    assert report["first_change"] == {"part": "history", "index": 2}
