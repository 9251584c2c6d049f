"""A large body is skimmed for its block count before any model is built (``offload.py``)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

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
