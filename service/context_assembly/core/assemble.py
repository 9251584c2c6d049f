"""One whole assembly, pure: sources in, frame + budget + manifest + hashes out.

The caller (CLI or HTTP service) resolves the model profile, the token counter, the clock and
the contributor results; this module validates, budgets, compacts history when the request allows
it, selects, lays out and hashes. Same arguments, same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from context_assembly.core.blocks import Node, SourceBlocks, build_graph, qualified
from context_assembly.core.budget import (
    Capacity,
    FixedCosts,
    count_history,
    fixed_costs,
    history_units,
    plan_drop_oldest,
)
from context_assembly.core.counting import Counted, ModelProfile, TokenCounter, count_message
from context_assembly.core.fingerprint import frame_hashes, input_hash, text_hash
from context_assembly.core.frame import Frame
from context_assembly.core.layout import Placed, build_texts, place
from context_assembly.core.memo import (
    AssemblyMemo,
    Entry,
    MemoKey,
    Outcome,
    Segment,
    blocks_digest,
    selection_key,
)
from context_assembly.core.request import AssemblyOptions, Message, PrepareRequest, Revision
from context_assembly.core.result import (
    BLOCK_REPORTS,
    BlockReport,
    BudgetReport,
    DecisionTally,
    SelectionReport,
    decision_tally,
    pack_block_rows,
)
from context_assembly.core.select import (
    CostPlan,
    cost_plan,
    data_message,
    protected_demand,
    rank_key,
    select,
)
from context_assembly.core.sources import SourceInput, SourceSetup
from context_assembly.errors import ContextOverflowError


@dataclass(frozen=True, slots=True)
class Assembly:
    """Everything one assembly produced; the caller adds ids, expiry and rendering."""

    frame: Frame
    placed: Placed
    budget: BudgetReport
    selection: SelectionReport
    fingerprint: str
    prefix_hash: str
    prefix_tokens: int
    input_hash: str
    instructions_hash: str
    history: tuple[Message, ...]  # the history actually sent (after compaction)
    selected_expiry: tuple[tuple[str, str], ...]  # (qualified id, expires_at) of entered blocks
    revisions: tuple[tuple[str, Revision | None], ...]  # (source, revision), manifest-free
    block_reports: tuple[BlockReport, ...]  # the manifest's block reports (as in ``selection``)
    block_rows: str  # the same in the packed stored form (``result.pack_block_rows``)
    block_decisions: DecisionTally  # the same counted by status and reason (for the metrics)
    block_digests: tuple[tuple[str, bytes], ...]  # (source, blocks_digest) of each live source


def assemble(
    request: PrepareRequest,
    setups: Sequence[SourceSetup],
    inputs: Sequence[SourceInput],
    *,
    now: datetime,
    local_now: datetime,
    counter: TokenCounter,
    profile: ModelProfile,
    capacity: Capacity,
    exact: bool,
    tenant: str,
    memo: AssemblyMemo | None = None,
) -> Assembly:
    """Run the whole pipeline of SPEC §4–§7 for one request.

    With a ``memo`` (``core/memo.py``), a turn whose blocks, limits and expiry state an earlier
    turn already decided reuses those decisions and only renders its data message; the result is
    the same as without one.

    Raises:
        InvalidError, AssemblyOverflowError, ContextOverflowError: as SPEC §9 describes.
    """
    options = request.options
    replaced = {setup.source: setup for setup in setups}
    texts = build_texts(request, replaced, local_now)
    live = [item for item in inputs if not item.failed]
    failed = frozenset(item.setup.source for item in inputs if item.failed)
    groups = [SourceBlocks(i.setup.source, i.blocks) for i in live]
    digests = tuple((item.setup.source, item.digest or blocks_digest(item.blocks)) for item in live)
    source_order = [p.name for p in request.plugins if p.name in replaced]
    reserve = request.response_reserve + options.reasoning_reserve_tokens
    key: MemoKey | None = None
    entry: Entry | None = None
    if memo is not None:
        key = memo.key(digests, source_order, failed, counter, profile, options)
        entry = memo.get(key, now)
    # A memoised entry means these blocks passed validation and the protected checks before.
    graph: dict[str, Node] | None = None
    plan: CostPlan | None = None
    if entry is None:
        graph, plan = _graph_and_plan(groups, source_order, options, counter, profile)

    history = request.history_messages  # empty when the provider holds the history (native)
    history_counts = count_history(request, counter, profile)
    fixed = fixed_costs(
        options.layout, texts, request.tools, history_counts, request.input, counter, profile
    )
    remaining = capacity.tokens - reserve - fixed.total
    if entry is not None:
        demand = entry.demand
    elif graph is not None and plan is not None:
        demand = protected_demand(graph, source_order, counter, profile, now, failed, plan=plan)
    else:
        demand = 0  # no block at all
    dropped = 0
    if remaining < demand and demand <= options.max_data_tokens:
        policy = options.history_policy
        if policy.mode == "drop_oldest":
            dropped = plan_drop_oldest(
                history_counts,
                history_units(history),
                policy.keep_last_messages,
                demand - remaining,
            )
        if dropped < 0 or remaining + _freed(history_counts, dropped) < demand:
            raise _overflow(capacity, reserve, fixed, demand, policy.mode)
        history = history[dropped:]
        history_counts = history_counts[dropped:]
        fixed = fixed_costs(
            options.layout, texts, request.tools, history_counts, request.input, counter, profile
        )
        remaining = capacity.tokens - reserve - fixed.total
    data_limit = min(options.max_data_tokens, remaining)

    sel_key = selection_key(data_limit, options.max_data_tokens, options.source_token_limits)
    outcome = entry.outcomes.get(sel_key) if entry is not None else None
    if outcome is None:
        if graph is None:  # memoised blocks, other limits: decide them afresh
            graph, plan = _graph_and_plan(groups, source_order, options, counter, profile)
        outcome, data_content = _select(
            graph, plan, groups, source_order, now, data_limit, options, counter, profile, failed
        )
        if memo is not None and key is not None:
            expiries = [n.expires_at for n in graph.values() if n.expires_at is not None]
            memo.record(key, entry, sel_key, outcome, demand=demand, expiries=expiries, now=now)
    else:
        data_content = _render(outcome.segments, groups)
    placed = place(options.layout, texts, request.tools, history, data_content, request.input)
    frame = Frame(messages=list(placed.messages), tools=list(placed.tools))
    data_tokens = outcome.data_tokens
    total = fixed.total + data_tokens
    opaque = fixed.opaque or any(c.opaque for c in history_counts)

    budget = BudgetReport(
        capacity=capacity.tokens,
        capacity_source=capacity.source,
        response_reserve=request.response_reserve,
        reasoning_reserve_tokens=options.reasoning_reserve_tokens,
        instructions_tokens=fixed.instructions,
        legacy_data_tokens=fixed.legacy_data,
        tools_tokens=fixed.tools,
        history_tokens=fixed.history,
        input_tokens=fixed.input,
        remaining_tokens=remaining,
        data_limit_tokens=data_limit,
        data_tokens=data_tokens,
        total_input_tokens=total,
        history_dropped_messages=dropped,
    )
    # Validated inside the SelectionReport below, in pydantic-core (a model each: ~2x the time).
    sources = [
        {
            "source": item.setup.source,
            "kind": item.setup.kind,
            "status": item.status,
            "duration_ms": round(item.duration_ms, 3),
            "block_count": len(item.blocks),
        }
        for item in _in_setup_order(setups, inputs)
    ]
    manifest = SelectionReport(
        blocks=outcome.blocks,
        sources=sources,
        max_data_tokens=options.max_data_tokens,
        selected_data_tokens=data_tokens,
        layout=options.layout,
        reasoning_reserve_tokens=options.reasoning_reserve_tokens,
        tokenizer=counter.name,
        exact=exact,
        opaque_or_multimodal=opaque,
    )
    prefix = placed.messages[: placed.prefix_len]
    prefix_tokens = fixed.tools + sum(count_message(m, counter, profile).tokens for m in prefix)
    fingerprint, prefix_hash, _ = frame_hashes(
        request.model_name,
        tenant,
        request.scope,
        request.render,
        placed.messages,
        placed.tools,
        placed.prefix_len,
    )
    return Assembly(
        frame=frame,
        placed=placed,
        budget=budget,
        selection=manifest,
        fingerprint=fingerprint,
        prefix_hash=prefix_hash,
        prefix_tokens=prefix_tokens,
        input_hash=input_hash(request.input),
        instructions_hash=text_hash(request.instructions),
        history=tuple(history),
        selected_expiry=outcome.selected_expiry,
        revisions=tuple((item.setup.source, item.revision) for item in inputs),
        block_reports=outcome.blocks,
        block_rows=outcome.block_rows,
        block_decisions=outcome.decisions,
        block_digests=digests,
    )


def _graph_and_plan(
    groups: Sequence[SourceBlocks],
    source_order: Sequence[str],
    options: AssemblyOptions,
    counter: TokenCounter,
    profile: ModelProfile,
) -> tuple[dict[str, Node], CostPlan | None]:
    """The validated graph and its one costing pass, which serves both the protected demand
    and the selection (no plan when there is no block)."""
    graph = build_graph(groups, options)
    return graph, cost_plan(graph, source_order, counter, profile) if graph else None


def _select(
    graph: dict[str, Node],
    plan: CostPlan | None,
    groups: Sequence[SourceBlocks],
    source_order: Sequence[str],
    now: datetime,
    data_limit: int,
    options: AssemblyOptions,
    counter: TokenCounter,
    profile: ModelProfile,
    failed: frozenset[str],
) -> tuple[Outcome, str | None]:
    """Select over ``graph``; the text-free outcome (what the memo keeps) and the data message."""
    selection = select(
        graph,
        source_order,
        now=now,
        data_limit=data_limit,
        max_data_tokens=options.max_data_tokens,
        source_limits=options.source_token_limits,
        counter=counter,
        profile=profile,
        failed_sources=failed,
        plan=plan,
    )
    decisions = selection.decisions
    # One list validation in pydantic-core (~3 µs a block) instead of a model per block (~6 µs
    # with __init__, ~10 µs with model_construct).
    blocks = BLOCK_REPORTS.validate_python(
        [
            {
                "source": node.source,
                "id": node.block.id,
                "status": decision.status,
                "reason": decision.reason,
                "tokens": decision.tokens,
                "full_tokens": decision.full_tokens,
                "projection_tokens": decision.projection_tokens,
                "priority": node.block.priority,
                "protected": node.block.protected,
                "dependencies": list(node.deps),
            }
            for node in sorted(graph.values(), key=rank_key)
            for decision in (decisions[node.qid],)
        ]
    )
    # Where each entered block sits in ``groups`` (the memo key's order), grouped by source in
    # source order and in selection order within a source, as ``select`` renders them.
    position: dict[str, int] = {}
    offset = 0
    for group in groups:
        for index, block in enumerate(group.blocks):
            position.setdefault(qualified(group.source, block.id), offset + index)
        offset += len(group.blocks)
    by_source: dict[str, list[tuple[int, bool]]] = {}
    for qid in selection.order:
        node = graph[qid]
        by_source.setdefault(node.source, []).append(
            (position[qid], decisions[qid].status == "projected")
        )
    segments = tuple(
        Segment(source, *_unzip(by_source[source]))
        for source in source_order
        if source in by_source
    )
    expiry = tuple(
        (qid, graph[qid].block.expires_at or "")
        for qid in selection.order
        if graph[qid].block.expires_at is not None
    )
    outcome = Outcome(
        segments,
        selection.data_tokens,
        tuple(blocks),
        pack_block_rows(blocks),
        expiry,
        decision_tally(blocks),
    )
    return outcome, selection.data_content


def _unzip(pieces: Sequence[tuple[int, bool]]) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """``(positions, projected)`` of a segment's ``(position, projected)`` pieces."""
    return tuple(p for p, _ in pieces), tuple(v for _, v in pieces)


def _render(segments: Sequence[Segment], groups: Sequence[SourceBlocks]) -> str | None:
    """The data message of a memoised outcome, rendered from this request's blocks."""
    if not segments:
        return None
    flat = [block for group in groups for block in group.blocks]
    at = flat.__getitem__
    return data_message(
        [
            (segment.source, zip(map(at, segment.positions), segment.projected, strict=True))
            for segment in segments
        ]
    )


def _freed(history_counts: Sequence[Counted], dropped: int) -> int:
    return sum(c.tokens for c in history_counts[:dropped]) if dropped > 0 else 0


def _in_setup_order(
    setups: Sequence[SourceSetup], inputs: Sequence[SourceInput]
) -> list[SourceInput]:
    by_source = {item.setup.source: item for item in inputs}
    return [by_source[s.source] for s in setups if s.source in by_source]


def _overflow(
    capacity: Capacity, reserve: int, fixed: FixedCosts, demand: int, mode: str
) -> ContextOverflowError:
    needed = fixed.total + reserve + demand
    hint = "" if mode == "drop_oldest" else " (history_policy 'drop_oldest' may compact history)"
    return ContextOverflowError(
        f"the request needs {needed} tokens (fixed {fixed.total} + reserve {reserve} + protected "
        f"data {demand}) but the window is {capacity.tokens}{hint}",
        capacity=capacity.tokens,
        needed_tokens=needed,
        shortfall_tokens=needed - capacity.tokens,
    )


__all__ = ["Assembly", "assemble", "qualified"]
