"""Figures that a benchmark reports against a target.

A benchmark prints its own detailed lines and, for each figure that has a target, one line
``FIGURE {json}`` through :func:`report`. ``bench/run_all.py`` (``make bench``) runs every
benchmark, collects those lines and writes the table in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import json

PREFIX = "FIGURE "


def report(figure: str, value: str, target: str, met: bool | None) -> None:
    """Print one figure: what it is, its value with unit, its target, and whether it is met
    (``None`` when the figure has no target and is printed for reference)."""
    line = {"figure": figure, "value": value, "target": target, "met": met}
    print(PREFIX + json.dumps(line, ensure_ascii=False), flush=True)


def parse(line: str) -> dict[str, object] | None:
    """The figure a ``FIGURE`` line carries, or ``None`` for any other line."""
    if not line.startswith(PREFIX):
        return None
    value: dict[str, object] = json.loads(line[len(PREFIX) :])
    return value
