"""One whole assembly, pure: sources in, frame + budget + manifest + hashes out.

The caller (CLI or HTTP service) resolves the model profile, the token counter, the clock and
the contributor results; this module validates, budgets, compacts history when the request allows
it, selects, lays out and hashes. Same arguments, same result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from datetime import datetime

from context_assembly.core import calibration, compaction
from context_assembly.core.anchor import Anchor, Anchored, anchor_count, head_digest, shared_length
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
from context_assembly.core.fingerprint import frame_hashes, input_hash, message_hashes, text_hash
from context_assembly.core.frame import Frame
from context_assembly.core.layout import (
    Placed,
    Texts,
    build_texts,
    frame_tools,
    leading_text,
    place,
    place_transcript,
    turn_point,
)
from context_assembly.core.pricing import PriceRates
from context_assembly.core.request import Message, PrepareRequest, Revision
from context_assembly.core.result import BLOCK_REPORTS, BlockReport, BudgetReport, SelectionReport
from context_assembly.core.select import (
    CostPlan,
    Selection,
    cost_plan,
    protected_demand,
    rank_key,
    select,
)
from context_assembly.core.sources import SourceInput, SourceSetup
from context_assembly.core.transcript import (
    CLEARED_DATA_MESSAGE,
    Insertion,
    Prior,
    Rebuilt,
    clear_data_messages,
    data_insertion,
    new_data,
    present_pieces,
    rebuild,
    turn_insertion,
)
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
    prefix_tokens: int  # tools + the messages before the turn point
    leading_tokens: int  # tools + the leading system message
    input_hash: str
    instructions_hash: str
    history: tuple[Message, ...]  # the history actually sent (after compaction)
    head_digest: str  # what precedes the conversation (``core/anchor.py``)
    conversation_hashes: tuple[str, ...]  # of the conversation sent: history, then input
    transcript: tuple[Insertion, ...] | None  # the ``transcript`` layout's insertions
    selected_expiry: tuple[tuple[str, str], ...]  # (qualified id, expires_at) of entered blocks
    revisions: tuple[tuple[str, Revision | None], ...]  # (source, revision), manifest-free
    floor_tokens: int = 0  # what no compaction removes (``core/compaction.py``)
    history_counts: tuple[int, ...] = ()  # per message of ``history``
    # Of the caller's own history, as sent (before compaction rewrote or dropped any of it)
    caller_history_hashes: tuple[str, ...] = ()
    # ``transcript``: the earlier turns' data messages still sent whole, and their count
    earlier_data: tuple[int, int] = (0, 0)
    # Per message of the prefix (``placed.messages[:placed.prefix_len]``): where a cache marker
    # that cannot end the prefix itself goes instead (``core/cache.py``).
    prefix_counts: tuple[int, ...] = ()


def assemble_frame(
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
    anchor: Anchor | None = None,
    prior: Prior | None = None,
    compacted: compaction.Previous | None = None,
    price: PriceRates | None = None,
) -> Assembly:
    """Assemble ``request`` (:func:`_assemble_once`) and decide its compaction
    (``core/compaction.py``, docs/compaction.md): the history is read as the provider reads it
    (from its latest compaction item on), and the tool results that the scope's previous turn
    (``compacted``) cleared are cleared again; when this turn's decision is to clear, the frame is
    assembled again with the results it clears. ``price``: the model's rates, for the decision's
    economics. The decision is ``selection.compaction``."""
    options = request.options.compaction
    history = request.history_messages
    sent, left_out = compaction.after_provider_compaction(history)
    cleared = () if compacted is None else compacted.cleared
    if options.mode == "clear_tool_results":
        present = {m.tool_call_id for m in sent if m.role == "tool"}
        cleared = tuple(call for call in cleared if call in present)
        sent = compaction.clear_results(sent, cleared)
    else:
        cleared = ()
    rewritten = len(sent) != len(history) or any(
        a is not b for a, b in zip(sent, history, strict=True)
    )
    if rewritten:
        request = request.model_copy(update={"history": sent})

    def once(request: PrepareRequest, clear_data: bool = False) -> Assembly:
        return _assemble_once(
            request,
            setups,
            inputs,
            now=now,
            local_now=local_now,
            counter=counter,
            profile=profile,
            capacity=capacity,
            exact=exact,
            tenant=tenant,
            anchor=anchor,
            prior=prior,
            clear_data=clear_data,
        )

    assembly = once(request)
    budget = assembly.budget
    total = budget.total_input_tokens
    floor = assembly.floor_tokens
    if budget.anchored is not None and budget.anchored.correction_tokens:
        # The total counts the repeated part as the provider did; the floor's terms are
        # estimated: scaled by the same correction, so both are in the provider's units.
        floor = floor * total // (total + budget.anchored.correction_tokens)
    pressure = compaction.Pressure(
        window=capacity.tokens,
        reserve=budget.response_reserve + budget.reasoning_reserve_tokens,
        total=total,
        floor=min(floor, total),
    )
    candidates: list[tuple[str, int]] = []  # what clearing may replace (clearing only)
    if options.mode == "clear_tool_results":
        candidates = compaction.clearable(
            assembly.history,
            assembly.history_counts,
            sum(message.role == "tool" for message in request.input),
            options,
            cleared,
        )
        # Clearing also lowers the tool loop after the latest user turn: its earlier results
        # leave the floor.
        point = turn_point([*assembly.history, *request.input])
        in_loop = {m.tool_call_id for m in assembly.history[point:] if m.role == "tool"}
        lowered = sum(tokens for call, tokens in candidates if call in in_loop)
        pressure = dataclass_replace(pressure, floor=max(pressure.floor - lowered, 0))
    data_messages, data_tokens = assembly.earlier_data
    report = compaction.decide(
        options,
        pressure,
        previous=compacted,
        clearable_tokens=sum(tokens for _, tokens in candidates) + data_tokens,
        price=price,
        render=request.render,
    )
    update: dict[str, object] = {
        "provider_item_dropped_messages": left_out,
        "cleared_calls": list(cleared),
    }
    if report.decision == "clear_tool_results" and options.mode == "clear_tool_results":
        calls = [call for call, _ in candidates]
        request = request.model_copy(
            update={"history": compaction.clear_results(request.history_messages, calls)}
        )
        rewritten = True
        assembly = once(request, clear_data=data_messages > 0)
        update["cleared_calls"] = [*cleared, *calls]
        # What the cleared results counted, less their placeholders: the totals before and after
        # may not compare (an anchored count holds only while the frame repeats the previous).
        named = set(calls)
        placeholders = [m for m in request.history_messages if m.tool_call_id in named]
        cleared_data = data_messages * count_message(CLEARED_DATA_MESSAGE, counter, profile).tokens
        update["cleared_tokens"] = max(
            sum(tokens for _, tokens in candidates)
            - sum(count_message(m, counter, profile).tokens for m in placeholders)
            + data_tokens
            - cleared_data,
            0,
        )
    selection = assembly.selection.model_copy(
        update={"compaction": report.model_copy(update=update)}
    )
    caller = assembly.caller_history_hashes
    if rewritten:
        caller = tuple(message_hashes(history))
    return dataclass_replace(assembly, selection=selection, caller_history_hashes=caller)


def _assemble_once(
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
    anchor: Anchor | None = None,
    prior: Prior | None = None,
    clear_data: bool = False,
) -> Assembly:
    """Run the whole pipeline (docs/contract.md, "Budget" to "Hashes") for one request.

    Five steps: the blocks are validated into a graph and costed once (:func:`_costed_blocks`);
    the fixed terms are counted and, when the request allows it, history is compacted until the
    protected data fits (:func:`_fit`); the blocks are selected into the room left
    (:func:`~.select.select`); the frame is laid out (:func:`~.layout.place`); the budget, the
    manifest and the hashes describe it (:func:`_budget_report`, :func:`_manifest`,
    :func:`~.fingerprint.frame_hashes`).

    With ``anchor`` (the previous turn and its provider count, ``core/anchor.py``) and a count
    that is not exact, the part of the frame that repeats the previous one counts as the
    provider counted it. With the ``transcript`` layout, ``prior`` (the previous turn's
    conversation and insertions) puts the earlier turns' messages back where they stood
    (``core/transcript.py``).

    Raises:
        InvalidError, AssemblyOverflowError, ContextOverflowError: as docs/contract.md, "Errors", describes.
    """
    options = request.options
    texts = build_texts(request, {setup.source: setup for setup in setups}, local_now)
    blocks = _costed_blocks(request, setups, inputs, now, counter, profile)
    head = head_digest(
        request.model_name,
        request.render,
        options.layout,
        frame_tools(options.layout, request.tools),
        leading_text(options.layout, texts),
    )
    # One hash per message of the conversation (history, then input): what the previous turn's
    # anchor and transcript are matched on, and what the record keeps of this one.
    hashes = message_hashes([*request.history_messages, *request.input])
    earlier = None
    if options.layout == "transcript":
        earlier = _earlier(
            request, texts, blocks.graph, prior, hashes, now, counter, profile, clear_data
        )
    fit = _fit(
        request,
        texts,
        blocks.protected_demand,
        capacity,
        counter,
        profile,
        anchor=None if exact or anchor is None or anchor.head != head else anchor,
        hashes=hashes,
        earlier=earlier,
        exact=exact,
    )
    data_limit = min(
        options.max_data_tokens, fit.remaining if fit.data_room is None else fit.data_room
    )
    selection = select(
        blocks.graph,
        blocks.source_order,
        now=now,
        data_limit=data_limit,
        max_data_tokens=options.max_data_tokens,
        source_limits=options.source_token_limits,
        counter=counter,
        profile=profile,
        failed_sources=blocks.failed,
        plan=blocks.plan,
    )
    transcript: tuple[Insertion, ...] | None = None
    data_tokens = selection.data_tokens
    if earlier is None:
        placed = place(
            options.layout, texts, request.tools, fit.history, selection.data_content, request.input
        )
    else:
        placed, transcript, data_tokens = _place_transcript(
            request, texts, blocks, selection, fit, earlier, local_now, counter, profile
        )
    fingerprint, prefix_hash, _ = frame_hashes(
        request.model_name,
        tenant,
        request.scope,
        request.render,
        placed.messages,
        placed.tools,
        placed.prefix_len,
    )
    prefix_counts = _prefix_counts(placed, fit, counter, profile)
    return Assembly(
        frame=Frame(messages=list(placed.messages), tools=list(placed.tools)),
        placed=placed,
        budget=_budget_report(request, capacity, fit, data_limit, data_tokens, exact),
        selection=_manifest(
            request, setups, inputs, blocks.graph, selection, fit, counter, exact, placed
        ).model_copy(update={"selected_data_tokens": data_tokens}),
        fingerprint=fingerprint,
        prefix_hash=prefix_hash,
        prefix_tokens=fit.fixed.tools + sum(prefix_counts),
        leading_tokens=fit.fixed.tools + (prefix_counts[0] if placed.leading else 0),
        input_hash=input_hash(request.input),
        instructions_hash=text_hash(request.instructions),
        history=tuple(fit.history),
        head_digest=head,
        conversation_hashes=tuple(hashes[fit.dropped :]),
        caller_history_hashes=tuple(hashes[: len(request.history_messages)]),
        transcript=transcript,
        selected_expiry=_selected_expiry(blocks.graph, selection),
        revisions=tuple((item.setup.source, item.revision) for item in inputs),
        floor_tokens=_floor(request, fit, blocks.protected_demand),
        earlier_data=(0, 0) if earlier is None else (earlier.data_messages, earlier.data_tokens),
        history_counts=tuple(item.tokens for item in fit.history_counts),
        prefix_counts=prefix_counts,
    )


def _floor(request: PrepareRequest, fit: _Fit, demand: int) -> int:
    """What no compaction removes (``core/compaction.py``): the instructions, tools and per-turn
    message, the input, the protected data, the history from the latest user turn on, and a
    provider's compaction item opening the history."""
    fixed = fit.fixed
    counts = fit.history_counts
    point = min(turn_point([*fit.history, *request.input]), len(counts))
    latest = sum(item.tokens for item in counts[point:])
    head = counts[0].tokens if point and compaction.starts_with_compaction(fit.history) else 0
    return (
        fixed.instructions + fixed.legacy_data + fixed.tools + fixed.input + demand + latest + head
    )


@dataclass(frozen=True, slots=True)
class _Earlier:
    """A ``transcript`` frame's earlier insertions as this turn sends them."""

    shared: int  # conversation messages repeated from the previous turn
    rebuilt: list[Rebuilt]
    tokens: int  # their count
    new_turn: bool  # the latest user turn is new: it gets a per-turn message
    point: int  # the turn point in the conversation
    data_messages: int = 0  # the earlier data messages sent whole (not the cleared ones)
    data_tokens: int = 0  # their count


def _earlier(
    request: PrepareRequest,
    texts: Texts,
    graph: dict[str, Node],
    prior: Prior | None,
    hashes: Sequence[str],
    now: datetime,
    counter: TokenCounter,
    profile: ModelProfile,
    clear_data: bool = False,
) -> _Earlier:
    """The previous turn's insertions kept by this conversation: those before the first
    message that differs (and at its end when the whole previous conversation is repeated),
    rebuilt or cleared (``core/transcript.py``); with ``clear_data`` (compaction clearing) every
    data message among them cleared, in one block."""
    conversation = [*request.history_messages, *request.input]
    point = turn_point(conversation)
    if prior is None or request.native_history is not None:
        return _Earlier(0, [], 0, True, point)
    shared = shared_length(prior.conversation, hashes)
    whole = shared == len(prior.conversation)
    kept = [i for i in prior.insertions if i.at < shared or (whole and i.at == shared)]
    rebuilt = rebuild(kept, legacy_views=texts.legacy_data, graph=graph, now=now)
    if clear_data:
        rebuilt = clear_data_messages(rebuilt)
    counts = [count_message(item.message, counter, profile).tokens for item in rebuilt]
    data = [n for item, n in zip(rebuilt, counts, strict=True) if item.insertion.kind == "data"]
    return _Earlier(shared, rebuilt, sum(counts), point >= shared, point, len(data), sum(data))


def _place_transcript(
    request: PrepareRequest,
    texts: Texts,
    blocks: _Blocks,
    selection: Selection,
    fit: _Fit,
    earlier: _Earlier,
    local_now: datetime,
    counter: TokenCounter,
    profile: ModelProfile,
) -> tuple[Placed, tuple[Insertion, ...], int]:
    """The ``transcript`` frame: the earlier insertions where they stood, and this turn's own
    (a per-turn message and the new data at a new user turn; new data after a tool loop's
    step otherwise). Also the insertions the record keeps and the new data message's count."""
    conversation = [*fit.history, *request.input]
    dropped = fit.dropped
    old = [
        (item.insertion.at - dropped, item)
        for item in earlier.rebuilt
        if item.insertion.at >= dropped
    ]
    present = present_pieces(item for _, item in old)
    projected = {qid: selection.decisions[qid].status == "projected" for qid in selection.order}
    segments = new_data(selection.order, blocks.graph, projected, blocks.source_order, present)
    at = earlier.point - dropped if earlier.new_turn else len(conversation)
    new: list[Rebuilt] = []
    if earlier.new_turn:
        new.append(turn_insertion(at, texts.legacy_data, local_now, request.timezone))
    data_tokens = 0
    if segments:
        new.append(data_insertion(at, segments))
        data_tokens = count_message(new[-1].message, counter, profile).tokens
    insertions = [(position, item.message, False) for position, item in old]
    insertions += [(at, item.message, True) for item in new]
    placed = place_transcript(
        texts,
        request.tools,
        conversation,
        insertions,
        history_len=len(fit.history),
        shared=max(earlier.shared - dropped, 0) if dropped == 0 else 0,
    )
    kept = [dataclass_replace(item.insertion, at=position) for position, item in old]
    return placed, (*kept, *(item.insertion for item in new)), data_tokens


@dataclass(frozen=True, slots=True)
class _Blocks:
    """The live sources' blocks, validated and costed, and what the protected ones need."""

    graph: dict[str, Node]
    plan: CostPlan | None  # None when there is no block
    source_order: list[str]  # the replaced sources, in plugin order
    failed: frozenset[str]  # sources that failed under ``omit``
    protected_demand: int  # estimated data tokens of the protected closure


def _costed_blocks(
    request: PrepareRequest,
    setups: Sequence[SourceSetup],
    inputs: Sequence[SourceInput],
    now: datetime,
    counter: TokenCounter,
    profile: ModelProfile,
) -> _Blocks:
    """The blocks of the sources that answered, validated into one graph (docs/contract.md,
    "Block rules") and costed once; the costs serve both the protected demand and
    the selection."""
    replaced = {setup.source for setup in setups}
    source_order = [p.name for p in request.plugins if p.name in replaced]
    failed = frozenset(item.setup.source for item in inputs if item.failed)
    groups = [SourceBlocks(i.setup.source, i.blocks) for i in inputs if not i.failed]
    graph = build_graph(groups, request.options)
    if not graph:
        return _Blocks(graph, None, source_order, failed, 0)
    plan = cost_plan(graph, source_order, counter, profile)
    demand = protected_demand(graph, source_order, counter, profile, now, failed, plan=plan)
    return _Blocks(graph, plan, source_order, failed, demand)


@dataclass(frozen=True, slots=True)
class _Fit:
    """The fixed terms of the request, and the history they count (after any compaction)."""

    history: Sequence[Message]  # the history to send
    history_counts: Sequence[Counted]  # its per-message counts
    fixed: FixedCosts
    remaining: int  # the window left for the data message
    dropped: int  # history messages dropped by compaction
    anchored: Anchored | None = None  # the shared part counted with the provider's figure
    # Set when an estimated count is over the window but the provider's may not be
    # (``_uncertain``): the room given to the data message instead of ``remaining``.
    data_room: int | None = None


def _fit(
    request: PrepareRequest,
    texts: Texts,
    demand: int,
    capacity: Capacity,
    counter: TokenCounter,
    profile: ModelProfile,
    *,
    anchor: Anchor | None = None,
    hashes: Sequence[str] = (),
    earlier: _Earlier | None = None,
    exact: bool = True,
) -> _Fit:
    """The fixed terms counted exactly, and the window they leave to the data message. When the
    protected data (``demand``) does not fit that window but fits ``max_data_tokens``, the
    history policy ``drop_oldest`` drops the oldest history units until it does; without it,
    or when dropping cannot free enough, ``ContextOverflowError``. With ``anchor`` the fixed
    terms' shared part counts as the provider counted it (``_anchored``; ``hashes``: the
    conversation's message hashes it is matched on). With ``earlier`` (the
    ``transcript`` layout) the earlier turns' messages count in the history term, and the
    per-turn message only at a new user turn."""
    options = request.options
    reserve = request.response_reserve + options.reasoning_reserve_tokens
    history = request.history_messages  # empty when the provider holds the history (native)
    history_counts = count_history(request, counter, profile)

    def fixed_terms(counts: Sequence[Counted]) -> FixedCosts:
        fixed = fixed_costs(
            options.layout, texts, request.tools, counts, request.input, counter, profile
        )
        if earlier is None:
            return fixed
        return dataclass_replace(
            fixed,
            history=fixed.history + earlier.tokens,
            legacy_data=fixed.legacy_data if earlier.new_turn else 0,
        )

    fixed = fixed_terms(history_counts)
    anchored = None
    if anchor is not None and request.native_history is None:
        extra = 0 if earlier is None else earlier.tokens  # the earlier turns' messages it holds
        anchored = _anchored(
            anchor, request, hashes, history_counts, fixed, extra, counter, profile
        )
    correction = 0 if anchored is None else anchored.correction
    remaining = capacity.tokens - reserve - fixed.total + correction
    if remaining >= demand or demand > options.max_data_tokens:
        return _Fit(history, history_counts, fixed, remaining, 0, anchored)
    policy = options.history_policy
    if not exact and policy.mode == "none" and _uncertain(fixed, anchored, remaining, demand):
        return _Fit(history, history_counts, fixed, remaining, 0, anchored, data_room=demand)
    # Dropping changes the conversation the anchor was matched on: count without it.
    remaining = capacity.tokens - reserve - fixed.total
    dropped = 0
    if policy.mode == "drop_oldest":
        # Units over history + input: a call whose results are in the input is never dropped.
        conversation = [*history, *request.input]
        dropped = plan_drop_oldest(
            history_counts,
            history_units(conversation),
            policy.keep_last_messages,
            demand - remaining,
            turn_point(conversation),
        )
    if dropped < 0 or remaining + _freed(history_counts, dropped) < demand:
        estimated = not exact and request.native_history is None
        if estimated and _uncertain(fixed, anchored, remaining + correction, demand):
            # Dropping cannot free enough by the estimate, but the provider's count may fit.
            room = remaining + correction
            return _Fit(history, history_counts, fixed, room, 0, anchored, data_room=demand)
        raise _overflow(capacity, reserve, fixed, demand, policy.mode, anchored)
    history_counts = history_counts[dropped:]
    fixed = fixed_terms(history_counts)
    remaining = capacity.tokens - reserve - fixed.total
    return _Fit(history[dropped:], history_counts, fixed, remaining, dropped)


def _uncertain(fixed: FixedCosts, anchored: Anchored | None, remaining: int, demand: int) -> bool:
    """Whether an estimated count over the window may still be under it by the provider's count:
    the protected data would fit if the estimated part counted ``calibration.FLOOR`` of itself
    (the most the estimate is taken to be over). Then the frame is not refused: it carries the
    protected data only, with the warning ``estimate_over_window``, and the provider's count
    (its usage report) anchors the next turn."""
    estimated = fixed.total - (0 if anchored is None else anchored.estimated_tokens)
    lowest = remaining + estimated - math.ceil(estimated * calibration.FLOOR)
    return lowest >= demand


def _anchored(
    anchor: Anchor,
    request: PrepareRequest,
    hashes: Sequence[str],
    history_counts: Sequence[Counted],
    fixed: FixedCosts,
    extra: int,
    counter: TokenCounter,
    profile: ModelProfile,
) -> Anchored:
    """The shared part of the frame (tools, the leading message, the conversation messages it
    repeats and ``extra``: a transcript's earlier turns' messages) as the service counts it, and
    as the provider's figure counts it."""
    conversation = [*request.history_messages, *request.input]
    shared = shared_length(anchor.conversation, hashes)
    estimated = fixed.tools + fixed.instructions + extra
    for index in range(shared):
        if index < len(history_counts):
            estimated += history_counts[index].tokens
        else:
            estimated += count_message(conversation[index], counter, profile).tokens
    return anchor_count(anchor, shared, estimated)


def _budget_report(
    request: PrepareRequest,
    capacity: Capacity,
    fit: _Fit,
    data_limit: int,
    data_tokens: int,
    exact: bool,
) -> BudgetReport:
    """The budget's terms as the answer reports them, and where the total comes from."""
    fixed = fit.fixed
    anchored = fit.anchored
    correction = 0 if anchored is None else anchored.correction
    total = fixed.total + data_tokens - correction
    if exact:
        source, estimated = "exact", 0
    elif anchored is None:
        source, estimated = "estimate", total
    else:
        source, estimated = "anchored", total - anchored.counted_tokens
    return BudgetReport(
        count_source=source,
        estimated_tokens=estimated,
        anchored=None
        if anchored is None
        else {
            "preparation_id": anchored.preparation_id,
            "shared_messages": anchored.shared_messages,
            "whole": anchored.whole,
            "provider_tokens": anchored.provider_tokens,
            "estimated_tokens": anchored.estimated_tokens,
            "counted_tokens": anchored.counted_tokens,
            "correction_tokens": anchored.correction,
        },
        capacity=capacity.tokens,
        capacity_source=capacity.source,
        response_reserve=request.response_reserve,
        reasoning_reserve_tokens=request.options.reasoning_reserve_tokens,
        instructions_tokens=fixed.instructions,
        legacy_data_tokens=fixed.legacy_data,
        tools_tokens=fixed.tools,
        history_tokens=fixed.history,
        input_tokens=fixed.input,
        remaining_tokens=fit.remaining,
        data_limit_tokens=data_limit,
        data_tokens=data_tokens,
        total_input_tokens=total,
        history_dropped_messages=fit.dropped,
    )


def _manifest(
    request: PrepareRequest,
    setups: Sequence[SourceSetup],
    inputs: Sequence[SourceInput],
    graph: dict[str, Node],
    selection: Selection,
    fit: _Fit,
    counter: TokenCounter,
    exact: bool,
    placed: Placed,
) -> SelectionReport:
    """The manifest: one report per block (then per item a source offered that is no block)
    and per source, with the selection's totals."""
    options = request.options
    live = [item for item in inputs if not item.failed]
    # Validated inside the SelectionReport below, in pydantic-core (a model each: ~2x the time).
    sources = [
        {
            "source": item.setup.source,
            "kind": item.setup.kind,
            "status": item.status,
            "duration_ms": round(item.duration_ms, 3),
            "block_count": len(item.blocks),
            **_failure_report(item),
        }
        for item in _in_setup_order(setups, inputs)
    ]
    return SelectionReport(
        blocks=_block_reports(graph, selection) + _skipped_reports(setups, live),
        sources=sources,
        max_data_tokens=options.max_data_tokens,
        selected_data_tokens=selection.data_tokens,
        layout=options.layout,
        reasoning_reserve_tokens=options.reasoning_reserve_tokens,
        tokenizer=counter.name,
        exact=exact,
        opaque_or_multimodal=fit.fixed.opaque or any(c.opaque for c in fit.history_counts),
        placement={
            "index": placed.own_index,
            "count": placed.own_count,
            "latest_user_turn": placed.turn_index,
        },
        warnings=[]
        if fit.data_room is None
        else [
            {
                "code": "estimate_over_window",
                "detail": "the estimated count is over the window, but the provider's count may "
                "not be: the frame carries the protected data only, and is sent for the provider "
                "to count (post its usage: the next turn counts on it)",
            }
        ],
    )


def _failure_report(item: SourceInput) -> dict[str, object]:
    """``{"failure": ...}`` for a failed source whose failure is known, else nothing (the
    report then leaves the member out)."""
    failure = item.failure
    if failure is None or not item.failed:
        return {}
    return {
        "failure": {
            "cause": failure.cause,
            "detail": failure.detail,
            "status": failure.status,
            "field": failure.field,
        }
    }


def _selected_expiry(graph: dict[str, Node], selection: Selection) -> tuple[tuple[str, str], ...]:
    """(qualified id, ``expires_at``) of each entered block that expires, in selection order."""
    return tuple(
        (qid, expires_at)
        for qid in selection.order
        if (expires_at := graph[qid].block.expires_at) is not None
    )


def _prefix_counts(
    placed: Placed, fit: _Fit, counter: TokenCounter, profile: ModelProfile
) -> tuple[int, ...]:
    """The tokens of each message of the frame's cache-stable prefix (the leading system message
    first, when there is one); with the tools they are the prefix's tokens. A history message
    takes the count ``fit`` already has."""
    # A provider-held history has one count and no message: nothing to reuse.
    known = {
        id(message): counted.tokens
        for message, counted in zip(fit.history, fit.history_counts, strict=False)
    }
    prefix = placed.messages[: placed.prefix_len]
    return tuple(
        known[id(m)] if id(m) in known else count_message(m, counter, profile).tokens
        for m in prefix
    )


def _block_reports(graph: dict[str, Node], selection: Selection) -> list[BlockReport]:
    """The manifest's block reports, in rank order."""
    decisions = selection.decisions
    # One list validation in pydantic-core (~3 µs a block) instead of a model per block (~6 µs
    # with __init__, ~10 µs with model_construct).
    return BLOCK_REPORTS.validate_python(
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


def _skipped_reports(
    setups: Sequence[SourceSetup], live: Sequence[SourceInput]
) -> list[BlockReport]:
    """One omitted report with 0 tokens per item a live source offered that is no block (an MCP
    server's binary content), after the blocks, in source order; a failed source has none."""
    return BLOCK_REPORTS.validate_python(
        [
            {
                "source": item.setup.source,
                "id": item_id,
                "status": "omitted",
                "reason": reason,
                "tokens": 0,
                "full_tokens": 0,
                "projection_tokens": None,
                "priority": 0,
                "protected": False,
                "dependencies": [],
            }
            for item in _in_setup_order(setups, live)
            for item_id, reason in item.skipped
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
    capacity: Capacity,
    reserve: int,
    fixed: FixedCosts,
    demand: int,
    mode: str,
    anchored: Anchored | None,
) -> ContextOverflowError:
    # Refused on the anchored count when there is one (the smallest figure the service holds).
    fixed_total = fixed.total - (0 if anchored is None else anchored.correction)
    needed = fixed_total + reserve + demand
    hint = "" if mode == "drop_oldest" else " (history_policy 'drop_oldest' may compact history)"
    return ContextOverflowError(
        f"the request needs {needed} tokens (fixed {fixed_total} + reserve {reserve} + protected "
        f"data {demand}) but the window is {capacity.tokens}{hint}",
        capacity=capacity.tokens,
        needed_tokens=needed,
        shortfall_tokens=needed - capacity.tokens,
    )


__all__ = ["Assembly", "assemble_frame", "qualified"]
