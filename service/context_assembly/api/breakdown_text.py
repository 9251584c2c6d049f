"""The breakdown of one preparation as fixed-width plain text (``breakdown.py`` holds what it
shows): the answer for a terminal or a script."""

from __future__ import annotations

import textwrap
from typing import Final

from context_assembly.api.breakdown import (
    Fact,
    cache_facts,
    compaction_facts,
    cost_words,
    data_words,
    failure_words,
    parts,
    remaining_words,
    share,
    turn_label,
    uncertainty_notes,
)
from context_assembly.api.pages import count, shown
from context_assembly.lifecycle_models import Observation, PreparationView
from context_assembly.preparations.operations import Breakdown

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


def render_text(data: Breakdown) -> str:
    """A fixed-width text breakdown: the heading, then each section in the page's order."""
    view = data.view
    b = view.budget
    lines = [
        f"preparation {shown(view.preparation_id)}  model {shown(view.model)}  layout "
        f"{view.layout}  attempt {view.attempt}",
        f"capacity {b.capacity} ({b.capacity_source})  total input {b.total_input_tokens}  "
        f"remaining {b.remaining_tokens}",
        *_budget(data),
        *_blocks(view),
        *_sources(view),
        *_cache(data),
        *_compaction(view),
        *_accounting(view),
        *(f"note: {shown(n)}" for n in uncertainty_notes(view)),
    ]
    return "\n".join(lines) + "\n"


def _budget(data: Breakdown) -> list[str]:
    """The window as a bar of marks, its parts with their shares, and the totals in words."""
    view = data.view
    b = view.budget
    lines = ["", "budget (the parts add up to the capacity):"]
    window = parts(b, data.legacy_views)
    widths = _spread([p.tokens for p in window], 60)
    bar = "".join(p.mark * w for p, w in zip(window, widths, strict=True))
    lines.append(f"  window [{bar}] {b.capacity}")
    for p in window:
        lines.append(f"  {p.mark} {p.label:<20} {p.tokens:>9}  {share(p.tokens, b.capacity):>7}")
    lines.append(f"  = {'capacity':<20} {b.capacity:>9}  {'100%':>7}")
    lines += _wrapped(remaining_words(view), "  ", "    ")
    lines += _wrapped(data_words(view), "  ", "    ")
    return lines


def _blocks(view: PreparationView) -> list[str]:
    """Each block's decision, reason, tokens and dependencies."""
    lines = ["", f"blocks ({len(view.selection.blocks)}):"]
    for block in view.selection.blocks:
        needs = ", ".join(shown(d) for d in block.dependencies)
        lines.append(
            f"  {block.status:<9} {block.reason:<18} {block.tokens:>7} / {block.full_tokens:<7} "
            f"{shown(block.source)}/{shown(block.id)}"
            + ("  [protected]" if block.protected else "")
            + (f"  <- {needs}" if needs else "")
        )
    return lines


def _sources(view: PreparationView) -> list[str]:
    """Each source's kind, status, time and blocks; a failed one with its cause."""
    lines = ["", "sources:"]
    for source in view.selection.sources:
        lines.append(
            f"  {shown(source.source):<24} {source.kind:<10} {source.status:<16} {source.duration_ms:>8.1f} ms  "
            f"{source.block_count} blocks"
        )
        if source.failure is not None:
            lines += _wrapped(failure_words(source.failure), "    failed: ", " " * 12)
    return lines


def _facts(facts: list[Fact]) -> list[str]:
    """Facts as named lines, their items as a list under them."""
    lines: list[str] = []
    for fact in facts:
        if fact.text:
            lines += _wrapped(fact.text, f"  {fact.name + ':':<17} ", " " * 20)
        else:
            lines.append(f"  {fact.name}:")
        for item in fact.items:
            lines += _wrapped(item, "    - ", "      ")
    return lines


def _cache(data: Breakdown) -> list[str]:
    """The cache facts and where the conversation's timeline is."""
    path = f"GET /v1/preparations/{shown(data.view.preparation_id)}/timeline"
    return [
        "",
        "cache:",
        *_facts(cache_facts(data)),
        f"  {'timeline:':<17} {path}" + turn_label(data),
    ]


def _compaction(view: PreparationView) -> list[str]:
    """The compaction facts; nothing for a preparation stored before decisions were kept."""
    facts = compaction_facts(view)
    return ["", "compaction:", *_facts(facts)] if facts else []


def _accounting(view: PreparationView) -> list[str]:
    """The hashes, the estimate and each usage report with its cost."""
    acc = view.accounting
    lines = [
        "",
        f"prefix {view.prefix_hash}  ({view.prefix_tokens} tokens)",
        f"input  {view.input_hash}",
        f"estimated input tokens {acc.estimated_input_tokens}",
    ]
    for name, obs in (("last", acc.last), ("auxiliary", acc.auxiliary)):
        lines += _report(name, obs)
    return lines


def _report(name: str, obs: Observation | None) -> list[str]:
    if obs is None:
        return [f"{name}: no usage report"]
    return [
        f"{name}: {obs.provider}/{obs.call} input {count(obs.provider_input_tokens)} "
        f"(delta {count(obs.input_token_delta)}) cached {count(obs.cached_input_tokens)} "
        f"(expected {count(obs.expected_cached_tokens)}) cache-creation {count(obs.cache_creation_input_tokens)} output {count(obs.output_tokens)}",
        *_wrapped(cost_words(obs), "  cost USD: ", " " * 12),
    ]
