"""Replay benchmark: the 20 recorded Claude Code conversations of ``bench/traces`` through the
service, under every cache policy of ``context-assembly replay`` (docs/replay.md), pooled.

Each trace is rebuilt as a conversation (text synthesised per block hash, counts exact by
construction) and replayed through the real app in-process, its clock at the recorded times;
each frame goes through Anthropic's documented cache rules (``replay/rules.py``). It prints the
pooled table, one row per policy, then the figures:

- refusals: the calls the service refused (``CONTEXT_OVERFLOW``) under its policies (target 0);
- per service layout and split (5-minute markers): the pooled cached share against the plain
  client's (``last-message 5m``), and the share of calls on which the service read at least as
  much (target ≥ 99% for ``transcript``, the layout made for caching and the adapters' default;
  the others for reference); the cached share against ``theory 5m`` (target: within 2 points);
- the relative price of every policy (5m and 1h), for reference;
- the compaction settings (``--compaction``, docs/compaction.md) side by side on
  ``service:transcript split:call 5m`` with the trigger at half the window: the input sent, the
  cost in uncached-token units and in USD, and the summary calls, against ``off``.

The service counts with its own tokenizer (``--tokenizer auto``: the conservative estimate,
anchored on the usage reports the replay posts); ``--tokenizer o200k_base`` has it count what the
simulated provider counts. Runs in about four minutes on two cores.

    .venv/bin/python bench/bench_replay.py [--traces bench/traces] [--tokenizer auto]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from figures import report

from context_assembly.logs import configure_logging
from context_assembly.replay.command import read_inputs
from context_assembly.replay.conversation import Conversation
from context_assembly.replay.driver import replay
from context_assembly.replay.policies import Options
from context_assembly.replay.report import Totals, pooled, text

HERE = Path(__file__).resolve().parent


def pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=str(HERE / "traces"))
    parser.add_argument("--tokenizer", default="auto")
    args = parser.parse_args()
    configure_logging("error")
    conversations = read_inputs([args.traces])
    started = time.perf_counter()
    results = replay(conversations, Options(tokenizer=args.tokenizer))
    elapsed = time.perf_counter() - started
    calls = sum(len(c.calls) for c in conversations)
    print(f"{len(conversations)} traces, {calls:,} calls, replayed in {elapsed:.0f} s")
    print(text(results, each=False), end="")
    totals = pooled(results)
    plain = totals["last-message 5m"]
    theory = totals["theory 5m"]
    service = {label: t for label, t in totals.items() if label.startswith("service:")}
    refused = sum(t.refused for t in service.values())
    served = sum(t.requests for t in service.values())
    worst = max(service.items(), key=lambda item: item[1].refused, default=None)
    detail = "" if worst is None else f" (most: {worst[0]}, {worst[1].refused:,})"
    report(
        f"replay of {len(conversations)} traces, calls refused by the service (all service "
        f"policies; tokenizer {args.tokenizer})",
        f"{refused:,} of {served:,}{detail}",
        "0",
        refused == 0,
    )
    for label, got in service.items():
        if not label.endswith(" 5m"):
            continue
        name = label.removesuffix(" 5m")
        # The targets are the cache plan's in the layout made for it (the adapters' default);
        # the others are shown for reference.
        held = "service:transcript " in label
        at_least = (got.at_least or 0) / got.compared if got.compared else 0.0
        report(
            f"replay, {name}: cached share vs last-message (pooled, 5m); calls reading at least "
            "as much",
            f"{pct(got.cached_share)} vs {pct(plain.cached_share)}; {pct(at_least)} "
            f"({got.at_least:,} of {got.compared:,})",
            "≥ 99% of calls" if held else "—",
            at_least >= 0.99 if held else None,
        )
        gap = (got.cached_share - theory.cached_share) * 100
        report(
            f"replay, {name}: cached share vs theory (pooled, 5m)",
            f"{gap:+.1f} points ({pct(got.cached_share)} vs {pct(theory.cached_share)})",
            "within 2 points" if held else "—",
            abs(gap) <= 2.0 if held else None,
        )
    _compaction(conversations, args.tokenizer)
    for label, got in totals.items():
        if label.endswith(" 1h") or ("split:turn" in label):
            continue
        hour = totals.get(label.removesuffix(" 5m") + " 1h") if label.endswith(" 5m") else None
        report(
            f"replay, relative price: {label.removesuffix(' 5m')}",
            _price(got, hour),
            "—",
            None,
        )
    return 0


COMPACTION_TRIGGER = 0.5


def _compaction(conversations: list[Conversation], tokenizer: str) -> None:
    """The compaction settings on the transcript layout, pooled, against ``off``."""
    options = Options(
        kinds=("service",),
        ttls=("5m",),
        layouts=("transcript",),
        splits=("call",),
        tokenizer=tokenizer,
        compactions=("off", "drop-oldest", "clear", "summary"),
        trigger=COMPACTION_TRIGGER,
    )
    totals = pooled(replay(conversations, options))
    rows = {
        label.rsplit("compaction:", 1)[-1] if "compaction:" in label else "off": t
        for label, t in totals.items()
    }
    off = rows["off"]
    for name, got in rows.items():
        usd = "—" if got.dollars is None else f"{got.dollars:,.2f} USD"
        summaries = f", {got.summaries} summary calls" if got.summaries else ""
        report(
            f"replay, compaction {name} (transcript split:call 5m, trigger "
            f"{COMPACTION_TRIGGER:g} of the window): input; cost vs off",
            f"{got.input_tokens / 1e6:,.1f}M tokens; {got.cost / off.cost:.3f} ({usd}"
            f"{summaries}); {got.refused} refused",
            "—",
            None,
        )


def _price(five: Totals, hour: Totals | None) -> str:
    if hour is None:
        return f"{five.relative_price:.3f}"
    return f"{five.relative_price:.3f} (5m) / {hour.relative_price:.3f} (1h)"


if __name__ == "__main__":
    raise SystemExit(main())
