"""The human view of one preparation: the window as a stacked bar, decisions with reasons and
dependencies, accounting.

HTML for browsers (``Accept: text/html``), plain text otherwise. It shows ids, statuses, reasons
and token counts only: the stored record has no block bodies to show.
"""

from __future__ import annotations

from html import escape

from context_assembly.lifecycle import PreparationView

# The parts of the model's window in frame order, each with the answer's field, its short mark
# in the text view and its colour in the HTML view. They add up to the capacity together with
# the free window (what the data could still have used) that follows them.
_TERMS = (
    ("instructions", "instructions_tokens", "I", "#4a7bd0"),
    ("legacy data + date", "legacy_data_tokens", "L", "#8250df"),
    ("tools", "tools_tokens", "T", "#bf3989"),
    ("history", "history_tokens", "H", "#0a7ea4"),
    ("input", "input_tokens", "U", "#1a7f37"),
    ("selected data", "data_tokens", "D", "#d4a72c"),
)
_FREE = ("free window", "F", "#e6e6e6")
_RESERVES = (
    ("response reserve", "response_reserve", "R", "#9a6700"),
    ("reasoning reserve", "reasoning_reserve_tokens", "Q", "#cf222e"),
)


def _window(view: PreparationView) -> list[tuple[str, int, str, str]]:
    """The window as ``(label, tokens, mark, colour)`` parts in frame order: the input terms,
    the free window, the reserves. The free window is what is left of the remaining tokens
    after the selected data; with it the parts add up to the capacity."""
    budget = view.budget.model_dump()
    parts = [(label, int(budget[key]), mark, colour) for label, key, mark, colour in _TERMS]
    free = max(0, view.budget.remaining_tokens - view.budget.data_tokens)
    parts.append((_FREE[0], free, _FREE[1], _FREE[2]))
    parts += [(label, int(budget[key]), mark, colour) for label, key, mark, colour in _RESERVES]
    return parts


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


def shown(text: str) -> str:
    """``text`` with every character ``str.isprintable`` refuses (controls, format characters
    such as bidi overrides, line and paragraph separators) written as its escape, ``\\n`` or
    ``\\u202e``: a source or block id is the caller's to choose, and must not start a line of
    its own, move the terminal's cursor or reorder what is shown around it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def count(value: int | None) -> str:
    """A count, or "-" when the provider did not report it (never Python's "None")."""
    return "-" if value is None else str(value)


def render_text(view: PreparationView) -> str:
    """A fixed-width text breakdown."""
    b = view.budget
    lines = [
        f"preparation {shown(view.preparation_id)}  model {shown(view.model)}  layout {view.layout}  attempt {view.attempt}",
        f"capacity {b.capacity} ({b.capacity_source})  total input {b.total_input_tokens}  "
        f"remaining {b.remaining_tokens}  data limit {b.data_limit_tokens}",
        "",
        "budget:",
    ]
    parts = _window(view)
    widths = _spread([tokens for _, tokens, _, _ in parts], 60)
    window = "".join(mark * w for (_, _, mark, _), w in zip(parts, widths, strict=True))
    lines.append(f"  window [{window}] {b.capacity}")
    for label, tokens, mark, _ in parts:
        lines.append(f"  {mark} {label:<20} {tokens:>9}  {_share(tokens, b.capacity):>7}")
    lines.append(
        f"    {'remaining tokens':<20} {b.remaining_tokens:>9}  (for data, after the terms above and the reserves)"
    )
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
    lines.append(f"turns of this scope: GET /v1/preparations/{shown(view.preparation_id)}/timeline")
    return "\n".join(lines) + "\n"


def _bar_px(tokens: int, capacity: int) -> str:
    """A table bar's width: its share of a 400 px window, at least 4 px when not zero."""
    if tokens <= 0 or capacity <= 0:
        return "0.0"
    return f"{max(4.0, 400 * tokens / capacity):.1f}"


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2rem;color:#222}
table{border-collapse:collapse;margin:1rem 0}td,th{padding:.2rem .6rem;border-bottom:1px solid #ddd;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{height:.8rem;display:inline-block;vertical-align:middle}
.window{display:flex;width:100%;max-width:60rem;height:1.6rem;border:1px solid #999;margin:1rem 0}
.window .seg{min-width:4px;border-right:1px solid #fff}
.sw{display:inline-block;width:.8rem;height:.8rem;vertical-align:middle;margin-right:.4rem}
.selected{color:#1a7f37}.projected{color:#9a6700}.omitted{color:#cf222e}
.note{background:#fff8c5;padding:.4rem .8rem}
"""


def render_html(view: PreparationView) -> str:
    """A self-contained HTML page (no scripts, no external resources)."""
    b = view.budget

    def e(text: str) -> str:
        return escape(shown(text))

    parts = _window(view)
    # The window as one stacked bar: each part's width is its share of the capacity, but a
    # part of a few tokens keeps a minimum visible width (CSS min-width); zero parts are absent.
    window = "".join(
        f'<span class=seg style="flex:{tokens} 1 0;background:{colour}" '
        f'title="{e(label)}: {tokens} tokens, {_share(tokens, b.capacity)}"></span>'
        for label, tokens, _, colour in parts
        if tokens > 0
    )
    budget_rows = "".join(
        f'<tr><td><span class=sw style="background:{colour}"></span>{e(label)}</td>'
        f"<td class=n>{tokens}</td><td class=n>{_share(tokens, b.capacity)}</td><td>"
        f'<span class=bar style="width:{_bar_px(tokens, b.capacity)}px;background:{colour}">'
        "</span></td></tr>"
        for label, tokens, _, colour in parts
    )
    budget_rows += (
        f"<tr><td><b>remaining tokens</b> (for data, after the input terms and the reserves)"
        f"</td><td class=n>{b.remaining_tokens}</td>"
        f"<td class=n>{_share(b.remaining_tokens, b.capacity)}</td><td></td></tr>"
        f"<tr><td><b>capacity</b></td><td class=n>{b.capacity}</td><td class=n>100%</td>"
        "<td></td></tr>"
    )
    block_rows = "".join(
        f"<tr class={e(x.status)}><td>{e(x.source)}/{e(x.id)}</td><td>{e(x.status)}</td><td>{e(x.reason)}</td>"
        f"<td class=n>{x.tokens}</td><td class=n>{x.full_tokens}</td>"
        f"<td class=n>{'' if x.projection_tokens is None else x.projection_tokens}</td>"
        f"<td class=n>{x.priority}</td><td>{'yes' if x.protected else ''}</td>"
        f"<td>{', '.join(e(d) for d in x.dependencies)}</td></tr>"
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
            "<td colspan=7>no usage report</td>"
            if obs is None
            else f"<td>{e(obs.provider)}/{e(obs.call)}</td><td class=n>{count(obs.provider_input_tokens)}</td>"
            f"<td class=n>{count(obs.input_token_delta)}</td><td class=n>{count(obs.cached_input_tokens)}</td>"
            f"<td class=n>{count(obs.expected_cached_tokens)}</td>"
            f"<td class=n>{count(obs.cache_creation_input_tokens)}</td><td class=n>{count(obs.output_tokens)}</td>"
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
<h2>Budget</h2><div class=window id=window>{window}</div>
<table id=budget><tr><th>part of the window</th><th>tokens</th><th>share</th><th></th></tr>{budget_rows}</table>
<h2>Blocks</h2><table id=blocks><tr><th>block</th><th>status</th><th>reason</th><th>tokens</th><th>full</th>
<th>projection</th><th>priority</th><th>protected</th><th>depends on</th></tr>{block_rows}</table>
<h2>Sources</h2><table id=sources><tr><th>source</th><th>kind</th><th>status</th><th>ms</th><th>blocks</th></tr>{source_rows}</table>
<h2>Cache and accounting</h2><p>prefix {e(view.prefix_hash)} ({view.prefix_tokens} tokens)<br>input {e(view.input_hash)}<br>
estimated input tokens {acc.estimated_input_tokens}</p>
<table id=accounting><tr><th></th><th>call</th><th>provider input</th><th>delta</th><th>cached</th><th>expected cached</th><th>cache creation</th><th>output</th></tr>{acc_rows}</table>
<p><a id=timeline href="timeline">Timeline of this scope's turns</a></p>
</body></html>
"""
