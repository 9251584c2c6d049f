"""The ``transcript`` layout (core/transcript.py) through the real app on a real SQLite file: each
turn's frame begins with the previous turn's, the earlier per-turn and data messages put back
where they stood, new data sent as what the transcript does not hold, nothing inserted before a
tool loop's results, and what cannot be rebuilt cleared, never sent stale."""

from __future__ import annotations

import secrets
from typing import Any

from api_support import AppFactory, FakeWall

DATA = "Account note 7: the customer prefers short answers."


def turn(
    history: list[dict[str, Any]],
    inputs: list[dict[str, Any]],
    scope: str,
    blocks: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "instructions": "You are a careful agent.",
        "plugins": [{"name": "notes", "instructions": "Account notes."}],
        "contributions": [
            {"source": "notes", "revision": 1, "blocks": blocks or [{"id": "n7", "text": DATA}]}
        ],
        "tools": [{"name": "lookup", "description": "Look an order up."}],
        "history": history,
        "input": inputs,
        "assembly": {"layout": "transcript"},
        "scope": {"task_id": scope},
        **fields,
    }


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def ok(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/prepare", json=body)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_each_turn_extends_the_previous_frame(make_client: AppFactory) -> None:
    wall = FakeWall()
    client = make_client(wall=wall)
    scope = secrets.token_hex(4)
    first = ok(client, turn([], [user("Hello.")], scope))
    messages = first["frame"]["messages"]
    assert [m["role"] for m in messages] == ["system", "developer", "user", "user"]
    wall.now += 120  # two minutes later: a new date line, for the new turn only
    second = ok(client, turn([user("Hello."), assistant("Hi.")], [user("Again.")], scope))
    frame = second["frame"]["messages"]
    assert frame[: len(messages)] == messages
    # The data did not change: only the per-turn message is new, no data message.
    assert [m["role"] for m in frame[len(messages) :]] == ["assistant", "developer", "user"]
    assert second["budget"]["data_tokens"] == 0
    assert second["selection"]["placement"]["index"] == len(messages) + 1
    assert frame[1]["content"] != frame[-2]["content"]  # the earlier date line stays as it was


def test_a_tool_loop_gets_nothing_before_its_results(make_client: AppFactory) -> None:
    client = make_client()
    scope = secrets.token_hex(4)
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "lookup"}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "A42: shipped."}
    first = ok(client, turn([], [user("Where is A42?")], scope))
    changed = [{"id": "n7", "text": DATA}, {"id": "n8", "text": "Note 8: a refund is open."}]
    step = ok(client, turn([user("Where is A42?"), call], [result], scope, blocks=changed))
    frame = step["frame"]["messages"]
    before = first["frame"]["messages"]
    assert frame[: len(before)] == before
    assert [m["role"] for m in frame[len(before) :]] == ["assistant", "tool", "user"]
    assert "Note 8" in frame[-1]["content"] and DATA not in frame[-1]["content"]


def test_a_changed_block_is_cleared_where_it_was_and_sent_again(make_client: AppFactory) -> None:
    client = make_client()
    scope = secrets.token_hex(4)
    first = ok(client, turn([], [user("Hello.")], scope))
    edited = [{"id": "n7", "text": "Account note 7: the customer wants long answers now."}]
    second = ok(
        client, turn([user("Hello."), assistant("Hi.")], [user("Go.")], scope, blocks=edited)
    )
    frame = second["frame"]["messages"]
    old_data = frame[2]["content"]
    assert DATA not in old_data and "cleared" in old_data
    assert "long answers" in frame[-2]["content"]
    assert first["frame"]["messages"][2]["content"] != old_data


def test_an_expired_block_is_never_sent_from_an_earlier_turn(make_client: AppFactory) -> None:
    wall = FakeWall()
    client = make_client(wall=wall)
    scope = secrets.token_hex(4)
    expiring = [{"id": "n7", "text": DATA, "expires_at": "2026-12-02T12:30:00Z"}]
    ok(client, turn([], [user("Hello.")], scope, blocks=expiring))
    wall.now += 3600
    second = ok(
        client, turn([user("Hello."), assistant("Hi.")], [user("Go.")], scope, blocks=expiring)
    )
    assert DATA not in str(second["frame"])


def test_the_plan_marks_the_previous_end_and_the_new_end(make_client: AppFactory) -> None:
    client = make_client()
    scope = secrets.token_hex(4)
    long = "You are a careful agent. " * 400
    fields: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "render": "neutral",
        "cache": {"breakpoints": True},
    }
    first = ok(client, turn([], [user("Hello.")], scope, instructions=long, **fields))
    second = ok(
        client,
        turn([user("Hello."), assistant("Hi.")], [user("Go.")], scope, instructions=long, **fields),
    )
    marks = {b["after"]: b["message"] for b in second["selection"]["cache"]["breakpoints"]}
    assert marks["history"] == len(first["frame"]["messages"]) - 1
    assert marks["end"] == len(second["frame"]["messages"]) - 1
    assert second["selection"]["cache"]["prefix_kept"] is True
