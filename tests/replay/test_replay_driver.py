"""The replay's policies against the service in-process (``replay/driver.py``): a layout the
service refuses is skipped with a note, the 1-hour lifetime reaches the service's plan, and a
frame the service refuses is counted and priced as sent uncached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from context_assembly.replay.driver import replay
from context_assembly.replay.logs import read_lines
from context_assembly.replay.policies import Compaction, Options, Policy, policies
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


def test_the_service_plan_reads_on_gpt_5_6_where_openais_own_breakpoint_does_not() -> None:
    """A chat on an explicit-breakpoint model, a minute between calls: with the service's plan
    (breakpoints on the instructions and the stable history) every call after the first reads
    the previous call's history marker; without it OpenAI's own breakpoint ends on the per-turn
    messages of the stable-prefix layout, so only the first call's system entry is read again.
    Writes are priced at 1.25 times uncached input."""
    # 1,536 tokens
    system: dict[str, object] = {"role": "system", "content": blocks_text(range(1, 25))}
    messages: list[dict[str, object]] = [system]
    lines = []
    for turn in range(5):
        messages.append({"role": "user", "content": f"Question {turn}: " + "word " * 80})
        body = {"model": "gpt-5.6-sol", "messages": list(messages)}
        lines.append(orjson.dumps({"timestamp": 60 * turn, "request": body}).decode())
        messages.append({"role": "assistant", "content": f"Answer {turn}: " + "word " * 80})
    [conversation] = read_lines(lines, "gpt-5.6")
    options = Options(
        kinds=("none", "service"), ttls=("5m",), layouts=("stable-prefix",), splits=("call",)
    )
    [result] = replay([conversation], options)
    plain, planned = result.runs
    assert planned.prices.write_5m == 1.25
    reads = [o.usage.cache_read for o in planned.outcomes]
    plain_reads = [o.usage.cache_read for o in plain.outcomes]
    assert reads[0] == 0 and all(r > 0 for r in reads[1:])
    assert all(r > p for r, p in zip(reads[2:], plain_reads[2:], strict=True))
    assert sum(reads) > sum(plain_reads)


def _growing_log(turns: int) -> list[str]:
    """A logged conversation of ``turns`` calls, each adding an exchange of about 1,300
    tokens and a tool call with a result of about 1,300 tokens."""
    messages: list[dict[str, Any]] = []
    lines = []
    for turn in range(turns):
        text = blocks_text(range(turn * 40 + 1, turn * 40 + 21))
        result = blocks_text(range(turn * 40 + 21, turn * 40 + 41))
        messages.append({"role": "user", "content": f"question {turn}: {text}"})
        request = {"model": "gpt-4o", "messages": list(messages)}
        lines.append(orjson.dumps({"timestamp": turn * 30, "request": request}).decode())
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": result})
        messages.append({"role": "assistant", "content": f"answer {turn}"})
    return lines


def test_compaction_settings_are_compared_side_by_side() -> None:
    """Under a low trigger: `summary` follows the decision as a caller would (summary calls
    counted, later calls sending less input), `clear` sends less input than the history as
    recorded, and `off` and `drop-oldest` send it all (nothing overflows)."""
    [conversation] = read_lines(_growing_log(10), "growing")
    options = Options(
        kinds=("service",),
        ttls=("5m",),
        layouts=("transcript",),
        splits=("call",),
        compactions=("off", "drop-oldest", "clear", "summary"),
        trigger=0.06,  # 7,680 of gpt-4o's 128,000: passed by the fourth call
        summary_tokens=300,
    )
    [result] = replay([conversation], options)
    runs = {run.policy.compaction: run for run in result.runs}
    assert [run.policy.label for run in result.runs][-1] == (
        "service:transcript split:call 5m compaction:summary"
    )

    def sent(name: Compaction) -> int:
        return sum(o.usage.input_tokens for o in runs[name].outcomes if not o.summary)

    calls = len(result.calls)
    summaries = [o for o in runs["summary"].outcomes if o.summary]
    assert summaries and all(o.summary_output == 300 for o in summaries)
    assert len(runs["summary"].outcomes) == calls + len(summaries)
    assert sent("summary") < sent("off")
    assert sent("clear") < sent("off")
    assert sent("drop-oldest") == sent("off")
    assert not any(o.refused for run in result.runs for o in run.outcomes)
