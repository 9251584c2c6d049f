"""The selection algorithm (docs/contract.md, "Selection"): which blocks enter this request, in what view, and why.

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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Literal, NamedTuple, TypeVar

import orjson

from context_assembly.core.blocks import Node
from context_assembly.core.counting import (
    ModelProfile,
    TokenCounter,
    block_piece,
    count_joined,
)
from context_assembly.core.request import Block
from context_assembly.errors import AssemblyOverflowError, ContextOverflowError, InvalidError

T = TypeVar("T")
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
    # Not a decision of select(): an item a source offered that is no block (an MCP server's
    # binary content), reported by assemble_frame() with 0 tokens.
    "binary_content",
]

# The data message's layout: one block a line, each line starting at a split of the tokenizers'
# pre-tokenisers (after a newline) and each piece ending at one (before a space), so that its
# exact count is the sum of its parts' counts (``count_joined``; module doc of ``_render``).
DATA_OPEN = '{"context_data":[\n'
DATA_CLOSE = " ]}"  # closes a source's blocks and segment, then the message's list and object
SEPARATOR = " ,\n"  # between two blocks, and between two sources' segments
DATA_ROLE = "user"

# Block states during selection (index-based: the hot loop avoids dict lookups by id).
_OPEN, _FULL, _PROJ, _OMIT = 0, 1, 2, 3
_STATUS: tuple[Status, ...] = ("omitted", "selected", "projected", "omitted")


class Decision(NamedTuple):
    """What happened to one block, and what it costs (estimated, in this data message).

    A NamedTuple rather than a frozen dataclass: one is built per block on every request, and on
    our machines a frozen dataclass costs twice as much to construct.
    """

    status: Status
    reason: Reason
    tokens: int
    full_tokens: int
    projection_tokens: int | None


@dataclass(frozen=True, slots=True)
class Selection:
    """The result of :func:`select`."""

    decisions: dict[str, Decision]  # by qualified id, in rank order
    order: tuple[str, ...]  # qualified ids that entered, in selection order
    data_content: str | None  # the data message content; None when no block entered
    data_tokens: int  # exact tokens of the data message (framing included); 0 without one
    source_tokens: Mapping[str, int]  # exact tokens of each entered source segment with a limit
    trimmed: int  # optional choices dropped after the exact count


def rank_key(node: Node) -> tuple[int, str]:
    """The published total order: priority descending, then qualified id ascending."""
    return node.rank


_RANK = attrgetter("rank")


def _count_block(count: Callable[[str], int], block: Block) -> tuple[int, int]:
    """Piece counts of one block with a plain counter: (full, projected or -1)."""
    full = count(block_piece(block.id, block.text, False))
    if block.projection is None:
        return full, -1
    return full, count(block_piece(block.id, block.projection, True))


def _source_open(source: str) -> str:
    return '{"source":' + orjson.dumps(source).decode() + ',"blocks":[\n'


class _Plan:
    """Blocks in rank order with their costs, as parallel arrays indexed by rank."""

    __slots__ = (
        "deps",
        "expiries",
        "full",
        "index",
        "message",
        "missing_deps",
        "nodes",
        "proj",
        "protected_roots",
        "qids",
        "separator",
        "source_names",
        "src",
        "wrapper",
    )

    def __init__(
        self,
        graph: Mapping[str, Node],
        counter: TokenCounter,
        profile: ModelProfile,
        sources: Sequence[str],
    ) -> None:
        count = counter.count
        close = count(DATA_CLOSE)
        # Each block is charged its piece and one separator; n blocks have n - 1 separators, so
        # the envelope gives one back (a source's sum is over its segment by that one). Where
        # the counter splits at every join of the message (``count_joined``) the sums are the
        # exact count; elsewhere they estimate, and the one exact count of the message confirms.
        self.separator = separator = count(SEPARATOR)
        self.message = (
            profile.tokens_per_message + count(DATA_ROLE) + count(DATA_OPEN) + close - separator
        )
        self.source_names = list(sources)
        source_index = {name: i for i, name in enumerate(self.source_names)}
        self.wrapper = [count(_source_open(name)) + close for name in self.source_names]
        self.nodes = sorted(graph.values(), key=_RANK)
        self.qids = [node.qid for node in self.nodes]
        self.index = index = {qid: i for i, qid in enumerate(self.qids)}
        nodes = self.nodes
        blocks = [node.block for node in nodes]
        # Counters with a block cache (tokens/counter.py) cost all blocks in one call, one cache
        # lookup each; others count the serialised pieces. Pieces are built only when rendered.
        # ``count_blocks(blocks)[i]`` is exactly ``_count_block(count, blocks[i])``.
        count_blocks = getattr(counter, "count_blocks", None)
        counts: list[tuple[int, int]] = (
            count_blocks(blocks)
            if count_blocks is not None
            else [_count_block(count, b) for b in blocks]
        )
        # Comprehensions, not append loops: this runs for every block on every request.
        self.src: list[int] = [source_index[node.source] for node in nodes]
        self.deps: list[tuple[int, ...]] = [
            tuple([index[d] for d in node.deps if d in index]) if node.deps else ()
            for node in nodes
        ]
        # Each piece with its separator (see the envelope's comment above).
        self.full: list[int] = [full + separator for full, _ in counts]
        self.proj: list[int] = [proj + separator if proj >= 0 else -1 for _, proj in counts]
        # For the availability fast path: any dependency outside the graph, any expiry at all.
        self.missing_deps = sum(map(len, self.deps)) != sum([len(node.deps) for node in nodes])
        self.expiries = [node.expires_at for node in nodes if node.expires_at is not None]
        # Protected roots in qualified-id order (the closure walk and error messages use it).
        self.protected_roots = sorted([b.qid for b in nodes if b.block.protected])

    def unavailable(
        self, graph: Mapping[str, Node], now: datetime, failed_sources: frozenset[str]
    ) -> dict[str, Reason]:
        """Blocks that cannot enter (see ``_availability``); the common case, nothing expired
        and every dependency present, is answered from facts the plan already gathered."""
        if self.missing_deps or any(moment <= now for moment in self.expiries):
            return _availability(graph, now, failed_sources)
        return {}


def _availability(
    graph: Mapping[str, Node], now: datetime, failed_sources: frozenset[str]
) -> dict[str, Reason]:
    """Blocks that cannot enter: expired, or a dependency missing, expired or failed (transitively).

    One pass in dependency order (Kahn's algorithm; the graph is acyclic), so a block is decided
    after all of its dependencies.
    """
    reasons: dict[str, Reason] = {}
    waiting = {qid: sum(1 for d in node.deps if d in graph) for qid, node in graph.items()}
    ready = [qid for qid, n in waiting.items() if n == 0]
    while ready:
        qid = ready.pop()
        node = graph[qid]
        if node.expires_at is not None and node.expires_at <= now:
            reasons[qid] = "expired"
        else:
            for dep in node.deps:
                if dep not in graph:
                    failed = dep.partition("/")[0] in failed_sources
                elif dep in reasons:
                    failed = reasons[dep] == "source_failed"
                else:
                    continue
                reasons[qid] = "source_failed" if failed else "missing_dependency"
                if not failed:
                    break
        for dependent in node.dependents:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                ready.append(dependent)
    return reasons


def _protected_closure(
    graph: Mapping[str, Node],
    roots: Sequence[str],
    unavailable: Mapping[str, Reason],
    failed_sources: frozenset[str],
) -> list[str]:
    """The protected roots (sorted qualified ids) and their whole dependency closure, in rank
    order; raises when a member is missing or expired."""
    if not roots:
        return []
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
            if unavailable.get(qid) == "expired":
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


class _Run:
    """Mutable state of one selection run over a :class:`_Plan`, and the one budget rule
    (:meth:`delta` prices a choice, :meth:`verdict` admits it or says why not)."""

    __slots__ = (
        "any_on",
        "data_limit",
        "limits",
        "order",
        "plan",
        "reason",
        "src_on",
        "src_used",
        "state",
        "used",
    )

    def __init__(self, plan: _Plan, limits: Sequence[int] = (), data_limit: int = 0) -> None:
        """``limits``: each source's limit by source index (-1: none). ``limits`` and
        ``data_limit`` matter to choosing only: :func:`protected_demand` only prices."""
        self.plan = plan
        self.limits = limits
        self.data_limit = data_limit
        self.state = bytearray(len(plan.qids))
        self.reason: list[Reason] = ["budget"] * len(plan.qids)
        self.order: list[int] = []  # the blocks that entered, in selection order
        self.used = 0
        self.src_used = [0] * len(plan.source_names)
        self.src_on = [False] * len(plan.source_names)
        self.any_on = False

    def needed(self, i: int) -> list[int]:
        """The not-yet-full part of block i's closure, in rank order (i excluded).

        The walk stops at blocks already selected in full: their closure is full by the invariant.
        """
        state = self.state
        stack = [d for d in self.plan.deps[i] if state[d] != _FULL]
        if not stack:
            return []
        deps = self.plan.deps
        seen: set[int] = set()
        while stack:
            x = stack.pop()
            if x in seen or state[x] == _FULL:
                continue
            seen.add(x)
            stack.extend(deps[x])
        return sorted(seen)

    def delta(
        self, needed: Sequence[int], i: int | None, projected: bool
    ) -> tuple[int, dict[int, int]]:
        """Extra global and per-source tokens of adding ``needed`` (full) and block ``i``.

        A source entering for the first time adds its wrapper, to the total and to its own
        amount (a source limit counts the source's segment, wrapper included); the first block
        of all adds the data message's envelope, to the total only.
        """
        plan, state = self.plan, self.state
        per: dict[int, int] = {}
        for x in needed:
            s = plan.src[x]
            extra = plan.full[x] - (plan.proj[x] if state[x] == _PROJ else 0)
            per[s] = per.get(s, 0) + extra
        if i is not None:
            s = plan.src[i]
            per[s] = per.get(s, 0) + (plan.proj[i] if projected else plan.full[i])
        total = 0
        for s in per:
            if not self.src_on[s]:
                per[s] += plan.wrapper[s]
            total += per[s]
        if not self.any_on and per:
            total += plan.message
        return total, per

    def verdict(self, total: int, per: Mapping[int, int]) -> Reason | None:
        """The budget rule for a choice priced by :meth:`delta`: ``None`` when it fits the data
        limit and every source's limit; else ``budget`` (over the data limit) or
        ``source_budget`` (within it, over a source's limit)."""
        if self.used + total > self.data_limit:
            return "budget"
        limits, src_used = self.limits, self.src_used
        if any(0 <= limits[s] < src_used[s] + extra for s, extra in per.items()):
            return "source_budget"
        return None

    def out_of_room(self, i: int) -> bool:
        """A lower bound of the rule, checked before the closure walk: block ``i``'s smaller
        view alone is over the room the data limit leaves, so every choice with it is
        ``budget`` (:meth:`delta` of any choice holds at least that view: what dependencies
        add is never negative, since a projected block's projection is its smaller view, or it
        would have entered in full). Once the data message is full, this decides the remaining
        blocks without walking their closures.

        The smaller of the two, not the projection: a projection's piece can count more than
        the full text's (it carries ``"projected":true``), and the full text is tried first.
        """
        plan = self.plan
        full, proj = plan.full[i], plan.proj[i]
        smallest = full if proj < 0 or full < proj else proj
        return self.used + smallest > self.data_limit

    def apply(self, total: int, per: Mapping[int, int]) -> None:
        """Charge a choice priced by :meth:`delta`."""
        self.used += total
        for s, extra in per.items():
            self.src_used[s] += extra
            self.src_on[s] = True
        if per:
            self.any_on = True


@dataclass(slots=True)
class _Choice:
    block: int
    added: list[int]  # newly entered dependencies (full), in rank order
    upgraded: list[int]  # previously projected blocks made full
    prior: dict[int, tuple[int, Reason]]  # (state, reason) overwritten by this choice


CostPlan = _Plan


def cost_plan(
    graph: Mapping[str, Node],
    sources: Sequence[str],
    counter: TokenCounter,
    profile: ModelProfile,
) -> CostPlan:
    """Every block of ``graph`` costed and ranked once; :func:`protected_demand` and
    :func:`select` take it so that one request walks its blocks for costs only once."""
    return _Plan(graph, counter, profile, sources)


def protected_demand(
    graph: Mapping[str, Node],
    sources: Sequence[str],
    counter: TokenCounter,
    profile: ModelProfile,
    now: datetime,
    failed_sources: frozenset[str] = frozenset(),
    *,
    plan: CostPlan | None = None,
) -> int:
    """Estimated data-message tokens the protected closure needs (0 when nothing is protected).

    The engine uses it to decide whether opt-in history compaction must run before selection.
    ``plan`` must come from :func:`cost_plan` over the same graph, sources, counter and profile.
    """
    if plan is None:
        if not any(node.block.protected for node in graph.values()):
            return 0
        plan = _Plan(graph, counter, profile, sources)
    elif not plan.protected_roots:
        return 0
    unavailable = plan.unavailable(graph, now, failed_sources)
    protected = _protected_closure(graph, plan.protected_roots, unavailable, failed_sources)
    index = plan.index
    total, _ = _Run(plan).delta([index[q] for q in protected], None, False)
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
    plan: CostPlan | None = None,
) -> Selection:
    """Decide every block and render the data message; see the module docstring for the promise.

    Four steps: the blocks that cannot enter are found (``_Plan.unavailable``); the protected
    closure enters in full or the call raises (:func:`_admit_protected`); the other blocks are
    taken greedily by rank under the budget rule (:func:`_choose_optional`); the data message
    is rendered and counted exactly, the last choices undone while it is over
    (:func:`_confirm`).

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
        plan: the costs from :func:`cost_plan` over the same graph, sources, counter and
            profile, when the caller already built them.

    Raises:
        InvalidError: a protected block or a dependency it requires is missing or expired.
        AssemblyOverflowError: the protected closure exceeds ``max_data_tokens`` or a source limit.
        ContextOverflowError: the protected closure fits the data budget but not the window left.
    """
    if plan is None:
        plan = _Plan(graph, counter, profile, sources)
    unavailable = plan.unavailable(graph, now, failed_sources)
    protected = _protected_closure(graph, plan.protected_roots, unavailable, failed_sources)
    limits = [source_limits.get(name, -1) for name in plan.source_names]
    run = _Run(plan, limits, data_limit)
    _admit_protected(run, [plan.index[qid] for qid in protected], max_data_tokens)
    choices = _choose_optional(run, unavailable)
    return _confirm(run, choices, counter, profile, source_limits)


def _admit_protected(run: _Run, protected: Sequence[int], max_data_tokens: int) -> None:
    """The protected closure (block indexes, rank order) enters first and in full, or the call
    raises: ``AssemblyOverflowError`` when it is over ``max_data_tokens`` or a source's limit,
    ``ContextOverflowError`` when it is within those but over the data limit (the window left)."""
    if not protected:
        return
    plan = run.plan
    roots = plan.protected_roots
    total, per = run.delta(protected, None, False)
    over = sorted(plan.source_names[s] for s, extra in per.items() if 0 <= run.limits[s] < extra)
    if total > max_data_tokens or over:
        where = (
            f"source limit of {', '.join(over)}" if over else f"max_data_tokens {max_data_tokens}"
        )
        raise AssemblyOverflowError(
            f"protected blocks and their dependencies need {total} tokens, over the {where}",
            block_ids=roots,
            needed_tokens=total,
            sources=over or None,
        )
    if total > run.data_limit:
        raise ContextOverflowError(
            f"protected blocks need {total} data tokens but only {max(run.data_limit, 0)} remain "
            "in the context window",
            block_ids=roots,
            needed_tokens=total,
            data_limit_tokens=run.data_limit,
        )
    run.apply(total, per)
    for i in protected:
        run.state[i] = _FULL
        run.reason[i] = "protected" if plan.nodes[i].block.protected else "dependency"
    run.order.extend(protected)


def _choose_optional(run: _Run, unavailable: Mapping[str, Reason]) -> list[_Choice]:
    """Every block still open, in rank order: omitted when it cannot enter (``unavailable``) or
    when even its smaller view is over the room left (:meth:`_Run.out_of_room`); else taken
    with its dependencies in the first view that fits (:func:`_take`), or omitted. Returns the
    choices, in the order made, for :func:`_confirm` to undo from the last."""
    plan, state, reason = run.plan, run.state, run.reason
    choices: list[_Choice] = []
    for i, qid in enumerate(plan.qids):
        if state[i] != _OPEN:
            continue
        why = unavailable.get(qid)
        if why is None and run.out_of_room(i):
            why = "budget"
        if why is not None:
            state[i], reason[i] = _OMIT, why
            continue
        choice = _take(run, i)
        if choice is None:
            state[i] = _OMIT  # with the reason of the last view tried
        else:
            choices.append(choice)
    return choices


def _take(run: _Run, i: int) -> _Choice | None:
    """Block ``i`` with the not-yet-full part of its closure (in full), in the first of its
    views, full then projection, that the budget rule admits; ``None`` when neither does, the
    reason of the last view tried left in ``run.reason[i]``."""
    needed = run.needed(i)
    for view in (_FULL, _PROJ):
        if view == _PROJ and run.plan.proj[i] < 0:
            break
        total, per = run.delta(needed, i, view == _PROJ)
        why = run.verdict(total, per)
        if why is None:
            return _enter(run, i, view, needed, total, per)
        run.reason[i] = why
    return None


def _enter(
    run: _Run, i: int, view: int, needed: Sequence[int], total: int, per: Mapping[int, int]
) -> _Choice:
    """Block ``i`` enters in ``view`` with ``needed`` in full; the choice records what it
    changed, so that :func:`_undo` can revert it."""
    state, reason = run.state, run.reason
    choice = _Choice(i, [], [], {})
    for dep in needed:
        if state[dep] != _OPEN:
            choice.prior[dep] = (state[dep], reason[dep])
        if state[dep] == _PROJ:
            choice.upgraded.append(dep)
        else:
            choice.added.append(dep)
        state[dep] = _FULL
        reason[dep] = "dependency"
    state[i] = view
    reason[i] = "fits" if view == _FULL else "projection_fits"
    run.apply(total, per)
    run.order.extend(choice.added)
    run.order.append(i)
    return choice


def _confirm(
    run: _Run,
    choices: list[_Choice],
    counter: TokenCounter,
    profile: ModelProfile,
    source_limits: Mapping[str, int],
) -> Selection:
    """The data message rendered and counted exactly (the estimates chose; this count decides):
    while it, or a source's segment, is over its limit, the last choice is undone and the
    message counted again. Raises when the protected data alone is over."""
    plan, state = run.plan, run.state
    content, data_tokens, source_tokens = _render(
        plan, run.order, state, counter, profile, source_limits
    )
    trimmed = 0
    while True:
        over_sources = [
            name
            for name, tokens in source_tokens.items()
            if name in source_limits and tokens > source_limits[name]
        ]
        if data_tokens <= run.data_limit and not over_sources:
            break
        if not choices:
            raise AssemblyOverflowError(
                f"protected data counts {data_tokens} tokens exactly, over the data limit "
                f"{run.data_limit} or a source limit",
                block_ids=plan.protected_roots,
                needed_tokens=data_tokens,
            )
        trimmed += 1
        trim_reason: Reason = (
            "source_budget" if over_sources and data_tokens <= run.data_limit else "budget"
        )
        _undo(choices.pop(), run, trim_reason)
        content, data_tokens, source_tokens = _render(
            plan, run.order, state, counter, profile, source_limits
        )
    full, proj, reason = plan.full, plan.proj, run.reason
    decisions = {
        qid: _decision(state[i], reason[i], full[i], proj[i]) for i, qid in enumerate(plan.qids)
    }
    order = tuple(plan.qids[i] for i in run.order)
    return Selection(decisions, order, content, data_tokens, source_tokens, trimmed)


def _decision(view: int, why: Reason, full: int, proj: int) -> Decision:
    """The decision of a block in state ``view`` with its plan costs (``proj`` -1: none)."""
    tokens = full if view == _FULL else (proj if view == _PROJ else 0)
    return Decision(_STATUS[view], why, tokens, full, proj if proj >= 0 else None)


def _undo(choice: _Choice, run: _Run, why: Reason) -> None:
    """Revert one choice: its block is omitted, its dependencies go back to what they were."""
    state, reason, order = run.state, run.reason, run.order
    state[choice.block] = _OMIT
    reason[choice.block] = why
    order.remove(choice.block)
    for dep in choice.upgraded:
        state[dep], reason[dep] = choice.prior[dep]
    for dep in choice.added:
        order.remove(dep)
        state[dep], reason[dep] = choice.prior.get(dep, (_OMIT, why))


def _render(
    plan: _Plan,
    order: Sequence[int],
    state: bytearray,
    counter: TokenCounter,
    profile: ModelProfile,
    source_limits: Mapping[str, int],
) -> tuple[str | None, int, dict[str, int]]:
    """The data message content, its exact token count, and the exact count of each entered
    source segment that has a limit (the only ones a limit check needs).

    Counted from its parts (``count_joined``): each piece's count is the plan's (what
    ``count_blocks`` counted: ``block_piece``, the very text rendered here), each framing
    string's the counter's (short, and the same on every turn: cached). With a counter that
    splits at every join (tiktoken: the layout puts them after a newline or before a space),
    that is their sum, with no count of the whole message; else one count of the whole text."""
    by_source: dict[int, list[int]] = {}
    for i in order:
        by_source.setdefault(plan.src[i], []).append(i)
    if not by_source:
        return None, 0, {}
    count, nodes, separator = counter.count, plan.nodes, plan.separator
    close = count(DATA_CLOSE)
    segments: list[list[str]] = []
    segment_counts: list[list[int]] = []  # the same layout, part by part, in tokens
    source_tokens: dict[str, int] = {}
    for s, name in enumerate(plan.source_names):
        entered = by_source.get(s)
        if entered is None:
            continue
        pieces = [_piece(nodes[i].block, state[i] == _PROJ) for i in entered]
        costs = [plan.proj[i] if state[i] == _PROJ else plan.full[i] for i in entered]
        parts = _segment_parts(name, pieces)
        counts = _laid_out(count(parts[0]), [[c - separator] for c in costs], separator, close)
        segments.append(parts)
        segment_counts.append(counts)
        if name in source_limits:
            source_tokens[name] = count_joined(parts, counts, counter)
    message = _laid_out(DATA_OPEN, segments, SEPARATOR, DATA_CLOSE)
    message_counts = _laid_out(count(DATA_OPEN), segment_counts, separator, close)
    content_tokens = count_joined(message, message_counts, counter)
    tokens = profile.tokens_per_message + count(DATA_ROLE) + content_tokens
    return "".join(message), tokens, source_tokens


def _laid_out(opener: T, items: Iterable[Sequence[T]], separator: T, closer: T) -> list[T]:
    """``opener``, each item's parts with ``separator`` between two items, then ``closer``: the
    layout of a segment (its pieces) and of the data message (its segments), as strings or as
    their counts."""
    out = [opener]
    for k, item in enumerate(items):
        if k:
            out.append(separator)
        out.extend(item)
    out.append(closer)
    return out


def _piece(block: Block, projected: bool) -> str:
    """A block's piece in the data message: its projection's when ``projected`` (only a block
    with a projection is projected)."""
    if projected and block.projection is not None:
        return block_piece(block.id, block.projection, True)
    return block_piece(block.id, block.text, False)


def _segment_parts(source: str, pieces: Sequence[str]) -> list[str]:
    """One source's segment of the data message, in parts: its opening line, then its pieces."""
    return _laid_out(_source_open(source), [[piece] for piece in pieces], SEPARATOR, DATA_CLOSE)


def data_message(segments: Iterable[tuple[str, Iterable[tuple[Block, bool]]]]) -> str:
    """The data message content, segments in the given (source) order, each block as its
    ``block_piece`` on a line of its own (see ``_piece``)::

        {"context_data":[
        {"source":"memory","blocks":[
        {"id":"m1","text":"..."} ,
        {"id":"m2","projected":true,"text":"..."} ]} ,
        {"source":"docs","blocks":[
        {"id":"d1","text":"..."} ]} ]}
    """
    segment_parts = [
        _segment_parts(source, [_piece(block, projected) for block, projected in pieces])
        for source, pieces in segments
    ]
    return "".join(_laid_out(DATA_OPEN, segment_parts, SEPARATOR, DATA_CLOSE))
