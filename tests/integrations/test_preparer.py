"""The pure steps of the adapters' shared loop: where the turn splits, and how a frame is matched
with what was sent."""

from __future__ import annotations

import pytest
from context_assembly_client.integrations.preparer import (
    Carried,
    IntegrationError,
    align,
    split_turn,
)


def carried(*roles: str, part: str = "h") -> list[Carried]:
    return [
        Carried({"role": role, "content": f"{part}{n} {role}"}, f"{part}{n}")
        for n, role in enumerate(roles)
    ]


@pytest.mark.parametrize(
    ("roles", "history_length"),
    [
        (("user",), 0),
        (("user", "assistant", "user"), 2),
        (("user", "assistant", "user", "user"), 2),  # the latest turn is the run of user messages
        (("user", "assistant", "assistant", "tool", "tool"), 0),  # tool results stay with the turn
        (("user", "assistant", "tool", "assistant", "user"), 4),
        (("system", "assistant", "tool"), 0),  # no user message: all input
        ((), 0),
    ],
)
def test_the_input_is_the_latest_user_turn_and_what_follows(
    roles: tuple[str, ...], history_length: int
) -> None:
    """The split point is the start of the last run of user messages; nothing after it is history."""
    messages = carried(*roles)
    history, inputs = split_turn(messages)
    assert history == messages[:history_length] and inputs == messages[history_length:]


def test_align_gives_back_the_origins_and_marks_what_the_service_added() -> None:
    """Sent messages come back with their origins, in order, past a dropped history prefix; the
    service's own messages are marked as added."""
    history, inputs = carried("user", "assistant", "user", "assistant"), carried("user", part="i")
    frame = [
        {"role": "system", "content": "instructions"},
        *[m.neutral for m in history[2:]],
        {"role": "developer", "content": "date", "name": None},
        {"role": "user", "content": '{"context_data":[]}'},
        inputs[0].neutral,
    ]
    aligned = align(frame, history, inputs, dropped=2)
    assert [m.index for m in aligned] == list(range(6))
    assert [m.origin for m in aligned] == [None, "h2", "h3", None, None, "i0"]


def test_align_refuses_a_frame_that_lost_or_changed_a_message() -> None:
    """A frame missing a sent message, or holding an assistant message that was not sent, is not
    the runtime's conversation any more: the adapter fails open instead of guessing."""
    history, inputs = carried("user", "assistant"), carried("user", part="i")
    with pytest.raises(IntegrationError, match="lacks"):
        align([history[0].neutral, inputs[0].neutral], history, inputs, dropped=0)
    changed = {"role": "assistant", "content": "something else"}
    with pytest.raises(IntegrationError, match="matches no message"):
        align([history[0].neutral, changed, inputs[0].neutral], history, inputs, dropped=0)


def test_the_adapters_take_anthropic_markers_only() -> None:
    """A neutral plan for an OpenAI model with explicit breakpoints names ``30m`` breakpoints
    (``prompt_cache_breakpoint``): the adapters, which place Anthropic markers, take none of
    them; the Anthropic markers of a plan are kept."""
    from types import SimpleNamespace
    from typing import Any

    from context_assembly_client.integrations.preparer import Breakpoint, _cache_plan
    from context_assembly_client.types import CacheBreakpoint

    def response(ttls: list[str]) -> Any:
        points = [
            CacheBreakpoint.model_validate(
                {"after": "history", "tokens": 2000, "ttl": ttl, "message": 3}
            )
            for ttl in ttls
        ]
        cache = SimpleNamespace(breakpoints=points, prompt_cache_key="k")
        return SimpleNamespace(selection=SimpleNamespace(cache=cache))

    assert _cache_plan(response(["30m", "30m"])) == ([], "k", None)
    assert _cache_plan(response(["1h"]))[0] == [Breakpoint("history", "1h", 3)]
