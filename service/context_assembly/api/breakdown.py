"""The human view of one preparation: the window as a stacked bar and a table whose parts add up
to the capacity, the cache plan and how the turn fared against the previous one, decisions with
reasons and dependencies, sources (a failed one with its cause), hashes and accounting, and what
each usage report cost per bucket at the model's price ("no price" where it has none: never a
guess), with what the turn's cache miss cost.

This module holds what both forms show, as parts, facts and words; ``breakdown_html.py`` renders
it for browsers (``Accept: text/html``), ``breakdown_text.py`` as plain text otherwise. It shows
ids, names, statuses, reasons and token counts only: the stored record has no block bodies,
instructions or history to show.

Totals, as the page states them: the parts of the window (input terms, data, unused, reserves)
add up to the capacity; ``remaining`` is the one figure left for data after the other input
terms and the reserves, and it is the data plus the unused part; the data message is counted
whole, so it is its entered blocks (counted one by one) plus the message's framing and source
headers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from context_assembly.api.pages import count, shown, usd
from context_assembly.api.turn_words import (
    MISS_WORDS,
    change_words,
    expected_words,
    reported_words,
)
from context_assembly.core.cache import OPENAI_BREAKPOINT_LIFETIME
from context_assembly.core.diagnostics import Agreement, agreement, vendor_diagnosis
from context_assembly.core.result import BudgetReport, CacheReport, SourceFailureReport
from context_assembly.lifecycle_models import CostReport, Observation, PreparationView
from context_assembly.preparations.operations import Breakdown


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
    "not_markable": "OpenAI takes no breakpoint there (tool definitions, assistant messages)",
    "automatic": "the provider's own marker ends the frame there (counted as cacheable)",
    "retention": "OpenAI breakpoints are not sent with prompt_cache_retention",
}
_AGREEMENT_WORDS: Final[dict[Agreement, str]] = {
    "agree": "agrees with the service's comparison",
    "disagree": "DISAGREES with the service's comparison",
    "not_comparable": "not comparable with the service's comparison",
}
_OPENAI: Final = ("openai-chat", "openai-responses")

# The buckets of a cost, in the order shown, with their names on the page.
COST_BUCKETS: Final = (
    ("uncached_input", "uncached input"),
    ("cache_read", "cache read"),
    ("cache_write_5m", "cache write 5m"),
    ("cache_write_1h", "cache write 1h"),
    ("cache_write", "cache write"),
    ("output", "output"),
)
NO_PRICE: Final = "no price: the model has none, or a bucket of the report has no rate"


def price_words(cost: CostReport) -> str:
    """Which price applied, in a few words."""
    tier = ", long-context rates" if cost.long_context else ""
    return f"price {shown(cost.price)} ({cost.price_source}{tier})"


def cost_words(obs: Observation) -> str:
    """A report's cost per bucket and in total, in USD, or why it has none."""
    cost = obs.cost
    if cost is None:
        return NO_PRICE
    buckets = ", ".join(f"{name} {usd(getattr(cost, key))}" for key, name in COST_BUCKETS)
    return f"{buckets}; total {usd(cost.total)} USD, {price_words(cost)}"


def miss_cost_words(obs: Observation) -> str | None:
    """What a main call's cache miss billed again and what that cost (``None``: no miss)."""
    if obs.miss_cause is None:
        return None
    tokens = obs.rebilled_tokens
    said = f"cause {obs.miss_cause}: "
    if tokens is None:
        return (
            said
            + "the tokens billed again are not known (a preparation stored before they were kept)"
        )
    said += f"{tokens} input tokens billed again instead of read from the cache"
    if obs.cost is None:
        return said + f" ({NO_PRICE})"
    if obs.cost.miss is None:
        return said + " (the price has no cache read rate)"
    return said + f", which cost {usd(obs.cost.miss)} USD more"


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


def share(tokens: int, capacity: int) -> str:
    """``tokens`` as a percentage of the window, with a digit more below 1%."""
    if capacity <= 0:
        return "-"
    percent = 100 * tokens / capacity
    if percent == 0:
        return "0%"
    return f"{percent:.2f}%" if 0 < percent < 1 else f"{percent:.1f}%"


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


def uncertainty_notes(view: PreparationView) -> list[str]:
    """What the figures cannot say exactly: estimated counts, opaque items, a provider-held or
    trimmed history, and the routing that chose the model."""
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
        explicit = OPENAI_BREAKPOINT_LIFETIME.total_seconds()
        if data.turn.cache_lifetime_seconds == explicit and (plan is None or not plan.breakpoints):
            return (
                "OpenAI's own breakpoint ends on this turn's messages, which the next turn does "
                "not repeat (cache.breakpoints: true marks the stable prefix)"
            )
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
    alert: bool = False  # shown in red in HTML (a miss, a disagreement)


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
    options = plan.prompt_cache_options
    if options is not None:
        said = [f"mode {options.mode}"] if options.mode is not None else []
        if options.comparison_response_id is not None:
            said.append(f"compared with {shown(options.comparison_response_id)}")
        facts.append(Fact("OpenAI options", "prompt_cache_options: " + ", ".join(said)))
    if plan.cache_control is not None:
        ttl = plan.cache_control.ttl or "5m"
        facts.append(Fact("automatic", f"top-level cache_control (ttl {ttl}), one marker slot"))
    if plan.diagnostics is not None:
        named = plan.diagnostics.previous_message_id
        compared = "nothing (a first turn)" if named is None else shown(named)
        facts.append(Fact("diagnostics", f"asked, previous_message_id {compared}"))
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
    last = view.accounting.last
    missed = None if last is None or last.call != "main" else miss_cost_words(last)
    if missed is not None:
        facts.append(Fact("miss cost", missed))
    if last is not None and last.diagnostics is not None:
        facts.append(_diagnosis_fact(last.provider, last.diagnostics, data))
    return facts


def _diagnosis_fact(provider: str, diagnostics: dict[str, object], data: Breakdown) -> Fact:
    """The provider's cache diagnosis of the latest call beside the service's comparison, and
    whether they agree (``core/diagnostics.py``)."""
    turn = data.turn
    vendor = vendor_diagnosis(diagnostics)
    if turn.prefix_kept is None:
        ours = "the service compared with nothing"
    elif turn.prefix_kept:
        ours = "the service kept the prefix"
    else:
        ours = f"the service: {change_words(turn.first_change)}"
    if vendor is None:
        return Fact("provider diagnosis", f"{provider}: not read (not a shape it returns); {ours}")
    said = f"{provider}: {shown(vendor.reason)}"
    if vendor.missed_tokens is not None:
        said += f" ({count(vendor.missed_tokens)} input tokens missed)"
    part = None if turn.first_change is None else turn.first_change.part
    verdict = agreement(turn.prefix_kept, part, vendor)
    return Fact(
        "provider diagnosis",
        f"{said}; {ours}: {_AGREEMENT_WORDS[verdict]}",
        alert=verdict == "disagree",
    )


def turn_label(data: Breakdown) -> str:
    """`` (turn N)`` after a mention of the timeline; empty for a turn without a number."""
    return "" if data.turn.turn is None else f" (turn {data.turn.turn})"


def compaction_facts(view: PreparationView) -> list[Fact]:
    """The compaction section (docs/compaction.md): the decision and its numbers; nothing for
    a preparation stored before decisions were recorded."""
    decided = view.selection.compaction
    if decided is None:
        return []
    facts = [
        Fact("decision", f"{decided.decision} ({decided.reason}), mode {decided.mode}"),
        Fact(
            "pressure",
            f"input {decided.input_tokens} of a {decided.window_tokens}-token window; trigger "
            f"{decided.trigger_tokens}; floor {decided.floor_tokens} (what no compaction "
            f"removes); {decided.reclaimable_tokens} reclaimable",
        ),
    ]
    money = decided.economics
    if money is not None:
        facts.append(
            Fact(
                "economics",
                f"carrying {usd(money.carry_usd)} USD over {money.horizon_turns} turns against "
                f"compacting {usd(money.compact_usd)} USD: "
                + ("pays" if money.pays else "does not pay"),
            )
        )
    if decided.native is not None:
        beta = (
            ""
            if decided.native.beta is None
            else f" (header anthropic-beta: {decided.native.beta})"
        )
        facts.append(
            Fact("native", f"the provider compacts at {decided.native.threshold_tokens}{beta}")
        )
    if decided.cleared_calls:
        facts.append(
            Fact(
                "cleared",
                f"{len(decided.cleared_calls)} tool results sent cleared, "
                f"{decided.cleared_tokens} tokens removed this turn",
                items=tuple(shown(call) for call in decided.cleared_calls),
            )
        )
    if decided.folded_messages:
        facts.append(Fact("folded", f"{decided.folded_messages} history messages into a summary"))
    if decided.provider_item_dropped_messages:
        facts.append(
            Fact(
                "provider item",
                f"{decided.provider_item_dropped_messages} history messages before the "
                "provider's compaction item left out",
            )
        )
    return facts
