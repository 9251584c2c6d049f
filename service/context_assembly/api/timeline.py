"""The human view of a conversation's turns: one row per preparation of the scope (total input,
prefix kept, first change, expected and reported cached tokens) and an inline SVG chart of those
figures per turn.

HTML for browsers (``Accept: text/html``), plain text otherwise (JSON is the route's, from the
``Timeline`` model). Ids, figures and part names only: the records hold no text to show.
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from context_assembly.api.breakdown import count, shown
from context_assembly.lifecycle import Timeline, TimelineTurn

# The chart's series: the answer's field, its legend and its colour.
_SERIES = (
    ("total_input_tokens", "total input", "#9aa4b1"),
    ("expected_cached_tokens", "expected cached", "#4a7bd0"),
    ("cached_input_tokens", "reported cached", "#1a7f37"),
)
_KEPT_COLOUR = {True: "#1a7f37", False: "#cf222e", None: "#9aa4b1"}


def _kept(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _change(turn: TimelineTurn) -> str:
    change = turn.first_change
    if change is None:
        return "-"
    return change.part if change.index is None else f"{change.part}[{change.index}]"


def render_text(timeline: Timeline) -> str:
    """A fixed-width table, oldest turn first."""
    lines = [
        f"timeline of {shown(timeline.preparation_id)} ({len(timeline.turns)} turns)",
        f"{'turn':>4}  {'preparation':<30} {'input':>8} {'kept':>4}  {'first change':<16} "
        f"{'expected':>8} {'reported':>8}",
    ]
    for number, turn in enumerate(timeline.turns, 1):
        lines.append(
            f"{number:>4}  {shown(turn.preparation_id):<30} {turn.total_input_tokens:>8} "
            f"{_kept(turn.prefix_kept):>4}  {_change(turn):<16} "
            f"{count(turn.expected_cached_tokens):>8} {count(turn.cached_input_tokens):>8}"
        )
    return "\n".join(lines) + "\n"


def chart_svg(turns: list[TimelineTurn]) -> str:
    """Grouped bars per turn (total input, expected and reported cached tokens, all on one
    scale) and a dot under each turn: green when the prefix was kept, red when not, grey when
    there was nothing to compare with. A missing figure draws no bar."""
    group, bar, height, top = 36, 10, 160, 10
    width = max(1, len(turns)) * group + 20
    peak = max(
        [1]
        + [
            value
            for turn in turns
            for field, _, _ in _SERIES
            if isinstance(value := getattr(turn, field), int)
        ]
    )
    shapes = [
        f'<line x1="10" y1="{top + height}" x2="{width - 10}" y2="{top + height}" stroke="#999"/>'
    ]
    for number, turn in enumerate(turns):
        x0 = 10 + number * group + 3
        for offset, (field, label, colour) in enumerate(_SERIES):
            value = getattr(turn, field)
            if not isinstance(value, int) or value <= 0:
                continue
            h = max(1.0, height * value / peak)
            shapes.append(
                f'<rect x="{x0 + offset * bar}" y="{top + height - h:.1f}" width="{bar - 1}" '
                f'height="{h:.1f}" fill="{colour}"><title>turn {number + 1}: {label} {value}'
                "</title></rect>"
            )
        shapes.append(
            f'<circle cx="{x0 + 15}" cy="{top + height + 10}" r="4" '
            f'fill="{_KEPT_COLOUR[turn.prefix_kept]}"><title>turn {number + 1}: prefix kept '
            f"{_kept(turn.prefix_kept)}</title></circle>"
        )
    return (
        f'<svg id=chart xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{top + height + 20}" role="img" aria-label="tokens per turn">'
        + "".join(shapes)
        + "</svg>"
    )


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2rem;color:#222}
table{border-collapse:collapse;margin:1rem 0}td,th{padding:.2rem .6rem;border-bottom:1px solid #ddd;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.sw{display:inline-block;width:.8rem;height:.8rem;vertical-align:middle;margin:0 .3rem 0 .8rem}
.no{color:#cf222e}
"""


def render_html(timeline: Timeline) -> str:
    """A self-contained HTML page (no scripts, no external resources)."""

    def e(text: str) -> str:
        return escape(shown(text))

    rows = "".join(
        f"<tr{' class=no' if turn.prefix_kept is False else ''}><td class=n>{number}</td>"
        f'<td><a href="../{quote(turn.preparation_id, safe="")}/breakdown">'
        f"{e(turn.preparation_id)}</a></td>"
        f"<td>{e(turn.model)}</td><td>{e(turn.render)}</td><td>{e(turn.layout)}</td>"
        f"<td class=n>{turn.total_input_tokens}</td><td>{_kept(turn.prefix_kept)}</td>"
        f"<td>{e(_change(turn))}</td><td class=n>{count(turn.expected_cached_tokens)}</td>"
        f"<td class=n>{count(turn.cached_input_tokens)}</td></tr>"
        for number, turn in enumerate(timeline.turns, 1)
    )
    legend = "".join(
        f'<span class=sw style="background:{colour}"></span>{e(label)}'
        for _, label, colour in _SERIES
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Timeline {e(timeline.preparation_id)}</title>
<style>{_STYLE}</style></head><body>
<h1>Timeline of {e(timeline.preparation_id)}</h1>
<p>{len(timeline.turns)} turns in this scope, oldest first.{legend}</p>
{chart_svg(timeline.turns)}
<table id=turns><tr><th>turn</th><th>preparation</th><th>model</th><th>render</th><th>layout</th>
<th>total input</th><th>prefix kept</th><th>first change</th><th>expected cached</th>
<th>reported cached</th></tr>{rows}</table>
</body></html>
"""
