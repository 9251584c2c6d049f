"""The human view of one preparation: budget bars, decisions with reasons, accounting.

HTML for browsers (``Accept: text/html``), plain text otherwise. It shows ids, statuses, reasons
and token counts only: the stored record has no block bodies to show.
"""

from __future__ import annotations

from html import escape

from context_assembly.lifecycle import PreparationView

_BUDGET_ROWS = (
    ("instructions", "instructions_tokens"),
    ("legacy data + date", "legacy_data_tokens"),
    ("tools", "tools_tokens"),
    ("history", "history_tokens"),
    ("input", "input_tokens"),
    ("selected data", "data_tokens"),
    ("response reserve", "response_reserve"),
    ("reasoning reserve", "reasoning_reserve_tokens"),
)


def _rows(view: PreparationView) -> list[tuple[str, int]]:
    budget = view.budget.model_dump()
    return [(label, int(budget[key])) for label, key in _BUDGET_ROWS]


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
    routing = view.selection.routing
    if routing is not None:
        tried = "; ".join(
            f"{c.model} {c.reason} (needs {c.needed_tokens} of {c.capacity})"
            for c in routing.candidates
        )
        pinned = ", pinned on refresh" if routing.pinned else ""
        notes.append(f"Routed ({routing.policy}{pinned}) to {routing.chosen}: {tried}.")
    return notes


def _shown(text: str) -> str:
    """``text`` with every character ``str.isprintable`` refuses (controls, format characters
    such as bidi overrides, line and paragraph separators) written as its escape, ``\\n`` or
    ``\\u202e``: a source or block id is the caller's to choose, and must not start a line of
    its own, move the terminal's cursor or reorder what is shown around it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _n(value: int | None) -> str:
    """A count, or "-" when the provider did not report it (never Python's "None")."""
    return "-" if value is None else str(value)


def render_text(view: PreparationView) -> str:
    """A fixed-width text breakdown."""
    b = view.budget
    lines = [
        f"preparation {_shown(view.preparation_id)}  model {_shown(view.model)}  layout {view.layout}  attempt {view.attempt}",
        f"capacity {b.capacity} ({b.capacity_source})  total input {b.total_input_tokens}  "
        f"remaining {b.remaining_tokens}  data limit {b.data_limit_tokens}",
        "",
        "budget:",
    ]
    width = 40
    for label, tokens in _rows(view):
        bar = "#" * (round(width * tokens / b.capacity) if b.capacity else 0)
        lines.append(f"  {label:<20} {tokens:>9}  {bar}")
    lines += ["", f"blocks ({len(view.selection.blocks)}):"]
    for block in view.selection.blocks:
        lines.append(
            f"  {block.status:<9} {block.reason:<18} {block.tokens:>7} / {block.full_tokens:<7} "
            f"{_shown(block.source)}/{_shown(block.id)}"
            + ("  [protected]" if block.protected else "")
        )
    lines += ["", "sources:"]
    for source in view.selection.sources:
        lines.append(
            f"  {_shown(source.source):<24} {source.kind:<10} {source.status:<16} {source.duration_ms:>8.1f} ms  "
            f"{source.block_count} blocks"
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
                f"{name}: {obs.provider}/{obs.call} input {_n(obs.provider_input_tokens)} "
                f"(delta {_n(obs.input_token_delta)}) cached {_n(obs.cached_input_tokens)} "
                f"cache-creation {_n(obs.cache_creation_input_tokens)} output {_n(obs.output_tokens)}"
            )
    lines += [f"note: {_shown(n)}" for n in _uncertainty(view)]
    return "\n".join(lines) + "\n"


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2rem;color:#222}
table{border-collapse:collapse;margin:1rem 0}td,th{padding:.2rem .6rem;border-bottom:1px solid #ddd;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{background:#4a7bd0;height:.8rem;display:inline-block}
.selected{color:#1a7f37}.projected{color:#9a6700}.omitted{color:#cf222e}
.note{background:#fff8c5;padding:.4rem .8rem}
"""


def render_html(view: PreparationView) -> str:
    """A self-contained HTML page (no scripts, no external resources)."""
    b = view.budget

    def e(text: str) -> str:
        return escape(_shown(text))

    budget_rows = "".join(
        f"<tr><td>{e(label)}</td><td class=n>{tokens}</td><td>"
        f'<span class=bar style="width:{(400 * tokens / b.capacity) if b.capacity else 0:.1f}px"></span></td></tr>'
        for label, tokens in _rows(view)
    )
    block_rows = "".join(
        f"<tr class={e(x.status)}><td>{e(x.source)}/{e(x.id)}</td><td>{e(x.status)}</td><td>{e(x.reason)}</td>"
        f"<td class=n>{x.tokens}</td><td class=n>{x.full_tokens}</td>"
        f"<td class=n>{'' if x.projection_tokens is None else x.projection_tokens}</td>"
        f"<td class=n>{x.priority}</td><td>{'yes' if x.protected else ''}</td></tr>"
        for x in view.selection.blocks
    )
    source_rows = "".join(
        f"<tr><td>{e(s.source)}</td><td>{e(s.kind)}</td><td>{e(s.status)}</td>"
        f"<td class=n>{s.duration_ms:.1f}</td><td class=n>{s.block_count}</td></tr>"
        for s in view.selection.sources
    )
    acc = view.accounting
    acc_rows = "".join(
        f"<tr><td>{name}</td>"
        + (
            "<td colspan=6>no usage report</td>"
            if obs is None
            else f"<td>{e(obs.provider)}/{e(obs.call)}</td><td class=n>{_n(obs.provider_input_tokens)}</td>"
            f"<td class=n>{_n(obs.input_token_delta)}</td><td class=n>{_n(obs.cached_input_tokens)}</td>"
            f"<td class=n>{_n(obs.cache_creation_input_tokens)}</td><td class=n>{_n(obs.output_tokens)}</td>"
        )
        + "</tr>"
        for name, obs in (("last", acc.last), ("auxiliary", acc.auxiliary))
    )
    notes = "".join(f"<p class=note>{e(n)}</p>" for n in _uncertainty(view))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Breakdown {e(view.preparation_id)}</title>
<style>{_STYLE}</style></head><body>
<h1>Preparation {e(view.preparation_id)}</h1>
<p>model <b>{e(view.model)}</b> · layout <b>{e(view.layout)}</b> · attempt {view.attempt} ·
capacity <b id=capacity>{b.capacity}</b> ({e(b.capacity_source)}) · total input <b id=total>{b.total_input_tokens}</b> ·
remaining {b.remaining_tokens} · data limit {b.data_limit_tokens}</p>
{notes}
<h2>Budget</h2><table id=budget><tr><th>term</th><th>tokens</th><th></th></tr>{budget_rows}</table>
<h2>Blocks</h2><table id=blocks><tr><th>block</th><th>status</th><th>reason</th><th>tokens</th><th>full</th>
<th>projection</th><th>priority</th><th>protected</th></tr>{block_rows}</table>
<h2>Sources</h2><table id=sources><tr><th>source</th><th>kind</th><th>status</th><th>ms</th><th>blocks</th></tr>{source_rows}</table>
<h2>Cache and accounting</h2><p>prefix {e(view.prefix_hash)} ({view.prefix_tokens} tokens)<br>input {e(view.input_hash)}<br>
estimated input tokens {acc.estimated_input_tokens}</p>
<table id=accounting><tr><th></th><th>call</th><th>provider input</th><th>delta</th><th>cached</th><th>cache creation</th><th>output</th></tr>{acc_rows}</table>
</body></html>
"""
