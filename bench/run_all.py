"""``make bench``: run every benchmark, then write the table of figures to ``bench/RESULTS.md``.

Each benchmark prints its detailed output as it runs; the ``FIGURE`` lines it prints
(``bench/figures.py``) become the rows of the table, with the date and the machine. A benchmark
that fails is named in the table and makes the run exit non-zero.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path

from figures import parse

HERE = Path(__file__).resolve().parent
BENCHES = (
    "bench_select.py",
    "bench_counting.py",
    "bench_cache.py",
    "bench_fanout.py",
    "bench_inprocess.py",
    "bench_conversation.py",
    "bench_service.py",
    "bench_health_under_load.py",
    "bench_load.py",
    "bench_adapter.py",
    "bench_mcp.py",
    "bench_timeline.py",
    "bench_replay.py",
)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


def run(script: str) -> tuple[list[dict[str, object]], int]:
    figures: list[dict[str, object]] = []
    print(f"== {script}", flush=True)
    with subprocess.Popen(
        [sys.executable, str(HERE / script)],
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            figure = parse(line)
            if figure is not None:
                figures.append({**figure, "bench": script})
    return figures, proc.returncode


def mark(met: object) -> str:
    if met is None:
        return ""
    return "met" if met else "**not met**"


def main() -> int:
    only = sys.argv[1:]
    scripts = [s for s in BENCHES if (HERE / s).exists() and (not only or s in only)]
    rows: list[dict[str, object]] = []
    failed: list[str] = []
    for script in scripts:
        figures, status = run(script)
        rows += figures
        if status != 0:
            failed.append(script)
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    lines = [
        "# Benchmark results",
        "",
        "Produced by `make bench` (`.venv/bin/python bench/run_all.py`), which runs every benchmark",
        "in `bench/` and writes this table; each benchmark's detailed output is printed as it runs.",
        "Ratios compare figures measured in the same run on the same machine.",
        "",
        f"Date: {today}. Machine: {machine()}.",
        "",
        "| figure | target | value | status | benchmark |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['figure']} | {row['target'] or '—'} | {row['value']} | {mark(row['met'])} "
            f"| `{row['bench']}` |"
        )
    for script in failed:
        lines.append(f"| {script} | — | failed | **failed** | `{script}` |")
    (HERE / "RESULTS.md").write_text("\n".join(lines) + "\n")
    print(f"wrote bench/RESULTS.md: {len(rows)} figures, {len(failed)} benchmarks failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
