"""A large body is skimmed for its block and message counts before any model is built, and parsed
and assembled off the event loop (``offload.py``); history and input hold at most MAX_MESSAGES
messages, validated a chunk at a time."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from api_support import AppFactory

from context_assembly import offload
from context_assembly.api import bodies
from context_assembly.core.request import _MESSAGES, MAX_MESSAGES, AssemblyOptions, PrepareRequest
from context_assembly.engine import run_assembly
from context_assembly.errors import InvalidError
from context_assembly.offload import LARGE_BYTES, MOST_BLOCKS, parse_body
from context_assembly.validation import parse_model


def body(blocks_per_source: list[int], text_chars: int) -> bytes:
    """A prepare with ``blocks_per_source[i]`` blocks in source ``s{i}``, each of
    ``text_chars`` characters."""
    return orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "plugins": [{"name": f"s{i}"} for i in range(len(blocks_per_source))],
            "contributions": [
                {
                    "source": f"s{i}",
                    "revision": 1,
                    "blocks": [{"id": f"b{k}", "text": "x" * text_chars} for k in range(count)],
                }
                for i, count in enumerate(blocks_per_source)
            ],
            "input": [{"role": "user", "content": "hi"}],
        }
    )


def test_most_blocks_is_the_bound_of_max_blocks() -> None:
    """The skim's bound is the highest max_blocks a request may set."""
    schema: dict[str, Any] = AssemblyOptions.model_json_schema()
    assert schema["properties"]["max_blocks"]["maximum"] == MOST_BLOCKS


@pytest.mark.parametrize(
    "blocks", [[MOST_BLOCKS + 1], [MOST_BLOCKS, 1], [1000, 1000, 49], [250_000]]
)
def test_a_large_body_over_the_most_blocks_is_refused_by_the_skim(blocks: list[int]) -> None:
    """A body over LARGE_BYTES with more blocks in all than max_blocks can allow is refused,
    naming max_blocks and the count."""
    raw = body(blocks, 200)
    assert len(raw) > LARGE_BYTES
    with pytest.raises(InvalidError) as caught:
        parse_body(PrepareRequest, raw)
    assert caught.value.extensions["field"] == "max_blocks"
    assert f"{sum(blocks)} blocks" in caught.value.detail


@pytest.mark.parametrize("blocks", [[MOST_BLOCKS], [1024, 1024], [3]])
def test_a_large_body_within_the_most_blocks_parses_as_before(blocks: list[int]) -> None:
    """A large body within the bound parses to the same request as the plain parse."""
    raw = body(blocks, LARGE_BYTES // sum(blocks) + 1)
    assert len(raw) > LARGE_BYTES
    assert parse_body(PrepareRequest, raw) == parse_model(PrepareRequest, raw)


def test_a_large_body_the_skim_cannot_read_gets_the_parse_error() -> None:
    """A large body of the wrong shape is named by the full parse, as any body is."""
    raw = orjson.dumps({"model": "gpt-4o-mini", "contributions": "x" * LARGE_BYTES})
    with pytest.raises(InvalidError) as plain:
        parse_model(PrepareRequest, raw)
    with pytest.raises(InvalidError) as skimmed:
        parse_body(PrepareRequest, raw)
    assert skimmed.value.detail == plain.value.detail


def _on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize(
    ("route", "padding", "off_loop"),
    [
        ("/v1/prepare", LARGE_BYTES, True),
        ("/v1/budget", LARGE_BYTES, True),
        ("/v1/prepare", 0, False),
        ("/v1/budget", 0, False),
    ],
)
def test_a_large_body_is_assembled_off_the_event_loop(
    make_client: AppFactory,
    monkeypatch: pytest.MonkeyPatch,
    route: str,
    padding: int,
    off_loop: bool,
) -> None:
    """A body over LARGE_BYTES (here by its trailing whitespace alone: its texts are short) is
    assembled in a worker thread, where no event loop runs; a small one on the loop."""
    seen: list[bool] = []
    original = run_assembly

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(not _on_a_loop())
        return original(*args, **kwargs)

    monkeypatch.setattr(offload, "run_assembly", spy)
    client = make_client()
    raw = body([1], 10) + b" " * padding
    answer = client.post(route, content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert seen == [off_loop]


# --------------------------------------------------------------------------- many messages


def messages_body(history: int, input_: int = 1, message: Any = None) -> bytes:
    """A prepare of ``history`` history messages (each ``message``) and ``input_`` input
    messages."""
    sent = {"role": "user", "content": "x"} if message is None else message
    return orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "history": [sent] * history,
            "input": [{"role": "user", "content": "hi"}] * input_,
        }
    )


@pytest.mark.parametrize(
    ("history", "input_", "field"),
    [(MAX_MESSAGES + 1, 0, "history"), (MAX_MESSAGES, 1, "input"), (9000, 1001, "input")],
)
@pytest.mark.parametrize(
    ("message", "large"),
    [({}, False), ({"role": "user", "content": "x" * 40}, True)],
)
def test_more_messages_than_the_limit_are_refused_naming_it(
    history: int, input_: int, field: str, message: Any, large: bool
) -> None:
    """History and input over MAX_MESSAGES together: a 422 at the field that goes over, naming
    the count and the limit, before any message is validated; the skim of a large body says it
    as the full parse of a small one does."""
    raw = messages_body(history, input_, message)
    assert (len(raw) > LARGE_BYTES) == large
    with pytest.raises(InvalidError) as caught:
        parse_body(PrepareRequest, raw)
    problem = caught.value.to_problem()
    assert [e["loc"] for e in problem["errors"]] == [field]
    assert f"{history + input_} messages" in problem["detail"]
    assert f"limit of {MAX_MESSAGES}" in problem["detail"]
    with pytest.raises(InvalidError) as plain:
        parse_model(PrepareRequest, raw)
    assert plain.value.detail == caught.value.detail


def test_the_limit_counts_the_messages_as_sent() -> None:
    """An Anthropic turn read into several neutral messages counts once: MAX_MESSAGES such
    turns are read (and then paired), not refused."""
    turn = [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t"},
                {"type": "text", "text": "go on"},
            ],
        },
    ]
    raw = orjson.dumps(
        {"model": "gpt-4o-mini", "history": turn * (MAX_MESSAGES // 2 - 1), "input": [turn[0]]}
    )
    with pytest.raises(InvalidError) as caught:  # the input's call has no result
        parse_body(PrepareRequest, raw)
    assert [e["type"] for e in caught.value.to_problem()["errors"]] == ["tool_pairing"]


@pytest.mark.parametrize("route", ["/v1/prepare", "/v1/budget"])
def test_the_routes_refuse_too_many_messages(make_client: AppFactory, route: str) -> None:
    client = make_client()
    answer = client.post(
        route, content=messages_body(MAX_MESSAGES + 1), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 422
    problem = answer.json()
    assert problem["code"] == "CONTEXT_ASSEMBLY_INVALID"
    assert problem["errors"][0]["loc"] == "history"
    assert f"limit of {MAX_MESSAGES}" in problem["detail"]


@pytest.mark.parametrize(("padding", "off_loop"), [(LARGE_BYTES, True), (0, False)])
def test_a_large_body_is_parsed_off_the_event_loop(
    make_client: AppFactory, monkeypatch: pytest.MonkeyPatch, padding: int, off_loop: bool
) -> None:
    """A body over LARGE_BYTES is parsed (its messages read and validated) in a worker thread;
    a small one on the loop."""
    seen: list[bool] = []
    original = parse_body

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(not _on_a_loop())
        return original(*args, **kwargs)

    monkeypatch.setattr(bodies, "parse_body", spy)
    client = make_client()
    raw = messages_body(3) + b" " * padding
    answer = client.post("/v1/prepare", content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert seen == [off_loop]


def test_messages_validated_in_chunks_are_the_same_messages() -> None:
    """Many messages (and one of many parts) are validated a chunk at a time: the request is the
    one a single validation gives."""
    history: list[Any] = [
        {"role": "user" if i % 2 else "assistant", "content": f"m{i}"} for i in range(5000)
    ]
    history.append({"role": "user", "content": [{"type": "text", "text": "p"}] * 5000})
    request = PrepareRequest.model_validate({"model": "gpt-4o-mini", "history": history})
    assert request.history == _MESSAGES.validate_python(history)


@pytest.mark.parametrize(
    ("history", "loc"),
    [
        ([{"role": "user", "content": "x"}] * 4321 + [{"role": "nobody"}], "history.4321.role"),
        (
            [
                {"role": "user", "content": "x"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "p"}] * 4500 + [{"type": "text"}],
                },
            ],
            "history.1.content.4500.text.text",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": f"c{i}", "name": "f"} for i in range(3000)] + [{}],
                }
            ],
            "history.0.tool_calls.3000.id",
        ),
    ],
)
def test_an_error_in_a_chunk_names_its_place_in_the_whole(history: list[Any], loc: str) -> None:
    with pytest.raises(InvalidError) as caught:
        parse_model(PrepareRequest, orjson.dumps({"model": "gpt-4o-mini", "history": history}))
    assert loc in [e["loc"] for e in caught.value.to_problem()["errors"]]
