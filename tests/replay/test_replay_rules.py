"""The providers' cache rules of the replay (``replay/rules.py``), on prompts written by hand,
with every figure computed by hand in the comments."""

from __future__ import annotations

import pytest

from context_assembly.replay.rules import (
    ANTHROPIC_PRICES,
    AnthropicCache,
    OpenAIBreakpointCache,
    OpenAICache,
    Segment,
    TheoryCache,
    TooManyMarkers,
    Ttl,
    Usage,
    openai_prices,
)

Spec = tuple[str, int] | tuple[str, int, Ttl]


def prompt(*blocks: Spec) -> list[Segment]:
    """Blocks named by hand: a block's key is the names of the blocks through it, so equal
    names at equal places are equal prefixes."""
    out = []
    path = ""
    for spec in blocks:
        path += "/" + spec[0]
        out.append(Segment(path.encode(), spec[1], spec[2] if len(spec) == 3 else None))
    return out


HEAD: tuple[Spec, ...] = (("tools", 2000, "5m"), ("system", 500), ("user1", 1000, "5m"))
STEP: tuple[Spec, ...] = (("tools", 2000, "5m"), ("system", 500), ("user1", 1000))
STEP += (("answer1", 300), ("result1", 200, "5m"))
# The same blocks with the marker moved on: only the tools keep theirs.
MOVED: tuple[Spec, ...] = (*STEP[:4], ("result1", 200))
FAR: tuple[Spec, ...] = (*tuple((f"x{i}", 10) for i in range(1, 21)), ("x21", 10, "5m"))


def test_a_small_conversation_by_hand() -> None:
    """Writes, a read through the lookback, a lookback beyond 20 blocks that misses, expiry after
    a 6-minute gap, and a read that refreshes an entry."""
    cache = AnthropicCache(minimum=1024)
    # 1. Nothing cached: the tools marker writes 2,000, the user marker the next 1,500.
    assert cache.send(prompt(*HEAD), now=0) == Usage(3500, 0, 3500)
    # 2. The marker moved to the tool result; its lookback finds user1's entry two blocks back:
    #    3,500 read, 4,000 − 3,500 = 500 written.
    assert cache.send(prompt(*STEP), now=60) == Usage(4000, 3500, 500)
    # 3. 21 blocks of 10 tokens after result1, the marker on the last: result1's entry is 21
    #    boundaries back, beyond the lookback; only the tools marker finds its own entry
    #    (2,000). Written: 4,210 − 2,000.
    assert cache.send(prompt(*MOVED, *FAR), now=120) == Usage(4210, 2000, 2210)
    # 4. Six minutes later everything has expired (last used at 120, alive until 420).
    assert cache.send(prompt(*MOVED, *FAR), now=480) == Usage(4210, 0, 4210)
    # 5. Four minutes later the same prompt is read whole (written at 480, alive until 780).
    assert cache.send(prompt(*MOVED, *FAR), now=720) == Usage(4210, 4210, 0)
    # 6. And a read refreshes: 4 minutes on (alive until 1,020) it is read again.
    assert cache.send(prompt(*MOVED, *FAR), now=960) == Usage(4210, 4210, 0)


def test_the_lookback_reaches_twenty_boundaries_back_and_no_further() -> None:
    """An entry 20 boundaries before a marker is read; one 21 before is not."""
    near: tuple[Spec, ...] = (*tuple((f"x{i}", 10) for i in range(1, 20)), ("x20", 10, "5m"))
    cache = AnthropicCache(minimum=1024)
    cache.send(prompt(*STEP), now=0)
    # result1 is 20 boundaries before x20: 4,000 read, the 200 tokens of x1..x20 written.
    assert cache.send(prompt(*MOVED, *near), now=10) == Usage(4200, 4000, 200)
    cache = AnthropicCache(minimum=1024)
    cache.send(prompt(*STEP), now=0)
    assert cache.send(prompt(*MOVED, *FAR), now=10) == Usage(4210, 2000, 2210)


def test_an_entry_exists_only_where_a_marker_was() -> None:
    """A prefix an earlier request sent without a marker at its end is not cached there."""
    cache = AnthropicCache(minimum=1024)
    cache.send(prompt(("system", 1500), ("user1", 500, "5m")), now=0)  # entry at 2,000 only
    # The same system then another message: the marker's lookback passes "system", where no
    # entry was written; nothing is read.
    assert cache.send(prompt(("system", 1500), ("other", 700, "5m")), now=5) == Usage(2200, 0, 2200)


def test_a_marker_below_the_minimum_caches_nothing() -> None:
    """A prefix shorter than the model's minimum is neither written nor read; a model without a
    minimum caches nothing at all."""
    cache = AnthropicCache(minimum=1024)
    short = prompt(("system", 500, "5m"), ("user1", 400, "5m"))
    assert cache.send(short, now=0) == Usage(900)
    assert cache.send(short, now=1) == Usage(900)
    none = AnthropicCache(minimum=None)
    assert none.send(prompt(*HEAD), now=0) == Usage(3500)
    assert none.send(prompt(*HEAD), now=1) == Usage(3500)


def test_one_hour_markers_outlive_a_six_minute_gap_and_cost_more() -> None:
    """A 1-hour marker's write is counted apart, and its entry is read after 6 minutes."""
    cache = AnthropicCache(minimum=1024)
    blocks = prompt(("tools", 2000, "1h"), ("system", 500), ("user1", 1000, "5m"))
    # 2,000 written for an hour, 1,500 for five minutes.
    assert cache.send(blocks, now=0) == Usage(3500, 0, 1500, 2000)
    # After 6 minutes the 5-minute entry is gone, the hour's is read.
    assert cache.send(blocks, now=360) == Usage(3500, 2000, 1500, 0)
    # Price: 1,500 × 1.25 + 2,000 × 2 = 5,875 for 3,500 tokens; then 200 + 1,875 = 2,075.
    assert ANTHROPIC_PRICES.cost(Usage(3500, 0, 1500, 2000)) == pytest.approx(5875)
    assert ANTHROPIC_PRICES.cost(Usage(3500, 2000, 1500, 0)) == pytest.approx(2075)


def test_more_than_four_markers_are_refused() -> None:
    """Anthropic refuses a request with a fifth marker."""
    five = prompt(*((f"b{i}", 300, "5m") for i in range(5)))
    with pytest.raises(TooManyMarkers):
        AnthropicCache(minimum=1024).send(five, now=0)


def test_openai_caches_the_shared_prefix_from_the_minimum_in_steps() -> None:
    """1,500 shared tokens read as 1,024 + 3 × 128 = 1,408; a prefix below 1,024 reads nothing;
    after 6 minutes nothing is left. OpenAI has no write."""
    cache = OpenAICache(minimum=1024)
    assert cache.send(prompt(("system", 1000), ("user1", 500)), now=0) == Usage(1500)
    step = prompt(("system", 1000), ("user1", 500), ("user2", 300))
    assert cache.send(step, now=60) == Usage(1800, 1408)
    assert cache.send(prompt(("system", 1000), ("other", 900)), now=70) == Usage(1900)
    assert cache.send(step, now=70 + 360) == Usage(1800)
    assert openai_prices("gpt-4o-mini").read == 0.5
    assert openai_prices("gpt-5-mini").read == 0.1
    assert openai_prices("gpt-4.1").cost(Usage(1800, 1408)) == pytest.approx(392 + 352)


def test_theory_reads_the_longest_live_shared_prefix_at_any_boundary() -> None:
    """The upper bound: no markers, no lookback limit; what lies beyond the read is written."""
    theory = TheoryCache(minimum=1024)
    assert theory.send(prompt(*HEAD), now=0) == Usage(3500, 0, 3500)
    assert theory.send(prompt(*STEP), now=60) == Usage(4000, 3500, 500)
    # Far beyond any lookback, the whole previous request is still read.
    assert theory.send(prompt(*MOVED, *FAR), now=120) == Usage(4210, 4000, 210)
    assert theory.send(prompt(*MOVED, *FAR), now=480) == Usage(4210, 0, 4210)
    hour = TheoryCache(minimum=1024, ttl="1h")
    hour.send(prompt(*HEAD), now=0)
    assert hour.send(prompt(*HEAD), now=360) == Usage(3500, 3500, 0, 0)


def openai_prompt(*blocks: tuple[str, int, str]) -> list[Segment]:
    """OpenAI blocks named by hand, each with its kind: ``b`` a block with a
    ``prompt_cache_breakpoint``, ``a`` an assistant's (no implicit breakpoint ends on it), ``-``
    any other."""
    out = []
    path = ""
    for name, tokens, kind in blocks:
        path += "/" + name
        out.append(Segment(path.encode(), tokens, breakpoint=kind == "b", eligible=kind != "a"))
    return out


def test_gpt_5_6_reads_only_at_a_breakpoint_written_before() -> None:
    """Implicit mode: OpenAI's own breakpoint ends on the newest user message. A next request
    that shares more than the marked prefix reads exactly up to a breakpoint written before,
    with no steps of 128; writes run from the read point to the last breakpoint written."""
    cache = OpenAIBreakpointCache(minimum=1024)
    first = openai_prompt(("system", 1500, "b"), ("user1", 300, "-"))
    # Nothing cached: breakpoints after system (1,500) and, OpenAI's own, user1 (1,800).
    assert cache.send(first, now=0) == Usage(1800, 0, 1800)
    # The stable-prefix shape: user1 now follows other data, so only the system entry matches
    # (1,500 read, not 1,408 or 1,536); OpenAI's own breakpoint on user2 writes the rest.
    second = openai_prompt(("system", 1500, "b"), ("data", 400, "-"), ("user2", 300, "-"))
    assert cache.send(second, now=60) == Usage(2200, 1500, 700)
    # The same request again reads all of it: its own end was written a minute ago.
    assert cache.send(second, now=120) == Usage(2200, 2200, 0)
    # 31 minutes after the last use everything has expired.
    assert cache.send(second, now=120 + 31 * 60) == Usage(2200, 0, 2200)


def test_gpt_5_6_writes_at_most_four_breakpoints() -> None:
    """Implicit mode writes the latest 3 marked blocks and its own on the newest non-assistant
    block; explicit mode the latest 4 marked ones, and nothing without a mark."""
    blocks = [(f"m{i}", 1100 if i == 0 else 100, "b") for i in range(6)]
    blocks.append(("answer", 100, "a"))
    implicit = OpenAIBreakpointCache(minimum=1024)
    # Written: m3, m4, m5 and OpenAI's own on m5 (answer is the assistant's): up to 1,600.
    assert implicit.send(openai_prompt(*blocks), now=0) == Usage(1700, 0, 1600)
    shorter = [*blocks[:3], ("other", 100, "-")]
    # m2 (1,300) was not written: its prefix is not read; nothing of the first request is.
    assert implicit.send(openai_prompt(*shorter), now=1) == Usage(1400, 0, 1400)
    explicit = OpenAIBreakpointCache(minimum=1024)
    # The latest 4 marks: m2 to m5, up to 1,600.
    assert explicit.send(openai_prompt(*blocks), now=0, explicit=True) == Usage(1700, 0, 1600)
    unmarked = OpenAIBreakpointCache(minimum=1024)
    plain = openai_prompt(("system", 1500, "-"), ("user", 100, "-"))
    assert unmarked.send(plain, now=0, explicit=True) == Usage(1600, 0, 0)
    assert unmarked.send(plain, now=1, explicit=True) == Usage(1600, 0, 0)


def test_gpt_5_6_matches_the_latest_80_breakpoints_only() -> None:
    """An entry is matched while it is among the latest 80 breakpoints written, however far
    back in the prompt; older ones are not."""
    cache = OpenAIBreakpointCache(minimum=1024)
    head = ("system", 2000, "b")
    assert cache.send(openai_prompt(head), now=0) == Usage(2000, 0, 2000)
    for i in range(79):  # 79 more breakpoints on other prefixes: system is the 80th newest
        cache.send(openai_prompt((f"other{i}", 1100, "-")), now=1)
    longer = openai_prompt(head, *((f"x{i}", 10, "a") for i in range(50)), ("u", 10, "-"))
    assert cache.send(longer, now=2).cache_read == 2000
    for i in range(80):
        cache.send(openai_prompt((f"more{i}", 1100, "-")), now=3)
    assert cache.send(openai_prompt(head, ("v", 10, "-")), now=4).cache_read == 0


def test_gpt_5_6_writes_cost_a_quarter_more() -> None:
    assert openai_prices("gpt-5.6-sol", breakpoints=True).write_5m == 1.25
    assert openai_prices("gpt-5.5").write_5m == 1.0


def test_gpt_5_6_usage_reports_its_writes() -> None:
    """The simulated OpenAI usage names the writes where there are some (``cache_write_tokens``,
    which the service reads as cache creation), and nothing more for the older models."""
    from context_assembly.replay.conversation import simulated_usage

    written = simulated_usage("openai-responses", Usage(3000, 1000, 1500), 7)
    assert written["input_tokens_details"] == {"cached_tokens": 1000, "cache_write_tokens": 1500}
    older = simulated_usage("openai-chat", Usage(3000, 1000), 7)
    assert older["prompt_tokens_details"] == {"cached_tokens": 1000}
