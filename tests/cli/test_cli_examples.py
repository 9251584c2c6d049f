"""The example requests in examples/requests run through `context-assembly assemble` as documented."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from context_assembly.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "requests"
NOW = "2026-12-02T12:00:00Z"


def _assemble(name: str, capsysbinary: pytest.CaptureFixture[bytes]) -> tuple[int, dict[str, Any]]:
    code = main(["assemble", str(EXAMPLES / name), "--now", NOW])
    out = capsysbinary.readouterr().out
    body: dict[str, Any] = orjson.loads(out)
    return code, body


def _decisions(body: dict[str, Any]) -> dict[str, str]:
    return {
        f"{b['source']}/{b['id']}": f"{b['status']}/{b['reason']}"
        for b in body["selection"]["blocks"]
    }


def test_seed_example_keeps_the_receipt_and_projects_the_background(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    """The seed: the critical receipt enters in full, the 1,500-word entry only as its projection."""
    code, body = _assemble("seed-whiteboard.json", capsysbinary)
    assert code == 0
    assert _decisions(body) == {
        "in_context_memory/receipt": "selected/protected",
        "in_context_memory/background": "projected/projection_fits",
    }
    budget = body["budget"]
    assert budget["data_tokens"] <= budget["data_limit_tokens"] == 512
    assert body["layout"] == "stable-prefix"
    assert [m["role"] for m in body["frame"]["messages"]] == ["system", "developer", "user", "user"]
    assert "store_get" in body["frame"]["messages"][0]["content"], (
        "partial-view note names the recovery tool"
    )


def test_overflowing_legacy_view_fails_explicitly_where_selection_fits(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    """The same entries overflow as a legacy view (CONTEXT_OVERFLOW, exit 2) and fit when selected."""
    code, problem = _assemble("legacy-overflow.json", capsysbinary)
    assert code == 2
    assert problem["code"] == "CONTEXT_OVERFLOW" and problem["status"] == 422
    code, body = _assemble("selection-fits.json", capsysbinary)
    assert code == 0
    decisions = _decisions(body)
    assert decisions["in_context_memory/receipt"] == "selected/protected"
    assert decisions["in_context_memory/customer"] == "selected/fits"
    assert (
        body["budget"]["total_input_tokens"]
        <= body["budget"]["capacity"] - body["budget"]["response_reserve"]
    )


def test_dependency_and_projection_example(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """Dependencies stay full, a too-large block is projected, expired and orphaned blocks are omitted."""
    code, body = _assemble("dependencies-projection.json", capsysbinary)
    assert code == 0
    assert _decisions(body) == {
        "docs/policy": "selected/fits",
        "docs/incident-7": "projected/projection_fits",
        "docs/old-faq": "omitted/expired",
        "docs/glossary": "selected/dependency",
        "docs/appendix": "omitted/missing_dependency",
        "task_notes/goal": "selected/protected",
    }
