"""How a turn's cache figures are said in words, the same on the breakdown and the timeline:
the first change by name, why the expected cached tokens are what they are, how the reported
ones compare, and the two kinds of miss.

Only names the record keeps appear (tool names, message roles, models, layouts, ids), never a
text; they are returned as plain text, for the page to escape.
"""

from __future__ import annotations

from typing import Final

from context_assembly.api.pages import duration, shown
from context_assembly.lifecycle_models import CacheMiss, NamedChange, TimelineTurn

MISS_WORDS: Final[dict[CacheMiss, str]] = {
    "prefix_changed": "prefix changed",
    "expired": "cache expired",
    "provider": "provider did not cache",
}
"""Each kind of miss in a few words (the timeline's legend and column)."""

MISS_MEANING: Final[dict[CacheMiss, str]] = {
    "prefix_changed": "the frame's prefix differs from the previous turn's, so nothing it cached "
    "could be read",
    "expired": "the previous turn is older than the provider keeps a cached prefix",
    "provider": "the prefix was kept and within the cache lifetime, yet the provider reported "
    "fewer cached tokens than expected",
}


def change_words(change: NamedChange | None) -> str:
    """The first change by name: ``tool "search" changed (tools[1])``, ``history message 3
    (user) changed``, ``instructions changed``, ``model gpt-4o (openai-chat) → ...``."""
    if change is None:
        return "-"
    where = change.part if change.index is None else f"{change.part}[{change.index}]"
    name = None if change.name is None else shown(change.name)
    previous = None if change.previous_name is None else shown(change.previous_name)
    if change.part == "tools":
        if name is None:
            return f"a tool removed ({where})" if change.change == "removed" else where
        if change.change in ("added", "removed"):
            return f'tool "{name}" {change.change} ({where})'
        if previous is not None:
            return f'tool "{name}" in place of "{previous}" ({where})'
        return f'tool "{name}" changed ({where})'
    if change.part == "history":
        if change.change == "removed":
            return f"history message {change.index} removed (the history is shorter)"
        if change.role is not None:
            return f"history message {change.index} ({shown(change.role)}) changed"
        return where
    if change.part in ("model", "layout") and name is not None:
        if previous is not None:
            return f"{change.part} {previous} → {name}"
        return f"{change.part} changed to {name}"
    return f"{change.part} changed"


def expected_words(turn: TimelineTurn, nothing_cacheable: str | None = None) -> str:
    """Why ``expected_cached_tokens`` is what it is, in a sentence. ``nothing_cacheable`` is the
    breakdown's more precise reason for a prefix that could not be cached (it knows the plan)."""
    reason = turn.expected_reason
    since = turn.seconds_since_previous
    lifetime = turn.cache_lifetime_seconds
    if reason == "first_turn":
        return "the first turn of its conversation: nothing was cached before it"
    if reason == "previous_unknown":
        previous = shown(turn.previous_preparation_id or "-")
        return f"the previous preparation {previous} is unknown or expired: nothing to compare with"
    if reason == "prefix_changed":
        return f"the prefix changed: {change_words(turn.first_change)}"
    if reason == "no_provider_cache":
        return f"the service models no provider cache for render {shown(turn.render)}"
    if reason == "expired" and since is not None and lifetime is not None:
        return (
            f"{duration(since)} since the previous turn: longer than the provider keeps a "
            f"cached prefix ({duration(lifetime)})"
        )
    if reason == "nothing_cacheable":
        return nothing_cacheable or (
            "this turn's prefix could not be cached (below the model's minimum cacheable "
            "length, or no cache marker)"
        )
    if reason == "previous_nothing_cacheable":
        return "the previous turn's prefix could not be cached, so it wrote nothing to read"
    if reason == "cached" and since is not None and lifetime is not None:
        return (
            f"the prefix the previous turn cached, {duration(since)} earlier (the provider "
            f"keeps it {duration(lifetime)})"
        )
    return "not known for a preparation stored before the reason was kept"


def reported_words(turn: TimelineTurn, reported_at_all: bool = True) -> str:
    """How the reported cached tokens compare with the expected ones, and the likely cause;
    ``reported_at_all``: whether the main call's usage was reported (it may lack the figure)."""
    reported = turn.cached_input_tokens
    expected = turn.expected_cached_tokens
    if reported is None:
        if reported_at_all:
            return "the usage report of the main call has no cached figure"
        return "no usage report of the main call yet"
    if expected is None:
        return "no expected figure to compare with (a preparation stored before it was kept)"
    if reported == expected:
        return "as expected"
    if reported < expected:
        return (
            f"{expected - reported} fewer than expected: provider-side, the provider did not "
            "cache or read what it could (an eviction before the lifetime ended, or the call "
            "reached a server without the cached prefix)"
        )
    likely = {
        "prefix_changed": "the part of the prefix before the first change",
        "expired": "the prefix, kept longer than the lifetime the service assumes",
    }.get(turn.expected_reason or "", "the same prefix sent by another conversation")
    return (
        f"{reported - expected} more than expected: the provider read a cache the plan did not "
        f"count on (likely {likely})"
    )
