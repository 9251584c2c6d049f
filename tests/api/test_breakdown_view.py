"""The breakdown page against the stored preparation it shows (in-process app, real SQLite
file): the parts of the window add up to the capacity and the page says how remaining, data
and blocks relate; parts are named by what they hold and absent when empty; the cache section
gives the plan, the previous turn, the first change by name and the cause of the expected and
reported cached tokens, in HTML and in text; each usage report's cost per bucket ("no price"
without one) and what a miss billed again and cost; nothing of the request's texts is shown;
the stylesheet keeps the page within a 360 px screen (checked by eye in a browser as well)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from api_support import AppFactory, FakeWall, basic_request
from page_support import (
    INSTRUCTIONS,
    Page,
    converse,
    new_scope,
    next_history,
    ok,
    prepare,
    report,
    tool,
    turn_body,
)

# The parts of the window in frame order, each with the stored budget's field (written out
# here, not taken from the module under test); "unused" is what the data left of the
# remaining tokens. The date line's label depends on the legacy views (see below).
PARTS = (
    ("instructions", "instructions_tokens"),
    (None, "legacy_data_tokens"),
    ("tools", "tools_tokens"),
    ("history", "history_tokens"),
    ("input", "input_tokens"),
    ("data", "data_tokens"),
    ("unused", None),
    ("response reserve", "response_reserve"),
    ("reasoning reserve", "reasoning_reserve_tokens"),
)
MARKS = "ILTHUDFRQ"  # the text view's mark of each part, in the same order


def _parts(budget: dict[str, int], date_label: str) -> list[tuple[str, int, str]]:
    """``(label, tokens, mark)`` of the non-empty parts, computed from the stored budget."""
    unused = budget["remaining_tokens"] - budget["data_tokens"]
    found = [
        (label or date_label, budget[key] if key else unused, mark)
        for (label, key), mark in zip(PARTS, MARKS, strict=True)
    ]
    return [part for part in found if part[1] > 0]


def _share(tokens: int, capacity: int) -> str:
    share = 100 * tokens / capacity
    return f"{share:.2f}%" if share < 1 else f"{share:.1f}%"


def _request() -> dict[str, Any]:
    """Blocks that meet most decisions; every other entry needs the one before it and the
    receipt."""
    body = basic_request()
    body["contributions"][0]["blocks"] += [
        {
            "id": f"entry-{i}",
            "text": f"Entry {i}. " * (40 * i + 1),
            "priority": i,
            "dependencies": [f"memory/entry-{i - 1}", "memory/receipt"] if i % 2 else [],
        }
        for i in range(6)
    ]
    body["assembly"] = {"layout": "stable-prefix", "max_data_tokens": 300}
    body["response_reserve"] = 1000
    return body


def _views(client: Any, prep_id: str) -> tuple[dict[str, Any], Page, list[str]]:
    """The stored JSON, the HTML page and the text lines of one preparation."""
    stored = ok(client.get(f"/v1/preparations/{prep_id}"))
    path = f"/v1/preparations/{prep_id}/breakdown"
    html = client.get(path, headers={"Accept": "text/html"})
    assert html.headers["content-type"].startswith("text/html")
    text = client.get(path, headers={"Accept": "text/plain"}).text
    return stored, Page(html.text), text.splitlines()


def test_the_parts_add_up_to_the_capacity_and_remaining_to_data_and_unused(
    make_client: AppFactory,
) -> None:
    """Computed from the stored JSON: the window's non-empty parts sum to the capacity (the
    table's rows, its stacked bar and the text's lines); remaining is data + unused; the data
    message is its entered blocks plus the framing between them, which the page states."""
    client = make_client()
    prep = prepare(client, _request())
    stored, page, lines = _views(client, prep["preparation_id"])
    budget = stored["budget"]
    capacity = budget["capacity"]
    parts = _parts(budget, "date line")
    assert sum(tokens for _, tokens, _ in parts) == capacity
    assert page.table("budget")[1:] == [
        [label, str(tokens), _share(tokens, capacity), ""] for label, tokens, _ in parts
    ] + [["capacity", str(capacity), "100%", ""]]
    segments = [e for e in page.elements if "seg" in e.cls()]
    assert [s.attrs["title"] for s in segments] == [
        f"{label}: {tokens} tokens, {_share(tokens, capacity)}" for label, tokens, _ in parts
    ]
    unused = budget["remaining_tokens"] - budget["data_tokens"]
    said = page.text(page.by_id("remaining-words"))
    assert said.startswith(
        f"remaining {budget['remaining_tokens']} = data {budget['data_tokens']} + unused {unused}:"
    )
    entered = [b for b in stored["selection"]["blocks"] if b["status"] != "omitted"]
    assert {b["status"] for b in stored["selection"]["blocks"]} >= {"selected", "omitted"}
    entered_tokens = sum(b["tokens"] for b in entered)
    rest = budget["data_tokens"] - entered_tokens
    data = page.text(page.by_id("data-words"))
    sign = f"+ {rest}" if rest >= 0 else f"- {-rest}"
    assert f"= {entered_tokens} in the {len(entered)} entered blocks {sign}" in data
    assert f"at most {budget['data_limit_tokens']}:" in data
    blocks = page.table("blocks")
    assert blocks[-1][0] == "entered blocks" and blocks[-1][3] == str(entered_tokens)
    # The text view: the same parts with their marks, filling a 60-character window.
    window = next(ln for ln in lines if ln.startswith("  window ["))
    bar = window[window.index("[") + 1 : window.index("]")]
    assert len(bar) == 60 and "".join(dict.fromkeys(bar)) == "".join(m for _, _, m in parts)
    for label, tokens, mark in parts:
        assert f"  {mark} {label:<20} {tokens:>9}  {_share(tokens, capacity):>7}" in lines
    assert f"  = {'capacity':<20} {capacity:>9}     100%" in lines
    flowing = " ".join(" ".join(lines).split())  # the text view wraps long lines
    assert said in flowing and data in flowing
    start = lines.index(f"  = {'capacity':<20} {capacity:>9}     100%")
    words = lines[start + 1 : lines.index("", start)]
    assert len(words) >= 2 and all(len(line) <= 96 for line in words)


def test_parts_are_named_by_what_they_hold_and_left_out_when_empty(
    make_client: AppFactory,
) -> None:
    """Without a legacy view the per-turn part is the date line alone; a plugin's content
    that no source replaces is named; an empty part (no history, no reasoning reserve) has no
    row, no segment and no mark."""
    client = make_client()
    plain = prepare(client, basic_request(history=[]))
    stored, page, lines = _views(client, plain["preparation_id"])
    labels = [row[0] for row in page.table("budget")[1:]]
    assert "date line" in labels and not any("legacy" in label for label in labels)
    assert "history" not in labels and "reasoning reserve" not in labels
    assert stored["budget"]["history_tokens"] == stored["budget"]["reasoning_reserve_tokens"] == 0
    assert not any(ln.startswith(("  H ", "  Q ")) for ln in lines)
    plugins = [
        {"name": "memory", "instructions": "Saved entries."},
        {"name": "notes", "content": "Meeting at noon."},  # a legacy view: no source replaces it
    ]
    viewed = prepare(client, basic_request(plugins=plugins))
    page = _views(client, viewed["preparation_id"])[1]
    labels = [row[0] for row in page.table("budget")[1:]]
    assert "date line + legacy views (notes)" in labels


def _conversation(client: Any, wall: FakeWall) -> tuple[list[str], dict[str, Any]]:
    """Two turns that keep their prefix, then a third whose ``search`` tool changed; the third
    turn's body (for the next turn)."""
    body = turn_body(new_scope())
    ids = converse(client, wall, body, 2)
    body = next_history(next_history(body, 0), 1)
    body["tools"] = [tool("search", 210), tool("fetch")]
    ids.append(prepare(client, body)["preparation_id"])
    return ids, body


def test_the_cache_section_names_the_first_change_and_the_cause(
    make_client: AppFactory,
) -> None:
    """The turn that missed the cache: its plan (each breakpoint, where and with which ttl),
    the previous turn with its prefix not kept, the first change by the tool's name, expected
    0 because the prefix changed, and the link to the timeline; the same in the text view."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids, _ = _conversation(client, wall)
    stored, page, lines = _views(client, ids[2])
    plan = stored["selection"]["cache"]
    assert plan["prefix_kept"] is False and plan["first_change"] == {"part": "tools", "index": 1}
    facts = page.facts("cache-facts")
    # Tools are laid out by name in stable-prefix: fetch, then search (index 1).
    change = 'tool "search" changed (tools[1])'
    assert facts["first change"] == change
    assert facts["previous turn"] == f"{ids[1]}: prefix not kept"
    previous = next(e for e in page.elements if e.tag == "a" and page.text(e) == ids[1])
    assert previous.attrs["href"] == f"../{ids[1]}/breakdown"
    assert facts["expected cached"] == f"0: the prefix changed: {change}"
    assert facts["miss"] == "prefix changed"
    assert facts["plan"] == "render anthropic"
    breakpoints = [
        f"after {b['after']}"
        + ("" if b.get("message") is None else f" (ends frame message {b['message']})")
        + f": {b['tokens']} tokens up to it, ttl {b['ttl']}"
        for b in plan["breakpoints"]
    ]
    assert len(breakpoints) == 3 and facts["breakpoints"] == " | ".join(breakpoints)
    assert page.by_id("timeline").attrs["href"] == "timeline"
    assert "(turn 3)" in page.text(page.by_id("timeline").parent or page.by_id("timeline"))
    text = "\n".join(lines)
    assert f"  first change:     {change}" in lines
    assert f"  expected cached:  0: the prefix changed: {change}" in lines
    for line in breakpoints:
        assert f"    - {line}" in lines
    assert f"GET /v1/preparations/{ids[2]}/timeline (turn 3)" in text


def test_a_provider_side_miss_is_told_apart_from_a_prefix_change(
    make_client: AppFactory,
) -> None:
    """A kept prefix within the cache lifetime expects what the previous turn cached; a report
    of fewer cached tokens is a provider-side miss, one of as many is as expected."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids, body = _conversation(client, wall)
    wall.now += 60
    fourth = prepare(client, next_history(body, 2))
    expected = report(client, fourth["preparation_id"], 0)["accounting"]["last"][
        "expected_cached_tokens"
    ]
    assert expected > 0
    page = _views(client, fourth["preparation_id"])[1]
    facts = page.facts("cache-facts")
    assert facts["previous turn"] == f"{ids[2]}: prefix kept" and "first change" not in facts
    assert facts["expected cached"].startswith(f"{expected}: the prefix the previous turn cached")
    assert facts["reported cached"].startswith(f"0: {expected} fewer than expected: provider-side")
    assert facts["miss"] == "provider did not cache"
    report(client, ids[1], 10**6, "r-more")  # more than expected: not a miss
    facts = _views(client, ids[1])[1].facts("cache-facts")
    assert "more than expected" in facts["reported cached"] and "miss" not in facts


def _edit_history(body: dict[str, Any]) -> dict[str, Any]:
    history = list(body["history"])
    history[1] = {"role": "assistant", "content": "rewritten"}
    return {**body, "history": history}


@pytest.mark.parametrize(
    ("edit", "change", "expected"),
    [
        (
            lambda b: {**b, "tools": [*b["tools"], tool("zeta")]},
            'tool "zeta" added (tools[2])',
            'the prefix changed: tool "zeta" added (tools[2])',
        ),
        (
            lambda b: {**b, "tools": [tool("fetch")]},
            'tool "search" removed (tools[1])',
            "the prefix changed",
        ),
        (
            lambda b: {**b, "tools": [tool("fetch"), tool("scan")]},
            'tool "scan" in place of "search" (tools[1])',
            "the prefix changed",
        ),
        (
            lambda b: {**b, "tools": [*b["tools"], tool("calendar")]},
            'tool "calendar" added (tools[0])',
            "the prefix changed",
        ),
        (
            lambda b: {**b, "tools": [tool("search")]},
            'tool "fetch" removed (tools[0])',
            "the prefix changed",
        ),
        (_edit_history, "history message 1 (assistant) changed", "the prefix changed"),
        (
            lambda b: {**b, "history": b["history"][:1]},
            "history message 1 removed (the history is shorter)",
            "the prefix changed",
        ),
        (
            lambda b: {**b, "instructions": INSTRUCTIONS + "Be brief."},
            "instructions changed",
            "the prefix changed: instructions changed",
        ),
        (
            lambda b: {**b, "model": "claude-opus-4-1"},
            "model claude-sonnet-4-5 (anthropic) → claude-opus-4-1 (anthropic)",
            "the prefix changed",
        ),
    ],
)
def test_each_first_change_is_named(
    make_client: AppFactory, edit: Any, change: str, expected: str
) -> None:
    """Tools by name (added, removed, replaced), history messages by index and role, the
    instructions, the model with its render target: names only, never texts."""
    wall = FakeWall()
    client = make_client(wall=wall)
    body = turn_body(new_scope())
    ids = converse(client, wall, body, 2)
    body = edit(next_history(next_history(body, 0), 1))
    prep = prepare(client, body)
    facts = _views(client, prep["preparation_id"])[1].facts("cache-facts")
    assert facts["previous turn"] == f"{ids[1]}: prefix not kept"
    assert facts["first change"] == change
    assert facts["expected cached"].startswith(f"0: {expected}")


def test_an_elapsed_cache_lifetime_is_the_cause(make_client: AppFactory) -> None:
    """Six minutes after the previous turn a 5-minute cache has expired: expected 0, with the
    time since the previous turn and the lifetime in words; a 1-hour ttl still expects."""
    wall = FakeWall()
    client = make_client(wall=wall)
    body = turn_body(new_scope())
    prepare(client, body)
    wall.now += 360
    late = prepare(client, next_history(body, 0))
    facts = _views(client, late["preparation_id"])[1].facts("cache-facts")
    assert facts["expected cached"] == (
        "0: 6 min since the previous turn: longer than the provider keeps a cached prefix (5 min)"
    )
    assert facts["miss"] == "cache expired"
    hour = turn_body(new_scope(), cache={"breakpoints": True, "ttl": "1h"})
    prepare(client, hour)
    wall.now += 360
    kept = prepare(client, next_history(hour, 0))
    facts = _views(client, kept["preparation_id"])[1].facts("cache-facts")
    assert re.fullmatch(
        r"\d+: the prefix the previous turn cached, 6 min earlier \(the provider keeps it 1 h\)",
        facts["expected cached"],
    ), facts["expected cached"]


def test_a_prefix_below_the_minimum_and_a_first_turn_are_causes(make_client: AppFactory) -> None:
    """A short prefix places no marker (skipped: below the minimum) and expects nothing, saying
    so with the model's minimum; a first turn expects nothing for want of a previous turn."""
    wall = FakeWall()
    client = make_client(wall=wall)
    body = turn_body(new_scope(), instructions="Be brief.", tools=None)
    first = prepare(client, body)
    facts = _views(client, first["preparation_id"])[1].facts("cache-facts")
    assert facts["previous turn"] == "none: the first turn of its conversation"
    page = _views(client, first["preparation_id"])[1]
    assert not any(e.attrs.get("id") in ("blocks", "sources") for e in page.elements)
    assert "No block: no source offered any." in page.text(page.elements[0])
    assert facts["expected cached"] == (
        "0: the first turn of its conversation: nothing was cached before it"
    )
    wall.now += 60
    second = prepare(client, next_history(body, 0))
    plan = second["selection"]["cache"]
    assert plan["cacheable_tokens"] == 0 and plan["breakpoints"] == []
    facts = _views(client, second["preparation_id"])[1].facts("cache-facts")
    assert facts["skipped"].startswith("after instructions: the tokens up to it are below")
    prefix = second["prefix_tokens"]
    assert facts["expected cached"] == (
        f"0: the stable prefix ({prefix} tokens) is below the model's minimum cacheable "
        "length (1024)"
    )
    assert facts["cacheable"] == f"0 of the {prefix}-token stable prefix (model minimum 1024)"


def test_the_openai_key_and_a_request_without_cache(make_client: AppFactory) -> None:
    """An OpenAI render shows its prompt_cache_key and retention; a request without ``cache``
    says that no directive was added, and is still compared with its previous turn."""
    client = make_client()
    scope = {"task_id": "conversation-7"}
    body = basic_request(
        render="openai-chat", scope=scope, cache={"key": "conversation-7", "retention": "24h"}
    )
    prep = prepare(client, body)
    facts = _views(client, prep["preparation_id"])[1].facts("cache-facts")
    assert facts["OpenAI key"] == "prompt_cache_key conversation-7, retention 24h"
    plain = prepare(client, basic_request(render="openai-chat", scope=scope))
    facts = _views(client, plain["preparation_id"])[1].facts("cache-facts")
    assert facts["plan"].startswith("render openai-chat; none: the request has no cache object")
    assert facts["previous turn"].startswith(prep["preparation_id"])
    assert facts["reported cached"] == "-: no usage report of the main call yet"
    usage = {"report_id": "u1", "provider": "openai", "usage": {"prompt_tokens": 50}}
    ok(client.post(f"/v1/preparations/{plain['preparation_id']}/usage", json=usage))
    facts = _views(client, plain["preparation_id"])[1].facts("cache-facts")
    assert facts["reported cached"] == "-: the usage report of the main call has no cached figure"


def test_the_page_shows_no_text_of_the_request(make_client: AppFactory) -> None:
    """Block texts, instructions, tool descriptions and history stay out of both views."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids, _ = _conversation(client, wall)
    path = f"/v1/preparations/{ids[2]}/breakdown"
    for accept in ("text/html", "text/plain"):
        shown = client.get(path, headers={"Accept": accept}).text
        for text in ("careful assistant", "search-word", "question 0", "answer 1", "What now"):
            assert text not in shown, (accept, text)


def test_the_stylesheet_keeps_the_page_within_a_narrow_screen(make_client: AppFactory) -> None:
    """What keeps the page from scrolling sideways at 360 px: the viewport's width, text that
    wraps anywhere, every table in a container that scrolls on its own (and shown as cards on
    a narrow screen), grid facts that collapse to one column."""
    client = make_client()
    prep = prepare(client, _request())
    page = _views(client, prep["preparation_id"])[1]
    viewport = next(e for e in page.elements if e.tag == "meta" and e.attrs.get("name"))
    assert viewport.attrs == {"name": "viewport", "content": "width=device-width, initial-scale=1"}
    style = page.style()
    assert "box-sizing:border-box" in style
    assert re.search(r"body\{[^}]*max-width:72rem[^}]*overflow-wrap:anywhere", style)
    assert ".scroll{max-width:100%;overflow-x:auto" in style
    assert "@media (max-width:40rem)" in style and "table.cards td::before" in style
    assert "grid-template-columns:minmax(0,1fr)" in style
    tables = [e for e in page.elements if e.tag == "table"]
    assert len(tables) == 4
    assert all(t.parent is not None and "scroll" in t.parent.cls() for t in tables)
    for ident in ("blocks", "sources", "accounting"):
        table = page.by_id(ident)
        assert "cards" in table.cls()
        cells = page.inside(table, "td")
        assert all(c.attrs.get("data-label") for c in cells if page.text(c))
    assert not re.search(
        r"width:\d{3,}px", page.style() + "".join(e.attrs.get("style", "") for e in page.elements)
    ), "no fixed width of 100 px or more"


def test_a_hostile_tool_name_is_shown_escaped(make_client: AppFactory) -> None:
    """A tool's name is the caller's: a line break or a bidi override in it is written as its
    escape in the cache section, in the text and in the HTML."""
    wall = FakeWall()
    client = make_client(wall=wall)
    body = turn_body(new_scope(), render="neutral")
    prepare(client, body)
    wall.now += 60
    hostile = "zz\u202eevil\nFAKE"
    prep = prepare(client, {**next_history(body, 0), "tools": [*body["tools"], tool(hostile)]})
    path = f"/v1/preparations/{prep['preparation_id']}/breakdown"
    text = client.get(path, headers={"Accept": "text/plain"}).text
    assert all(line.isprintable() for line in text.splitlines())
    assert 'first change:     tool "zz\\u202eevil\\nFAKE" added (tools[2])' in text
    html = client.get(path, headers={"Accept": "text/html"}).text
    assert "\u202e" not in html and "zz\\u202eevil\\nFAKE" in html


def test_each_report_is_priced_per_bucket_and_a_miss_by_what_it_billed_again(
    make_client: AppFactory,
) -> None:
    """The turn whose tool changed reports 40,000 tokens written for 5 minutes and 100
    uncached: the cost table gives each bucket and the total as the usage answer has them, with
    the price that applied; the cache section says what the miss billed again and cost; a
    repair report of another shape gets a row of its own; the text says the same."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids, _ = _conversation(client, wall)
    usage = {
        "input_tokens": 100,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 40_000,
        "output_tokens": 50,
    }
    path = f"/v1/preparations/{ids[2]}/usage"
    last = ok(client.post(path, json={"report_id": "m", "provider": "anthropic", "usage": usage}))[
        "accounting"
    ]["last"]
    cost = last["cost"]
    assert last["miss_cause"] == "tools" and last["rebilled_tokens"] > 0
    _, page, lines = _views(client, ids[2])
    table = page.table("cost")
    assert table[0] == [
        "",
        "uncached input",
        "cache read",
        "cache write 5m",
        "cache write 1h",
        "cache write",
        "output",
        "total",
        "price",
    ]
    buckets = ("uncached_input", "cache_read", "cache_write_5m", "cache_write_1h", "cache_write")
    figures = [cost[key] for key in (*buckets, "output", "total")]
    assert table[1][:8] == ["last", *(f"{v:.9f}".rstrip("0").rstrip(".") for v in figures)]
    assert table[1][8] == "price claude-sonnet-4-5 (shipped)"
    assert cost["cache_write_5m"] == pytest.approx(40_000 * 3.75 / 1e6, abs=1e-9)
    fact = page.facts("cache-facts")["miss cost"]
    assert fact == (
        f"cause tools: {last['rebilled_tokens']} input tokens billed again instead of read from "
        f"the cache, which cost {cost['miss']:.9f}".rstrip("0")
        + " USD more"
    )
    # Fewer than the writes: all of them written again rather than read ($3.75 against $0.30).
    assert last["rebilled_tokens"] < 40_000
    assert cost["miss"] == pytest.approx(last["rebilled_tokens"] * 3.45 / 1e6, abs=1e-9)
    text = "\n".join(lines)
    assert f"total {cost['total']:.9f}".rstrip("0") + " USD, price claude-sonnet-4-5" in text
    assert "  cost USD: uncached input " in text
    assert "  miss cost:" in text


def test_a_report_without_a_price_says_so_and_guesses_nothing(make_client: AppFactory) -> None:
    """A model without a price: the cost row says "no price", in HTML and text, and no figure
    stands in for it; before any report the page says there is nothing to price."""
    client = make_client()
    prep_id = prepare(
        client, {"model": "gemini-2.5-pro", "input": [{"role": "user", "content": "hi"}]}
    )["preparation_id"]
    page = _views(client, prep_id)[1]
    assert page.text(page.by_id("cost")) == "No usage report yet: nothing to price."
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 2}
    payload = {"report_id": "g", "provider": "google", "usage": usage}
    assert (
        ok(client.post(f"/v1/preparations/{prep_id}/usage", json=payload))["accounting"]["last"][
            "cost"
        ]
        is None
    )
    _, page, lines = _views(client, prep_id)
    assert page.table("cost")[1] == [
        "last",
        "no price: the model has none, or a bucket of the report has no rate",
    ]
    assert (
        "  cost USD: no price: the model has none, or a bucket of the report has no rate" in lines
    )
