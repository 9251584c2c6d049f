"""``context-assembly replay --preparation ID``: a scope's own stored turns read from the store
the configuration names (a real SQLite file the service wrote), as text and JSON."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from context_assembly.api.app import create_app
from context_assembly.config import load_settings

COMMAND = [sys.executable, "-m", "context_assembly.cli", "replay"]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def conversation(tmp_path: Path) -> tuple[Path, list[str], list[dict[str, Any]]]:
    """Three turns of one scope on a Sonnet model, the first two reported, in a SQLite file."""
    database = tmp_path / "service.db"
    config = tmp_path / "service.toml"
    config.write_text(f'[store]\npath = "{database}"\n')
    scope = {"task_id": secrets.token_hex(4)}
    ids: list[str] = []
    reports: list[dict[str, Any]] = []
    with TestClient(create_app(load_settings(config))) as client:
        history: list[dict[str, Any]] = []
        for number in range(3):
            body: dict[str, Any] = {
                "model": "claude-sonnet-4-5",
                "render": "anthropic",
                "assembly": {"layout": "transcript"},
                "cache": {"breakpoints": True},
                "scope": scope,
                "instructions": "Be exact. " * 300,
                "history": history,
                "input": [{"role": "user", "content": f"question {number}"}],
            }
            prep = client.post("/v1/prepare", json=body).json()
            ids.append(prep["preparation_id"])
            if number < 2:
                usage = {
                    "input_tokens": 100,
                    "cache_read_input_tokens": 1000 * number,
                    "cache_creation_input_tokens": 500,
                    "output_tokens": 10,
                }
                payload = {"report_id": f"r{number}", "provider": "anthropic", "usage": usage}
                answer = client.post(
                    f"/v1/preparations/{prep['preparation_id']}/usage", json=payload
                )
                reports.append(answer.json()["accounting"]["last"])
            history = [*history, body["input"][0], {"role": "assistant", "content": "answer"}]
    return config, ids, reports


def test_the_stored_turns_show_predicted_against_reported_and_the_cost(
    conversation: tuple[Path, list[str], list[dict[str, Any]]],
) -> None:
    config, ids, reports = conversation
    done = run("--preparation", ids[-1], "--config", config, "--json")
    assert done.returncode == 0, done.stderr
    data = orjson.loads(done.stdout)
    assert [t["preparation_id"] for t in data["turns"]] == ids
    assert [t["cached_input_tokens"] for t in data["turns"]] == [0, 1000, None]
    assert [t["cache_write_tokens"] for t in data["turns"]] == [500, 500, None]
    total = data["total"]
    assert (total["turns"], total["reported"]) == (3, 2)
    assert total["reported_cached"] == 1000 and total["reported_cache_writes"] == 1000
    assert total["cost"] == pytest.approx(sum(r["cost"]["total"] for r in reports), abs=1e-9)
    assert total["predicted_cached"] == sum(t["expected_cached_tokens"] or 0 for t in data["turns"])
    text = run("--preparation", ids[-1], "--config", config)
    assert text.returncode == 0, text.stderr
    assert f"{ids[-1]} (stored preparations): 3 turns, oldest first" in text.stdout
    assert "2 of 3 turns reported" in text.stdout


def test_an_unknown_preparation_or_files_with_it_are_refused(
    conversation: tuple[Path, list[str], list[dict[str, Any]]],
) -> None:
    config, ids, _ = conversation
    unknown = run("--preparation", "prep_unknown", "--config", config)
    assert unknown.returncode == 2 and "no live preparation 'prep_unknown'" in unknown.stderr
    both = run("some.jsonl", "--preparation", ids[0], "--config", config)
    assert both.returncode == 2 and "not both" in both.stderr
    neither = run()
    assert neither.returncode == 2
