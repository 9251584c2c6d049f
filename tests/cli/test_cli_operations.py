"""What the command and the service say about themselves (docs/operations.md): the version, a
readable assemble answer, config errors that name the key meant, the start-up line, and the
unknown-model warning."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
import structlog
from fastapi.testclient import TestClient
from pydantic import ValidationError

from context_assembly import __version__
from context_assembly.api.app import create_app
from context_assembly.config import explain, load_settings
from context_assembly.logs import configure_logging

COMMAND = [sys.executable, "-m", "context_assembly.cli"]
REQUEST = {"model": "gpt-4o-mini", "input": [{"role": "user", "content": "hi"}]}


def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*COMMAND, *args], input=stdin, capture_output=True, timeout=60, check=False
    )


def test_version() -> None:
    """``--version`` prints the package's version and exits 0."""
    done = run("--version")
    assert (
        done.returncode == 0 and done.stdout.decode().strip() == f"context-assembly {__version__}"
    )


def test_assemble_is_one_line_when_piped_and_indented_when_asked() -> None:
    """Piped output is one JSON line (for tools); ``--pretty`` indents it, ``--no-pretty`` not."""
    body = orjson.dumps(REQUEST)
    piped = run("assemble", "--now", "2026-12-02T12:00:00Z", stdin=body)
    pretty = run("assemble", "--pretty", "--now", "2026-12-02T12:00:00Z", stdin=body)
    assert piped.returncode == pretty.returncode == 0
    assert piped.stdout.count(b"\n") == 1
    assert pretty.stdout.startswith(b'{\n  "preparation_id"')
    assert json.loads(pretty.stdout) == json.loads(piped.stdout)
    refused = run("assemble", "--pretty", stdin=b'{"model": 5}')
    assert refused.returncode == 2 and refused.stdout.startswith(b"{\n  ")


@pytest.mark.parametrize(
    ("toml", "line"),
    [
        ("[server]\nprot = 9000\n", "server.prot: unknown key; did you mean server.port?"),
        ('[store]\nbakend = "redis"\n', "store.bakend: unknown key; did you mean store.backend?"),
        ("[cach]\nkey_secret = 'x'\n", "cach: unknown key; did you mean cache?"),
        ("[limits]\nzzz = 1\n", "limits.zzz: unknown key (valid keys: max_body_bytes, "),
        ("[limits]\nmax_body_bytes = 1\n", "limits.max_body_bytes: Input should be greater"),
    ],
)
def test_a_config_error_names_the_key_and_the_nearest_valid_one(
    tmp_path: Path, toml: str, line: str
) -> None:
    """An unknown key is named with the closest key of its section, else the section's keys."""
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ValidationError) as caught:
        load_settings(path)
    lines = [explain(e) for e in caught.value.errors(include_input=False, include_url=False)]
    assert any(found.startswith(line) for found in lines), lines


def test_serve_prints_the_named_errors_and_exits_2(tmp_path: Path) -> None:
    """``serve`` refuses an invalid file at start with those lines on stderr."""
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nprot = 9000\n")
    done = run("serve", "--config", str(path))
    assert done.returncode == 2
    assert (
        b"invalid configuration: server.prot: unknown key; did you mean server.port?" in done.stderr
    )


@pytest.fixture
def log_lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.BytesIO]:
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", SimpleNamespace(buffer=out))
    before = structlog.get_config()
    configure_logging("info")
    try:
        yield out
    finally:
        structlog.configure(**before)


def test_start_up_line_and_unknown_model_warning(tmp_path: Path, log_lines: io.BytesIO) -> None:
    """The start-up line says host, port, workers, store, auth and contributors; a prepare for a
    model the registry does not know warns in the manifest and in the log."""
    settings = load_settings(store={"path": str(tmp_path / "s.db")})
    with TestClient(create_app(settings)) as client:
        answer = client.post("/v1/prepare", json={**REQUEST, "model": "my-local-llm"}).json()
        known = client.post("/v1/prepare", json=REQUEST).json()
    lines = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    started = next(line for line in lines if line["event"] == "started")
    assert {
        k: started[k] for k in ("host", "port", "workers", "store", "auth", "contributors")
    } == {
        "host": "127.0.0.1",
        "port": 8080,
        "workers": 1,
        "store": "sqlite",
        "auth": "none",
        "contributors": 0,
    }
    assert [w["code"] for w in answer["selection"]["warnings"]] == ["unknown_model"]
    assert "my-local-llm" in answer["selection"]["warnings"][0]["detail"]
    assert "warnings" not in known["selection"]
    warned = [line for line in lines if line["event"] == "unknown_model"]
    assert [(w["model"], w["preparation_id"]) for w in warned] == [
        ("my-local-llm", answer["preparation_id"])
    ]
