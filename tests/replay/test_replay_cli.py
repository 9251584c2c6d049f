"""``context-assembly replay`` as a user runs it: a fixture trace and a log, as the text table,
JSON and the HTML page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
TRACE = HERE / "traces" / "trace_0026.json.gz"  # 3 requests
LOG = HERE / "logs" / "anthropic.jsonl"
COMMAND = [sys.executable, "-m", "context_assembly.cli", "replay"]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=300, check=False
    )


def test_the_table_has_a_row_per_policy() -> None:
    """The text table names the model it resolved and has one row per policy, the service's
    once per layout, split and lifetime; theory reads at least what the plain client reads."""
    done = run(TRACE, "--turns")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "claude-opus-4-5-20251101 → claude-opus-4-5" in out
    assert "minimum cacheable prefix 4,096" in out
    rows = {line.split("  ")[0]: line for line in out.splitlines() if re.match(r"^[a-z:-]+", line)}
    for label in ("theory 5m", "theory 1h", "last-message 5m", "last-message 1h", "none"):
        assert label in rows, label
    for layout in ("legacy", "stable-prefix"):
        for split in ("call", "turn"):
            for ttl in ("5m", "1h"):
                assert f"service:{layout} split:{split} {ttl}" in rows
    assert "cached share per call:" in out
    assert done.stderr == ""


def test_json_has_every_call_of_every_policy(tmp_path: Path) -> None:
    """--json prints the totals and every call's usage per policy; the cached share and price
    follow from the counts."""
    done = run(TRACE, "--json", "--ttl", "5m", "--split", "call")
    assert done.returncode == 0, done.stderr
    document = orjson.loads(done.stdout)
    [conversation] = document["conversations"]
    assert conversation["name"] == "trace_0026"
    assert [c["recorded_input_tokens"] for c in conversation["calls"]] == [15291, 17401, 20068]
    labels = [p["label"] for p in conversation["policies"]]
    assert labels[:3] == ["theory 5m", "last-message 5m", "none"]
    for policy in conversation["policies"]:
        assert len(policy["requests"]) == 3
        totals = policy["totals"]
        assert totals["input_tokens"] == sum(r["input_tokens"] for r in policy["requests"])
        assert totals["cache_read"] == sum(r["cache_read"] for r in policy["requests"])
        assert abs(totals["cached_share"] - totals["cache_read"] / totals["input_tokens"]) < 1e-6
        assert totals["refused"] == 0
    none = next(p for p in conversation["policies"] if p["label"] == "none")
    assert none["totals"]["cache_read"] == 0 and none["totals"]["relative_price"] == 1.0


def test_html_is_one_self_contained_page(tmp_path: Path) -> None:
    """--html writes a page with the table and an SVG chart, and no script or link out."""
    page = tmp_path / "replay.html"
    done = run(TRACE, "--html", page, "--ttl", "5m")
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert html.count("<svg") == 1 and "<polyline" in html and "theory 5m" in html
    for forbidden in ("<script", "http://", "https://", "src=", "href=", "@import", "url("):
        assert forbidden not in html, forbidden


def test_a_log_shows_predicted_against_reported_usage() -> None:
    """A log's recorded requests are a policy of their own, shown beside the reported usage."""
    done = run(LOG, "--turns", "--ttl", "5m", "--split", "call", "--layouts", "stable-prefix")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "anthropic (log): 3 calls" in out
    assert "claude-sonnet-4-5-20250929 → claude-sonnet-4-5" in out
    assert re.search(r"^recorded\s+3\s+0", out, re.MULTILINE)
    assert "predicted / reported" in out
    assert re.search(r"^3\s+[\d,]+ / 498\s+0 / 0\s+0 / 0$", out, re.MULTILINE)


def test_an_unreadable_file_is_refused() -> None:
    """A file that is neither a trace nor a log exits 2 with one line naming it."""
    done = run(HERE / "traces" / "NOTICE.md")
    assert done.returncode == 2
    assert done.stderr.startswith("context-assembly replay: NOTICE.md")
    assert done.stdout == ""
