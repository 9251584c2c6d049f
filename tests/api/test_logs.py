"""The JSON log lines never carry a request's text, an exception's traceback included: a frame's
local variables (where a frame, blocks or input live while a request is served) are not logged."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import structlog

from context_assembly.logs import configure_logging

MARKER = "ZZ-request-text-ZZ"


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.BytesIO]:
    """What the service's logging writes (to ``sys.stderr.buffer`` of when it is configured)."""
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", SimpleNamespace(buffer=out))
    before = structlog.get_config()
    configure_logging("debug")
    try:
        yield out
    finally:
        structlog.configure(**before)


def _fails_holding_text(frame: dict[str, list[dict[str, str]]]) -> None:
    messages = frame["messages"]
    raise ValueError(f"bookkeeping failed on {len(messages)} messages")


def test_an_exception_line_has_its_traceback_without_the_frames_locals(
    written: io.BytesIO,
) -> None:
    log = structlog.get_logger("test_logs")
    frame = {"messages": [{"role": "user", "content": f"{MARKER} the user's question"}]}
    try:
        _fails_holding_text(frame)
    except ValueError:
        log.exception("bookkeeping_failed", preparation_id="prep_x")
    err = written.getvalue().decode()
    line = json.loads(err.strip().splitlines()[-1])
    assert line["event"] == "bookkeeping_failed"
    assert line["preparation_id"] == "prep_x"
    frames = line["exception"][0]["frames"]
    assert any(f["name"] == "_fails_holding_text" for f in frames)  # the traceback is there
    assert MARKER not in err  # and no local variable's value is
