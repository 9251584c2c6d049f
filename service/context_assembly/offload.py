"""Large requests off the event loop: their token counting in a worker thread, their block count
refused before any model is built.

Counting a few megabytes of text with tiktoken takes a second or more; on the event loop it would
hold every other request (``/healthz`` included) that long. tiktoken releases the GIL while it
encodes, so the assembly of a large request runs in a worker thread (``asyncio.to_thread``: the
loop's default executor, a bounded pool) while the loop keeps serving. Small requests, nearly all
of them, are assembled on the loop, where they take well under a millisecond: a thread hop would
only add to their latency.

A request is large when its body is over ``LARGE_BYTES`` (the route says so: ``large_body``,
from ``api.bodies.large_body``) or when the block text of its sources is over ``LARGE_BYTES``
characters (``run_assembly_async`` adds up the blocks it is given, the contributors' answers
included).

Parsing holds the GIL (pydantic-core does not release it), so a thread would not free the loop
while a body is parsed. What must be refused is refused first instead: a large body with more
blocks than any request may have (``MOST_BLOCKS``, ``AssemblyOptions.max_blocks``' upper bound)
is counted by a skim that builds no block models, and refused at a small fraction of the full
parse's cost. Any body the skim cannot read goes on to the full parse, which names the problem.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from context_assembly.core.assemble import Assembly
from context_assembly.core.request import PrepareRequest
from context_assembly.core.sources import SourceInput, SourceSetup
from context_assembly.engine import ModelContext, run_assembly
from context_assembly.errors import InvalidError
from context_assembly.validation import parse_model

M = TypeVar("M", bound=BaseModel)

LARGE_BYTES = 256 * 1024
MOST_BLOCKS = 2048


class _Block(TypedDict, total=False):
    """A block, none of its fields read: each is an empty dict."""


class _Contribution(TypedDict, total=False):
    blocks: list[_Block]


class _Skim(TypedDict, total=False):
    contributions: list[_Contribution]


_SKIM = TypeAdapter(_Skim)


def parse_body(model: type[M], raw: bytes) -> M:
    """``raw`` parsed into ``model`` (``validation.parse_model``); a large body is first skimmed
    for its block count.

    Raises:
        InvalidError: the body has more than ``MOST_BLOCKS`` blocks, or does not parse.
    """
    if len(raw) > LARGE_BYTES:
        try:
            skim = _SKIM.validate_json(raw)
        except ValidationError:
            skim = {}  # the full parse names the problem
        blocks = sum(len(c.get("blocks", ())) for c in skim.get("contributions", ()))
        if blocks > MOST_BLOCKS:
            raise InvalidError(
                f"{blocks} blocks in this preparation, over {MOST_BLOCKS}, the most that "
                "max_blocks allows",
                field="max_blocks",
            )
    return parse_model(model, raw)


async def run_assembly_async(
    request: PrepareRequest,
    setups: Sequence[SourceSetup],
    inputs: Sequence[SourceInput],
    *,
    large_body: bool = False,
    **options: Any,
) -> tuple[Assembly, ModelContext]:
    """``engine.run_assembly(request, setups, inputs, **options)``: in a worker thread for a
    large request (``large_body``: its body was over ``LARGE_BYTES``), on the loop otherwise."""
    if large_body or _text_chars(inputs) > LARGE_BYTES:
        return await asyncio.to_thread(run_assembly, request, setups, inputs, **options)
    return run_assembly(request, setups, inputs, **options)


def _text_chars(inputs: Sequence[SourceInput]) -> int:
    # Within max_blocks blocks: a short loop.
    return sum(len(block.text) for source in inputs for block in source.blocks)
