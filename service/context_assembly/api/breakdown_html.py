"""The breakdown of one preparation as a self-contained HTML page (``breakdown.py`` holds what it
shows): the answer for a browser."""

from __future__ import annotations

from urllib.parse import quote

from context_assembly.api.breakdown import (
    COST_BUCKETS,
    NO_PRICE,
    Fact,
    Part,
    cache_facts,
    compaction_facts,
    data_words,
    entered_tokens,
    failure_words,
    parts,
    price_words,
    remaining_words,
    share,
    turn_label,
    uncertainty_notes,
)
from context_assembly.api.pages import cell, count, duration, e, page, shown, usd
from context_assembly.lifecycle_models import AccountingReport, PreparationView
from context_assembly.preparations.operations import Breakdown

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
    cls = " class=miss" if fact.name == "miss" or fact.alert else ""
    return f"<dt>{e(fact.name)}</dt><dd{cls}>{body}</dd>"


def render_html(data: Breakdown) -> str:
    """A self-contained HTML page (no scripts, no external resources), readable from 360 px
    wide (``pages``): the heading, then each section in the page's order."""
    view = data.view
    b = view.budget
    acc = view.accounting
    window = parts(b, data.legacy_views)
    notes = "".join(f"<p class=note>{e(n)}</p>" for n in uncertainty_notes(view))
    created = data.turn.created_at
    age = "" if created is None else f" · prepared {e(created)}"
    since = data.turn.seconds_since_previous
    after = "" if since is None else f", {duration(since)} after the previous turn"
    body = f"""<h1>Preparation <span class=id>{e(view.preparation_id)}</span></h1>
<p>model <b>{e(view.model)}</b> · render {e(view.render)} · layout {e(view.layout)} ·
attempt {view.attempt}{age} · capacity <b id=capacity>{b.capacity}</b> ({e(b.capacity_source)}) ·
total input <b id=total>{b.total_input_tokens}</b> · remaining <b id=remaining>{b.remaining_tokens}</b></p>
{notes}
<h2>Budget</h2><div class=window id=window>{_window_bar(window, b.capacity)}</div>
<div class=scroll><table id=budget><tr><th>part of the window</th><th class=n>tokens</th>
<th class=n>share</th><th></th></tr>{_budget_rows(window, b.capacity)}</table></div>
<p id=remaining-words>{e(remaining_words(view))}</p>
<p id=data-words>{e(data_words(view))}</p>
<h2 id=cache>Cache</h2>
<dl class=facts id=cache-facts>{"".join(_fact_html(f) for f in cache_facts(data))}</dl>
<p><a id=timeline href="timeline">Timeline of this conversation</a>{e(turn_label(data))}{after}</p>
{_compaction_section(view)}
<h2>Blocks</h2>{_blocks_section(view)}
<h2>Sources</h2>{_sources_section(view)}
<h2>Hashes and accounting</h2>
<p>prefix <code>{e(view.prefix_hash)}</code> ({view.prefix_tokens} tokens)<br>
input <code>{e(view.input_hash)}</code><br>estimated input tokens {acc.estimated_input_tokens}</p>
<div class=scroll><table id=accounting class=cards><tr><th></th><th>call</th><th class=n>provider input</th>
<th class=n>delta</th><th class=n>cached</th><th class=n>expected cached</th>
<th class=n>cache creation</th><th class=n>output</th></tr>{_accounting_rows(acc)}</table></div>
<h2>Cost (USD)</h2>{_cost_section(acc)}"""
    return page(f"Breakdown {view.preparation_id}", _STYLE, body)


def _window_bar(window: list[Part], capacity: int) -> str:
    """The window as one stacked bar: each part's width is its share of the capacity, but a part
    of a few tokens keeps a minimum visible width (CSS min-width); empty parts are left out."""
    return "".join(
        f'<span class=seg style="flex:{p.tokens} 1 0;background:{p.colour}" '
        f'title="{e(p.label)}: {p.tokens} tokens, {share(p.tokens, capacity)}"></span>'
        for p in window
    )


def _budget_rows(window: list[Part], capacity: int) -> str:
    """A row of each part of the window with its share and bar, then the capacity."""
    rows = "".join(
        f'<tr><td><span class=sw style="background:{p.colour}"></span>{e(p.label)}</td>'
        f"<td class=n>{p.tokens}</td><td class=n>{share(p.tokens, capacity)}</td>"
        f'<td class=barcell><span class=bar style="width:{_bar_share(p.tokens, capacity)};'
        f'background:{p.colour}"></span></td></tr>'
        for p in window
    )
    return rows + (
        f"<tr class=sum><td>capacity</td><td class=n>{capacity}</td><td class=n>100%</td>"
        "<td></td></tr>"
    )


def _compaction_section(view: PreparationView) -> str:
    """The compaction facts under their heading; nothing for a preparation stored before
    decisions were kept."""
    compaction = "".join(_fact_html(f) for f in compaction_facts(view))
    if compaction:
        compaction = f"<h2 id=compaction>Compaction</h2><dl class=facts id=compaction-facts>{compaction}</dl>"
    return compaction


def _blocks_section(view: PreparationView) -> str:
    """The blocks' table (each block's decision, reason, tokens, priority and dependencies, then
    the entered blocks' total), or why there is none."""
    blocks = view.selection.blocks
    if not blocks:
        return "<p>No block: no source offered any.</p>"
    rows = "".join(
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
        for x in blocks
    )
    rows += (
        "<tr class=sum>"
        + cell("block", "entered blocks")
        + "<td></td><td></td>"
        + cell("tokens", str(entered_tokens(view)), "n")
        + "<td></td>" * 5
        + "</tr>"
    )
    return (
        "<div class=scroll><table id=blocks class=cards><tr><th>block</th><th>status</th>"
        "<th>reason</th><th class=n>tokens</th><th class=n>full</th><th class=n>projection</th>"
        "<th class=n>priority</th><th>protected</th><th>depends on</th></tr>"
        f"{rows}</table></div>"
    )


def _sources_section(view: PreparationView) -> str:
    """The sources' table (a failed one with its cause), or why there is none."""
    sources = view.selection.sources
    if not sources:
        return "<p>No source in this request.</p>"
    rows = "".join(
        "<tr>"
        + cell("source", e(s.source))
        + cell("kind", e(s.kind))
        + cell("status", e(s.status))
        + cell("ms", f"{s.duration_ms:.1f}", "n")
        + cell("blocks", str(s.block_count), "n")
        + cell("cause", "" if s.failure is None else e(failure_words(s.failure)))
        + "</tr>"
        for s in sources
    )
    return (
        "<div class=scroll><table id=sources class=cards><tr><th>source</th><th>kind</th>"
        "<th>status</th><th class=n>ms</th><th class=n>blocks</th><th>cause</th></tr>"
        f"{rows}</table></div>"
    )


def _accounting_rows(acc: AccountingReport) -> str:
    """A row of each usage report's tokens (the last main call's, the auxiliary's)."""
    return "".join(
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


def _cost_section(acc: AccountingReport) -> str:
    """What each usage report cost per bucket, or that there is nothing to price yet."""
    rows = "".join(
        f"<tr>{cell('report', name)}"
        + (
            f'<td data-label="cost" colspan={len(COST_BUCKETS) + 2}>{e(NO_PRICE)}</td>'
            if obs.cost is None
            else "".join(
                cell(label, usd(getattr(obs.cost, key)), "n") for key, label in COST_BUCKETS
            )
            + cell("total", f"<b>{usd(obs.cost.total)}</b>", "n")
            + cell("price", e(price_words(obs.cost)))
        )
        + "</tr>"
        for name, obs in (("last", acc.last), ("auxiliary", acc.auxiliary))
        if obs is not None
    )
    if not rows:
        return "<p id=cost>No usage report yet: nothing to price.</p>"
    return (
        "<div class=scroll><table id=cost class=cards><tr><th></th>"
        + "".join(f"<th class=n>{label}</th>" for _, label in COST_BUCKETS)
        + f"<th class=n>total</th><th>price</th></tr>{rows}</table></div>"
    )
