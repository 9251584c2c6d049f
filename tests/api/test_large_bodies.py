"""A large body is skimmed for its block count before any model is built, and assembled off the
event loop (``offload.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from api_support import AppFactory

from context_assembly import offload
from context_assembly.core.request import AssemblyOptions, PrepareRequest
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
    original = offload.run_assembly

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(not _on_a_loop())
        return original(*args, **kwargs)

    monkeypatch.setattr(offload, "run_assembly", spy)
    client = make_client()
    raw = body([1], 10) + b" " * padding
    answer = client.post(route, content=raw, headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert seen == [off_loop]
