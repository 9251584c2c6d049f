"""``examples/run_all.py`` runs every example against one real service, and each prints the
lines the README's "Examples" section says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [
    "selection",
    "dispatch_safety",
    "cache_aware",
    "contributor",
    "breakdown",
    "provider_sdk",
    "mcp_contributor",
    "integrations/langchain_agent",
    "integrations/pydantic_ai_agent",
    "integrations/openai_agents_agent",
    "integrations/ai_sdk",
]


@pytest.fixture(scope="module")
def sections() -> dict[str, str]:
    """The output of one ``run_all.py`` run, split by example (``=== name`` headers)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "run_all.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-4000:]
    assert re.search(r"^service stopped cleanly; removed .*: True$", out, re.M), out[-2000:]
    assert re.search(r"^all examples: ok in [\d.]+ s$", out, re.M)
    found: dict[str, str] = {}
    for name in EXAMPLES:
        match = re.search(rf"^=== {name}\n(.*?)^=== {name}: ok in [\d.]+ s$", out, re.M | re.S)
        assert match is not None, f"no output section for {name}"
        found[name] = match.group(1)
    # Bounded diagnostics: no example prints a long line (no block texts, no frames).
    longest = max(len(line) for line in out.splitlines())
    assert longest <= 200, longest
    return found


def test_selection(sections: dict[str, str]) -> None:
    out = sections["selection"]
    overflow = re.search(
        r"^legacy view: 422 CONTEXT_OVERFLOW needed=(\d+) shortfall=(\d+) tokens$", out, re.M
    )
    assert overflow is not None and int(overflow.group(2)) > 0
    assert int(overflow.group(1)) - int(overflow.group(2)) == 4000
    assert re.search(r"^  in_context_memory/receipt: selected \(protected\) tokens=\d+", out, re.M)
    assert re.search(r"^  in_context_memory/customer: selected \(fits\)", out, re.M)
    assert re.search(r"^  in_context_memory/background: projected \(projection_fits\)", out, re.M)
    budget = re.search(r"^budget: capacity=4000 reserve=512 data=(\d+)/(\d+) ", out, re.M)
    assert budget is not None and int(budget.group(1)) <= int(budget.group(2)) == 1500


def test_dispatch_safety(sections: dict[str, str]) -> None:
    out = sections["dispatch_safety"]
    assert re.search(r"^refresh: attempt=2 input_hash=sha256:\w{12} \(changed=True\)", out, re.M)
    assert "second refresh: 409 CONTEXT_ASSEMBLY_STALE reasons=['refresh_used']" in out
    assert "validate refreshed frame: valid=True" in out
    assert (
        "repair with a changed host prompt: 409 CONTEXT_ASSEMBLY_STALE "
        "reasons=['instructions_changed']"
    ) in out
    assert re.search(
        r"^repair with the original prompt: \d+ messages \(last roles assistant,user\)", out, re.M
    )
    after_wrap = out.split("after wrap_up report:")[1].split("after repair report:")[0]
    assert "last:      wrap_up/chatcmpl-wrap-1" in after_wrap
    assert "auxiliary: null" in after_wrap
    after_repair = out.split("after repair report:")[1]
    assert "last:      wrap_up/chatcmpl-wrap-1" in after_repair  # repair never overwrites last
    assert re.search(
        r"auxiliary: repair/chatcmpl-repair-1 provider_input=\d+ delta=3 ", after_repair
    )
    assert "same report_id again: unchanged=True" in out


def test_cache_aware(sections: dict[str, str]) -> None:
    """Five Anthropic turns found by the scope's pointer: the prefix is kept every turn but
    turn 4, whose changed tool is named; expected cached tokens follow."""
    out = sections["cache_aware"]
    turn = (
        r"^turn (\d): prefix_kept=(null|true|false) first_change=(\S+) breakpoints=(\S+) "
        r"skipped=(\S+) markers=(\d) cacheable=(\d+) total_input=(\d+)$"
    )
    turns = re.findall(turn, out, re.M)
    assert [t[1] for t in turns] == ["null", "true", "true", "false", "true"]
    assert [t[2] for t in turns] == ["-", "-", "-", "tools[0]", "-"]
    assert all(0 < int(t[5]) <= 4 and int(t[5]) == len(t[3].split(",")) for t in turns)
    assert all(int(t[6]) >= 1024 for t in turns)
    usage = re.findall(r"^  usage turn (\d) \(synthetic\): expected_cached=(\d+) ", out, re.M)
    cacheable = [int(t[6]) for t in turns]
    assert [int(e) for _, e in usage] == [0, cacheable[0], cacheable[1], 0, cacheable[3]]
    assert re.search(r"^timeline: 5 turns$", out, re.M)
    rows = re.findall(r"^  \d: input=\d+ kept=(null|true|false) ", out, re.M)
    assert rows == [t[1] for t in turns]


def test_contributor(sections: dict[str, str]) -> None:
    out = sections["contributor"]
    assert "  source notes: kind=webhook status=ok blocks=2" in out
    assert "  block notes/sla: selected (fits)" in out
    assert re.search(r"^contributor saw for notes: x-contributor-timeout-ms=(\d+) ", out, re.M)
    assert "validate: valid=True" in out
    assert (
        "validate after a revision bump: 409 CONTEXT_ASSEMBLY_STALE ['revision_changed:notes']"
        in out
    )
    assert "  source slow_notes: kind=webhook status=timeout blocks=0" in out
    seen = re.search(r"^contributor saw for slow_notes: x-contributor-timeout-ms=(\d+) ", out, re.M)
    assert seen is not None and 0 < int(seen.group(1)) <= 400
    assert re.search(r"^slow_notes: function cancelled at the deadline after \d+ ms$", out, re.M)
    assert "forged call (wrong signature): HTTP 401" in out
    assert "unsigned call: HTTP 401" in out


def test_breakdown(sections: dict[str, str]) -> None:
    out = sections["breakdown"]
    assert re.search(r"^preparation prep_\S+  model gpt-4o-mini  layout stable-prefix", out, re.M)
    assert "blocks (7):" in out
    for reason in (
        "protected",
        "dependency",
        "fits",
        "projection_fits",
        "expired",
        "missing_dependency",
        "budget",
    ):
        assert re.search(rf"^  (selected|projected|omitted) +{reason} ", out, re.M), reason
    assert re.search(r"^last: openai/main input \d+ \(delta 0\)", out, re.M)
    assert "(html view: " in out


def test_provider_sdk(sections: dict[str, str]) -> None:
    """An OpenAI-shaped history posted as it is; the OpenAI SDK sends the frame unchanged with
    the reserve as its output limit; its usage is accounted."""
    out = sections["provider_sdk"]
    assert "output limit: max_completion_tokens = 4096 (reserve)" in out
    assert "block notes/vip: selected (fits, " in out
    assert "sent roles: system user assistant tool tool user user" in out
    assert re.search(r"^usage: provider 236 input tokens, delta -?\d+ .* cached 0$", out, re.M)


def test_ai_sdk(sections: dict[str, str]) -> None:
    """The AI SDK middleware prepares generateText and streamText calls, reports their usage,
    and fails open against a closed port."""
    out = sections["integrations/ai_sdk"]
    assert re.search(r"^generateText: preparation prep_\S+$", out, re.M)
    assert re.search(r"^streamText: preparation prep_\S+, \d+ characters streamed$", out, re.M)
    assert len(re.findall(r"^  usage report ai-sdk-main: provider=normalized ", out, re.M)) == 2
    assert "closed port: prepare: APIConnectionError; the model got 1 message (user)" in out


@pytest.mark.parametrize(
    "name",
    [
        "integrations/langchain_agent",
        "integrations/pydantic_ai_agent",
        "integrations/openai_agents_agent",
    ],
)
def test_python_runtime_adapters(sections: dict[str, str], name: str) -> None:
    """Each runtime's agent makes two model calls, each prepared (the protected receipt in, the
    long history omitted), and both usage reports arrive in the background."""
    out = sections[name]
    preparations = re.findall(
        r"^preparation (prep_\S+) model=gpt-4o-mini layout=stable-prefix$", out, re.M
    )
    assert len(preparations) == 2
    assert out.count("  notes/receipt: selected (protected) ") == 2
    assert out.count("  notes/history: omitted (budget) ") == 2
    reported = re.findall(r"^usage report (?:\S+ of )?(prep_\S+): provider=normalized ", out, re.M)
    assert sorted(reported) == sorted(preparations)
    assert "stats: prepared=2 failed_open=0 usage_reports=2" in out


def test_mcp_contributor(sections: dict[str, str]) -> None:
    """An official-SDK MCP server's resources and tool results become blocks with mapped
    priorities; a server that is down is an omitted source; binary content is skipped and said;
    the header's value never reaches the log."""
    out = sections["mcp_contributor"]
    assert "  source handbook: status=ok blocks=4" in out
    assert "  source archive: status=error blocks=0" in out
    assert re.search(
        r"^  block handbook/handbook://refunds: selected \(fits\) priority=800 ", out, re.M
    )
    assert re.search(r"^  block handbook/search#[0-9a-f]{12}: selected \(fits\) ", out, re.M)
    assert re.search(r"^log: mcp_binary_skipped source=handbook items=1 bytes=\d+$", out, re.M)
    assert "validate: valid=True" in out
    assert "header value in the service log: False" in out
