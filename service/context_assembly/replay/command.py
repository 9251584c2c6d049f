"""``context-assembly replay FILE...``: the command's options, reading and output."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, cast

from context_assembly.replay.conversation import Conversation
from context_assembly.replay.driver import ReplayError, replay
from context_assembly.replay.logs import LogError, read_log
from context_assembly.replay.policies import (
    COMPACTIONS,
    SPLITS,
    TTLS,
    Compaction,
    Kind,
    Options,
    Split,
)
from context_assembly.replay.report import as_html, as_json, text
from context_assembly.replay.rules import Ttl
from context_assembly.replay.synth import DEFAULT_START, TraceError, read_trace, rebuild

KINDS: Final[tuple[Kind, ...]] = ("theory", "last-message", "recorded", "none", "service")
TOKENIZERS: Final = ("auto", "o200k_base", "estimate", "cl100k_base")

DESCRIPTION = """\
Replay recorded agent conversations through the service and report, per policy, the input
tokens, cache reads and cache writes that the provider's documented cache rules give, the
cached share and the price relative to the same input sent uncached.

FILE is a trace of the kv-cache-tester project (.json or .json.gz; its text is synthesised per
block hash), a conversation log (.jsonl: one provider request body per line), or a directory
holding such files. The service runs in-process on a temporary SQLite file, its clock set to
each call's recorded time. docs/replay.md explains the synthesis, the rules and the policies.
With --preparation ID instead of files: a stored preparation's own turns, read from the store
the configuration names (its plan's predicted cached tokens against the reported ones, and the
cost).

policies (one row each):
  theory          the most any client could read: the longest live shared prefix
  last-message    a plain client: one cache marker on its last message
  recorded        a log's request as it was sent, its own markers included (logs only)
  none            the service's frame without a cache plan
  service:LAYOUT  the service's frame and cache plan, per layout the service accepts,
                  with split:call (the input is what came since the model last answered)
                  and split:turn (the whole tool loop since the last user message)

exit status:
  0  the figures were printed
  2  a file could not be read, or the service answered what the replay cannot go on from
"""

EPILOG = """\
examples:
  context-assembly replay bench/traces/trace_0021.json.gz
  context-assembly replay bench/traces --total-only --ttl 5m
  context-assembly replay calls.jsonl --turns --html replay.html
"""


def _choices(value: str, allowed: Sequence[str], option: str) -> list[str]:
    picked = [v.strip() for v in value.split(",") if v.strip()]
    wrong = [v for v in picked if v not in allowed]
    if wrong or not picked:
        raise argparse.ArgumentTypeError(
            f"{option} takes a comma-separated list of {', '.join(allowed)}; got {value!r}"
        )
    return picked


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "replay",
        help="replay recorded conversations and report cache reads, writes and price per policy",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="trace files (.json, .json.gz), conversation logs (.jsonl) or directories of them",
    )
    parser.add_argument(
        "--preparation",
        metavar="ID",
        default=None,
        help="instead of files: the conversation of this stored preparation, read from the "
        "store the configuration names (its turns, the cached tokens its plan predicted against "
        "those its usage reports gave, and the cost)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="with --preparation: the service's TOML configuration (its [store]); the "
        "environment's CONTEXT_ASSEMBLY_* variables apply as for serve",
    )
    parser.add_argument(
        "--tenant",
        default="default",
        help="with --preparation: the tenant it belongs to (default: default, the tenant of a "
        "service without keys)",
    )
    parser.add_argument(
        "--turns",
        action="store_true",
        help="also print the cached share of every call under every policy",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the figures as JSON (every call of every policy) instead of the table",
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained HTML page with the tables and a chart per conversation",
    )
    parser.add_argument(
        "--total-only",
        action="store_true",
        help="print only the table pooled over all conversations, not one per conversation",
    )
    parser.add_argument(
        "--policies",
        metavar="LIST",
        default=",".join(KINDS),
        help=f"the kinds of policy to run, comma-separated (default: {','.join(KINDS)})",
    )
    parser.add_argument(
        "--layouts",
        metavar="LIST",
        default=None,
        help="the service layouts to run, comma-separated (default: every layout the service "
        "accepts; a layout it refuses is skipped with a note)",
    )
    parser.add_argument(
        "--split",
        metavar="LIST",
        default=",".join(SPLITS),
        help="how the caller splits history and input for the service policies: call, turn or "
        "both (default: call,turn)",
    )
    parser.add_argument(
        "--ttl",
        metavar="LIST",
        default=",".join(TTLS),
        help="the cache marker lifetimes to run: 5m, 1h or both (default: 5m,1h)",
    )
    parser.add_argument(
        "--compaction",
        metavar="LIST",
        default="off",
        help="the compaction settings of the service policies, comma-separated: off (the "
        "history as recorded), drop-oldest, clear (clear_tool_results) and summary (the report "
        "mode's decision followed, with a summary of --summary-tokens); default: off",
    )
    parser.add_argument(
        "--trigger",
        type=float,
        default=0.8,
        metavar="FRACTION",
        help="the compaction trigger as a share of the window (default 0.8)",
    )
    parser.add_argument(
        "--summary-tokens",
        type=int,
        default=2000,
        metavar="N",
        help="the size of a summary with --compaction summary (default 2000)",
    )
    parser.add_argument(
        "--tokenizer",
        choices=TOKENIZERS,
        default="auto",
        help="the tokenizer the service counts with (assembly.tokenizer). Default auto: the "
        "model's own, or the estimate anchored on the usage reports; o200k_base is the "
        "simulated provider's",
    )
    parser.add_argument(
        "--start",
        metavar="TIMESTAMP",
        default=None,
        help="when a trace starts, as RFC 3339 with an offset (its times are seconds since its "
        f"start). Default: {DEFAULT_START.isoformat()}",
    )
    parser.set_defaults(func=run)


def _files(paths: Sequence[str]) -> list[Path]:
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                sorted(
                    p
                    for p in path.iterdir()
                    if p.name.endswith((".json", ".json.gz", ".jsonl")) and p.is_file()
                )
            )
        else:
            found.append(path)
    return found


def read_inputs(paths: Sequence[str], start: str | None = None) -> list[Conversation]:
    """The conversations of trace files, logs and directories (raises TraceError, LogError)."""
    from datetime import datetime

    begin = DEFAULT_START
    if start is not None:
        try:
            begin = datetime.fromisoformat(start.replace("Z", "+00:00"))
        except ValueError:
            raise TraceError(f"--start must be RFC 3339 with an offset, got {start!r}") from None
        if begin.tzinfo is None:
            raise TraceError(f"--start must have an offset, got {start!r}")
    conversations: list[Conversation] = []
    for path in _files(paths):
        if not path.exists():
            raise TraceError(f"{path}: no such file")
        if path.name.endswith(".jsonl"):
            conversations.extend(read_log(path))
        else:
            conversations.append(rebuild(read_trace(path), begin))
    return conversations


def _run_stored(args: argparse.Namespace) -> int:
    """``--preparation``: a scope's own stored turns (``replay/stored.py``)."""
    import asyncio
    import time

    import orjson

    from context_assembly.config import load_settings
    from context_assembly.errors import StoreUnavailableError
    from context_assembly.replay import stored

    if args.files:
        return _fail("give FILE arguments or --preparation, not both")
    try:
        settings = load_settings(args.config)
        shown = asyncio.run(
            stored.read_stored(settings, args.tenant, args.preparation, time.time())
        )
    except (OSError, ValueError, stored.StoredError, StoreUnavailableError) as err:
        return _fail(str(err))
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(stored.as_json(args.preparation, shown)) + b"\n")
    else:
        sys.stdout.write(stored.as_text(args.preparation, shown))
    return 0


def _fail(message: str) -> int:
    sys.stderr.write(f"context-assembly replay: {message}\n")
    return 2


def run(args: argparse.Namespace) -> int:
    from context_assembly.logs import configure_logging

    if args.preparation is not None:
        return _run_stored(args)
    if not args.files:
        return _fail("give FILE arguments, or --preparation ID")
    try:
        options = Options(
            kinds=tuple(cast(list[Kind], _choices(args.policies, KINDS, "--policies"))),
            ttls=tuple(cast(list[Ttl], _choices(args.ttl, TTLS, "--ttl"))),
            layouts=None
            if args.layouts is None
            else tuple(v.strip() for v in args.layouts.split(",") if v.strip()),
            splits=tuple(cast(list[Split], _choices(args.split, SPLITS, "--split"))),
            tokenizer=args.tokenizer,
            compactions=tuple(
                cast(list[Compaction], _choices(args.compaction, COMPACTIONS, "--compaction"))
            ),
            trigger=args.trigger,
            summary_tokens=args.summary_tokens,
        )
        if not 0 < options.trigger <= 1 or options.summary_tokens < 1:
            raise argparse.ArgumentTypeError(
                "--trigger must be in (0, 1] and --summary-tokens at least 1"
            )
        conversations = read_inputs(args.files, args.start)
    except (argparse.ArgumentTypeError, TraceError, LogError) as err:
        return _fail(str(err))
    if not conversations:
        return _fail("no conversation to replay")
    configure_logging("error")  # the in-process service's access lines are not the output
    try:
        results = replay(conversations, options)
    except ReplayError as err:
        return _fail(str(err))
    if args.html:
        try:
            Path(args.html).write_text(as_html(results), encoding="utf-8")
        except OSError as err:
            return _fail(f"cannot write {args.html}: {err.strerror}")
    if args.json:
        sys.stdout.buffer.write(as_json(results) + b"\n")
    else:
        sys.stdout.write(text(results, turns=args.turns, each=not args.total_only))
    return 0
