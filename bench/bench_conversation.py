"""Conversation benchmark: a 40-turn agent conversation through a real service, against the
stored echo on the same bodies, measured in the processes' CPU time.

The conversation (``conversation``, bench/agent_conversation.py): 2k-token instructions, 10 tools
with JSON schemas, a history that grows by a user and an assistant message (OpenAI Chat shape)
each turn, a ``memory`` source of 30 stable entries plus one new entry per turn, a ``retrieval``
source of 8 fresh ~150-token passages every turn, ``cache: {"key": "auto"}`` and
``render: "openai-chat"``, under a data limit that the last turns overflow (so selection omits
and projects).

The figure's conversation sends both sources inline (``contributions``): the service and the echo
then read the very same bytes, and the ratio measures what the service does with a body beyond
parsing and storing it. A second conversation, for reference, has the service fetch the passages
from a registered, signed loopback webhook (``bench/retrieval_contributor.py``), as a retrieval
source usually is: its bodies lack the passages, so it has no echo to compare with.

The service is ``context-assembly serve`` (uvicorn, one worker) on a free loopback port with a
temporary SQLite file; the stored echo is ``bench/echo_app.py``'s ``/v1/prepare-stored`` (FastAPI
parses the same request model and commits the body to SQLite before it answers), its own uvicorn
process. Each conversation has a fresh scope. Its turns are sent in order, each turn's body to
the service and to the echo one after the other (each over its own keep-alive connection,
after its previous answer), so that both sides of a turn are measured within milliseconds of
each other on a machine whose speed moves. The CPU of a process is the sum of its threads' time
on CPU (``/proc/<pid>/task/*/schedstat``, first field, ns), read before and after each turn: it
does not move with the machine's wake-up latency as wall time does. The figures are medians
over the conversations (a warm-up conversation first, not counted); the wall p50/p99 per turn is
printed for reference, pooled over the counted turns.

How a turn's cost grows with the conversation (``growth``): conversations of 400 turns, each
turn sent to a fresh service and to the echo as above, the CPU of turns 31-40 and 391-400
(medians) compared; their memory source offers the latest 40 notes only, so that what grows is
the history (at turn 400 some 800 messages, a body six times turn 40's).

``--tree LABEL=DIR`` (repeatable) runs the service from the source tree DIR instead
(``PYTHONPATH=DIR/service:DIR/clients/python/src python -m context_assembly.cli serve``): an A/B of
copies of the repository, every turn going to every tree, the first tree being the control the
others are compared with (their answers must decide the same, ``same``). It prints no figures.

Bounded: fixed turn counts, loopback only, every process stopped at the end. The default run takes
about a minute, half of it the three growing conversations.

    .venv/bin/python bench/bench_conversation.py [--conversations 5] [--turns 40] [--growth 3]
    .venv/bin/python bench/bench_conversation.py --retrieval inline --tree on=DIR1 --tree off=DIR2
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from agent_conversation import Retrieval, conversation
from context_assembly_client import testing
from context_assembly_client.testing import ServedProcess, service_command, start_app
from figures import report
from load_client import cpu_seconds, pct, run
from loopback import HERE, start_echo

TARGET = 2.5  # service CPU per turn / stored echo CPU per turn
# ``growth``: a turn's CPU at these turns of one growing conversation (the window of turns
# before each, medians), its memory source offering its latest GROWTH_NOTES notes.
GROWTH_TURNS = (40, 400)
GROWTH_WINDOW = 10
GROWTH_NOTES = 40
GROWTH_TARGET = 1.5  # service CPU per turn at the last of GROWTH_TURNS / at the first
DATE_LINE = re.compile(rb"Current date and time: [^\\\"]*")  # core/layout.py's date_line

# --------------------------------------------------------------------------- measuring


@dataclass
class Run:
    """One conversation through one process: per turn, its CPU (s), wall time (s) and answer."""

    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    answers: list[bytes] = field(default_factory=list)

    @property
    def cpu_per_turn(self) -> float:
        return sum(self.cpu) / len(self.cpu)


@dataclass
class Server:
    """A process under measurement and its counted conversations."""

    label: str
    proc: ServedProcess
    url: str
    runs: list[Run] = field(default_factory=list)

    def cpu_per_turn(self) -> float:
        """The median over the conversations of the CPU per turn (s)."""
        return statistics.median(r.cpu_per_turn for r in self.runs)


async def talk(servers: list[Server], bodies: Iterable[bytes], keep: bool = True) -> list[Run]:
    """One conversation through every server at once: turn after turn, each turn's body is sent
    to each server (over its own keep-alive connection, after its previous answer), starting
    with another server each turn, so that the servers' turns are paired within milliseconds on
    a machine whose speed moves; the CPU of each server's process is read around its turns. A
    non-200 stops the benchmark. ``keep``: keep the answers (``growth``'s would weigh some
    100 MB)."""
    results = [Run() for _ in servers]
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for _ in servers]
    try:
        for turn, body in enumerate(bodies):
            for k in range(len(servers)):
                i = (turn + k) % len(servers)
                server, result = servers[i], results[i]
                before = cpu_seconds(server.proc.pid)
                started = time.perf_counter()
                async with sessions[i].post(
                    server.url, data=body, headers={"content-type": "application/json"}
                ) as resp:
                    answer = await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(
                            f"{server.label} answered {resp.status}: {answer[:300]!r}"
                        )
                result.wall.append(time.perf_counter() - started)
                result.cpu.append(cpu_seconds(server.proc.pid) - before)
                if keep:
                    result.answers.append(answer)
    finally:
        for session in sessions:
            await session.close()
    return results


def write_config(folder: Path, retrieval_port: int, secret: str) -> Path:
    """The services' TOML: the ``retrieval`` contributor registered, the SQLite file in
    ``folder`` (each service gets its own through ``CONTEXT_ASSEMBLY_STORE__PATH``)."""
    config = folder / "service.toml"
    config.write_text(
        f'[contributors.retrieval]\nurl = "http://127.0.0.1:{retrieval_port}/contribute"\n'
        f'secret = "{secret}"\n'
    )
    return config


def start_service(label: str, tree: Path | None, folder: Path, config: Path) -> Server:
    """``context-assembly serve`` on a free port with its own SQLite file: the installed one, or
    the one of the source tree ``tree``."""
    env = {"CONTEXT_ASSEMBLY_STORE__PATH": str(folder / f"{label}.db")}
    if tree is None:
        proc = testing.start_service(config, env=env)
    else:
        env["PYTHONPATH"] = f"{tree / 'service'}:{tree / 'clients' / 'python' / 'src'}"
        # The command of the tree's code: ``serve`` and its arguments, run as a module.
        cmd = [sys.executable, "-m", "context_assembly.cli", *service_command(config)[1:]]
        proc = ServedProcess(cmd, env={**os.environ, **env})
    return Server(label, proc, f"{proc.url}/v1/prepare")


def describe(answers: list[bytes]) -> None:
    """What the conversation made the service do, read from its answers, so that a reader can
    check the benchmark exercises what it says: budget terms, decisions, cache plans."""
    for turn in (0, len(answers) - 1):
        prepared = orjson.loads(answers[turn])
        budget, selection = prepared["budget"], prepared["selection"]
        statuses: dict[str, int] = {}
        for block in selection["blocks"]:
            statuses[block["status"]] = statuses.get(block["status"], 0) + 1
        terms = {
            k.removesuffix("_tokens"): v
            for k, v in budget.items()
            if k.endswith("_tokens") and isinstance(v, int) and v
        }
        print(f"  turn {turn + 1}: blocks {statuses}; tokens {terms}")
    kept = sum(1 for a in answers[1:] if orjson.loads(a)["selection"]["cache"]["prefix_kept"])
    print(f"  cache plans: the previous turn's prefix kept in {kept} of {len(answers) - 1} turns")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def converse(
    servers: list[Server], echo: Server | None, retrieval: Retrieval, count: int, turns: int
) -> None:
    """A warm-up conversation, then ``count`` counted ones, each through every server and the
    echo at once (``talk``); prints what each process spent per turn."""
    started = time.perf_counter()
    talks = [
        list(conversation(seed, turns, f"{retrieval}-{seed}-{time.time_ns()}", retrieval))
        for seed in range(count + 1)
    ]
    print(
        f"{turns}-turn conversations, retrieval {retrieval}: bodies {len(talks[0][0])} to"
        f" {len(talks[0][-1])} bytes (built in {time.perf_counter() - started:.1f} s);"
        f" {count} counted after a warm-up, a fresh scope each"
    )
    everyone = [*servers, *([echo] if echo else [])]
    for index, bodies in enumerate(talks):
        done = run(talk(everyone, bodies))
        if index == 0:
            describe(done[0].answers)
            continue
        for server, result in zip(everyone, done, strict=True):
            server.runs.append(result)
    tenth = max(1, turns // 10)
    print(
        f"  {'process':>22} {'CPU ms/turn':>11} {'conversations':>13} {'first/last':>13}"
        f" {'max turn':>8} {'wall p50':>8} {'p99':>7}"
    )
    for server in everyone:
        each = [r.cpu_per_turn for r in server.runs]
        position = [statistics.median(r.cpu[t] for r in server.runs) for t in range(turns)]
        first, last = statistics.mean(position[:tenth]), statistics.mean(position[-tenth:])
        worst = max(c for r in server.runs for c in r.cpu)
        wall = [w for r in server.runs for w in r.wall]
        print(
            f"  {server.label:>22} {ms(server.cpu_per_turn()):>11}"
            f" {ms(min(each)):>6}-{ms(max(each)):<6} {ms(first):>6}/{ms(last):<6} {ms(worst):>8}"
            f" {pct(wall, 0.5):>8.2f} {pct(wall, 0.99):>7.2f}"
        )
    print(
        "  (CPU ms/turn: the median over the conversations, then its range; first/last: the"
        f" first and last {tenth} turns; max turn: the most CPU one turn took; wall in ms)"
    )


def compare(servers: list[Server]) -> None:
    """Each tree against the first (the control): CPU per turn and the difference in % of the
    control's turn, overall (medians) and paired by conversation (same bodies, same minute)."""
    control = servers[0]
    for server in servers[1:]:
        same(control, server)
        cpu, base = server.cpu_per_turn(), control.cpu_per_turn()
        paired = [
            (b.cpu_per_turn - a.cpu_per_turn) / a.cpu_per_turn * 100
            for a, b in zip(control.runs, server.runs, strict=True)
        ]
        print(
            f"  {server.label} vs {control.label}: {ms(cpu)} vs {ms(base)} ms per turn,"
            f" {(cpu - base) / base * 100:+.1f}%; paired by conversation: median"
            f" {statistics.median(paired):+.1f}%, mean {statistics.mean(paired):+.1f}%"
            f" ({', '.join(f'{p:+.0f}' for p in paired)})"
        )


def same(control: Server, server: Server) -> None:
    """An A/B is only fair between trees that answer the same: every turn's block reports and
    frame must equal the control's (but for what differs by design: the frame's date line, to
    the minute, and the cache key, an HMAC under each service's own secret)."""

    def decided(answer: bytes) -> tuple[object, bytes]:
        prepared = orjson.loads(answer)
        prepared["frame"].pop("prompt_cache_key", None)
        frame = DATE_LINE.sub(b"", orjson.dumps(prepared["frame"]))
        return prepared["selection"]["blocks"], frame

    for a, b in zip(control.runs, server.runs, strict=True):
        for turn, (x, y) in enumerate(zip(a.answers, b.answers, strict=True)):
            if decided(x) != decided(y):
                raise RuntimeError(f"{server.label} answered turn {turn + 1} unlike the control")


def growth(service: Server, echo: Server, count: int) -> None:
    """How a turn's CPU grows with the conversation's length: ``count`` conversations of
    ``GROWTH_TURNS[-1]`` turns (a fresh scope each), every turn sent to the service and the echo
    as ``talk`` does; per conversation, the median CPU of the ``GROWTH_WINDOW`` turns up to each
    of ``GROWTH_TURNS``, then the median over the conversations. The memory source offers its
    stable entries and the latest ``GROWTH_NOTES`` notes (at turn 40, the very blocks of
    ``conversation``), so that what grows is the history and nothing else: at turn 400 the body
    is some six times that of turn 40, and the echo's own CPU grows with it."""
    first, last = GROWTH_TURNS[0], GROWTH_TURNS[-1]
    marks: dict[str, dict[int, list[float]]] = {"service": {}, "echo": {}}
    started = time.perf_counter()
    for seed in range(count):
        scope = f"growth-{seed}-{time.time_ns()}"
        bodies = conversation(seed, last, scope, "inline", notes=GROWTH_NOTES)
        for label, run_ in zip(
            ("service", "echo"), run(talk([service, echo], bodies, keep=False)), strict=True
        ):
            for turn in GROWTH_TURNS:
                window = run_.cpu[turn - GROWTH_WINDOW : turn]
                marks[label].setdefault(turn, []).append(statistics.median(window))
    cpu = {label: {t: statistics.median(v) for t, v in m.items()} for label, m in marks.items()}
    print(
        f"{count} growing conversations of {last} turns ({time.perf_counter() - started:.0f} s),"
        f" CPU ms per turn, the median of the {GROWTH_WINDOW} turns up to each:"
    )
    for turn in GROWTH_TURNS:
        s_cpu, e_cpu = cpu["service"][turn], cpu["echo"][turn]
        print(
            f"  turn {turn:>4}: service {ms(s_cpu):>6}  stored echo {ms(e_cpu):>6}"
            f"  ratio {s_cpu / e_cpu:.2f}x"
        )
    grown = cpu["service"][last] / cpu["service"][first]
    echo_grown = cpu["echo"][last] / cpu["echo"][first]
    print(
        f"  turn {last} / turn {first}: service {grown:.2f}x (target <= {GROWTH_TARGET}x),"
        f" stored echo {echo_grown:.2f}x"
    )
    report(
        f"conversation turn {last} / turn {first}, service CPU per turn (one growing conversation)",
        f"{grown:.2f}x ({ms(cpu['service'][last])} / {ms(cpu['service'][first])} ms)",
        f"≤ {GROWTH_TARGET}x",
        grown <= GROWTH_TARGET,
    )
    report(
        f"conversation turn {last} / turn {first}, stored echo CPU per turn (same bodies)",
        f"{echo_grown:.2f}x ({ms(cpu['echo'][last])} / {ms(cpu['echo'][first])} ms)",
        "",
        None,
    )
    report(
        f"conversation turn {last}, service CPU per turn / stored echo CPU per turn",
        f"{cpu['service'][last] / cpu['echo'][last]:.2f}x (turn {first}:"
        f" {cpu['service'][first] / cpu['echo'][first]:.2f}x)",
        "",
        None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=5, help="counted, after a warm-up")
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument(
        "--growth", type=int, default=3, metavar="N",
        help=f"N growing conversations of {GROWTH_TURNS[-1]} turns (0: none; not in an A/B)",
    )  # fmt: skip
    parser.add_argument(
        "--retrieval", choices=["inline", "webhook", "both"], default="both",
        help="where the retrieval passages come from (the figure is inline's)",
    )  # fmt: skip
    parser.add_argument(
        "--tree", action="append", default=[], metavar="LABEL=DIR",
        help="run the service from this source tree; several: an A/B against the first",
    )  # fmt: skip
    args = parser.parse_args()
    trees: list[tuple[str, Path | None]] = [
        (label, Path(d)) for label, d in (t.split("=", 1) for t in args.tree)
    ] or [("service", None)]
    variants: list[Retrieval] = (
        ["inline", "webhook"] if args.retrieval == "both" else [args.retrieval]
    )
    folder = Path(tempfile.mkdtemp(prefix="ca-conversation-"))
    procs: list[ServedProcess] = []
    try:
        secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
        retrieval = start_app(
            "retrieval_contributor:app", "--loop", "uvloop", "--http", "httptools", app_dir=HERE,
            env={"RETRIEVAL_SECRET": secret},
        )  # fmt: skip
        procs.append(retrieval)
        echo_proc = start_echo(folder)
        procs.append(echo_proc)
        config = write_config(folder, retrieval.port, secret)
        for variant in variants:
            servers = []
            for label, tree in trees:  # new processes: each variant starts from a warm-up
                servers.append(start_service(f"{label}-{variant}", tree, folder, config))
                procs.append(servers[-1].proc)
            # The echo reads the same bodies; with a webhook retrieval source they lack the
            # passages the service fetches, so the echo is measured on the inline bodies only.
            echo = Server("stored echo", echo_proc, f"{echo_proc.url}/v1/prepare-stored")
            paired_echo = echo if variant == "inline" else None
            converse(servers, paired_echo, variant, args.conversations, args.turns)
            if len(trees) > 1:
                compare(servers)  # an A/B of trees prints no figures
            elif variant == "inline":
                figures(servers[0], echo)
            else:
                wall = [w for r in servers[0].runs for w in r.wall]
                report(
                    "conversation turn, retrieval from a webhook contributor, service CPU per turn"
                    " (for reference)",
                    f"{ms(servers[0].cpu_per_turn())} ms (wall p50 {pct(wall, 0.5):.2f} ms)",
                    "",
                    None,
                )
            for server in servers:
                server.proc.stop()
                procs.remove(server.proc)
        if args.growth and len(trees) == 1:
            label, tree = trees[0]
            server = start_service(f"{label}-growth", tree, folder, config)
            procs.append(server.proc)
            echo = Server("stored echo", echo_proc, f"{echo_proc.url}/v1/prepare-stored")
            growth(server, echo, args.growth)
    finally:
        for proc in procs:
            proc.stop()
        shutil.rmtree(folder, ignore_errors=True)


def figures(service: Server, echo: Server) -> None:
    """The figures of the inline conversation: the ratio to the stored echo (paired by
    conversation: the same bodies in the same minute), and each side's CPU and wall."""
    ratio = statistics.median(
        s.cpu_per_turn / e.cpu_per_turn for s, e in zip(service.runs, echo.runs, strict=True)
    )
    cpu, echo_cpu = service.cpu_per_turn(), echo.cpu_per_turn()
    wall = [w for r in service.runs for w in r.wall]
    print(f"  service CPU per turn / stored echo CPU per turn: {ratio:.2f}x (target <= {TARGET}x)")
    report(
        "conversation turn, service CPU per turn / stored echo CPU per turn (same bodies)",
        f"{ratio:.2f}x ({ms(cpu)} / {ms(echo_cpu)} ms)",
        f"≤ {TARGET}x",
        ratio <= TARGET,
    )
    report("conversation turn, service CPU per turn", f"{ms(cpu)} ms", "", None)
    report("conversation turn, stored echo CPU per turn", f"{ms(echo_cpu)} ms", "", None)
    report(
        "conversation turn, service wall p50 / p99 (c=1, loopback)",
        f"{pct(wall, 0.5):.2f} / {pct(wall, 0.99):.2f} ms",
        "",
        None,
    )


if __name__ == "__main__":
    main()
