"""Frames with the providers' own compaction (`assembly.compaction.mode: "native"`,
docs/compaction.md) are what the official SDKs declare and send: Anthropic's compaction edit
through the beta Messages API with its beta header, OpenAI Responses' `context_management`;
and a history holding the item each provider returned is sent back as the SDK types it."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types.beta import BetaContextManagementConfigParam, BetaMessageParam
from openai.types.responses import ResponseInputItemParam
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from provider_double import Sdks, sdks
from provider_sdk_support import conforms, prepare, service
from pydantic import ValidationError

__all__ = ["sdks", "service"]  # module-scoped fixtures

RETURNED = {
    "anthropic": {
        "role": "assistant",
        "content": [{"type": "compaction", "content": "They agreed on the plan."}],
    },
    "openai-responses": {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA"},
}
MODELS = {"anthropic": "claude-sonnet-4-5", "openai-responses": "gpt-5.5"}


def body(render: str) -> dict[str, Any]:
    return {
        "model": MODELS[render],
        "render": render,
        "instructions": "Plan carefully.",
        "history": [
            {"role": "user", "content": "Let us plan."},
            {"role": "assistant", "content": "First, the budget."},
            RETURNED[render],
            {"role": "user", "content": "Go on."},
            {"role": "assistant", "content": "Then the schedule."},
        ],
        "input": [{"role": "user", "content": "And then?"}],
        "assembly": {"compaction": {"mode": "native", "trigger_tokens": 100_000}},
    }


@pytest.mark.parametrize("render", ["anthropic", "openai-responses"])
def test_native_frames_are_what_the_sdks_declare_and_send(
    render: str, service: Any, sdks: Sdks
) -> None:
    """The frame validates against the SDK's request type (Anthropic: the beta one), starts its
    conversation at the returned item, and the SDK sends exactly it."""
    answer = prepare(service, body(render))
    frame = answer["frame"]
    native = answer["selection"]["compaction"]["native"]
    if render == "anthropic":
        # The beta body type holds a TypedDict pydantic cannot close: its parts are checked.
        conforms(BetaMessageParam, frame["messages"])
        conforms(BetaContextManagementConfigParam, [frame["context_management"]])
        assert frame["messages"][0] == RETURNED[render]
        sdks.double.reset()
        sdks.anthropic.beta.messages.create(**frame, betas=[native["beta"]])
        sent = sdks.double.last()
    else:
        conforms(ResponseInputItemParam, frame["input"])
        conforms(ResponseCreateParamsNonStreaming, [frame])
        assert frame["input"][1] == RETURNED[render]  # after the instructions
        sdks.double.reset()
        sdks.openai.responses.create(**frame)
        sent = sdks.double.last()
    assert sent == frame


def test_the_check_can_fail() -> None:
    """A compaction edit of an unknown type is refused by the beta request type."""
    edits = {"edits": [{"type": "compact_19990101"}]}
    with pytest.raises(ValidationError):
        conforms(BetaContextManagementConfigParam, [edits])
