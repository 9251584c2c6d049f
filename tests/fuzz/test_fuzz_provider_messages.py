"""Fuzzing provider-shaped history and input: messages near the OpenAI Chat, Anthropic Messages
and OpenAI Responses shapes, with any JSON in any place (a role that is a list, tool calls that
are a boolean, a content part that is a number, an integer beyond 64 bits in a carried item).

Two layers: the request model on its own (``validation.parse_model``, as the routes and the CLI
read a body), which must answer a request or one ``InvalidError`` whose every place below
``history`` or ``input`` names a message the caller sent; then ``POST /v1/prepare`` and
``/v1/budget`` through the app, which must answer 200 or a 422 problem, never a 500. Derandomized
and small in CI; ``make test-deep`` draws many more at random (``hypothesis_budget``). No log line of the app holds the messages' text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.core.request import PrepareRequest
from context_assembly.errors import InvalidError
from context_assembly.validation import parse_model
from hypothesis_budget import DEEP, examples

MARKER = "ZQ-message-text-7"
"""Text the messages carry: no log line may hold it."""


def fuzz_settings(max_examples: int) -> settings:
    """Bounded, reproducible Hypothesis settings (no example database, fixed derivation)."""
    return settings(
        max_examples=examples(max_examples),
        deadline=None,
        derandomize=not DEEP,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --------------------------------------------------------------------------- strategies

texts = st.one_of(st.text(max_size=8), st.just(MARKER))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.integers(min_value=2**64, max_value=2**70),  # beyond 64 bits: cannot be encoded again
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
junk = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)
ROLES = ["system", "developer", "user", "assistant", "tool"]
roles = st.one_of(st.sampled_from(ROLES), junk)
PART_TYPES = [
    "text",
    "input_text",
    "output_text",
    "image",
    "image_url",
    "input_image",
    "tool_use",
    "tool_result",
    "thinking",
    "native",
    "opaque",
    "refusal",
]
parts = st.one_of(
    st.fixed_dictionaries(
        {"type": st.one_of(st.sampled_from(PART_TYPES), junk)},
        optional={
            "text": st.one_of(texts, junk),
            "id": st.one_of(st.sampled_from(["c1", "c2"]), junk),
            "name": st.one_of(texts, junk),
            "input": junk,
            "tool_use_id": st.one_of(st.sampled_from(["c1", "c2"]), junk),
            "content": st.one_of(texts, st.lists(junk, max_size=2), junk),
            "signature": junk,
            "cache_control": junk,
        },
    ),
    junk,
)
contents = st.one_of(st.none(), texts, st.lists(parts, max_size=4), junk)
calls = st.one_of(
    st.fixed_dictionaries(
        {"id": st.one_of(st.sampled_from(["c1", "c2"]), junk)},
        optional={
            "type": st.one_of(st.just("function"), junk),
            "function": st.one_of(
                st.fixed_dictionaries(
                    {"name": st.one_of(texts, junk)}, optional={"arguments": junk}
                ),
                junk,
            ),
            "name": st.one_of(texts, junk),
            "arguments": junk,
        },
    ),
    junk,
)
messages = st.fixed_dictionaries(
    {"role": roles},
    optional={
        "content": contents,
        "tool_calls": st.one_of(st.lists(calls, max_size=3), junk),
        "tool_call_id": st.one_of(st.sampled_from(["c1", "c2"]), junk),
        "name": st.one_of(texts, junk),
        "refusal": junk,
    },
)
items = st.fixed_dictionaries(
    {
        "type": st.one_of(
            st.sampled_from(
                ["message", "function_call", "function_call_output", "reasoning", "web_search"]
            ),
            junk,
        )
    },
    optional={
        "role": roles,
        "content": contents,
        "call_id": st.one_of(st.sampled_from(["c1", "c2"]), junk),
        "name": st.one_of(texts, junk),
        "arguments": st.one_of(texts, junk),
        "output": contents,
        "id": junk,
        "status": junk,
    },
)
conversations = st.lists(st.one_of(messages, items, junk), max_size=6)
FORMATS = ["auto", "neutral", "openai-chat", "anthropic", "openai-responses"]
bodies = st.fixed_dictionaries(
    {"model": st.just("gpt-4o-mini"), "history": conversations, "input": conversations},
    optional={"input_format": st.one_of(st.sampled_from(FORMATS), junk)},
)

# The issue's cases, and the shapes that answered 500 before.
ROLE_LIST = {
    "history": [{"role": [], "content": None}],
    "input": [{"role": "user", "content": "hi"}],
}
CALLS_TRUE = {
    "history": [
        {"role": "assistant", "content": "", "tool_calls": True},
        {"type": "function_call", "call_id": "c", "name": "n", "arguments": "{}"},
    ],
    "input": [{"role": "user", "content": "hi"}],
}
SPLIT_TURN = {
    "history": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "r"},
                {"type": "text", "text": "x"},
            ],
        },
        {"role": "user", "content": 123},
    ],
    "input": [{"role": "user", "content": "hi"}],
}


def raw(body: dict[str, Any]) -> bytes:
    """``body`` as JSON (the standard library writes integers beyond 64 bits)."""
    return json.dumps({"model": "gpt-4o-mini", **body}).encode()


def check_places(body: dict[str, Any], problem: dict[str, Any]) -> None:
    """Every place of the problem below ``history`` or ``input`` names a message the caller
    sent (its index within what was sent)."""
    for error in problem.get("errors", []):
        field, _, rest = str(error["loc"]).partition(".")
        sent = body.get(field)
        if field not in ("history", "input") or not isinstance(sent, list) or not rest:
            continue
        index = rest.split(".")[0]
        assert index.isdigit() and int(index) < len(sent), (error, len(sent))


# --------------------------------------------------------------------------- the model


@fuzz_settings(600)
@example(body=ROLE_LIST)
@example(body=CALLS_TRUE)
@example(body=SPLIT_TURN)
@given(body=bodies)
def test_fuzz_a_provider_shaped_conversation_is_read_or_refused_by_name(
    body: dict[str, Any],
) -> None:
    """The request is read, or refused with one InvalidError whose places name the caller's
    messages; no other exception (a TypeError was a 500)."""
    try:
        parse_model(PrepareRequest, raw(body))
    except InvalidError as err:
        check_places(body, err.to_problem())


def test_the_issue_cases_name_their_places() -> None:
    """The cases the issue reports: the role, the tool calls, and the caller's message after a
    split turn."""
    for body, loc in [
        (ROLE_LIST, "history.0.role"),
        (CALLS_TRUE, "history.0.tool_calls"),
        (SPLIT_TURN, "history.2.content"),
    ]:
        with pytest.raises(InvalidError) as caught:
            parse_model(PrepareRequest, raw(body))
        assert caught.value.to_problem()["errors"][0]["loc"] == loc


# --------------------------------------------------------------------------- through the app


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder: Path = tmp_path_factory.mktemp("fuzz-messages")
    settings = load_settings(store={"path": str(folder / "fuzz.db")})
    with TestClient(create_app(settings), raise_server_exceptions=False) as app_client:
        yield app_client


@fuzz_settings(60)
@example(body=ROLE_LIST, route="/v1/prepare")
@example(body=ROLE_LIST, route="/v1/budget")
@example(body=CALLS_TRUE, route="/v1/prepare")
@example(body=CALLS_TRUE, route="/v1/budget")
@example(body=SPLIT_TURN, route="/v1/budget")
@given(body=bodies, route=st.sampled_from(["/v1/prepare", "/v1/budget"]))
def test_fuzz_prepare_and_budget_never_answer_500(
    client: TestClient, body: dict[str, Any], route: str
) -> None:
    """Any such conversation is answered 200 or a 422 problem naming where, never a 500; no
    log line holds the messages' text."""
    with capture_logs() as logs:
        answer = client.post(route, content=raw(body), headers={"content-type": "application/json"})
    assert answer.status_code in (200, 422), answer.text
    assert MARKER not in repr(logs)
    if answer.status_code == 422:
        assert answer.headers["content-type"] == "application/problem+json"
        check_places(body, answer.json())
