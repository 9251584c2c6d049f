"""Items a source offered that are no blocks (an MCP server's binary contents) reach the manifest
as omitted reports with their reason and 0 tokens, and nowhere else; a source's kind as its
caller reports it (``mcp``) is the manifest's."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from context_assembly.core.request import Block, PrepareRequest
from context_assembly.core.sources import SourceInput, SourceStatus, plan_sources
from context_assembly.engine import run_assembly
from context_assembly.tokens.registry import ModelRegistry

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
LOGO = "docs://logo.png"


def request() -> PrepareRequest:
    return PrepareRequest.model_validate(
        {
            "model": "gpt-4o-mini",
            "assembly": {"max_data_tokens": 1000},
            "plugins": [{"name": "docs"}, {"name": "notes"}],
            "contributors": [{"source": "docs", "endpoint": "docs"}],
            "contributions": [
                {"source": "notes", "revision": 1, "blocks": [{"id": "n", "text": "A note."}]}
            ],
            "input": [{"role": "user", "content": "What is the refund policy?"}],
        }
    )


def assembled(status: SourceStatus) -> Any:
    """The request with ``docs`` answered as an MCP server with ``status``: one text block and
    two binary items skipped."""
    req = request()
    setups = plan_sources(req)
    called, inline = setups
    docs = SourceInput(
        replace(called, kind="mcp"),
        status,
        12.5,
        "mcp:r1",
        (Block(id="docs://guide/refunds", text="Refunds within 30 days.", priority=800),),
        ((LOGO, "binary_content"), ("search#0123456789ab", "binary_content")),
    )
    notes = SourceInput(inline, "inline", 0.0, 1, tuple(req.contributions[0].blocks))
    assembly, _ = run_assembly(
        req, setups, [docs, notes], now=NOW, tenant="t", registry=ModelRegistry.load()
    )
    return assembly


def test_each_skipped_item_is_an_omitted_report_with_its_reason_and_no_tokens() -> None:
    """The blocks come first in rank order, then one ``omitted``/``binary_content`` report per
    skipped item with 0 tokens; the source is reported as ``mcp`` with its blocks counted, and
    no skipped id reaches the frame."""
    assembly = assembled("ok")
    reports = [
        (r.source, r.id, r.status, r.reason, r.tokens, r.full_tokens, r.projection_tokens)
        for r in assembly.selection.blocks
    ]
    assert reports[:2] == [
        ("docs", "docs://guide/refunds", "selected", "fits", *reports[0][4:]),
        ("notes", "n", "selected", "fits", *reports[1][4:]),
    ]
    assert reports[0][4] > 0
    assert reports[2:] == [
        ("docs", LOGO, "omitted", "binary_content", 0, 0, None),
        ("docs", "search#0123456789ab", "omitted", "binary_content", 0, 0, None),
    ]
    sources = {s.source: (s.kind, s.status, s.block_count) for s in assembly.selection.sources}
    assert sources == {"docs": ("mcp", "ok", 1), "notes": ("inline", "inline", 1)}
    sent = str([m.model_dump() for m in assembly.frame.messages])
    assert "docs://guide/refunds" in sent and LOGO not in sent and "search#" not in sent


def test_a_failed_source_reports_no_skipped_items() -> None:
    """A source that failed under ``omit`` contributed nothing: neither blocks nor skipped
    items appear in the manifest."""
    assembly = assembled("error")
    assert [(r.source, r.id) for r in assembly.selection.blocks] == [("notes", "n")]
    [docs] = [s for s in assembly.selection.sources if s.source == "docs"]
    assert (docs.kind, docs.status) == ("mcp", "error")
