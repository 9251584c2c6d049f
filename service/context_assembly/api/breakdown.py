"""The human view of one preparation: the window as a stacked bar and a table whose parts add up
to the capacity, the cache plan and how the turn fared against the previous one, decisions with
reasons and dependencies, sources (a failed one with its cause), hashes and accounting.

HTML for browsers (``Accept: text/html``), plain text otherwise. It shows ids, names, statuses,
reasons and token counts only: the stored record has no block bodies, instructions or history
to show.

Totals, as the page states them: the parts of the window (input terms, data, unused, reserves)
add up to the capacity; ``remaining`` is the one figure left for data after the other input
terms and the reserves, and it is the data plus the unused part; the data message is counted
whole, so it is its entered blocks (counted one by one) plus the message's framing and source
headers.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from context_assembly.api.pages import cell, count, duration, e, page, shown
from context_assembly.api.turn_words import (
    MISS_WORDS,
    change_words,
    expected_words,
    reported_words,
)
from context_assembly.core.result import BudgetReport, CacheReport, SourceFailureReport
from context_assembly.lifecycle_models import PreparationView
from context_assembly.preparations.operations import Breakdown

__all__ = ["count", "render_html", "render_text", "shown"]


@dataclass(frozen=True, slots=True)
class Part:
    """A part of the window: its label, tokens, mark in the text view and colour in HTML."""

    label: str
    tokens: int
    mark: str
    colour: str


_SKIP_WORDS: Final = {
    "below_minimum": "the tokens up to it are below the model's minimum cacheable length",
    "unstable_in_layout": "in the legacy layout that part changes every turn",
    "limit": "the provider accepts at most 4 markers",
}
_OPENAI: Final = ("openai-chat", "openai-responses")


def _per_turn_label(legacy_views: list[str] | None) -> str:
    """The date line's part, named by what it holds: legacy views only when there are some."""
    if legacy_views is None:  # a record made before the views were kept
        return "date line + legacy views"
    if not legacy_views:
        return "date line"
    return f"date line + legacy views ({', '.join(shown(v) for v in legacy_views)})"


def parts(budget: BudgetReport, legacy_views: list[str] | None) -> list[Part]:
    """The window in frame order, parts of 0 tokens left out: the input terms, the data, the
    unused rest of the remaining tokens, the reserves. They add up to the capacity."""
    b = budget
    found = [
        Part("instructions", b.instructions_tokens, "I", "#4a7bd0"),
        Part(_per_turn_label(legacy_views), b.legacy_data_tokens, "L", "#8250df"),
        Part("tools", b.tools_tokens, "T", "#bf3989"),
        Part("history", b.history_tokens, "H", "#0a7ea4"),
        Part("input", b.input_tokens, "U", "#1a7f37"),
        Part("data", b.data_tokens, "D", "#d4a72c"),
        Part("unused", unused(b), "F", "#e6e6e6"),
        Part("response reserve", b.response_reserve, "R", "#9a6700"),
        Part("reasoning reserve", b.reasoning_reserve_tokens, "Q", "#cf222e"),
    ]
    return [part for part in found if part.tokens > 0]


def failure_words(failure: SourceFailureReport) -> str:
    """A failed source's cause in one line: its name, the HTTP status or the field path, then
    the words (``http_status 503: HTTP 503``, ``invalid_answer at blocks.0.id: schema: ...``)."""
    where = f" {failure.status}" if failure.status is not None else ""
    where += f" at {failure.field}" if failure.field is not None else ""
    return shown(f"{failure.cause}{where}: {failure.detail}")


def unused(budget: BudgetReport) -> int:
    """What the data left of the remaining tokens."""
    return max(0, budget.remaining_tokens - budget.data_tokens)


def _spread(tokens: list[int], width: int) -> list[int]:
    """Character widths for ``tokens`` that fill ``width``: proportional, but every non-zero
    part at least one character wide, so that a term of a few tokens in a large window stays
    visible; the largest part gives up what the small ones take."""
    total = sum(tokens)
    if total <= 0:
        return [0] * len(tokens)
    widths = [max(1, round(width * t / total)) if t > 0 else 0 for t in tokens]
    largest = max(range(len(tokens)), key=lambda i: tokens[i])
    widths[largest] = max(1, widths[largest] + width - sum(widths))
    return widths


def _share(tokens: int, capacity: int) -> str:
    """``tokens`` as a percentage of the window, with a digit more below 1%."""
    if capacity <= 0:
        return "-"
    share = 100 * tokens / capacity
    if share == 0:
        return "0%"
    return f"{share:.2f}%" if 0 < share < 1 else f"{share:.1f}%"


def entered_tokens(view: PreparationView) -> int:
    """The tokens of the blocks that entered the data message (selected or projected), each
    counted alone."""
    return sum(b.tokens for b in view.selection.blocks if b.status != "omitted")


def _entered_count(view: PreparationView) -> int:
    return sum(1 for b in view.selection.blocks if b.status != "omitted")


def remaining_words(view: PreparationView) -> str:
    """The one remaining figure, explained."""
    b = view.budget
    return (
        f"remaining {b.remaining_tokens} = data {b.data_tokens} + unused {unused(b)}: what the "
        "reserves and the other input terms leave of the window."
    )


def data_words(view: PreparationView) -> str:
    """The data message against its limit and its blocks."""
    b = view.budget
    limit = (
        f"at most {b.data_limit_tokens}: max_data_tokens {view.selection.max_data_tokens}, "
        "or the remaining tokens when fewer"
    )
    entered = entered_tokens(view)
    blocks = _entered_count(view)
    if blocks == 0:
        return f"data 0 ({limit}): no block entered the prompt."
    noun = "block" if blocks == 1 else "blocks"
    rest = b.data_tokens - entered
    if rest >= 0:
        return (
            f"data {b.data_tokens} ({limit}) = {entered} in the {blocks} entered {noun} + {rest} "
            "of message framing and source headers (the message is counted whole, each block "
            "alone)."
        )
    return (
        f"data {b.data_tokens} ({limit}) = {entered} in the {blocks} entered {noun} - {-rest}: "
        "the message counted whole takes fewer tokens than its blocks counted one by one."
    )


def _uncertainty(view: PreparationView) -> list[str]:
    notes = []
    if not view.selection.exact:
        notes.append(
            f"Counts are estimated ({view.selection.tokenizer}), not the model's own tokenizer."
        )
    if view.selection.opaque_or_multimodal:
        notes.append(
            "The request holds images, files or opaque items: their counts are conservative guesses."
        )
    if view.budget.provider_counted_tokens is not None:
        notes.append(
            f"The history is held by the provider: its {view.budget.provider_counted_tokens} "
            "tokens are the provider's count, not this service's."
        )
    if view.budget.history_dropped_messages:
        notes.append(
            f"The {view.budget.history_dropped_messages} oldest history messages were dropped "
            "to fit the window (history_policy)."
        )
    routing = view.selection.routing
    if routing is not None:
        tried = "; ".join(
            f"{c.model} {c.reason} (needs {c.needed_tokens} of {c.capacity})"
            for c in routing.candidates
        )
        pinned = ", pinned on refresh" if routing.pinned else ""
        notes.append(f"Routed ({routing.policy}{pinned}) to {routing.chosen}: {tried}.")
    return notes


# --------------------------------------------------------------------------- cache


def _nothing_cacheable(data: Breakdown) -> str:
    """Why this turn's prefix could not be cached, from its plan, render and layout."""
    view = data.view
    plan = view.selection.cache
    minimum = data.min_cacheable_tokens
    prefix = f"the stable prefix ({view.prefix_tokens} tokens)"
    if minimum is None:
        return f"the provider caches nothing for model {shown(view.model)} (no minimum known)"
    if view.render in _OPENAI:
        if view.layout == "legacy":
            return "in the legacy layout the leading message changes every turn"
        return f"{prefix} is below the model's minimum cacheable length ({minimum})"
    if plan is None or (not plan.breakpoints and not plan.skipped):
        return (
            "no cache marker was asked for (the request's cache object with breakpoints: true "
            "adds them)"
        )
    if plan.skipped and all(s.reason == "unstable_in_layout" for s in plan.skipped):
        return "in the legacy layout only the tools marker can be stable, and there are no tools"
    return f"{prefix} is below the model's minimum cacheable length ({minimum})"


@dataclass(frozen=True, slots=True)
class Fact:
    """One line of the cache section: a name and what to say (plain text, or list items);
    ``link``: the preparation whose id opens ``text``, linked to its breakdown in HTML."""

    name: str
    text: str
    items: tuple[str, ...] = ()
    link: str | None = None


def _plan_facts(view: PreparationView, plan: CacheReport | None) -> list[Fact]:
    render = shown(view.render)
    if plan is None:
        what = "none: the request has no cache object, so no directive was added"
        if view.render in _OPENAI:
            what += " (OpenAI caches a long enough prefix by itself)"
        return [Fact("plan", f"render {render}; {what}")]
    facts = [Fact("plan", f"render {render}")]
    if plan.breakpoints:
        facts.append(
            Fact(
                "breakpoints",
                "",
                tuple(
                    f"after {b.after}"
                    + ("" if b.message is None else f" (ends frame message {b.message})")
                    + f": {b.tokens} tokens up to it, ttl {b.ttl}"
                    for b in plan.breakpoints
                ),
            )
        )
    if plan.skipped:
        facts.append(
            Fact(
                "skipped",
                "",
                tuple(f"after {s.after}: {_SKIP_WORDS[s.reason]}" for s in plan.skipped),
            )
        )
    if plan.prompt_cache_key is not None or plan.prompt_cache_retention is not None:
        key = "-" if plan.prompt_cache_key is None else shown(plan.prompt_cache_key)
        retention = plan.prompt_cache_retention or "default"
        facts.append(Fact("OpenAI key", f"prompt_cache_key {key}, retention {retention}"))
    if not plan.breakpoints and not plan.skipped and view.render not in _OPENAI:
        if view.render in ("anthropic", "neutral"):
            facts.append(Fact("breakpoints", "none asked for (cache.breakpoints is false)"))
        else:
            facts.append(Fact("breakpoints", f"none: render {render} takes no cache directive"))
    return facts


def cache_facts(data: Breakdown) -> list[Fact]:
    """The cache section: the plan, the previous turn, the first change by name, the expected
    and the reported cached tokens with their causes."""
    view, turn = data.view, data.turn
    facts = _plan_facts(view, view.selection.cache)
    minimum = data.min_cacheable_tokens
    cacheable = count(turn.cacheable_tokens)
    if minimum is not None:
        cacheable += f" of the {view.prefix_tokens}-token stable prefix (model minimum {minimum})"
    facts.append(Fact("cacheable", cacheable))
    previous = turn.previous_preparation_id
    if previous is None:
        facts.append(Fact("previous turn", "none: the first turn of its conversation"))
    else:
        kept = {
            True: "prefix kept",
            False: "prefix not kept",
            None: "not found (unknown or expired)",
        }
        said = f"{shown(previous)}: {kept[turn.prefix_kept]}"
        facts.append(Fact("previous turn", said, link=previous))
    if turn.first_change is not None:
        facts.append(Fact("first change", change_words(turn.first_change)))
    expected = count(turn.expected_cached_tokens)
    facts.append(
        Fact("expected cached", f"{expected}: {expected_words(turn, _nothing_cacheable(data))}")
    )
    reported = count(turn.cached_input_tokens)
    said = reported_words(turn, view.accounting.last is not None)  # repairs report elsewhere
    facts.append(Fact("reported cached", f"{reported}: {said}"))
    if turn.miss is not None:
        facts.append(Fact("miss", MISS_WORDS[turn.miss]))
    return facts


def _turn_label(data: Breakdown) -> str:
    return "" if data.turn.turn is None else f" (turn {data.turn.turn})"


# --------------------------------------------------------------------------- text

_TEXT_WIDTH: Final = 96


def _wrapped(text: str, first: str, rest: str) -> list[str]:
    """``text`` in lines of at most ``_TEXT_WIDTH`` characters, after ``first`` on the first
    line and ``rest`` on the others; ids and hashes are never split."""
    return textwrap.wrap(
        text,
        width=_TEXT_WIDTH,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    )


def render_text(data: Breakdown) -> str:
    """A fixed-width text breakdown."""
    view = data.view
    b = view.budget
    lines = [
        f"preparation {shown(view.preparation_id)}  model {shown(view.model)}  layout "
        f"{view.layout}  attempt {view.attempt}",
        f"capacity {b.capacity} ({b.capacity_source})  total input {b.total_input_tokens}  "
        f"remaining {b.remaining_tokens}",
        "",
        "budget (the parts add up to the capacity):",
    ]
    window = parts(b, data.legacy_views)
    widths = _spread([p.tokens for p in window], 60)
    bar = "".join(p.mark * w for p, w in zip(window, widths, strict=True))
    lines.append(f"  window [{bar}] {b.capacity}")
    for p in window:
        lines.append(f"  {p.mark} {p.label:<20} {p.tokens:>9}  {_share(p.tokens, b.capacity):>7}")
    lines.append(f"  = {'capacity':<20} {b.capacity:>9}  {'100%':>7}")
    lines += _wrapped(remaining_words(view), "  ", "    ")
    lines += _wrapped(data_words(view), "  ", "    ")
    lines += ["", f"blocks ({len(view.selection.blocks)}):"]
    for block in view.selection.blocks:
        needs = ", ".join(shown(d) for d in block.dependencies)
        lines.append(
            f"  {block.status:<9} {block.reason:<18} {block.tokens:>7} / {block.full_tokens:<7} "
            f"{shown(block.source)}/{shown(block.id)}"
            + ("  [protected]" if block.protected else "")
            + (f"  <- {needs}" if needs else "")
        )
    lines += ["", "sources:"]
    for source in view.selection.sources:
        lines.append(
            f"  {shown(source.source):<24} {source.kind:<10} {source.status:<16} {source.duration_ms:>8.1f} ms  "
            f"{source.block_count} blocks"
        )
        if source.failure is not None:
            lines += _wrapped(failure_words(source.failure), "    failed: ", " " * 12)
    lines += ["", "cache:"]
    for fact in cache_facts(data):
        if fact.text:
            lines += _wrapped(fact.text, f"  {fact.name + ':':<17} ", " " * 20)
        else:
            lines.append(f"  {fact.name}:")
        for item in fact.items:
            lines += _wrapped(item, "    - ", "      ")
    lines.append(
        f"  {'timeline:':<17} GET /v1/preparations/{shown(view.preparation_id)}/timeline"
        + _turn_label(data)
    )
    lines += [
        "",
        f"prefix {view.prefix_hash}  ({view.prefix_tokens} tokens)",
        f"input  {view.input_hash}",
    ]
    acc = view.accounting
    lines.append(f"estimated input tokens {acc.estimated_input_tokens}")
    for name, obs in (("last", acc.last), ("auxiliary", acc.auxiliary)):
        if obs is None:
            lines.append(f"{name}: no usage report")
        else:
            lines.append(
                f"{name}: {obs.provider}/{obs.call} input {count(obs.provider_input_tokens)} "
                f"(delta {count(obs.input_token_delta)}) cached {count(obs.cached_input_tokens)} "
                f"(expected {count(obs.expected_cached_tokens)}) cache-creation {count(obs.cache_creation_input_tokens)} output {count(obs.output_tokens)}"
            )
    lines += [f"note: {shown(n)}" for n in _uncertainty(view)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- HTML

_STYLE = """
.window{display:flex;width:100%;height:1.6rem;border:1px solid #999;margin:.8rem 0}
.window .seg{min-width:4px;border-right:1px solid #fff}
#budget{width:100%;max-width:44rem}#budget td:first-child{white-space:nowrap}
td.barcell{width:40%;min-width:3rem}
.bar{display:block;height:.8rem;min-width:0}
tr.selected td:nth-child(2){color:#1a7f37}tr.projected td:nth-child(2){color:#9a6700}
tr.omitted td:nth-child(2){color:#cf222e}
.miss{color:#cf222e;font-weight:600}
"""


def _bar_share(tokens: int, capacity: int) -> str:
    """A table bar's width: its share of the bar column, at least 1% when not zero (so that a
    part of a few tokens stays visible)."""
    if tokens <= 0 or capacity <= 0:
        return "0%"
    return f"{max(1.0, 100 * tokens / capacity):.1f}%"


def _fact_html(fact: Fact) -> str:
    items = "".join(f"<li>{e(item)}</li>" for item in fact.items)
    body = e(fact.text)
    if fact.link is not None:
        shown_id = shown(fact.link)
        href = f"../{quote(fact.link, safe='')}/breakdown"
        body = f'<a class=id href="{href}">{e(shown_id)}</a>{e(fact.text[len(shown_id) :])}'
    body += f"<ul>{items}</ul>" if items else ""
    cls = " class=miss" if fact.name == "miss" else ""
    return f"<dt>{e(fact.name)}</dt><dd{cls}>{body}</dd>"


def render_html(data: Breakdown) -> str:
    """A self-contained HTML page (no scripts, no external resources), readable from 360 px
    wide (``pages``)."""
    view = data.view
    b = view.budget
    window = parts(b, data.legacy_views)
    # The window as one stacked bar: each part's width is its share of the capacity, but a part
    # of a few tokens keeps a minimum visible width (CSS min-width); empty parts are left out.
    segments = "".join(
        f'<span class=seg style="flex:{p.tokens} 1 0;background:{p.colour}" '
        f'title="{e(p.label)}: {p.tokens} tokens, {_share(p.tokens, b.capacity)}"></span>'
        for p in window
    )
    budget_rows = "".join(
        f'<tr><td><span class=sw style="background:{p.colour}"></span>{e(p.label)}</td>'
        f"<td class=n>{p.tokens}</td><td class=n>{_share(p.tokens, b.capacity)}</td>"
        f'<td class=barcell><span class=bar style="width:{_bar_share(p.tokens, b.capacity)};'
        f'background:{p.colour}"></span></td></tr>'
        for p in window
    )
    budget_rows += (
        f"<tr class=sum><td>capacity</td><td class=n>{b.capacity}</td><td class=n>100%</td>"
        "<td></td></tr>"
    )
    block_rows = "".join(
        f"<tr class={e(x.status)}>"
        + cell("block", f"<span class=id>{e(x.source)}/{e(x.id)}</span>")
        + cell("status", e(x.status))
        + cell("reason", e(x.reason))
        + cell("tokens", str(x.tokens), "n")
        + cell("full", str(x.full_tokens), "n")
        + cell("projection", "" if x.projection_tokens is None else str(x.projection_tokens), "n")
        + cell("priority", str(x.priority), "n")
        + cell("protected", "yes" if x.protected else "")
        + cell("depends on", ", ".join(e(d) for d in x.dependencies))
        + "</tr>"
        for x in view.selection.blocks
    )
    if view.selection.blocks:
        block_rows += (
            "<tr class=sum>"
            + cell("block", "entered blocks")
            + "<td></td><td></td>"
            + cell("tokens", str(entered_tokens(view)), "n")
            + "<td></td>" * 5
            + "</tr>"
        )
    source_rows = "".join(
        "<tr>"
        + cell("source", e(s.source))
        + cell("kind", e(s.kind))
        + cell("status", e(s.status))
        + cell("ms", f"{s.duration_ms:.1f}", "n")
        + cell("blocks", str(s.block_count), "n")
        + cell("cause", "" if s.failure is None else e(failure_words(s.failure)))
        + "</tr>"
        for s in view.selection.sources
    )
    acc = view.accounting
    acc_rows = "".join(
        f"<tr>{cell('report', name)}"
        + (
            '<td data-label="call" colspan=7>no usage report</td>'
            if obs is None
            else cell("call", f"{e(obs.provider)}/{e(obs.call)}")
            + cell("provider input", count(obs.provider_input_tokens), "n")
            + cell("delta", count(obs.input_token_delta), "n")
            + cell("cached", count(obs.cached_input_tokens), "n")
            + cell("expected cached", count(obs.expected_cached_tokens), "n")
            + cell("cache creation", count(obs.cache_creation_input_tokens), "n")
            + cell("output", count(obs.output_tokens), "n")
        )
        + "</tr>"
        for name, obs in (("last", acc.last), ("auxiliary", acc.auxiliary))
    )
    notes = "".join(f"<p class=note>{e(n)}</p>" for n in _uncertainty(view))
    facts = "".join(_fact_html(f) for f in cache_facts(data))
    blocks = (
        "<div class=scroll><table id=blocks class=cards><tr><th>block</th><th>status</th>"
        "<th>reason</th><th class=n>tokens</th><th class=n>full</th><th class=n>projection</th>"
        "<th class=n>priority</th><th>protected</th><th>depends on</th></tr>"
        f"{block_rows}</table></div>"
        if view.selection.blocks
        else "<p>No block: no source offered any.</p>"
    )
    sources = (
        "<div class=scroll><table id=sources class=cards><tr><th>source</th><th>kind</th>"
        "<th>status</th><th class=n>ms</th><th class=n>blocks</th><th>cause</th></tr>"
        f"{source_rows}</table></div>"
        if view.selection.sources
        else "<p>No source in this request.</p>"
    )
    created = data.turn.created_at
    age = "" if created is None else f" · prepared {e(created)}"
    since = data.turn.seconds_since_previous
    after = "" if since is None else f", {duration(since)} after the previous turn"
    body = f"""<h1>Preparation <span class=id>{e(view.preparation_id)}</span></h1>
<p>model <b>{e(view.model)}</b> · render {e(view.render)} · layout {e(view.layout)} ·
attempt {view.attempt}{age} · capacity <b id=capacity>{b.capacity}</b> ({e(b.capacity_source)}) ·
total input <b id=total>{b.total_input_tokens}</b> · remaining <b id=remaining>{b.remaining_tokens}</b></p>
{notes}
<h2>Budget</h2><div class=window id=window>{segments}</div>
<div class=scroll><table id=budget><tr><th>part of the window</th><th class=n>tokens</th>
<th class=n>share</th><th></th></tr>{budget_rows}</table></div>
<p id=remaining-words>{e(remaining_words(view))}</p>
<p id=data-words>{e(data_words(view))}</p>
<h2 id=cache>Cache</h2>
<dl class=facts id=cache-facts>{facts}</dl>
<p><a id=timeline href="timeline">Timeline of this conversation</a>{e(_turn_label(data))}{after}</p>
<h2>Blocks</h2>{blocks}
<h2>Sources</h2>{sources}
<h2>Hashes and accounting</h2>
<p>prefix <code>{e(view.prefix_hash)}</code> ({view.prefix_tokens} tokens)<br>
input <code>{e(view.input_hash)}</code><br>estimated input tokens {acc.estimated_input_tokens}</p>
<div class=scroll><table id=accounting class=cards><tr><th></th><th>call</th><th class=n>provider input</th>
<th class=n>delta</th><th class=n>cached</th><th class=n>expected cached</th>
<th class=n>cache creation</th><th class=n>output</th></tr>{acc_rows}</table></div>"""
    return page(f"Breakdown {view.preparation_id}", _STYLE, body)
