"""The human view of a conversation's turns: a chart and a table of one page of turns (total
input, expected and reported cached tokens, prefix kept, the first change by name, and the
turns that missed the cache, by kind), with links to older and newer pages.

HTML for browsers (``Accept: text/html``), plain text otherwise (JSON is the route's, from the
``Timeline`` model). Ids, figures and names only: the records hold no text to show.

Under it a second chart shows what each turn cost in USD (the part its cache miss cost in the
miss's colour) on a scale at the left, and the running total of the page's turns as a line on a
scale of its own at the right.

The charts are inline SVGs as wide as the page at any width: the bars are drawn in a plot whose
``viewBox`` counts turns across and tokens up, stretched to the page's width
(``preserveAspectRatio="none"``); the scale, the turn numbers and the miss marks are drawn
around it in CSS pixels and percentages of the width, so that their text keeps its size on a
phone and on a wide screen. The scale's labels stand in a left margin as wide as the widest of
them (the ``--scale`` width the stylesheet moves the SVG right by), right-aligned against the
axis, so that no label covers a bar; the cost chart's running total has its labels in a right
margin (``--right``) the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from context_assembly.api.pages import cell, count, e, page, shown
from context_assembly.api.turn_words import (
    MISS_MEANING,
    MISS_WORDS,
    change_words,
    expected_words,
    reported_words,
)
from context_assembly.lifecycle_models import CacheMiss, Timeline, TimelineTurn
from context_assembly.preparations.turns import TIMELINE_TURNS


@dataclass(frozen=True, slots=True)
class Series:
    """A bar of each turn: the turn's field, its legend and its colour."""

    field: str
    label: str
    colour: str


SERIES: Final = (
    Series("total_input_tokens", "total input", "#9aa4b1"),
    Series("expected_cached_tokens", "expected cached", "#4a7bd0"),
    Series("cached_input_tokens", "reported cached", "#1a7f37"),
)

# Each kind of miss: its colour and its mark, a path around (0, 0) about 12 px wide. The shapes
# differ as well as the colours, so that the kinds stay apart without colour vision.
MISS_COLOUR: Final[dict[CacheMiss, str]] = {
    "prefix_changed": "#cf222e",
    "expired": "#8250df",
    "provider": "#bc4c00",
}
_MISS_PATH: Final[dict[CacheMiss, str]] = {
    "prefix_changed": "M-6,-5H6L0,6Z",  # a triangle pointing down
    "expired": "M0,-6L6,0L0,6L-6,0Z",  # a diamond
    "provider": "M-5,0A5,5 0 1,0 5,0A5,5 0 1,0 -5,0Z",  # a ring (drawn with a stroke)
}

# The chart's geometry in CSS pixels: the plot's top and height, the rows under it.
_TOP, _PLOT = 20, 200
_NUMBERS_Y = _TOP + _PLOT + 16
_MARKS_Y = _NUMBERS_Y + 18
_HEIGHT = _MARKS_Y + 14
_SLOT = 4  # plot units per turn: three bars of 1 with gaps
_MIN_SLOTS = 8  # a short conversation does not get bars a quarter of the page wide
# The scale's text: its font size (the stylesheet's), a width per character that no common
# sans-serif font's digits or letters exceed, and the gap between a label and the axis.
_FONT_PX = 11
_CHAR_EM = 0.62
_GAP = 6
UNIT: Final = "tokens"  # the scale's unit, written above its labels


def _kept(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _label(turn: TimelineTurn) -> str:
    return "?" if turn.turn is None else str(turn.turn)


def _range(timeline: Timeline) -> str:
    """Which turns a page shows, in words."""
    turns = timeline.turns
    if not turns:
        return "no turns"
    first, last = turns[0].turn, turns[-1].turn
    if first is None or last is None:
        return f"{len(turns)} turns"
    return f"turn {first}" if first == last else f"turns {first}–{last}"


def newer_before(timeline: Timeline, before: int | None) -> int | None:
    """The ``before`` of the next newer page (``None``: this page ends with the preparation, or
    the turns have no numbers)."""
    if before is None or not timeline.turns or timeline.turns[-1].turn is None:
        return None
    return timeline.turns[-1].turn + 1 + TIMELINE_TURNS


def dollars(value: float | None) -> str:
    """A cost in USD to four decimals (``-`` when there is none)."""
    return "-" if value is None else f"{value:.4f}"


def running_totals(turns: list[TimelineTurn]) -> list[float]:
    """What the page's turns cost up to and including each one (a turn without a cost adds
    nothing)."""
    totals, total = [], 0.0
    for turn in turns:
        total += turn.cost or 0.0
        totals.append(round(total, 9))
    return totals


def _cost_words(timeline: Timeline) -> str | None:
    """The page's total, and what its misses cost, in a sentence (``None``: no cost known)."""
    if timeline.cost is None:
        return None
    said = f"These turns cost {dollars(timeline.cost)} USD"
    if timeline.miss_cost:
        said += (
            f", of which {dollars(timeline.miss_cost)} USD is what their cache misses cost "
            "over reading the same tokens from the cache"
        )
    return said + "."


def compaction_words(turn: TimelineTurn) -> str:
    """A turn's compaction decision in a few words: ``none (under_trigger)``; ``-`` when the
    turn recorded none."""
    decided = turn.compaction
    if decided is None:
        return "-"
    return decided.decision if decided.reason is None else f"{decided.decision} ({decided.reason})"


def why(turn: TimelineTurn) -> str:
    """A turn's cache story in a sentence (the chart's tooltips)."""
    said = f"expected {count(turn.expected_cached_tokens)} cached: {expected_words(turn)}"
    if turn.cached_input_tokens is not None:
        said += f"; reported {turn.cached_input_tokens}: {reported_words(turn)}"
    return said


# --------------------------------------------------------------------------- text


def render_text(timeline: Timeline, before: int | None = None) -> str:
    """A fixed-width table, oldest turn first, and the paths of the older and newer pages."""
    path = f"GET /v1/preparations/{shown(timeline.preparation_id)}/timeline"
    lines = [
        f"timeline of {shown(timeline.preparation_id)}: {_range(timeline)}, oldest first",
        f"{'turn':>4}  {'preparation':<30} {'input':>8} {'kept':>4} {'cacheable':>9} "
        f"{'expected':>8} {'reported':>8} {'cost USD':>10} {'miss USD':>10}  "
        f"{'compaction':<18} {'miss':<22} first change",
    ]
    for turn in timeline.turns:
        miss = "-" if turn.miss is None else MISS_WORDS[turn.miss]
        lines.append(
            f"{_label(turn):>4}  {shown(turn.preparation_id):<30} {turn.total_input_tokens:>8} "
            f"{_kept(turn.prefix_kept):>4} {count(turn.cacheable_tokens):>9} "
            f"{count(turn.expected_cached_tokens):>8} {count(turn.cached_input_tokens):>8} "
            f"{dollars(turn.cost):>10} {dollars(turn.miss_cost):>10}  "
            f"{compaction_words(turn):<18} {miss:<22} {change_words(turn.first_change)}"
        )
    if timeline.cost is not None:
        lines.append(f"cost of these turns: {dollars(timeline.cost)} USD")
    if timeline.miss_cost is not None:
        lines.append(f"cost of their cache misses: {dollars(timeline.miss_cost)} USD")
    if timeline.older_before is not None:
        lines.append(f"older turns: {path}?before={timeline.older_before}")
    newer = newer_before(timeline, before)
    if newer is not None:
        lines.append(f"newer turns: {path}?before={newer}")
    if before is not None:
        lines.append(f"newest turns: {path}")
    lines += [f"{MISS_WORDS[kind]}: {meaning}" for kind, meaning in MISS_MEANING.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- chart


def scale(peak: int) -> tuple[int, int]:
    """``(step, top)`` of the token scale: the smallest round step (1, 2, 2.5 or 5 times a power
    of ten) giving at most six intervals, and the first multiple of it at or above ``peak``."""
    peak = max(1, peak)
    magnitude = 1
    while magnitude * 10 <= peak:
        magnitude *= 10
    step = 2 * magnitude  # peak < 10 * magnitude: at most five intervals of this
    for factor in (0.1, 0.2, 0.25, 0.5, 1.0):
        candidate = max(1, round(magnitude * factor))
        if peak / candidate <= 6:
            step = candidate
            break
    top = -(-peak // step) * step
    return step, top


def label_margin(labels: list[str]) -> int:
    """The left margin, in CSS pixels, that holds the widest of ``labels`` right-aligned
    ``_GAP`` pixels left of the axis."""
    widest = max((len(label) for label in labels), default=0)
    return math.ceil(widest * _FONT_PX * _CHAR_EM) + _GAP


def _x(slot: float, slots: int) -> str:
    """The horizontal position of ``slot`` (in turn slots) as a percentage of the chart."""
    return f"{100 * slot / slots:.3f}%"


def mark(kind: CacheMiss, x: str, y: int, title: str = "") -> str:
    """A miss mark centred on ``(x, y)``; ``x`` may be a percentage, hence the nested SVG."""
    colour = MISS_COLOUR[kind]
    paint = (
        f'fill="none" stroke="{colour}" stroke-width="2.5"'
        if kind == "provider"
        else f'fill="{colour}"'
    )
    tip = f"<title>{e(title)}</title>" if title else ""
    return (
        f'<svg x="{x}" y="{y}" width="1" height="1" overflow="visible" class="mark {kind}">'
        f'<path d="{_MISS_PATH[kind]}" {paint}/>{tip}</svg>'
    )


def _scale_text(text: str, y: float, cls: str) -> str:
    """A label of the token scale (or its unit, above it): right-aligned ``_GAP`` pixels left
    of the axis, in the margin, and centred on the height ``y`` it names."""
    return (
        f'<text x="-{_GAP}" y="{y:.1f}" text-anchor="end" dominant-baseline="middle" '
        f'class="{cls}">{text}</text>'
    )


def _end_label(index: int, last: int, number: int) -> bool:
    """Whether the first or the last turn of a page gets its number among every fifth: when
    no fifth is within two turns of it on the page (their labels would touch)."""
    if index == 0:
        return all((number + step) % 5 for step in (1, 2) if index + step <= last)
    if index == last:
        return all((number - step) % 5 for step in (1, 2) if index - step >= 0)
    return False


def _number(turns: list[TimelineTurn], index: int, slots: int, y: int, cls: str) -> str:
    """The turn number under the turn ``index`` of a chart, of class ``cls`` (``minor`` too
    when only a wide page shows it; nothing when no page does): see ``chart_svg``."""
    turn = turns[index]
    number = turn.turn if turn.turn is not None else index + 1
    major = len(turns) <= 12 or number % 5 == 0 or _end_label(index, len(turns) - 1, number)
    if not major and len(turns) > 30:
        return ""
    return (
        f'<text x="{_x(index + 0.5, slots)}" y="{y}" text-anchor="middle" '
        f'class="{cls if major else cls + " minor"}">{_label(turn)}</text>'
    )


def chart_svg(turns: list[TimelineTurn]) -> str:
    """Grouped bars per turn (total input, expected and reported cached tokens, on one token
    scale), a band behind each turn that missed the cache and its mark under the turn number,
    the scale's gridlines and labels, the axes and the turn numbers. A missing figure draws no
    bar. With more than twelve turns, every fifth number (and the first and the last, unless a
    fifth is next to them) is always shown, the others only on a wide page, and none of them
    past thirty turns."""
    slots = max(len(turns), _MIN_SLOTS)
    peak = max(
        [0]
        + [
            value
            for turn in turns
            for series in SERIES
            if isinstance(value := getattr(turn, series.field), int)
        ]
    )
    step, top = scale(peak)
    under: list[str] = []  # the gridlines, behind the bars
    over = [  # the axes, the scale's labels, the turn numbers and the miss marks
        f'<line x1="0" x2="100%" y1="{_TOP + _PLOT}" y2="{_TOP + _PLOT}" class="axis"/>',
        f'<line x1="0.5" x2="0.5" y1="{_TOP}" y2="{_TOP + _PLOT}" class="axis"/>',
    ]
    labels = [UNIT]
    for tick in range(step, top + 1, step):
        y = _TOP + _PLOT * (1 - tick / top)
        labels.append(str(tick))
        under.append(f'<line x1="0" x2="100%" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        over.append(_scale_text(str(tick), y, "scale"))
    over.append(_scale_text(UNIT, _TOP - 13, "unit"))
    plot: list[str] = []  # in turn slots across, tokens up
    for index, turn in enumerate(turns):
        left = index * _SLOT
        label = _label(turn)
        if turn.miss is not None:
            plot.append(
                f'<rect x="{left}" y="0" width="{_SLOT}" height="{top}" '
                f'fill="{MISS_COLOUR[turn.miss]}" fill-opacity="0.12" class="band {turn.miss}"/>'
            )
        for offset, series in enumerate(SERIES):
            value = getattr(turn, series.field)
            if not isinstance(value, int) or value <= 0:
                continue
            plot.append(
                f'<rect x="{left + 0.4 + offset * 1.1:.1f}" y="{top - value}" width="1" '
                f'height="{value}" fill="{series.colour}" class="bar">'
                f"<title>turn {label}: {series.label} {value}</title></rect>"
            )
        centre = _x(index + 0.5, slots)
        over.append(_number(turns, index, slots, _NUMBERS_Y, "number"))
        if turn.miss is not None:
            title = f"turn {label}: {MISS_WORDS[turn.miss]}"
            if turn.miss == "prefix_changed":
                title += f" at {change_words(turn.first_change)}"
            over.append(mark(turn.miss, centre, _MARKS_Y, f"{title}. {why(turn)}"))
    inner = (
        f'<svg x="0" y="{_TOP}" width="100%" height="{_PLOT}" '
        f'viewBox="0 0 {slots * _SLOT} {top}" preserveAspectRatio="none">'
        + "".join(plot)
        + "</svg>"
    )
    return (
        f'<svg id="chart" class="chart" style="--scale:{label_margin(labels)}px" '
        f'xmlns="http://www.w3.org/2000/svg" width="100%" '
        f'height="{_HEIGHT}" role="img" aria-label="Tokens per turn: total input, expected and '
        f'reported cached tokens, with the turns that missed the cache marked">'
        + "".join(under)
        + inner
        + "".join(over)
        + "</svg>"
    )


_MICRO: Final = 1_000_000  # the cost scale counts in millionths of a dollar
_COST_PLOT: Final = 1000  # plot units from the cost chart's bottom to its top
COST_COLOUR: Final = "#6e7781"
TOTAL_COLOUR: Final = "#0a58ca"
COST_UNIT: Final = "USD"
TOTAL_UNIT: Final = "USD so far"


def usd_scale(peak: float) -> tuple[list[int], int]:
    """The ticks and the top of a USD scale, in millionths of a dollar (``scale``)."""
    step, top = scale(math.ceil(peak * _MICRO))
    return list(range(step, top + 1, step)), top


def usd_label(micro: int) -> str:
    """A tick of a USD scale (in millionths) in as few decimals as it needs: ``0.025``."""
    return f"{micro / _MICRO:.6f}".rstrip("0").rstrip(".")


def _right_text(text: str, y: float, cls: str) -> str:
    """A label of the running total's scale: left-aligned ``_GAP`` pixels right of the plot."""
    return (
        f'<text x="100%" dx="{_GAP}" y="{y:.1f}" text-anchor="start" '
        f'dominant-baseline="middle" class="{cls}">{text}</text>'
    )


def cost_svg(turns: list[TimelineTurn]) -> str:
    """What each turn cost: a bar of its cost (USD, the scale at the left), its miss_cost the
    bar's top part in the miss's colour, and the running total of the page's turns as a line
    with a point per turn (the scale at the right). A turn without a cost draws no bar."""
    slots = max(len(turns), _MIN_SLOTS)
    peak = max([0.0] + [turn.cost for turn in turns if turn.cost is not None])
    totals = running_totals(turns)
    ticks, top = usd_scale(peak)
    total_ticks, total_top = usd_scale(max([0.0, *totals]))
    under: list[str] = []
    over = [
        f'<line x1="0" x2="100%" y1="{_TOP + _PLOT}" y2="{_TOP + _PLOT}" class="axis"/>',
        f'<line x1="0.5" x2="0.5" y1="{_TOP}" y2="{_TOP + _PLOT}" class="axis"/>',
        f'<line x1="100%" x2="100%" y1="{_TOP}" y2="{_TOP + _PLOT}" class="axis"/>',
    ]
    labels, right = [COST_UNIT], [TOTAL_UNIT]
    for tick in ticks:
        y = _TOP + _PLOT * (1 - tick / top)
        labels.append(usd_label(tick))
        under.append(f'<line x1="0" x2="100%" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        over.append(_scale_text(usd_label(tick), y, "cost-scale"))
    over.append(_scale_text(COST_UNIT, _TOP - 13, "cost-unit"))
    for tick in total_ticks:
        y = _TOP + _PLOT * (1 - tick / total_top)
        right.append(usd_label(tick))
        over.append(_right_text(usd_label(tick), y, "total-scale"))
    over.append(_right_text(TOTAL_UNIT, _TOP - 13, "total-unit"))
    plot: list[str] = []
    line: list[str] = []  # the running total: segments in CSS units, so the stroke keeps its width
    previous: tuple[str, str] | None = None
    for index, turn in enumerate(turns):
        label = _label(turn)
        left = index * _SLOT + 1
        over.append(_number(turns, index, slots, _NUMBERS_Y, "cost-number"))
        if turn.cost is not None and turn.cost > 0:
            height = _COST_PLOT * turn.cost * _MICRO / top
            plot.append(
                f'<rect x="{left}" y="{_COST_PLOT - height:.3f}" width="2" '
                f'height="{height:.3f}" fill="{COST_COLOUR}" class="cost-bar">'
                f"<title>turn {label}: cost {dollars(turn.cost)} USD</title></rect>"
            )
            missed = min(turn.miss_cost or 0.0, turn.cost)
            if missed > 0 and turn.miss is not None:
                part = _COST_PLOT * missed * _MICRO / top
                plot.append(
                    f'<rect x="{left}" y="{_COST_PLOT - height:.3f}" width="2" '
                    f'height="{part:.3f}" fill="{MISS_COLOUR[turn.miss]}" '
                    f'class="miss-part {turn.miss}"><title>turn {label}: the miss cost '
                    f"{dollars(missed)} USD</title></rect>"
                )
        point = (
            _x(index + 0.5, slots),
            f"{_TOP + _PLOT * (1 - totals[index] / total_top * _MICRO):.1f}",
        )
        if previous is not None:
            line.append(
                f'<line x1="{previous[0]}" y1="{previous[1]}" x2="{point[0]}" y2="{point[1]}" '
                f'stroke="{TOTAL_COLOUR}" stroke-width="2" class="total"/>'
            )
        line.append(
            f'<circle cx="{point[0]}" cy="{point[1]}" r="3" fill="{TOTAL_COLOUR}" '
            f'class="total-point"><title>after turn {label}: {dollars(totals[index])} USD so '
            "far</title></circle>"
        )
        previous = point
    inner = (
        f'<svg x="0" y="{_TOP}" width="100%" height="{_PLOT}" '
        f'viewBox="0 0 {slots * _SLOT} {_COST_PLOT}" preserveAspectRatio="none">'
        + "".join(plot)
        + "</svg>"
    )
    return (
        f'<svg id="cost-chart" class="chart cost" style="--scale:{label_margin(labels)}px;'
        f'--right:{label_margin(right)}px" xmlns="http://www.w3.org/2000/svg" width="100%" '
        f'height="{_NUMBERS_Y + 6}" role="img" aria-label="Cost per turn in USD, the part '
        f'its cache miss cost marked, and the running total of these turns">'
        + "".join(under)
        + inner
        + "".join(over)
        + "".join(line)
        + "</svg>"
    )


# --------------------------------------------------------------------------- HTML

_STYLE = """
svg.chart{display:block;width:calc(100% - var(--scale));max-width:100%;overflow:visible;
margin:.4rem 0 1rem var(--scale)}
svg.chart.cost{width:calc(100% - var(--scale) - var(--right))}
svg.chart .grid{stroke:#e3e3e3}svg.chart .axis{stroke:#666}
svg.chart text{font:11px system-ui,sans-serif;fill:#555}
.legend{display:flex;flex-wrap:wrap;gap:.3rem 1.2rem;margin:.4rem 0}
.legend span{white-space:nowrap}
svg.mk{width:12px;height:12px;vertical-align:-1px;margin-right:.3rem}
tr.prefix_changed td{background:#ffebe9}tr.expired td{background:#f3eefe}
tr.provider td{background:#fff1e5}
nav.pages{display:flex;flex-wrap:wrap;gap:.4rem 1.2rem;margin:.6rem 0}
@media (max-width:40rem){svg.chart text.minor{display:none}}
"""


def _mark_icon(kind: CacheMiss) -> str:
    """A miss mark for the legend and the table (its own small SVG)."""
    return f'<svg class="mk" viewBox="-7 -7 14 14" aria-hidden="true">{mark(kind, "0", 0)}</svg>'


def _row(turn: TimelineTurn, models: bool) -> str:
    """A turn's row; the model's cell only when the page's turns differ in model."""
    breakdown = f"../{quote(turn.preparation_id, safe='')}/breakdown"
    miss = "-"
    if turn.miss is not None:
        miss = f"{_mark_icon(turn.miss)}{e(MISS_WORDS[turn.miss])}"
    if turn.first_change is not None:  # the prefix changed: by name, where
        miss += f": {e(change_words(turn.first_change))}"
    cells = [
        cell("turn", e(_label(turn)), "n"),
        cell("preparation", f'<a class=id href="{breakdown}">{e(turn.preparation_id)}</a>'),
        cell("model", e(turn.model), "nw") if models else "",
        cell("total input", str(turn.total_input_tokens), "n"),
        cell("prefix kept", _kept(turn.prefix_kept)),
        cell("cacheable", count(turn.cacheable_tokens), "n"),
        cell("expected cached", count(turn.expected_cached_tokens), "n"),
        cell("reported cached", count(turn.cached_input_tokens), "n"),
        cell("cost (USD)", dollars(turn.cost), "n"),
        cell("miss cost (USD)", dollars(turn.miss_cost), "n"),
        cell("compaction", e(compaction_words(turn))),
        cell("miss", miss),
    ]
    cls = "" if turn.miss is None else f' class="{turn.miss}"'
    return f"<tr{cls}>{''.join(cells)}</tr>"


def _cost_section(timeline: Timeline) -> str:
    """The page's total, its legend and the cost chart; nothing when no turn has a cost."""
    words = _cost_words(timeline)
    if words is None:
        return ""
    legend = (
        f'<span><span class=sw style="background:{COST_COLOUR}"></span>cost of the turn</span>'
        + "".join(
            f'<span><span class=sw style="background:{MISS_COLOUR[kind]}"></span>'
            f"of which the miss ({e(MISS_WORDS[kind])})</span>"
            for kind in MISS_WORDS
        )
        + f'<span><span class=sw style="background:{TOTAL_COLOUR}"></span>running total '
        "(right scale)</span>"
    )
    return f"<p id=cost>{e(words)}</p><div class=legend id=cost-legend>{legend}</div>" + cost_svg(
        timeline.turns
    )


def render_html(timeline: Timeline, before: int | None = None) -> str:
    """A self-contained HTML page (no scripts, no external resources), readable from 360 px
    wide (``pages``): the heading, the page links, the legend and the charts, the table of
    turns and what each kind of miss means."""
    names = sorted({turn.model for turn in timeline.turns})
    models = len(names) > 1
    nav = _pages_nav(timeline, before)
    model = "" if models or not names else f" Model {e(names[0])}."
    body = f"""<h1>Timeline of <span class=id>{e(timeline.preparation_id)}</span></h1>
<p>{e(_range(timeline))} of this conversation, oldest first (at most {TIMELINE_TURNS} a page).{model}
Each turn is compared with the one before it; a turn is marked when it read less from the
provider's cache than it could have.</p>
{nav}
<div class=legend id=legend>{_legend()}</div>
{chart_svg(timeline.turns)}
{_cost_section(timeline)}
<div class=scroll><table id=turns class=cards><tr>{_heading(models)}</tr>{"".join(_row(turn, models) for turn in timeline.turns)}</table></div>
<ul id=misses>{_miss_meanings()}</ul>
{nav}"""
    return page(f"Timeline {timeline.preparation_id}", _STYLE, body)


def _legend() -> str:
    """The chart's legend: a swatch of each series, then the mark of each kind of miss."""
    return "".join(
        f'<span><span class=sw style="background:{s.colour}"></span>{e(s.label)}</span>'
        for s in SERIES
    ) + "".join(
        f'<span title="{e(MISS_MEANING[kind])}">{_mark_icon(kind)}{e(words)}</span>'
        for kind, words in MISS_WORDS.items()
    )


def _pages_nav(timeline: Timeline, before: int | None) -> str:
    """The links to the older, the newer and the newest turns (nothing on a page that is all
    of the conversation)."""
    links = []
    if timeline.older_before is not None:
        links.append(f'<a id=older href="timeline?before={timeline.older_before}">older turns</a>')
    newer = newer_before(timeline, before)
    if newer is not None:
        links.append(f'<a id=newer href="timeline?before={newer}">newer turns</a>')
    if before is not None:
        links.append('<a id=newest href="timeline">newest turns</a>')
    return f"<nav class=pages>{''.join(links)}</nav>" if links else ""


def _miss_meanings() -> str:
    """What each kind of miss means, by its mark."""
    return "".join(
        f"<li>{_mark_icon(kind)}<b>{e(MISS_WORDS[kind])}</b>: {e(meaning)}</li>"
        for kind, meaning in MISS_MEANING.items()
    )


def _heading(models: bool) -> str:
    """The table's heading; the model's column only when the page's turns differ in model."""
    return "".join(
        f"<th{' class=n' if numeric else ''}>{label}</th>"
        for label, numeric, shown_ in (
            ("turn", True, True),
            ("preparation", False, True),
            ("model", False, models),
            ("total input", True, True),
            ("prefix kept", False, True),
            ("cacheable", True, True),
            ("expected cached", True, True),
            ("reported cached", True, True),
            ("cost (USD)", True, True),
            ("miss cost (USD)", True, True),
            ("compaction", False, True),
            ("miss, first change", False, True),
        )
        if shown_
    )
