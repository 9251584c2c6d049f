"""Cache plans (core/cache.py): Anthropic breakpoints, OpenAI cache keys, prefix digests and the
turn-to-turn comparison, on whole assemblies through the engine and the renderers."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from context_assembly.core import cache
from context_assembly.core.request import PrepareRequest, Render, Scope
from context_assembly.core.sources import materialised_inputs, plan_sources
from context_assembly.engine import cache_minimum, run_assembly, to_response
from context_assembly.errors import InvalidError
from context_assembly.tokens.registry import ModelRegistry
from context_assembly.validation import parse_model
from hypothesis_budget import examples

NOW = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
TEST_MODEL = "claude-cachetest"


def registry_with_minimum(minimum: int | None) -> ModelRegistry:
    """The shipped registry plus a small Anthropic test model whose minimum is ``minimum``."""
    raw = resources.files("context_assembly.tokens").joinpath("data", "models.json").read_bytes()
    data = orjson.loads(raw)
    data["models"].append(
        {
            "name": TEST_MODEL,
            "provider": "anthropic",
            "tokenizer": "estimate",
            "context_window": 200_000,
            "max_output_tokens": 8_192,
            "min_cacheable_prefix": minimum,
        }
    )
    return ModelRegistry.from_json(orjson.dumps(data))


def tool(name: str, words: int = 20) -> dict[str, Any]:
    return {
        "name": name,
        "description": " ".join(f"{name}-word{i}" for i in range(words)),
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }


def history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}: " + "detail " * 30})
        messages.append({"role": "assistant", "content": f"answer {turn}: " + "reply " * 30})
    return messages


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": TEST_MODEL,
        "instructions": "You are a careful assistant. " * 40,
        "tools": [tool("search"), tool("fetch")],
        "history": history(2),
        "input": [{"role": "user", "content": "What now?"}],
        "assembly": {"layout": "stable-prefix"},
        "render": "anthropic",
        "cache": {"breakpoints": True},
    }
    base.update(fields)
    return {key: value for key, value in base.items() if value is not None}


SECRET = b"test secret, 16+"


def prepare(
    fields: dict[str, Any],
    registry: ModelRegistry,
    *,
    tenant: str = "t1",
    now: datetime = NOW,
    previous: cache.PrefixDigests | None = None,
    previous_id: str | None = None,
    key_secret: bytes = b"test secret, 16+",
) -> tuple[dict[str, Any], cache.CacheTurn]:
    """One turn: the answer as JSON data, and its cache turn."""
    request = parse_model(PrepareRequest, orjson.dumps(fields))
    setups = plan_sources(request)
    inputs = materialised_inputs(request, setups)
    assembly, ctx = run_assembly(request, setups, inputs, now=now, tenant=tenant, registry=registry)
    turn = cache.turn(
        request,
        assembly,
        model=ctx.model,
        minimum=cache_minimum(request, ctx, registry),
        tenant=tenant,
        previous_preparation_id=previous_id,
        previous=previous,
        key_secret=key_secret,
    )
    response = to_response(
        request, assembly, ctx, preparation_id="prep_test", expires_at=now, cache=turn
    )
    return orjson.loads(response.model_dump_json()), turn


def markers(frame: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every ``cache_control`` in an Anthropic body, with where it sits, in prompt order."""
    found: list[tuple[str, dict[str, Any]]] = []
    for item in frame.get("tools", []):
        if "cache_control" in item:
            found.append(("tools", item["cache_control"]))
    system = frame.get("system")
    if isinstance(system, list):
        found.extend(("system", b["cache_control"]) for b in system if "cache_control" in b)
    for message in frame["messages"]:
        for block in message["content"]:
            if "cache_control" in block:
                found.append(("messages", block["cache_control"]))
    return found


SHIPPED = registry_with_minimum(256)


# --------------------------------------------------------------------------- Anthropic body


def test_anthropic_body_carries_a_marker_at_each_planned_place() -> None:
    """Tools, system and the last history message are marked; the plan names the same three
    places with growing token figures; cacheable_tokens is the last one."""
    answer, _ = prepare(body(), SHIPPED)
    frame = answer["frame"]
    report = answer["selection"]["cache"]
    assert [b["after"] for b in report["breakpoints"]] == ["tools", "instructions", "history"]
    tokens = [b["tokens"] for b in report["breakpoints"]]
    assert tokens == sorted(tokens) and tokens[0] == answer["budget"]["tools_tokens"]
    assert tokens[-1] == answer["prefix_tokens"] == report["cacheable_tokens"]
    assert report["skipped"] == []
    assert [place for place, _ in markers(frame)] == ["tools", "system", "messages"]
    assert all(marker == {"type": "ephemeral"} for _, marker in markers(frame))
    assert "cache_control" in frame["tools"][-1]
    assert [b["text"] for b in frame["system"]] == [body()["instructions"]]
    # The marked message block is the last history message's (the assistant's last answer),
    # not the per-turn developer message or the input after it.
    marked = [
        block
        for message in frame["messages"]
        for block in message["content"]
        if "cache_control" in block
    ]
    assert marked[0]["text"] == history(2)[-1]["content"]


def test_the_history_marker_is_on_the_last_block_of_the_last_history_message() -> None:
    """A history message of several blocks is marked on its last one (the prefix ends there)."""
    parts = [{"type": "text", "text": "first part"}, {"type": "text", "text": "last part"}]
    last = {"role": "assistant", "content": parts}
    answer, _ = prepare(body(history=[*history(1), last]), SHIPPED)
    blocks = [b for m in answer["frame"]["messages"] for b in m["content"]]
    marked = [b["text"] for b in blocks if "cache_control" in b]
    assert marked == ["last part"]


def test_one_hour_ttl_is_on_every_marker() -> None:
    answer, _ = prepare(body(cache={"breakpoints": True, "ttl": "1h"}), SHIPPED)
    found = markers(answer["frame"])
    assert len(found) == 3
    assert all(marker == {"type": "ephemeral", "ttl": "1h"} for _, marker in found)
    assert {b["ttl"] for b in answer["selection"]["cache"]["breakpoints"]} == {"1h"}


@pytest.mark.parametrize("after", ["tools", "instructions", "history"])
def test_a_marker_is_placed_exactly_from_the_model_minimum(after: str) -> None:
    """The same request on each side of a small model minimum: at the figure the marker is
    placed, one token above it the marker is skipped as below_minimum."""
    fields = body()
    planned, _ = prepare(fields, registry_with_minimum(1))
    figure = next(
        b["tokens"] for b in planned["selection"]["cache"]["breakpoints"] if b["after"] == after
    )
    at, _ = prepare(fields, registry_with_minimum(figure))
    above, _ = prepare(fields, registry_with_minimum(figure + 1))
    assert after in [b["after"] for b in at["selection"]["cache"]["breakpoints"]]
    assert {"after": after, "reason": "below_minimum"} in above["selection"]["cache"]["skipped"]
    assert after not in [b["after"] for b in above["selection"]["cache"]["breakpoints"]]
    assert len(markers(above["frame"])) == len(markers(at["frame"])) - 1
    for answer in (at, above):
        placed = answer["selection"]["cache"]["breakpoints"]
        assert len(markers(answer["frame"])) == len(placed)
        assert answer["selection"]["cache"]["cacheable_tokens"] == (
            placed[-1]["tokens"] if placed else 0
        )


def test_a_model_without_caching_gets_no_marker() -> None:
    answer, _ = prepare(body(), registry_with_minimum(None))
    report = answer["selection"]["cache"]
    assert report["breakpoints"] == [] and report["cacheable_tokens"] == 0
    assert {s["reason"] for s in report["skipped"]} == {"below_minimum"}
    assert markers(answer["frame"]) == []
    assert isinstance(answer["frame"]["system"], str)


def test_an_unknown_model_takes_the_largest_minimum_of_the_provider() -> None:
    registry = ModelRegistry.load()
    largest = max(p.min_cacheable_prefix or 0 for p in registry.all() if p.provider == "anthropic")
    assert registry.min_cacheable_prefix("claude-unreleased-9", "anthropic") == largest
    assert registry.min_cacheable_prefix("claude-3-5-haiku-20241022", "anthropic") == 2048
    assert registry.min_cacheable_prefix("gpt-4", "openai") is None


def test_legacy_layout_marks_only_the_tools() -> None:
    """In legacy the leading message holds the date: only the tools marker can be stable."""
    answer, _ = prepare(body(assembly={"layout": "legacy"}), SHIPPED)
    report = answer["selection"]["cache"]
    assert [b["after"] for b in report["breakpoints"]] == ["tools"]
    assert report["skipped"] == [
        {"after": "instructions", "reason": "unstable_in_layout"},
        {"after": "history", "reason": "unstable_in_layout"},
    ]
    assert [place for place, _ in markers(answer["frame"])] == ["tools"]


def test_without_history_the_system_marker_leaves_the_per_turn_text_unmarked() -> None:
    """With no history the per-turn developer message joins the system prompt: the marker goes
    on the instructions' block, not on the block with the date line."""
    answer, _ = prepare(body(history=[]), SHIPPED)
    system = answer["frame"]["system"]
    assert len(system) == 2
    assert "cache_control" in system[0] and "cache_control" not in system[1]
    assert system[1]["text"].startswith("Current date and time")
    assert [b["after"] for b in answer["selection"]["cache"]["breakpoints"]] == [
        "tools",
        "instructions",
    ]


@pytest.mark.parametrize("render", ["neutral", "gemini", "openai-chat", "openai-responses"])
def test_other_renderers_carry_no_marker(render: Render) -> None:
    """Only the Anthropic body is marked; neutral keeps the plan in the manifest only."""
    answer, _ = prepare(body(render=render), SHIPPED)
    assert "cache_control" not in orjson.dumps(answer["frame"]).decode()
    planned = answer["selection"]["cache"]["breakpoints"]
    assert bool(planned) == (render == "neutral")


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    return body(
        instructions=draw(st.sampled_from(["", "Be brief.", "You are careful. " * 60])),
        tools=[tool(f"t{i}", draw(st.integers(0, 80))) for i in range(draw(st.integers(0, 4)))],
        history=history(draw(st.integers(0, 4))),
        assembly={"layout": draw(st.sampled_from(["legacy", "stable-prefix"]))},
        cache={"breakpoints": True, "ttl": draw(st.sampled_from(["5m", "1h"]))},
    )


@settings(max_examples=examples(40), deadline=None)
@given(fields=requests(), minimum=st.integers(1, 1500))
def test_planned_markers_respect_the_provider_rules(fields: dict[str, Any], minimum: int) -> None:
    """At most four markers, none below the minimum, growing figures, the request's ttl on each
    (so a 1h marker never follows a 5m one), one marker in the body per planned breakpoint, and
    every candidate either placed or skipped."""
    answer, _ = prepare(fields, registry_with_minimum(minimum))
    report = answer["selection"]["cache"]
    placed = report["breakpoints"]
    assert len(placed) <= cache.MAX_BREAKPOINTS
    assert all(b["tokens"] >= minimum for b in placed)
    tokens = [b["tokens"] for b in placed]
    assert tokens == sorted(tokens)
    found = markers(answer["frame"])
    assert len(found) == len(placed)
    ttl = fields["cache"]["ttl"]
    assert all(b["ttl"] == ttl for b in placed)
    assert all(marker.get("ttl", "5m") == ttl for _, marker in found)
    afters = [b["after"] for b in placed] + [s["after"] for s in report["skipped"]]
    legacy = fields["assembly"]["layout"] == "legacy"
    expected = (
        (["tools"] if fields["tools"] else [])
        # The leading system message: the instructions, and in legacy also the date line.
        + (["instructions"] if fields["instructions"] or legacy else [])
        + (["history"] if fields["history"] else [])
    )
    assert sorted(afters) == sorted(expected)
    if legacy:
        assert all(b["after"] == "tools" for b in placed)
    assert report["cacheable_tokens"] == (tokens[-1] if tokens else 0)


@settings(max_examples=examples(100), deadline=None)
@given(
    figures=st.lists(st.integers(0, 5000), min_size=0, max_size=8),
    minimum=st.none() | st.integers(1, 5000),
    legacy=st.booleans(),
)
def test_plan_breakpoints_never_exceeds_the_limit(
    figures: list[int], minimum: int | None, legacy: bool
) -> None:
    """Over any number of candidates (more than the renderer ever offers): at most four are
    placed, the fifth eligible one is skipped with ``limit``, and none is both or neither."""
    afters = ("tools", "instructions", "history")
    found = [
        cache.Candidate(afters[i % 3], tokens, i)  # type: ignore[arg-type]
        for i, tokens in enumerate(sorted(figures))
    ]
    placed, skipped = cache.plan_breakpoints(found, legacy=legacy, minimum=minimum)
    assert len(placed) + len(skipped) == len(found)
    assert len(placed) <= cache.MAX_BREAKPOINTS
    eligible = [
        c
        for c in found
        if minimum is not None and c.tokens >= minimum and not (legacy and c.after != "tools")
    ]
    assert placed == eligible[: cache.MAX_BREAKPOINTS]
    assert sum(reason == "limit" for _, reason in skipped) == max(len(eligible) - 4, 0)


# --------------------------------------------------------------------------- OpenAI keys


@pytest.mark.parametrize("render", ["openai-chat", "openai-responses"])
def test_auto_key_is_stable_per_tenant_and_scope(render: Render) -> None:
    def key(tenant: str, scope: dict[str, Any], turns: int) -> str:
        fields = body(
            model="gpt-4o",
            render=render,
            scope=scope,
            history=history(turns),
            cache={"key": "auto"},
        )
        answer, _ = prepare(fields, ModelRegistry.load(), tenant=tenant)
        value = answer["frame"]["prompt_cache_key"]
        assert isinstance(value, str)
        return value

    scope = {"account_id": "acct-secret-42", "task_id": "task-7"}
    first = key("t1", scope, 1)
    assert key("t1", scope, 3) == first  # another turn of the same conversation
    assert key("t1", {**scope, "task_id": "task-8"}, 1) != first
    assert key("t2", scope, 1) != first
    assert "acct-secret-42" not in first and "task-7" not in first and len(first) <= 64


def test_auto_key_is_an_hmac_under_the_server_secret() -> None:
    """The automatic key is HMAC-SHA256(secret, [tenant, scope]): another secret gives another
    key, and without the secret the plain hash of tenant and scope does not give it."""
    scope = {"account_id": "acct-1"}
    fields = body(model="gpt-4o", render="openai-chat", scope=scope, cache={"key": "auto"})
    ours, _ = prepare(fields, ModelRegistry.load(), tenant="t1")
    theirs, _ = prepare(fields, ModelRegistry.load(), tenant="t1", key_secret=b"another secret!!")
    raw = orjson.dumps(
        ["t1", Scope.model_validate(scope).model_dump(mode="json")], option=orjson.OPT_SORT_KEYS
    )
    assert (
        ours["frame"]["prompt_cache_key"]
        == "ca-" + hmac.new(SECRET, raw, hashlib.sha256).hexdigest()[:32]
    )
    assert theirs["frame"]["prompt_cache_key"] != ours["frame"]["prompt_cache_key"]
    assert ours["frame"]["prompt_cache_key"] != "ca-" + hashlib.sha256(raw).hexdigest()[:32]


@pytest.mark.parametrize("render", ["openai-chat", "openai-responses"])
def test_given_key_and_retention_are_passed_through(render: Render) -> None:
    fields = body(model="gpt-4o", render=render, cache={"key": "conv-1", "retention": "24h"})
    answer, _ = prepare(fields, ModelRegistry.load())
    assert answer["frame"]["prompt_cache_key"] == "conv-1"
    assert answer["frame"]["prompt_cache_retention"] == "24h"


def test_openai_cacheable_tokens_follow_the_provider_rule() -> None:
    """From 1,024 up in steps of 128 over the stable prefix; 0 in legacy."""
    fields = body(model="gpt-4o", render="openai-chat", history=history(8), cache={"key": "auto"})
    answer, _ = prepare(fields, ModelRegistry.load())
    prefix = answer["prefix_tokens"]
    cacheable = answer["selection"]["cache"]["cacheable_tokens"]
    assert prefix >= 1024
    assert 1024 <= cacheable <= prefix < cacheable + 128 and (cacheable - 1024) % 128 == 0
    legacy, _ = prepare({**fields, "assembly": {"layout": "legacy"}}, ModelRegistry.load())
    assert legacy["selection"]["cache"]["cacheable_tokens"] == 0
    assert cache.openai_cacheable(1023, 1024) == 0
    assert cache.openai_cacheable(1024 + 127, 1024) == 1024
    assert cache.openai_cacheable(1024 + 128, 1024) == 1152
    assert cache.openai_cacheable(5000, None) == 0


# --------------------------------------------------------------------------- absent cache


@pytest.mark.parametrize("render", ["neutral", "openai-chat", "openai-responses", "anthropic"])
def test_without_cache_the_answer_is_unchanged(render: Render) -> None:
    """No ``cache``: no directive, no ``selection.cache``, and a request dump without the key
    (so the hashes kept over it stay as they were), even when a cache turn is handed over."""
    fields = body(render=render, cache=None)
    request = parse_model(PrepareRequest, orjson.dumps(fields))
    assert "cache" not in request.model_dump(mode="json")
    setups = plan_sources(request)
    inputs = materialised_inputs(request, setups)
    assembly, ctx = run_assembly(request, setups, inputs, now=NOW, tenant="t1", registry=SHIPPED)
    turn = cache.turn(
        request,
        assembly,
        model=ctx.model,
        minimum=cache_minimum(request, ctx, SHIPPED),
        tenant="t1",
        previous_preparation_id=None,
        previous=None,
        key_secret=SECRET,
    )
    plain = to_response(request, assembly, ctx, preparation_id="prep_x", expires_at=NOW)
    handed = to_response(
        request, assembly, ctx, preparation_id="prep_x", expires_at=NOW, cache=turn
    )
    text = plain.model_dump_json()
    assert handed.model_dump_json() == text
    for word in ("cache_control", "prompt_cache", '"cache"'):
        assert word not in text


def test_request_cache_defaults_and_explicit_null_previous() -> None:
    def options(raw: dict[str, Any]) -> Any:
        return parse_model(PrepareRequest, orjson.dumps(body(cache=raw))).cache

    absent = options({})
    assert (absent.breakpoints, absent.ttl, absent.key, absent.retention) == (
        False,
        "5m",
        None,
        None,
    )
    assert not absent.previous_given
    first = options({"previous_preparation_id": None})
    assert first.previous_given and first.previous_preparation_id is None
    named = options({"previous_preparation_id": "prep_abc-DEF_1"})
    assert named.previous_given and named.previous_preparation_id == "prep_abc-DEF_1"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"breakpoints": "yes"}, "cache.breakpoints"),
        ({"ttl": "10m"}, "cache.ttl"),
        ({"key": ""}, "cache.key"),
        ({"key": "k" * 65}, "cache.key"),
        ({"key": 7}, "cache.key"),
        ({"retention": "1h"}, "cache.retention"),
        ({"previous_preparation_id": "run_1"}, "cache.previous_preparation_id"),
        ({"previous_preparation_id": "prep_" + "x" * 200}, "cache.previous_preparation_id"),
        ({"unknown": 1}, "cache.unknown"),
        ("on", "cache"),
    ],
)
def test_invalid_cache_values_name_the_field(raw: Any, field: str) -> None:
    with pytest.raises(InvalidError) as caught:
        parse_model(PrepareRequest, orjson.dumps(body(cache=raw)))
    assert [item["loc"] for item in caught.value.extensions["errors"]] == [field]


# --------------------------------------------------------------------------- turn to turn


def conversation(
    turns: int, layout: str, change: dict[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The reports of a ``turns``-turn conversation; ``change[n]`` edits turn ``n``'s fields.

    Each turn appends the previous exchange to the history and is a minute after the one before;
    a turn's edits stay in force in the turns after it, as a host's would."""
    reports: list[dict[str, Any]] = []
    previous: cache.PrefixDigests | None = None
    fields = body(history=[], assembly={"layout": layout})
    for number in range(turns):
        edits = dict(change.get(number, {}))
        if "history" in edits:
            edits["history"] = edits["history"](fields["history"])
        fields = {**fields, **edits}
        answer, turn = prepare(
            fields,
            SHIPPED,
            now=NOW + timedelta(minutes=number),
            previous=previous,
            previous_id=f"prep_{number - 1}" if number else None,
        )
        reports.append(answer["selection"]["cache"])
        previous = turn.digests
        fields = {
            **fields,
            "history": [
                *fields["history"],
                {"role": "user", "content": f"question {number}"},
                {"role": "assistant", "content": f"answer {number}"},
            ],
        }
    return reports


def test_twenty_turns_keep_the_prefix_in_stable_prefix_and_not_in_legacy() -> None:
    stable = conversation(20, "stable-prefix", {})
    assert stable[0]["prefix_kept"] is None and stable[0]["previous_preparation_id"] is None
    assert all(r["prefix_kept"] is True and r["first_change"] is None for r in stable[1:])
    assert [r["previous_preparation_id"] for r in stable[1:]] == [f"prep_{n}" for n in range(19)]
    legacy = conversation(20, "legacy", {})
    assert all(r["prefix_kept"] is False for r in legacy[1:])
    assert all(r["first_change"] == {"part": "instructions", "index": None} for r in legacy[1:])


def _rewrite(index: int) -> Any:
    def edit(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        edited = list(messages)
        edited[index] = {**edited[index], "content": "rewritten"}
        return edited

    return edit


@pytest.mark.parametrize(
    ("change", "first_change"),
    [
        ({"tools": [tool("search"), tool("fetch"), tool("zeta")]}, {"part": "tools", "index": 2}),
        ({"tools": [tool("search"), tool("alpha")]}, {"part": "tools", "index": 0}),
        ({"tools": [tool("search", 21), tool("fetch")]}, {"part": "tools", "index": 1}),
        ({"instructions": "Other instructions."}, {"part": "instructions", "index": None}),
        ({"history": _rewrite(5)}, {"part": "history", "index": 5}),
        ({"history": lambda messages: messages[2:]}, {"part": "history", "index": 0}),
        ({"model": "claude-sonnet-4"}, {"part": "model", "index": None}),
        ({"render": "neutral"}, {"part": "model", "index": None}),
        ({"assembly": {"layout": "legacy"}}, {"part": "layout", "index": None}),
    ],
)
def test_a_change_is_named_with_its_part_and_index(
    change: dict[str, Any], first_change: dict[str, Any]
) -> None:
    """Turn 6 of a stable-prefix conversation changes one part; the turns before and after it
    keep their prefix. Tools are in the frame's order (sorted by name in stable-prefix)."""
    reports = conversation(8, "stable-prefix", {6: change})
    assert all(r["prefix_kept"] for r in reports[1:6])
    assert reports[6]["prefix_kept"] is False and reports[6]["first_change"] == first_change
    # The turn after keeps the changed prefix (in legacy, where the date opens it, it cannot).
    assert reports[7]["prefix_kept"] is (first_change["part"] != "layout")


def test_compare_without_previous_and_with_shorter_history() -> None:
    base = cache.PrefixDigests("m", "l", ("a", "b"), "i", ("h0", "h1", "h2"))
    assert cache.compare(None, base) == (None, None)
    assert cache.compare(base, base) == (True, None)
    grown = cache.PrefixDigests("m", "l", ("a", "b"), "i", ("h0", "h1", "h2", "h3"))
    assert cache.compare(base, grown) == (True, None)
    kept, change = cache.compare(grown, base)
    assert kept is False and change is not None and (change.part, change.index) == ("history", 3)


def test_digests_hold_no_text() -> None:
    """A record keeps hashes only: no instruction, tool or history text in the digests."""
    _, turn = prepare(body(), SHIPPED)
    kept = TypeAdapter(cache.PrefixDigests).dump_json(turn.digests).decode()
    for text in ("careful assistant", "search-word", "question 0", "answer 1", TEST_MODEL):
        assert text not in kept


# --------------------------------------------------------------------------- usage


@pytest.mark.parametrize(
    ("render", "options", "lifetime"),
    [
        ("anthropic", {}, timedelta(minutes=5)),
        ("anthropic", {"ttl": "1h"}, timedelta(hours=1)),
        ("openai-chat", {}, timedelta(minutes=5)),
        ("openai-responses", {"retention": "in_memory"}, timedelta(minutes=5)),
        ("openai-chat", {"retention": "24h"}, timedelta(hours=24)),
        ("gemini", {}, None),
    ],
)
def test_expected_cached_tokens_within_the_provider_lifetime(
    render: Render, options: dict[str, Any], lifetime: timedelta | None
) -> None:
    opts = parse_model(PrepareRequest, orjson.dumps(body(cache=options))).cache
    assert opts is not None
    assert cache.cache_lifetime(render, opts) == lifetime

    def expected(kept: bool | None, since: timedelta) -> int:
        return cache.expected_cached_tokens(
            prefix_kept=kept,
            cacheable_tokens=3000,
            previous_cacheable_tokens=2500,
            since_previous=since,
            lifetime=cache.cache_lifetime(render, opts),
        )

    if lifetime is None:
        assert expected(True, timedelta(0)) == 0
        return
    assert expected(True, lifetime) == 2500
    assert expected(True, lifetime + timedelta(seconds=1)) == 0
    assert expected(False, timedelta(0)) == 0
    assert expected(None, timedelta(0)) == 0
