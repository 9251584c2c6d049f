"""The selection algorithm (SPEC §5): which blocks enter this request, in what view, and why.

Promise of :func:`select`, in plain words:

* **Never over a limit.** The exact token count of the rendered data message never exceeds
  ``data_limit``, and the exact count of each source's segment (its own wrapper included) never
  exceeds that source's limit.
* **Dependencies are whole.** Every block that enters (selected or projected) has its whole
  dependency closure selected in *full* view. A dependency is never represented by its projection.
* **Protected means protected.** Protected blocks and their whole closure enter in full, or the
  call raises (``CONTEXT_ASSEMBLY_INVALID`` when one is missing or expired,
  ``CONTEXT_ASSEMBLY_OVERFLOW`` when they exceed ``max_data_tokens`` or a source limit,
  ``CONTEXT_OVERFLOW`` when only the remaining window is too small).
* **Deterministic.** Same input, byte-identical output; the input order of blocks does not matter.
  Optional blocks are considered in the published total order ``(-priority, "source/id")``.
* **Explained.** Every block gets a status and a reason.

How it chooses: greedily, by rank. Each optional block is taken with the not-yet-selected part of
its dependency closure, all in full view; if that does not fit, its projection is tried (its
dependencies still full); otherwise it is omitted. A block that was projected is upgraded to full
when a later block depends on it (the later block pays the difference, or is omitted).

Known non-optimal cases, on purpose: greedy by rank is not a knapsack optimum (a large
high-priority block can crowd out several smaller ones that would have used the window better);
a block's dependencies are admitted at the *dependent's* rank, so a low-priority dependency of a
high-priority block enters early (its *effective* rank is the best rank among itself and its
dependents, as in priompt); and when the final exact count is over (per-block estimates are
summed to choose, one exact count confirms), the last choices are dropped, not re-packed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import orjson

from context_assembly.core.blocks import Node
from context_assembly.core.counting import ModelProfile, TokenCounter, count_text_message
from context_assembly.errors import AssemblyOverflowError, ContextOverflowError, InvalidError

Status = Literal["selected", "projected", "omitted"]
Reason = Literal[
    "protected",
    "dependency",
    "fits",
    "projection_fits",
    "expired",
    "missing_dependency",
    "budget",
    "source_budget",
    "source_failed",
]

DATA_OPEN = '{"context_data":['
DATA_CLOSE = "]}"
DATA_ROLE = "user"


@dataclass(frozen=True, slots=True)
class Decision:
    """What happened to one block, and what it costs (estimated, in this data message)."""

    status: Status
    reason: Reason
    tokens: int
    full_tokens: int
    projection_tokens: int | None


@dataclass(frozen=True, slots=True)
class Selection:
    """The result of :func:`select`."""

    decisions: Mapping[str, Decision]
    order: tuple[str, ...]  # qualified ids that entered, in selection order
    data_content: str | None  # the data message content; None when no block entered
    data_tokens: int  # exact tokens of the data message (framing included); 0 without one
    source_tokens: Mapping[str, int]  # exact tokens of each source segment that entered
    trimmed: int  # optional choices dropped after the exact count


def _piece(block_id: str, text: str, projected: bool) -> str:
    if projected:
        return orjson.dumps({"id": block_id, "projected": True, "text": text}).decode()
    return orjson.dumps({"id": block_id, "text": text}).decode()


def _source_open(source: str) -> str:
    return '{"source":' + orjson.dumps(source).decode() + ',"blocks":['


@dataclass(slots=True)
class _Costs:
    full_piece: dict[str, str] = field(default_factory=dict)
    proj_piece: dict[str, str] = field(default_factory=dict)
    full: dict[str, int] = field(default_factory=dict)
    proj: dict[str, int] = field(default_factory=dict)
    wrapper: dict[str, int] = field(default_factory=dict)
    message: int = 0


def _cost(
    graph: Mapping[str, Node], counter: TokenCounter, profile: ModelProfile, sources: Sequence[str]
) -> _Costs:
    """Per-block and per-wrapper token estimates; each separator comma is charged one token."""
    costs = _Costs()
    count = counter.count
    close = count(DATA_CLOSE)
    costs.message = profile.tokens_per_message + count(DATA_ROLE) + count(DATA_OPEN) + close
    for source in sources:
        costs.wrapper[source] = count(_source_open(source)) + close + 1
    for qid, node in graph.items():
        block = node.block
        piece = _piece(block.id, block.text, False)
        costs.full_piece[qid] = piece
        costs.full[qid] = count(piece) + 1
        if block.projection is not None:
            ppiece = _piece(block.id, block.projection, True)
            costs.proj_piece[qid] = ppiece
            costs.proj[qid] = count(ppiece) + 1
    return costs


def rank_key(node: Node) -> tuple[int, str]:
    """The published total order: priority descending, then qualified id ascending."""
    return (-node.block.priority, node.qid)


def _availability(
    graph: Mapping[str, Node], now: datetime, failed_sources: frozenset[str]
) -> dict[str, Reason]:
    """Optional blocks that cannot enter: expired, or a dependency missing/expired/failed."""
    reasons: dict[str, Reason] = {}

    def missing_reason(dep: str) -> Reason:
        return "source_failed" if dep.partition("/")[0] in failed_sources else "missing_dependency"

    for qid, node in graph.items():
        if node.expires_at is not None and node.expires_at <= now:
            reasons[qid] = "expired"
    # Propagate along dependents (the graph is acyclic); process in rank order for determinism.
    pending = sorted(graph)
    changed = True
    while changed:
        changed = False
        for qid in pending:
            if qid in reasons:
                continue
            for dep in graph[qid].deps:
                if dep not in graph:
                    reasons[qid] = missing_reason(dep)
                elif dep in reasons:
                    dep_reason = reasons[dep]
                    reasons[qid] = (
                        "source_failed" if dep_reason == "source_failed" else "missing_dependency"
                    )
                else:
                    continue
                changed = True
                break
    return reasons


def _protected_closure(
    graph: Mapping[str, Node], unavailable: Mapping[str, Reason], failed_sources: frozenset[str]
) -> list[str]:
    roots = sorted(q for q, n in graph.items() if n.block.protected)
    seen: set[str] = set()
    for root in roots:
        stack = [(root, root)]
        while stack:
            qid, owner = stack.pop()
            if qid in seen:
                continue
            node = graph.get(qid)
            if node is None:
                source = qid.partition("/")[0]
                why = (
                    f"its source {source!r} failed" if source in failed_sources else "it is missing"
                )
                raise InvalidError(
                    f"protected block {owner!r} requires {qid!r}, but {why}",
                    block_ids=sorted({owner, qid}),
                    field="dependencies",
                )
            if node.expires_at is not None and unavailable.get(qid) == "expired":
                what = (
                    "protected block"
                    if qid == owner
                    else f"dependency of protected block {owner!r}"
                )
                raise InvalidError(
                    f"{what} {qid!r} is expired", block_ids=sorted({owner, qid}), field="expires_at"
                )
            seen.add(qid)
            stack.extend((dep, owner) for dep in node.deps)
    return sorted(seen, key=lambda q: rank_key(graph[q]))


@dataclass(slots=True)
class _State:
    """Mutable bookkeeping of one selection run."""

    full: set[str] = field(default_factory=set)
    projected: set[str] = field(default_factory=set)
    used: int = 0
    source_used: dict[str, int] = field(default_factory=dict)


def _delta(
    state: _State,
    costs: _Costs,
    graph: Mapping[str, Node],
    adds_full: Sequence[str],
    block: str | None,
    projected: bool,
) -> tuple[int, dict[str, int]]:
    """Extra global and per-source tokens of adding ``adds_full`` (full) and ``block``."""
    per_source: dict[str, int] = {}
    for qid in adds_full:
        src = graph[qid].source
        extra = costs.full[qid] - (costs.proj[qid] if qid in state.projected else 0)
        per_source[src] = per_source.get(src, 0) + extra
    if block is not None:
        src = graph[block].source
        per_source[src] = per_source.get(src, 0) + (
            costs.proj[block] if projected else costs.full[block]
        )
    total = 0
    for src, extra in per_source.items():
        if src not in state.source_used:
            extra += costs.wrapper[src]
            per_source[src] = extra
        total += extra
    if not state.source_used and per_source:
        total += costs.message
    return total, per_source


def _fits(
    state: _State,
    total: int,
    per_source: Mapping[str, int],
    data_limit: int,
    source_limits: Mapping[str, int],
) -> tuple[bool, bool]:
    """(fits globally, fits every touched source limit)."""
    global_ok = state.used + total <= data_limit
    sources_ok = all(
        state.source_used.get(src, 0) + extra <= source_limits[src]
        for src, extra in per_source.items()
        if src in source_limits
    )
    return global_ok, sources_ok


def _apply(state: _State, total: int, per_source: Mapping[str, int]) -> None:
    state.used += total
    for src, extra in per_source.items():
        state.source_used[src] = state.source_used.get(src, 0) + extra


@dataclass(slots=True)
class _Choice:
    block: str
    projected: bool
    added: list[str]  # newly entered dependencies (full), in rank order
    upgraded: list[str]  # previously projected blocks made full
    prior: dict[str, Decision]  # decisions overwritten by this choice


def protected_demand(
    graph: Mapping[str, Node],
    sources: Sequence[str],
    counter: TokenCounter,
    profile: ModelProfile,
    now: datetime,
    failed_sources: frozenset[str] = frozenset(),
) -> int:
    """Estimated data-message tokens the protected closure needs (0 when nothing is protected).

    The engine uses it to decide whether opt-in history compaction must run before selection.
    """
    costs = _cost(graph, counter, profile, sources)
    unavailable = _availability(graph, now, failed_sources)
    protected = _protected_closure(graph, unavailable, failed_sources)
    total, _ = _delta(_State(), costs, graph, protected, None, False)
    return total


def select(
    graph: Mapping[str, Node],
    sources: Sequence[str],
    *,
    now: datetime,
    data_limit: int,
    max_data_tokens: int,
    source_limits: Mapping[str, int],
    counter: TokenCounter,
    profile: ModelProfile,
    failed_sources: frozenset[str] = frozenset(),
) -> Selection:
    """Decide every block and render the data message; see the module docstring for the promise.

    Args:
        graph: validated blocks (``blocks.build_graph``), keyed by qualified id.
        sources: source names in request order (the data message keeps this order).
        now: the instant against which ``expires_at`` is compared.
        data_limit: ``min(max_data_tokens, remaining window)``, whole data message included.
        max_data_tokens: the configured data budget (protected data over it is an overflow).
        source_limits: per-source limits, each counting the source's own wrapper.
        counter: the token counter of this request.
        profile: the model profile (message framing overhead).
        failed_sources: sources whose contributor failed under ``omit``.

    Raises:
        InvalidError: a protected block or a dependency it requires is missing or expired.
        AssemblyOverflowError: the protected closure exceeds ``max_data_tokens`` or a source limit.
        ContextOverflowError: the protected closure fits the data budget but not the window left.
    """
    costs = _cost(graph, counter, profile, sources)
    unavailable = _availability(graph, now, failed_sources)
    protected = _protected_closure(graph, unavailable, failed_sources)
    decisions: dict[str, Decision] = {}
    state = _State()

    def decide(qid: str, status: Status, reason: Reason) -> None:
        full = costs.full[qid]
        proj = costs.proj.get(qid)
        tokens = full if status == "selected" else (proj or 0) if status == "projected" else 0
        decisions[qid] = Decision(status, reason, tokens, full, proj)

    if protected:
        total, per_source = _delta(state, costs, graph, protected, None, False)
        over = [
            src
            for src, extra in sorted(per_source.items())
            if src in source_limits and extra > source_limits[src]
        ]
        roots = sorted(q for q in protected if graph[q].block.protected)
        if total > max_data_tokens or over:
            where = (
                f"source limit of {', '.join(over)}"
                if over
                else f"max_data_tokens {max_data_tokens}"
            )
            raise AssemblyOverflowError(
                f"protected blocks and their dependencies need {total} tokens, over the {where}",
                block_ids=roots,
                needed_tokens=total,
                sources=over or None,
            )
        if total > data_limit:
            raise ContextOverflowError(
                f"protected blocks need {total} data tokens but only {max(data_limit, 0)} remain "
                "in the context window",
                block_ids=roots,
                needed_tokens=total,
                data_limit_tokens=data_limit,
            )
        _apply(state, total, per_source)
        for qid in protected:
            state.full.add(qid)
            decide(qid, "selected", "protected" if graph[qid].block.protected else "dependency")

    order: list[str] = list(protected)
    choices: list[_Choice] = []
    optional = sorted((n for n in graph.values() if n.qid not in decisions), key=rank_key)
    for node in optional:
        qid = node.qid
        if qid in decisions and decisions[qid].status != "omitted":
            continue
        if qid in unavailable:
            decide(qid, "omitted", unavailable[qid])
            continue
        if qid in decisions:  # omitted earlier for budget: it only re-enters as a dependency
            continue
        needed = _needed(graph, state, node)
        reason: Reason = "budget"
        admitted = False
        for projected in (False, True):
            if projected and qid not in costs.proj:
                break
            total, per_source = _delta(state, costs, graph, needed, qid, projected)
            global_ok, sources_ok = _fits(state, total, per_source, data_limit, source_limits)
            if global_ok and sources_ok:
                choice = _Choice(qid, projected, [], [], {})
                for dep in needed:
                    if dep in decisions:
                        choice.prior[dep] = decisions[dep]
                    if dep in state.projected:
                        state.projected.discard(dep)
                        choice.upgraded.append(dep)
                    else:
                        choice.added.append(dep)
                    state.full.add(dep)
                    decide(dep, "selected", "dependency")
                if projected:
                    state.projected.add(qid)
                    decide(qid, "projected", "projection_fits")
                else:
                    state.full.add(qid)
                    decide(qid, "selected", "fits")
                _apply(state, total, per_source)
                choices.append(choice)
                order.extend(choice.added)
                order.append(qid)
                admitted = True
                break
            reason = "source_budget" if global_ok and not sources_ok else "budget"
        if not admitted:
            decide(qid, "omitted", reason)

    content, data_tokens, source_tokens = _render(
        graph, costs, sources, order, state, counter, profile
    )
    trimmed = 0
    while True:
        over_sources = [
            s for s, t in source_tokens.items() if s in source_limits and t > source_limits[s]
        ]
        if data_tokens <= data_limit and not over_sources:
            break
        if not choices:
            roots = sorted(q for q in protected if graph[q].block.protected)
            raise AssemblyOverflowError(
                f"protected data counts {data_tokens} tokens exactly, over the data limit "
                f"{data_limit} or a source limit",
                block_ids=roots,
                needed_tokens=data_tokens,
            )
        choice = choices.pop()
        trimmed += 1
        why: Reason = "source_budget" if over_sources and data_tokens <= data_limit else "budget"
        _undo(choice, state, decisions, order, why)
        content, data_tokens, source_tokens = _render(
            graph, costs, sources, order, state, counter, profile
        )
    return Selection(decisions, tuple(order), content, data_tokens, source_tokens, trimmed)


def _needed(graph: Mapping[str, Node], state: _State, node: Node) -> list[str]:
    """The not-yet-full part of ``node``'s dependency closure, in rank order (node excluded).

    The walk stops at blocks already selected in full: their closure is full by the invariant.
    """
    seen: set[str] = set()
    stack = list(node.deps)
    while stack:
        qid = stack.pop()
        if qid in seen or qid in state.full:
            continue
        seen.add(qid)
        stack.extend(graph[qid].deps)
    return sorted(seen, key=lambda q: rank_key(graph[q]))


def _undo(
    choice: _Choice, state: _State, decisions: dict[str, Decision], order: list[str], why: Reason
) -> None:
    """Revert one choice: its block is omitted, its dependencies go back to what they were."""
    qid = choice.block
    state.full.discard(qid)
    state.projected.discard(qid)
    order.remove(qid)
    prior_omitted = decisions[qid]
    decisions[qid] = Decision(
        "omitted", why, 0, prior_omitted.full_tokens, prior_omitted.projection_tokens
    )
    for dep in choice.upgraded:
        state.full.discard(dep)
        state.projected.add(dep)
        decisions[dep] = choice.prior[dep]
    for dep in choice.added:
        state.full.discard(dep)
        order.remove(dep)
        previous = choice.prior.get(dep)
        current = decisions[dep]
        decisions[dep] = previous or Decision(
            "omitted", why, 0, current.full_tokens, current.projection_tokens
        )


def _render(
    graph: Mapping[str, Node],
    costs: _Costs,
    sources: Sequence[str],
    order: Sequence[str],
    state: _State,
    counter: TokenCounter,
    profile: ModelProfile,
) -> tuple[str | None, int, dict[str, int]]:
    """The data message content, its exact token count and each source segment's exact count."""
    by_source: dict[str, list[str]] = {}
    for qid in order:
        piece = costs.proj_piece[qid] if qid in state.projected else costs.full_piece[qid]
        by_source.setdefault(graph[qid].source, []).append(piece)
    if not by_source:
        return None, 0, {}
    segments: list[str] = []
    source_tokens: dict[str, int] = {}
    for source in sources:
        pieces = by_source.get(source)
        if not pieces:
            continue
        segment = _source_open(source) + ",".join(pieces) + DATA_CLOSE
        segments.append(segment)
        source_tokens[source] = counter.count(segment)
    content = DATA_OPEN + ",".join(segments) + DATA_CLOSE
    return content, count_text_message(DATA_ROLE, content, counter, profile), source_tokens
