"""Hypothesis properties of selection: the invariants of docs/contract.md, "Selection invariants"."""

from __future__ import annotations

from collections.abc import Iterable
from unittest.mock import patch

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from context_assembly.core import select as selection
from context_assembly.core.blocks import Node, SourceBlocks, build_graph
from context_assembly.core.counting import (
    TokenCounter,
    block_piece,
    count_text_message,
    piece_object,
)
from context_assembly.core.request import AssemblyOptions, Block
from context_assembly.core.select import (
    CostPlan,
    Selection,
    cost_plan,
    data_message,
    protected_demand,
    rank_key,
    select,
)
from context_assembly.errors import AssemblyOverflowError, ContextOverflowError, InvalidError
from context_assembly.tokens.counter import TiktokenCounter, get_counter
from context_assembly.tokens.encodings import SPECS, EncodingName
from fakes import PROFILE, SurchargeCounter, WordCounter
from hypothesis_budget import examples
from strategies import NOW, Scenario, scenarios

OPTIONS = AssemblyOptions(max_blocks=2048)
PROPERTY = settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
COUNTERS = [WordCounter(), SurchargeCounter()]


def _run(
    scenario: Scenario,
    groups: Iterable[SourceBlocks] | None = None,
    counter: TokenCounter | None = None,
) -> tuple[dict[str, Node], Selection]:
    graph = build_graph(groups if groups is not None else scenario.groups, OPTIONS)
    return graph, _select(graph, scenario, counter or WordCounter())


def _select(
    graph: dict[str, Node], scenario: Scenario, counter: TokenCounter, plan: CostPlan | None = None
) -> Selection:
    return select(
        graph,
        scenario.sources,
        now=NOW,
        data_limit=scenario.data_limit,
        max_data_tokens=scenario.max_data_tokens,
        source_limits=scenario.source_limits,
        counter=counter,
        profile=PROFILE,
        plan=plan,
    )


EXPECTED_ERRORS = (AssemblyOverflowError, ContextOverflowError, InvalidError)


def _closure(graph: dict[str, Node], roots: Iterable[str]) -> set[str]:
    """Every qualified id reachable from ``roots`` through dependencies, roots included (ids
    missing from the graph too)."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        qid = stack.pop()
        if qid not in seen:
            seen.add(qid)
            stack.extend(graph[qid].deps if qid in graph else ())
    return seen


@PROPERTY
@given(scenarios(), st.sampled_from(COUNTERS))
def test_never_over_the_data_limit_or_a_source_limit(
    scenario: Scenario, counter: TokenCounter
) -> None:
    """The exact count of the data message and of each source segment stays within its limit."""
    try:
        _, result = _run(scenario, counter=counter)
    except EXPECTED_ERRORS:
        return
    assert result.data_tokens <= scenario.data_limit
    for source, tokens in result.source_tokens.items():
        if source in scenario.source_limits:
            assert tokens <= scenario.source_limits[source]
    if result.data_content is not None:
        assert (
            count_text_message("user", result.data_content, counter, PROFILE) == result.data_tokens
        )


@PROPERTY
@given(scenarios(), st.sampled_from(sorted(SPECS)))
def test_with_a_tiktoken_counter_the_summed_costs_are_the_exact_count(
    scenario: Scenario, encoding: EncodingName
) -> None:
    """With a counter whose pre-tokeniser splits at every join of the data message (tiktoken),
    the envelope, the entered sources' wrappers and the entered blocks' costs add up to the
    exact count of the data message, a full count of its text; no choice is ever undone."""
    counter = get_counter(encoding)
    try:
        graph, result = _run(scenario, counter=counter)
    except EXPECTED_ERRORS:
        return
    assert result.trimmed == 0
    if result.data_content is None:
        return
    plan = cost_plan(graph, scenario.sources, counter, PROFILE)
    entered = {graph[qid].source for qid in result.order}
    summed = (
        plan.message
        + sum(plan.wrapper[s] for s, name in enumerate(plan.source_names) if name in entered)
        + sum(decision.tokens for decision in result.decisions.values())
    )
    full = count_text_message("user", result.data_content, TiktokenCounter(encoding), PROFILE)
    assert result.data_tokens == summed == full


@PROPERTY
@given(scenarios(), st.sampled_from(COUNTERS))
def test_entered_blocks_have_their_dependencies_in_full(
    scenario: Scenario, counter: TokenCounter
) -> None:
    """Every selected or projected block has its whole dependency closure selected in full."""
    try:
        graph, result = _run(scenario, counter=counter)
    except EXPECTED_ERRORS:
        return
    for qid, decision in result.decisions.items():
        if decision.status == "omitted":
            assert qid not in result.order
            continue
        assert qid in result.order
        for dep in _closure(graph, graph[qid].deps):
            assert result.decisions[dep].status == "selected", (qid, dep)
    assert set(result.decisions) == set(graph), "every block has a decision"


@PROPERTY
@given(scenarios())
def test_protected_blocks_enter_in_full_or_the_call_fails(scenario: Scenario) -> None:
    """A protected block is selected in full with reason 'protected', or selection raises."""
    try:
        graph, result = _run(scenario)
    except EXPECTED_ERRORS:
        return
    for qid, node in graph.items():
        if node.block.protected:
            assert result.decisions[qid].status == "selected"
            assert result.decisions[qid].reason == "protected"


@PROPERTY
@given(scenarios(), st.randoms(use_true_random=False))
def test_permuting_block_and_source_input_order_changes_nothing(
    scenario: Scenario, rnd: object
) -> None:
    """Shuffling each source's blocks (and the order sources are listed) gives identical output."""
    shuffled = []
    for group in scenario.groups:
        blocks = list(group.blocks)
        rnd.shuffle(blocks)  # type: ignore[attr-defined]
        shuffled.append(SourceBlocks(group.source, tuple(blocks)))
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    try:
        _, first = _run(scenario)
    except EXPECTED_ERRORS as err:
        try:
            _run(scenario, shuffled)
        except type(err) as again:
            assert str(again) == str(err)
            return
        raise AssertionError("only one order raised") from err
    _, second = _run(scenario, shuffled)
    assert first == second


@PROPERTY
@given(scenarios(protected=False), st.data())
def test_removing_a_lower_ranked_block_leaves_higher_ranked_decisions(
    scenario: Scenario, data: st.DataObject
) -> None:
    """Removing optional block R never changes higher-ranked decisions unrelated to R.

    "Higher-ranked" is measured against R's effective rank: the best rank among R and every
    block that (transitively) depends on R, because a dependency is admitted at its dependent's
    turn. Blocks that depend on R or lie in R's closure are excluded, as docs/contract.md, "Selection invariants", says.
    """
    try:
        graph, before = _run(scenario)
    except EXPECTED_ERRORS:
        return
    removed = data.draw(st.sampled_from(sorted(graph)))
    dependents = _dependents(graph, removed)
    effective = min(rank_key(graph[q]) for q in {removed, *dependents})
    related = dependents | _closure(graph, [removed])
    groups = [
        SourceBlocks(g.source, tuple(b for b in g.blocks if f"{g.source}/{b.id}" != removed))
        for g in scenario.groups
    ]
    try:
        _, after = _run(scenario, groups)
    except EXPECTED_ERRORS:
        raise AssertionError("removing an optional block made selection fail") from None
    for qid, node in graph.items():
        if qid in related or rank_key(node) >= effective:
            continue
        assert after.decisions[qid] == before.decisions[qid], (qid, removed)


def _dependents(graph: dict[str, Node], qid: str) -> set[str]:
    found: set[str] = set()
    stack = [qid]
    while stack:
        for dependent in graph[stack.pop()].dependents:
            if dependent not in found:
                found.add(dependent)
                stack.append(dependent)
    return found


@settings(max_examples=examples(300), deadline=None)
@given(scenarios())
def test_same_input_same_output(scenario: Scenario) -> None:
    """Two runs over the same input are byte-identical (content, decisions and order)."""
    try:
        _, first = _run(scenario)
    except EXPECTED_ERRORS:
        return
    _, second = _run(scenario)
    assert first == second


@PROPERTY
@given(scenarios(), st.sampled_from(COUNTERS))
def test_a_shared_cost_plan_changes_nothing(scenario: Scenario, counter: TokenCounter) -> None:
    """One plan serving protected_demand and then select (as the engine does) gives the same
    demand, the same selection and the same error as building the costs in each call."""
    graph = build_graph(scenario.groups, OPTIONS)
    plan = cost_plan(graph, scenario.sources, counter, PROFILE)

    def outcome(shared: bool) -> tuple[object, object]:
        try:
            demand: object = protected_demand(
                graph, scenario.sources, counter, PROFILE, NOW, plan=plan if shared else None
            )
        except EXPECTED_ERRORS as err:
            demand = (type(err), str(err))
        try:
            result: object = _select(graph, scenario, counter, plan if shared else None)
        except EXPECTED_ERRORS as err:
            result = (type(err), str(err))
        return demand, result

    assert outcome(True) == outcome(False)


@PROPERTY
@given(scenarios())
def test_the_availability_shortcut_answers_as_the_walk_does(scenario: Scenario) -> None:
    """With no dependency missing and nothing expired the plan answers that every block can
    enter without walking the graph; the walk finds the same, with or without a failed source."""
    graph = build_graph(scenario.groups, OPTIONS)
    plan = cost_plan(graph, scenario.sources, WordCounter(), PROFILE)
    for failed in (frozenset(), frozenset(scenario.sources[:1])):
        assert plan.unavailable(graph, NOW, failed) == selection._availability(graph, NOW, failed)


# A projection's piece counts more than its full text's ("projected":true): the full text fits
# the room the protected block leaves (63 of 65 tokens), the projection would not (69).
_PROJECTION_LONGER = Scenario(
    ("mem",),
    (
        SourceBlocks(
            "mem",
            (
                Block(id="b0", text="alpha", protected=True),
                Block(id="b1", text="alpha", projection="alpha"),
            ),
        ),
    ),
    data_limit=65,
    max_data_tokens=400,
    source_limits={},
)


@PROPERTY
@given(scenarios(), st.sampled_from(COUNTERS))
@example(_PROJECTION_LONGER, COUNTERS[0])
def test_the_out_of_room_shortcut_decides_as_the_budget_rule_does(
    scenario: Scenario, counter: TokenCounter
) -> None:
    """Omitting a block whose smallest view alone is over the room left, without pricing its
    dependencies, gives the same selection (or the same error) as pricing every block by the
    budget rule: the shortcut is a lower bound of that rule, never a second rule."""
    graph = build_graph(scenario.groups, OPTIONS)

    def outcome() -> Selection | tuple[type[Exception], str]:
        try:
            return _select(graph, scenario, counter)
        except EXPECTED_ERRORS as err:
            return type(err), str(err)

    with_shortcut = outcome()
    with patch.object(selection._Run, "out_of_room", lambda run, i: False):
        rule_alone = outcome()
    assert with_shortcut == rule_alone


def test_the_envelope_of_the_data_message_does_not_count_against_a_source_limit() -> None:
    """A source limit counts the source's own segment (its wrapper included), never the data
    message's envelope: the smallest limit that admits a source's block is the same whether the
    block enters first or after another source's (found by the removal property above: the block
    was omitted as ``source_budget`` when it entered first, selected when it did not)."""
    mem = SourceBlocks("mem", (Block(id="b0", text="alpha beta", priority=100),))
    notes = SourceBlocks("notes", (Block(id="n0", text="gamma", priority=200),))

    def smallest_limit(groups: tuple[SourceBlocks, ...]) -> int:
        for limit in range(1, 200):
            scenario = Scenario(
                sources=tuple(g.source for g in groups),
                groups=groups,
                data_limit=1000,
                max_data_tokens=1000,
                source_limits={"mem": limit},
            )
            _, result = _run(scenario)
            decision = result.decisions["mem/b0"]
            if decision.status == "selected":
                assert decision.reason == "fits"
                assert result.source_tokens["mem"] <= limit
                return limit
            assert decision.reason == "source_budget"
        raise AssertionError("no limit admitted the block")

    assert smallest_limit((mem,)) == smallest_limit((notes, mem))


@PROPERTY
@given(scenarios(), st.data())
def test_the_data_message_holds_each_block_as_its_piece_object(
    scenario: Scenario, data: st.DataObject
) -> None:
    """The data message is the JSON of its sources and blocks, each block on a line of its own
    that begins with its counted piece (``block_piece``) and ends with a separator or a closing
    bracket after a space: the layout that lets a splitting counter add the pieces' counts."""
    segments = [
        (
            group.source,
            [
                (block, block.projection is not None and data.draw(st.booleans()))
                for block in group.blocks
            ],
        )
        for group in scenario.groups
    ]
    expected = {
        "context_data": [
            {
                "source": source,
                "blocks": [
                    piece_object(block.id, block.projection, True)
                    if projected and block.projection is not None
                    else piece_object(block.id, block.text, False)
                    for block, projected in pieces
                ],
            }
            for source, pieces in segments
        ]
    }
    content = data_message(segments)
    assert orjson.loads(content) == expected
    lines = content.split("\n")
    assert lines[0] == '{"context_data":['
    block_lines = [line for line in lines if line.startswith('{"id":')]
    pieces = [
        block_piece(block.id, block.projection, True)
        if projected and block.projection is not None
        else block_piece(block.id, block.text, False)
        for _, items in segments
        for block, projected in items
    ]
    assert len(block_lines) == len(pieces)
    for line, piece in zip(block_lines, pieces, strict=True):
        assert line.removeprefix(piece) in (" ,", " ]} ,", " ]} ]}")
