"""Frame hashes computed in one pass equal their definitions (and the frame JSON the neutral
render); the date line is locale-free."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembly.core.fingerprint import fingerprint, frame_hashes, prefix_hash
from context_assembly.core.frame import Frame
from context_assembly.core.layout import date_line
from context_assembly.core.render import render_frame
from context_assembly.core.request import Message, Scope, Tool
from hypothesis_budget import examples

TEXT = st.text(
    alphabet=st.sampled_from(["a", "Z", " ", '"', "\\", "é", "日", "\n", "{"]), max_size=12
)
MESSAGES = st.lists(
    st.builds(
        Message,
        role=st.sampled_from(["system", "user", "assistant"]),
        content=TEXT,
        name=st.none() | TEXT,
    ),
    max_size=5,
)
TOOLS = st.lists(
    st.builds(Tool, name=st.sampled_from(["t", "lookup"]), description=TEXT),
    max_size=2,
)
SCOPES = st.builds(Scope, account_id=st.none() | TEXT, roles=st.lists(TEXT, max_size=2))


@settings(max_examples=examples(300), deadline=None)
@given(TEXT, TEXT, SCOPES, st.sampled_from(["neutral", "anthropic"]), MESSAGES, TOOLS, st.data())
def test_frame_hashes_equal_fingerprint_and_prefix_hash(
    model: str,
    tenant: str,
    scope: Scope,
    render: str,
    messages: list[Message],
    tools: list[Tool],
    data: st.DataObject,
) -> None:
    prefix_len = data.draw(st.integers(0, len(messages)))
    got = frame_hashes(model, tenant, scope, render, messages, tools, prefix_len)
    assert got[:2] == (
        fingerprint(model, tenant, scope, render, messages, tools),
        prefix_hash(model, messages[:prefix_len], tools),
    )
    frame = Frame(messages=messages, tools=tools)
    assert orjson.loads(got[2]) == render_frame(frame, "neutral", model, None)


def test_the_date_line_names_the_weekday_in_english_to_the_minute() -> None:
    monday = datetime(2026, 11, 30, 9, 5, 59, tzinfo=UTC)
    for offset in range(7):
        moment = monday + timedelta(days=offset)
        line = date_line(moment, "UTC")
        assert line == (
            f"Current date and time: {moment:%Y-%m-%d %H:%M} (UTC, "
            f"{['Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday', 'Sunday'][offset]})"
        )
    assert date_line(datetime(7, 1, 2, 3, 4, tzinfo=UTC), "UTC").startswith(
        "Current date and time: 0007-01-02 03:04"
    )
