"""The timeline of a conversation (in-process app, real SQLite file): both kinds of miss (the
prefix changed; the provider did not cache what it could) and an expired cache marked apart in
the JSON, the text and the SVG chart, the first change by name; a chart as wide as the page
with axes, a token scale and turn numbers; pages of 50 turns with links to older and newer
ones; the reason of each expected figure held to the figure itself; and the cost chart (each
turn's cost, the part its miss cost, the running total)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from api_support import AppFactory, FakeWall
from page_support import (
    Element,
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
from pydantic import ValidationError

from context_assembly.api import pages, timeline
from context_assembly.core.cache import expected_cached_tokens
from context_assembly.core.result import CacheReport
from context_assembly.preparations import record, turns


def _timeline(client: Any, prep_id: str, query: str = "") -> tuple[dict[str, Any], Page, str]:
    """The JSON, the HTML page and the text of a timeline page."""
    path = f"/v1/preparations/{prep_id}/timeline{query}"
    data = ok(client.get(path, headers={"Accept": "application/json"}))
    html = client.get(path, headers={"Accept": "text/html"})
    assert html.headers["content-type"].startswith("text/html")
    text = client.get(path, headers={"Accept": "text/plain"}).text
    return data, Page(html.text), text


def _six_turns(client: Any, wall: FakeWall) -> list[str]:
    """Turn 3 edits the ``search`` tool (its prefix changes), turn 5's provider reports no
    cached tokens though its prefix was kept (provider-side), turn 6 comes ten minutes after
    turn 5 (the 5-minute cache expired); every turn reports what it could read."""
    body = turn_body(new_scope())
    ids = []
    for number in range(1, 7):
        if number == 3:
            body = {**body, "tools": [tool("search", 210), tool("fetch")]}
        wall.now += 600 if number == 6 else 60
        prep = prepare(client, body)
        ids.append(prep["preparation_id"])
        plan = prep["selection"]["cache"]
        readable = 0 if number in (1, 5) or not plan["prefix_kept"] else plan["cacheable_tokens"]
        report(client, prep["preparation_id"], readable)
        body = next_history(body, number)
    return ids


def _marks(page: Page) -> dict[str, list[Element]]:
    """The chart's miss marks (nested SVGs of class ``mark``) by kind; the legend and the
    table draw the same marks outside the chart."""
    chart = page.by_id("chart")
    found: dict[str, list[Element]] = {}
    for element in page.elements:
        if element.tag == "svg" and "mark" in element.cls() and element.parent is chart:
            kind = (element.cls() - {"mark"}).pop()
            found.setdefault(kind, []).append(element)
    return found


def test_both_kinds_of_miss_are_marked_in_json_text_and_svg(make_client: AppFactory) -> None:
    """Turn 3 missed because its prefix changed (named: the tool ``search``), turn 5 because
    the provider did not cache what it could, turn 6 because the cache had expired: each kind
    in the JSON, in the text's miss column, and in the chart with its own shape and colour."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids = _six_turns(client, wall)
    data, page, text = _timeline(client, ids[-1])
    rows = data["turns"]
    assert [t["preparation_id"] for t in rows] == ids and [t["turn"] for t in rows] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert [t["miss"] for t in rows] == [None, None, "prefix_changed", None, "provider", "expired"]
    assert [t["expected_reason"] for t in rows] == [
        "first_turn",
        "cached",
        "prefix_changed",
        "cached",
        "cached",
        "expired",
    ]
    assert rows[2]["first_change"] == {
        "part": "tools",
        "index": 1,
        "change": "changed",
        "name": "search",
        "previous_name": None,
        "role": None,
    }
    assert rows[4]["cached_input_tokens"] == 0 < rows[4]["expected_cached_tokens"]
    assert rows[5]["seconds_since_previous"] == 600 and rows[5]["cache_lifetime_seconds"] == 300
    assert data["older_before"] is None
    # Text: one line per turn with its miss and its first change by name.
    lines = {ln.split()[0]: ln for ln in text.splitlines()[2:8]}
    assert lines["3"].endswith('prefix changed         tool "search" changed (tools[1])')
    assert lines["5"].rstrip().endswith("provider did not cache -")
    assert lines["6"].rstrip().endswith("cache expired          -")
    assert all(lines[n].rstrip().endswith("-                      -") for n in ("1", "2", "4"))
    # Chart: one mark per missed turn, each kind its own path and colour; a band behind it.
    marks = _marks(page)
    assert {kind: len(found) for kind, found in marks.items()} == {
        "prefix_changed": 1,
        "provider": 1,
        "expired": 1,
    }
    paths = {
        kind: next(e for e in page.elements if e.tag == "path" and e.parent is found[0])
        for kind, found in marks.items()
    }
    assert len({p.attrs["d"] for p in paths.values()}) == 3
    colours = {
        p.attrs.get("fill") if p.attrs["fill"] != "none" else p.attrs["stroke"]
        for p in paths.values()
    }
    assert len(colours) == 3
    tip = page.text(marks["prefix_changed"][0])
    assert tip.startswith('turn 3: prefix changed at tool "search" changed (tools[1]).')
    assert page.text(marks["provider"][0]).startswith("turn 5: provider did not cache.")
    bands = [e for e in page.elements if e.tag == "rect" and "band" in e.cls()]
    assert sorted((e.cls() - {"band"}).pop() for e in bands) == [
        "expired",
        "prefix_changed",
        "provider",
    ]
    # Table: the missed rows carry their kind; the change is named beside it.
    table = page.table("turns")
    assert table[3][-1] == 'prefix changed: tool "search" changed (tools[1])'
    assert table[5][-1] == "provider did not cache" and table[6][-1] == "cache expired"
    assert [r.attrs.get("class") for r in page.inside(page.by_id("turns"), "tr")][1:] == [
        None,
        None,
        "prefix_changed",
        None,
        "provider",
        "expired",
    ]


def test_the_chart_fills_the_width_with_axes_a_token_scale_and_turn_numbers(
    make_client: AppFactory,
) -> None:
    """The chart with its scale's margin is as wide as the page; its plot has a viewBox
    stretched to that width; the scale's labels are round multiples of one step, the top one
    at or above every figure, under the unit ``tokens``; the turn numbers are the JSON's; every
    figure of every turn is a bar of its height."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids = _six_turns(client, wall)
    data, page, _ = _timeline(client, ids[-1])
    chart = page.by_id("chart")
    assert chart.attrs["width"] == "100%"
    plot = next(
        e for e in page.elements if e.tag == "svg" and e.parent is chart and "viewbox" in e.attrs
    )
    assert plot.attrs["width"] == "100%" and plot.attrs["preserveaspectratio"] == "none"
    axes = [e for e in page.elements if e.tag == "line" and e.parent is chart and "axis" in e.cls()]
    assert len(axes) == 2
    labels = [page.text(e) for e in page.elements if e.tag == "text" and "scale" in e.cls()]
    ticks = [int(label) for label in labels]
    assert len(ticks) >= 3
    assert [page.text(e) for e in page.elements if e.tag == "text" and "unit" in e.cls()] == [
        "tokens"
    ]
    assert ticks == [ticks[0] * (i + 1) for i in range(len(ticks))]
    figures = [
        t[field]
        for t in data["turns"]
        for field in ("total_input_tokens", "expected_cached_tokens", "cached_input_tokens")
        if t[field]
    ]
    assert ticks[-1] >= max(figures) > ticks[-1] - ticks[0]
    top = int(plot.attrs["viewbox"].split()[3])
    assert top == ticks[-1]
    numbers = [page.text(e) for e in page.elements if e.tag == "text" and "number" in e.cls()]
    assert numbers == [str(t["turn"]) for t in data["turns"]]
    heights = sorted(
        int(e.attrs["height"]) for e in page.elements if e.tag == "rect" and "bar" in e.cls()
    )
    assert heights == sorted(figures)
    # Narrow screens: the table scrolls in its own box, or shows a card per turn.
    table = page.by_id("turns")
    assert table.parent is not None and "scroll" in table.parent.cls() and "cards" in table.cls()
    assert all(c.attrs.get("data-label") for c in page.inside(table, "td"))
    assert "svg.chart{display:block;width:calc(100% - var(--scale))" in page.style()
    assert "margin:.4rem 0 1rem var(--scale)}" in page.style()


def test_the_scale_labels_stand_in_a_margin_left_of_the_first_bar(
    make_client: AppFactory,
) -> None:
    """Every label of the token scale is right-aligned left of the axis, so the widest one's
    right edge lies left of the first bar; the margin holds it even in digits of Arial's width
    (0.556 em at the chart's 11 px)."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids = _six_turns(client, wall)
    _, page, _ = _timeline(client, ids[-1])
    chart = page.by_id("chart")
    labels = [e for e in page.elements if e.tag == "text" and e.cls() & {"scale", "unit"}]
    assert {e.attrs["text-anchor"] for e in labels} == {"end"}
    widest = max(labels, key=lambda e: len(page.text(e)))
    right_edge = float(widest.attrs["x"])
    plot = next(
        e for e in page.elements if e.tag == "svg" and e.parent is chart and "viewbox" in e.attrs
    )
    first_bar = next(e for e in page.inside(plot, "rect") if "bar" in e.cls())
    assert float(plot.attrs["x"]) == 0 and float(first_bar.attrs["x"]) > 0
    assert right_edge < float(plot.attrs["x"])
    margin = float(chart.attrs["style"].removeprefix("--scale:").removesuffix("px"))
    assert margin >= -right_edge + len(page.text(widest)) * 0.556 * 11


def test_pages_of_fifty_turns_link_to_the_older_and_newer_ones(make_client: AppFactory) -> None:
    """Fifty-five turns: the newest page holds turns 6 to 55 and links to the turns before 6;
    that page holds turns 1 to 5, links back, and has no older page. JSON, text and HTML say
    the same."""
    wall = FakeWall()
    client = make_client(wall=wall)
    body = turn_body(new_scope(), instructions="Be brief.", tools=None)
    ids = []
    for number in range(55):
        wall.now += 30
        ids.append(prepare(client, body)["preparation_id"])
        body = next_history(body, number)
    newest, page, text = _timeline(client, ids[-1])
    assert [t["turn"] for t in newest["turns"]] == list(range(6, 56))
    assert [t["preparation_id"] for t in newest["turns"]] == ids[5:]
    assert newest["older_before"] == 6
    assert page.by_id("older").attrs["href"] == "timeline?before=6"
    assert not any(e.attrs.get("id") in ("newer", "newest") for e in page.elements)
    path = f"GET /v1/preparations/{ids[-1]}/timeline"
    assert f"older turns: {path}?before=6" in text.splitlines()
    assert text.splitlines()[0].endswith("turns 6–55, oldest first")
    older, page, text = _timeline(client, ids[-1], "?before=6")
    assert [t["preparation_id"] for t in older["turns"]] == ids[:5]
    assert older["older_before"] is None and older["preparation_id"] == ids[-1]
    assert page.by_id("newer").attrs["href"] == "timeline?before=56"
    assert page.by_id("newest").attrs["href"] == "timeline"
    assert not any(e.attrs.get("id") == "older" for e in page.elements)
    assert f"newer turns: {path}?before=56" in text.splitlines()
    middle = ok(
        client.get(
            f"/v1/preparations/{ids[-1]}/timeline?before=30", headers={"Accept": "application/json"}
        )
    )
    assert [t["turn"] for t in middle["turns"]] == list(range(1, 30))
    assert middle["older_before"] is None
    # The chart shows every fifth number, the first and the last on a page of fifty.
    numbers = [
        page.text(e)
        for e in _timeline(client, ids[-1])[1].elements
        if e.tag == "text" and "number" in e.cls()
    ]
    assert numbers == ["6", *(str(n) for n in range(10, 56, 5))]


@pytest.mark.parametrize("before", ["0", "-3", "x", str(2**64)])
def test_a_before_out_of_range_is_a_422_naming_it(make_client: AppFactory, before: str) -> None:
    client = make_client()
    prep = prepare(client, turn_body(new_scope()))
    response = client.get(f"/v1/preparations/{prep['preparation_id']}/timeline?before={before}")
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "before" in response.text


_REPORT: dict[str, Any] = {
    "previous_preparation_id": "prep_a",
    "first_change": None,
    "breakpoints": [],
    "skipped": [],
}


@pytest.mark.parametrize(
    ("kept", "cacheable", "previous", "since", "lifetime", "reason"),
    [
        (True, 2000, 1500, 60, 300, "cached"),
        (True, 1500, 2000, 300, 300, "cached"),
        (False, 2000, 2000, 60, 300, "prefix_changed"),
        (True, 2000, 2000, 301, 300, "expired"),
        (True, 2000, 2000, 60, None, "no_provider_cache"),
        (True, 0, 2000, 60, 300, "nothing_cacheable"),
        (True, 2000, 0, 60, 300, "previous_nothing_cacheable"),
    ],
)
def test_the_reason_agrees_with_the_expected_figure(
    kept: bool,
    cacheable: int,
    previous: int,
    since: float,
    lifetime: float | None,
    reason: str,
) -> None:
    """``expected_reason`` follows the conditions of the expected figure: "cached" exactly when
    the figure is above 0."""
    plan = CacheReport.model_validate(
        {**_REPORT, "prefix_kept": kept, "cacheable_tokens": cacheable}
    )
    span = None if lifetime is None else timedelta(seconds=lifetime)
    found = turns.expected_reason(
        plan,
        has_previous=True,
        previous_cacheable_tokens=previous,
        since_previous=since,
        lifetime=span,
    )
    figure = expected_cached_tokens(
        prefix_kept=kept,
        cacheable_tokens=cacheable,
        previous_cacheable_tokens=previous,
        since_previous=timedelta(seconds=since),
        lifetime=span,
    )
    assert found == reason
    assert (found == "cached") == (figure > 0)


@pytest.mark.parametrize(
    ("peak", "step", "top"),
    [
        (0, 1, 1),
        (9, 2, 10),
        (5308, 1000, 6000),
        (6001, 2000, 8000),
        (1200, 200, 1200),
        (1300, 250, 1500),
    ],
)
def test_the_token_scale_takes_round_steps(peak: int, step: int, top: int) -> None:
    """At most six intervals of a round step, the top the first multiple at or above the peak."""
    assert timeline.scale(peak) == (step, top)


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0.4, "under 1 s"),
        (45, "45 s"),
        (310, "5 min 10 s"),
        (360, "6 min"),
        (3600, "1 h"),
        (3900, "1 h 5 min"),
        (200_000, "2 d 7 h"),
    ],
)
def test_durations_read_at_a_glance(seconds: float, words: str) -> None:
    assert pages.duration(seconds) == words


def test_requests_without_a_scope_form_no_conversation(make_client: AppFactory) -> None:
    """Only an explicit scope chains turns: unrelated unscoped requests each stand alone (one
    turn in the timeline, compared with nothing), while scoped ones still chain."""
    client = make_client()
    body = {k: v for k, v in turn_body(new_scope()).items() if k != "scope"}
    unscoped = [prepare(client, body) for _ in range(3)]
    for prep in unscoped:
        assert prep["selection"]["cache"]["previous_preparation_id"] is None
        assert prep["selection"]["cache"]["prefix_kept"] is None
        data, _, _ = _timeline(client, prep["preparation_id"])
        assert len(data["turns"]) == 1
    scoped = turn_body(new_scope())
    first = prepare(client, scoped)
    second = prepare(client, scoped)
    assert second["selection"]["cache"]["previous_preparation_id"] == first["preparation_id"]
    assert len(_timeline(client, second["preparation_id"])[0]["turns"]) == 2


def test_older_turns_are_read_for_their_turn_part_only(
    make_client: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page reads each older record's turn part (``record.TurnRecord``), not the whole record:
    no record but the one named in the path is validated whole, however many turns the page
    shows (each was, before: a heavy record's manifest and hashes for nothing shown)."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids = converse(client, wall, turn_body(new_scope()), 6)
    whole = record.StoredPreparation.read.__func__  # type: ignore[attr-defined]
    reads: list[str] = []

    def counted(cls: type[record.StoredPreparation], found: Any) -> Any:
        reads.append(found.id)
        return whole(cls, found)

    monkeypatch.setattr(record.StoredPreparation, "read", classmethod(counted))
    data, _, _ = _timeline(client, ids[-1])
    assert [t["preparation_id"] for t in data["turns"]] == ids
    assert reads == [ids[-1]] * 3  # the path's record, once per form (JSON, HTML, text)


def test_an_older_record_shows_though_its_other_parts_do_not_read(
    make_client: AppFactory,
) -> None:
    """An older record whose manifest and hashes no longer read (a part a newer version wrote
    otherwise, say) still shows its turn: the timeline does not read them."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids = converse(client, wall, turn_body(new_scope()), 3)
    app: Any = client.app
    service = app.state.preparations

    async def spoil() -> None:
        found = await service.store.get("default", ids[0], wall())
        data = {**found.data, "contributors": "not a list", "shape_hash": None}
        data["response"] = {"layout": found.data["response"]["layout"]}  # no manifest
        assert await service.store.replace_data("default", ids[0], data, wall())
        spoiled = await service.store.get("default", ids[0], wall())
        with pytest.raises(ValidationError):  # read whole, it fails
            record.StoredPreparation.read(spoiled)

    assert client.portal is not None
    client.portal.call(spoil)
    data, _, _ = _timeline(client, ids[-1])
    assert [t["preparation_id"] for t in data["turns"]] == ids
    assert data["turns"][0]["turn"] == 1 and data["turns"][0]["layout"] == "stable-prefix"


def test_the_pages_send_a_policy_that_runs_no_script(make_client: AppFactory) -> None:
    """The timeline and the breakdown pages come with a Content-Security-Policy that allows no
    script and no request of any kind (their styles are inline), and hold no script."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids = converse(client, wall, turn_body(new_scope()), 2)
    for view in ("timeline", "breakdown"):
        answer = client.get(f"/v1/preparations/{ids[-1]}/{view}", headers={"Accept": "text/html"})
        assert answer.headers["content-type"].startswith("text/html")
        policy = answer.headers["content-security-policy"]
        assert policy == pages.POLICY
        assert "default-src 'none'" in policy and "script-src" not in policy
        assert "frame-ancestors 'none'" in policy
        assert "<script" not in answer.text.lower()


def test_the_cost_chart_shows_each_turns_cost_its_miss_and_the_running_total(
    make_client: AppFactory,
) -> None:
    """Below the token chart, a bar per priced turn as tall as its cost on a USD scale, the
    part its miss cost on top in the miss's colour (turns 3 and 5, which billed again the 100
    input tokens they did not read), and a point per turn at the running total on a scale of
    its own; the table, the text and the sentence under the chart give the same figures."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids = _six_turns(client, wall)
    data, page, text = _timeline(client, ids[-1])
    rows = data["turns"]
    costs = [t["cost"] for t in rows]
    assert all(c > 0 for c in costs)
    assert [t["rebilled_tokens"] for t in rows] == [0, 0, 100, 0, 100, 0]
    per_miss = 100 * (3 - 0.30) / 1e6  # uncached input instead of cache reads, Sonnet 4.5
    assert [t["miss_cost"] for t in rows] == pytest.approx([0, 0, per_miss, 0, per_miss, 0])
    assert data["miss_cost"] == pytest.approx(2 * per_miss, abs=1e-9)
    chart = page.by_id("cost-chart")
    bars = [e for e in page.inside(chart, "rect") if "cost-bar" in e.cls()]
    ticks = [page.text(e) for e in page.inside(chart, "text") if "cost-scale" in e.cls()]
    top = float(ticks[-1])
    assert top >= max(costs) > top - float(ticks[0])
    assert [float(b.attrs["height"]) for b in bars] == pytest.approx(
        [1000 * c / top for c in costs], abs=1e-3
    )
    parts = [e for e in page.inside(chart, "rect") if "miss-part" in e.cls()]
    assert [(e.cls() - {"miss-part"}).pop() for e in parts] == ["prefix_changed", "provider"]
    assert [float(e.attrs["height"]) for e in parts] == pytest.approx(
        [1000 * per_miss / top] * 2, abs=1e-3
    )
    assert {e.attrs["fill"] for e in parts} == {
        timeline.MISS_COLOUR["prefix_changed"],
        timeline.MISS_COLOUR["provider"],
    }
    points = [e for e in page.inside(chart, "circle") if "total-point" in e.cls()]
    running = [sum(costs[: n + 1]) for n in range(len(costs))]
    assert [page.text(p) for p in points] == [
        f"after turn {n + 1}: {total:.4f} USD so far" for n, total in enumerate(running)
    ]
    heights = [float(p.attrs["cy"]) for p in points]
    assert heights == sorted(heights, reverse=True)  # the total only grows: each point higher
    totals = [page.text(e) for e in page.inside(chart, "text") if "total-scale" in e.cls()]
    assert float(totals[-1]) >= running[-1]
    lines = [e for e in page.inside(chart, "line") if "total" in e.cls()]
    assert len(lines) == len(rows) - 1
    assert [page.text(e) for e in page.inside(chart, "text") if "cost-number" in e.cls()] == [
        str(n) for n in range(1, 7)
    ]
    assert page.text(page.by_id("cost")) == (
        f"These turns cost {sum(costs):.4f} USD, of which {2 * per_miss:.4f} USD is what their "
        "cache misses cost over reading the same tokens from the cache."
    )
    table = page.table("turns")
    column = table[0].index("miss cost (USD)")
    assert [r[column] for r in table[1:]] == [f"{t['miss_cost']:.4f}" for t in rows]
    assert f"cost of their cache misses: {2 * per_miss:.4f} USD" in text.splitlines()
    heading, *turn_lines = text.splitlines()[1:8]
    assert "  cost USD   miss USD  compaction " in heading
    assert [ln.split()[7:9] for ln in turn_lines] == [
        [f"{t['cost']:.4f}", f"{t['miss_cost']:.4f}"] for t in rows
    ]


def test_a_page_without_a_cost_draws_no_cost_chart(make_client: AppFactory) -> None:
    """Without a usage report there is nothing to chart: no sentence, no cost chart."""
    wall = FakeWall()
    client = make_client(wall=wall)
    ids = converse(client, wall, turn_body(new_scope()), 2)
    data, page, text = _timeline(client, ids[-1])
    assert data["cost"] is None and data["miss_cost"] is None
    assert not any(e.attrs.get("id") in ("cost", "cost-chart") for e in page.elements)
    assert "cost of" not in text
