"""The replay's policies against the service in-process (``replay/driver.py``): a layout the
service refuses is skipped with a note, the 1-hour lifetime reaches the service's plan, and a
frame the service refuses is counted and priced as sent uncached."""

from __future__ import annotations

from pathlib import Path

import orjson

from context_assembly.replay.driver import Options, Policy, policies, replay
from context_assembly.replay.logs import read_lines
from context_assembly.replay.synth import blocks_text, read_trace, rebuild

TRACE = Path(__file__).resolve().parent / "traces" / "trace_0026.json.gz"


def test_the_policy_list_follows_the_layouts_and_skips_a_refused_one() -> None:
    """One service policy per layout, split and lifetime; a layout the service does not accept
    is skipped and named in the notes, the others run."""
    options = Options(
        kinds=("last-message", "service"),
        ttls=("5m", "1h"),
        layouts=("stable-prefix", "no-such-layout"),
        splits=("call",),
    )
    planned = policies(options, ["stable-prefix", "no-such-layout"], "trace")
    assert [p.label for p in planned] == [
        "last-message 5m",
        "last-message 1h",
        "service:stable-prefix split:call 5m",
        "service:stable-prefix split:call 1h",
        "service:no-such-layout split:call 5m",
        "service:no-such-layout split:call 1h",
    ]
    [result] = replay([rebuild(read_trace(TRACE))], options)
    assert [run.policy.label for run in result.runs] == [p.label for p in planned[:4]]
    assert any("layout 'no-such-layout' refused by the service" in n for n in result.notes)
    five, hour = result.runs[2], result.runs[3]
    # The service marks for an hour when asked: its writes are 1-hour writes, and the reads
    # of the 5-minute and 1-hour runs agree on a trace without long pauses.
    assert sum(o.usage.cache_write_1h for o in hour.outcomes) > 0
    assert sum(o.usage.cache_write_5m for o in hour.outcomes) == 0
    assert sum(o.usage.cache_write_1h for o in five.outcomes) == 0
    assert [o.usage.cache_read for o in five.outcomes] == [
        o.usage.cache_read for o in hour.outcomes
    ]
    assert Policy("recorded") not in planned  # a trace has no recorded requests


def test_a_frame_the_service_refuses_is_counted_and_priced_uncached() -> None:
    """A call over the model's window is ``CONTEXT_OVERFLOW``: refused, its plain request priced
    as sent uncached, the next call replayed as usual."""
    big = blocks_text(range(1, 161))  # 10,240 tokens: over gpt-4's 8,192
    lines = [
        orjson.dumps(
            {"timestamp": i, "request": {"model": "gpt-4", "messages": [m]}, "usage": None}
        ).decode()
        for i, m in enumerate(
            [{"role": "user", "content": big}, {"role": "user", "content": "A short question."}]
        )
    ]
    [conversation] = read_lines(lines, "overflow")
    options = Options(kinds=("last-message", "service"), ttls=("5m",), layouts=("legacy",))
    [result] = replay([conversation], options)
    plain, call_split, turn_split = result.runs
    assert [o.refused for o in call_split.outcomes] == [True, False]
    assert [o.refused for o in turn_split.outcomes] == [True, False]
    refused = call_split.outcomes[0].usage
    assert refused.input_tokens == plain.outcomes[0].usage.input_tokens
    assert refused.cache_read == refused.cache_write == 0
    assert call_split.prices.cost(refused) == refused.input_tokens
