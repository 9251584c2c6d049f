"""The replay's figures: totals per policy, the text table, JSON and the HTML page.

Per policy: the calls, the refused ones, the input tokens, the cache reads and writes, the cached
share (read ÷ input), the relative price (the input's cost ÷ the cost of the same input sent
uncached) and on how many calls the policy read at least as much as ``last-message`` with the
same lifetime did (``recorded`` and ``none`` against ``last-message 5m``).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from context_assembly.replay.policies import ConversationResult, Outcome, Policy, PolicyRun

FORMAT_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Totals:
    requests: int
    refused: int
    input_tokens: int
    cache_read: int
    cache_write: int
    cost: float
    at_least: int | None  # calls reading at least as much as last-message (None: itself)
    compared: int
    dollars: float | None = None  # the input's cost in USD (``None``: a call without a price)
    summaries: int = 0  # summary calls (``compaction:summary``), counted in the cost only

    @property
    def cached_share(self) -> float:
        return self.cache_read / self.input_tokens if self.input_tokens else 0.0

    @property
    def relative_price(self) -> float:
        return self.cost / self.input_tokens if self.input_tokens else 1.0

    def add(self, other: Totals) -> Totals:
        at_least = (
            None
            if self.at_least is None and other.at_least is None
            else (self.at_least or 0) + (other.at_least or 0)
        )
        return Totals(
            self.requests + other.requests,
            self.refused + other.refused,
            self.input_tokens + other.input_tokens,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
            self.cost + other.cost,
            at_least,
            self.compared + other.compared,
            None if self.dollars is None or other.dollars is None else self.dollars + other.dollars,
            self.summaries + other.summaries,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "refused": self.refused,
            "input_tokens": self.input_tokens,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
            "cached_share": round(self.cached_share, 6),
            "relative_price": round(self.relative_price, 6),
            "input_usd": None if self.dollars is None else round(self.dollars, 6),
            "cost_tokens": round(self.cost),
            "summary_calls": self.summaries,
            "at_least_last_message": self.at_least,
            "compared": self.compared,
        }


def baseline(policy: Policy, runs: Sequence[PolicyRun]) -> PolicyRun | None:
    """The ``last-message`` run a policy is compared with (``None`` for itself or when absent)."""
    if policy.kind == "last-message":
        return None
    ttl = policy.ttl if policy.kind in ("theory", "service") else "5m"
    return next((r for r in runs if r.policy.kind == "last-message" and r.policy.ttl == ttl), None)


def totals(run: PolicyRun, runs: Sequence[PolicyRun]) -> Totals:
    """A run's totals. A summary call (``compaction:summary``) adds its input and output to the
    cost, never to the requests, tokens or comparisons of the calls themselves."""
    summaries = [o for o in run.outcomes if o.summary]
    outcomes = [o for o in run.outcomes if not o.summary]
    base = baseline(run.policy, runs)
    at_least: int | None = None
    compared = 0
    if base is not None:
        reads = {o.index: o.usage.cache_read for o in base.outcomes}
        pairs = [(o, reads[o.index]) for o in outcomes if o.index in reads]
        compared = len(pairs)
        at_least = sum(o.usage.cache_read >= read for o, read in pairs)
    return Totals(
        requests=len(outcomes),
        refused=sum(o.refused for o in outcomes),
        input_tokens=sum(o.usage.input_tokens for o in outcomes),
        cache_read=sum(o.usage.cache_read for o in outcomes),
        cache_write=sum(o.usage.cache_write for o in outcomes),
        cost=sum(run.prices.cost(o.usage, o.summary_output) for o in run.outcomes),
        at_least=at_least,
        compared=compared,
        dollars=_dollars(run, run.outcomes),
        summaries=len(summaries),
    )


def _dollars(run: PolicyRun, outcomes: Sequence[Outcome]) -> float | None:
    """The cost in USD at the model's price, or ``None`` when a call has none."""
    total = 0.0
    for outcome in outcomes:
        dollars = run.prices.dollars(outcome.usage, outcome.summary_output)
        if dollars is None:
            return None
        total += dollars
    return total


def pooled(results: Iterable[ConversationResult]) -> dict[str, Totals]:
    """Totals per policy label over every conversation (in first-seen order)."""
    out: dict[str, Totals] = {}
    for result in results:
        for run in result.runs:
            got = totals(run, result.runs)
            label = run.policy.label
            out[label] = out[label].add(got) if label in out else got
    return out


def share(outcome: Outcome) -> float:
    usage = outcome.usage
    return usage.cache_read / usage.input_tokens if usage.input_tokens else 0.0


# --------------------------------------------------------------------------- text


HEADER: Final = (
    "policy",
    "requests",
    "refused",
    "input",
    "cache read",
    "cache write",
    "cached",
    "price",
    "cost",
    "input USD",
    "≥ last-message",
)


def _row(label: str, t: Totals) -> tuple[str, ...]:
    at_least = "—" if t.at_least is None else f"{t.at_least}/{t.compared}"
    return (
        label,
        f"{t.requests:,}",
        f"{t.refused:,}",
        f"{t.input_tokens:,}",
        f"{t.cache_read:,}",
        f"{t.cache_write:,}",
        f"{t.cached_share * 100:.1f}%",
        f"{t.relative_price:.3f}",
        f"{t.cost / 1e6:,.2f}M" + (f" ({t.summaries} sum.)" if t.summaries else ""),
        "—" if t.dollars is None else f"{t.dollars:,.2f}",
        at_least,
    )


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = []
    for r in (header, *rows):
        cells = [
            r[0].ljust(widths[0]),
            *(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)),
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _describe(result: ConversationResult) -> list[str]:
    calls = result.calls
    lines = [f"{result.name} ({result.kind}): {len(calls)} calls"]
    for info in result.models.values():
        if info.entry is None:
            minimum = "none" if info.minimum is None else f"{info.minimum:,}"
            lines.append(
                f"  model {info.requested}: not in the registry (minimum cacheable prefix: the "
                f"largest of its provider, {minimum})"
            )
            continue
        minimum = "none" if info.minimum is None else f"{info.minimum:,}"
        window = "unknown" if info.context_window is None else f"{info.context_window:,}"
        lines.append(
            f"  model {info.requested} → {info.entry}: window {window}, minimum cacheable "
            f"prefix {minimum}"
        )
    reference = [c.reference_input_tokens for c in calls if c.reference_input_tokens is not None]
    if reference:
        lines.append(f"  the trace's own input tokens: {sum(reference):,}")
    lines.extend(f"  note: {note}" for note in result.notes)
    return lines


def _turn_lines(result: ConversationResult) -> list[str]:
    runs = result.runs
    if not runs or not result.calls:
        return []
    start = result.calls[0].at
    header = ["call", "t (s)", "recorded in", *(f"[{i + 1}]" for i in range(len(runs)))]
    by_index = [{o.index: o for o in run.outcomes if not o.summary} for run in runs]
    rows = []
    for call in result.calls:
        cells = [
            str(call.index),
            f"{(call.at - start).total_seconds():.0f}",
            "—" if call.reference_input_tokens is None else f"{call.reference_input_tokens:,}",
        ]
        for outcomes in by_index:
            got = outcomes.get(call.index)
            if got is None:
                cells.append("—")
            elif got.refused:
                cells.append("refused")
            else:
                cells.append(f"{share(got) * 100:.0f}%")
        rows.append(cells)
    legend = [f"  [{i + 1}] {run.policy.label}" for i, run in enumerate(runs)]
    lines = ["", "cached share per call:", *legend, *_table(rows, header)]
    reported = _reported_lines(result)
    return lines + reported


def _reported_lines(result: ConversationResult) -> list[str]:
    """Predicted (the ``recorded`` policy) against reported usage, per call, where a log has it."""
    run = next((r for r in result.runs if r.policy.kind == "recorded"), None)
    if run is None or not any(c.reported for c in result.calls):
        return []
    predicted = {o.index: o for o in run.outcomes}
    rows = []
    for call in result.calls:
        if call.reported is None or call.index not in predicted:
            continue
        usage = predicted[call.index].usage
        r = call.reported

        def pair(predicted_value: int, reported_value: int | None) -> str:
            shown = "—" if reported_value is None else f"{reported_value:,}"
            return f"{predicted_value:,} / {shown}"

        rows.append(
            (
                str(call.index),
                pair(usage.input_tokens, r.input_tokens),
                pair(usage.cache_read, r.cache_read),
                pair(usage.cache_write, r.cache_write),
            )
        )
    header = ("call", "input predicted / reported", "read", "write")
    return ["", "the recorded requests, predicted / reported usage:", *_table(rows, header)]


def text(results: Sequence[ConversationResult], *, turns: bool = False, each: bool = True) -> str:
    lines: list[str] = []
    if each or len(results) == 1:
        for result in results:
            lines.extend(_describe(result))
            rows = [_row(run.policy.label, totals(run, result.runs)) for run in result.runs]
            lines.extend(_table(rows, HEADER))
            if turns:
                lines.extend(_turn_lines(result))
            lines.append("")
    if len(results) > 1:
        calls = sum(len(r.calls) for r in results)
        lines.append(f"all {len(results)} conversations ({calls:,} calls):")
        notes = sorted({n for r in results for n in r.notes if "skipped" in n and "layout" in n})
        lines.extend(f"  note: {note}" for note in notes)
        rows = [_row(label, t) for label, t in pooled(results).items()]
        lines.extend(_table(rows, HEADER))
        lines.append("")
    lines.append(
        "cost: in millions of uncached input tokens, the same unit for every policy of a "
        "conversation (with compaction:summary, the summary calls included: their input read "
        "from the cache, their output at the output price); "
        "price: the input's cost relative to the same input sent uncached (Anthropic: read 0.1, "
        "5m write 1.25, 1h write 2; OpenAI: read at the model's cached price, no write price "
        "but on GPT-5.6 and later, write 1.25); "
        "input USD: the input's cost at the model's price in the service's price data (GET "
        "/v1/models), — for a model without one."
    )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- JSON


def _policy_json(policy: Policy) -> dict[str, Any]:
    return {
        "label": policy.label,
        "kind": policy.kind,
        "layout": policy.layout,
        "split": policy.split if policy.kind == "service" else None,
        "ttl": policy.ttl if policy.kind not in ("none", "recorded") else None,
        "compaction": policy.compaction if policy.kind == "service" else None,
    }


def as_json(results: Sequence[ConversationResult]) -> bytes:
    conversations = []
    for result in results:
        start = result.calls[0].at if result.calls else None
        conversations.append(
            {
                "name": result.name,
                "kind": result.kind,
                "notes": result.notes,
                "models": [
                    {
                        "requested": m.requested,
                        "entry": m.entry,
                        "provider": m.provider,
                        "context_window": m.context_window,
                        "min_cacheable_prefix": m.minimum,
                    }
                    for m in result.models.values()
                ],
                "calls": [
                    {
                        "index": c.index,
                        "at": c.at.isoformat(),
                        "seconds": (c.at - start).total_seconds() if start else 0.0,
                        "model": c.model,
                        "recorded_input_tokens": c.reference_input_tokens,
                        "output_tokens": c.output_tokens,
                        "rewritten": c.rewritten,
                        "reported": None
                        if c.reported is None
                        else {
                            "input_tokens": c.reported.input_tokens,
                            "cache_read": c.reported.cache_read,
                            "cache_write": c.reported.cache_write,
                        },
                    }
                    for c in result.calls
                ],
                "policies": [
                    {
                        **_policy_json(run.policy),
                        "totals": totals(run, result.runs).as_json(),
                        "requests": [
                            {
                                "index": o.index,
                                "input_tokens": o.usage.input_tokens,
                                "cache_read": o.usage.cache_read,
                                "cache_write_5m": o.usage.cache_write_5m,
                                "cache_write_1h": o.usage.cache_write_1h,
                                "refused": o.refused,
                                "summary_output_tokens": o.summary_output,
                                "relative_price": round(
                                    run.prices.cost(o.usage) / o.usage.input_tokens, 6
                                )
                                if o.usage.input_tokens
                                else 1.0,
                            }
                            for o in run.outcomes
                        ],
                    }
                    for run in result.runs
                ],
            }
        )
    document = {
        "format_version": FORMAT_VERSION,
        "conversations": conversations,
        "total": [{"label": label, **t.as_json()} for label, t in pooled(results).items()],
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2)


# --------------------------------------------------------------------------- HTML

_COLOURS: Final = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39",
    "#7b4173", "#3182bd",
)  # fmt: skip
_DASHES: Final = ("", "6 3", "2 3", "8 3 2 3")

_STYLE: Final = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #222; max-width: 72rem; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: .5rem 0; }
th, td { padding: .2rem .6rem; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.box { overflow-x: auto; } .note { color: #555; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
"""


def _html_table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return (
        f'<div class="box"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    )


def _chart(result: ConversationResult) -> str:
    """An SVG chart of the cached share per call, one line per policy."""
    runs = result.runs
    n = len(result.calls)
    if not runs or n == 0:
        return ""
    width, height = 760, 300
    left, right, top, bottom = 48, 16, 12, 36
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(index: int) -> float:
        return left + (plot_w * (index - 1) / (n - 1) if n > 1 else plot_w / 2)

    def y(value: float) -> float:
        return top + plot_h * (1 - value)

    parts = [
        f'<svg width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="cached share per call">'
    ]
    for tick in range(0, 101, 20):
        ty = y(tick / 100)
        parts.append(
            f'<line x1="{left}" y1="{ty:.1f}" x2="{width - right}" y2="{ty:.1f}" stroke="#e5e5e5"/>'
        )
        parts.append(f'<text x="{left - 6}" y="{ty + 4:.1f}" text-anchor="end">{tick}%</text>')
    step = max(1, round(n / 10))
    for index in [*range(1, n + 1, step)]:
        parts.append(
            f'<text x="{x(index):.1f}" y="{height - bottom + 16}" text-anchor="middle">{index}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle">call</text>'
    )
    parts.append(
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>'
    )
    for i, run in enumerate(runs):
        colour = _COLOURS[i % len(_COLOURS)]
        dash = _DASHES[(i // len(_COLOURS)) % len(_DASHES)]
        points = " ".join(
            f"{x(o.index):.1f},{y(share(o)):.1f}" for o in run.outcomes if not o.summary
        )
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5"{dashed} '
            f'points="{points}"><title>{html.escape(run.policy.label)}</title></polyline>'
        )
    parts.append("</svg>")
    legend = "".join(
        f'<li><span style="color:{_COLOURS[i % len(_COLOURS)]}">━━</span> '
        f"{html.escape(run.policy.label)}</li>"
        for i, run in enumerate(runs)
    )
    return "".join(parts) + f'<ul class="note">{legend}</ul>'


def as_html(results: Sequence[ConversationResult]) -> str:
    sections = []
    if len(results) > 1:
        rows = [_row(label, t) for label, t in pooled(results).items()]
        calls = sum(len(r.calls) for r in results)
        sections.append(
            f"<h2>All {len(results)} conversations ({calls:,} calls)</h2>"
            + _html_table(rows, HEADER)
        )
    for result in results:
        describe = _describe(result)
        rows = [_row(run.policy.label, totals(run, result.runs)) for run in result.runs]
        notes = "".join(f"<li>{html.escape(line.strip())}</li>" for line in describe[1:])
        sections.append(
            f"<h2>{html.escape(describe[0])}</h2>"
            + (f'<ul class="note">{notes}</ul>' if notes else "")
            + _html_table(rows, HEADER)
            + "<h3>Cached share per call</h3>"
            + _chart(result)
        )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>context-assembly replay</title><style>{_STYLE}</style></head><body>"
        "<h1>context-assembly replay</h1>"
        '<p class="note">Input tokens, cache reads and writes under each provider\'s documented '
        "cache rules, per policy. Cached share: read ÷ input. Price: the input's cost relative to "
        "the same input sent uncached.</p>" + "".join(sections) + "</body></html>\n"
    )
