"""Large requests off the event loop: their parsing and their token counting in a worker thread,
their block and message counts refused before any model is built.

Counting a few megabytes of text with tiktoken takes a second or more; on the event loop it would
hold every other request (``/healthz`` included) that long. tiktoken releases the GIL while it
encodes, so the assembly of a large request runs in a worker thread (``asyncio.to_thread``: the
loop's default executor, a bounded pool) while the loop keeps serving. Small requests, nearly all
of them, are parsed and assembled on the loop, where they take well under a millisecond: a thread
hop would only add to their latency.

A request is large when its body is over ``LARGE_BYTES`` (the route says so: ``large_body``,
from ``api.bodies.large_body``) or when the block text of its sources is over ``LARGE_BYTES``
characters (``run_assembly_async`` adds up the blocks it is given, the contributors' answers
included).

A large body is parsed in a worker thread too (``api.bodies.json_body``): its provider-shaped
messages are read into the neutral shape there, and its messages validated; so are the hashes
and dumps of a large prepare's answer and record (``off_loop``). pydantic-core holds the GIL
for the whole of each call, so the loop gets it back only between the steps that return to
Python: the messages are validated about ``core.request._CHUNK`` items (messages, content parts,
tool calls) a call, and a body's longest single step is the decoding of its JSON, which grows
with the number of values it holds (bounded by ``limits.max_body_bytes``).

What must be refused is refused first: a large body with more blocks than any request may have
(``MOST_BLOCKS``, ``AssemblyOptions.max_blocks``' upper bound) or more messages
(``core.request.MAX_MESSAGES``) is counted by a skim (``_skim``) that builds none of them, with
the standard library's decoder, which returns to Python at every object and number (so the loop
is not held while a body of many small values is counted), and refused at a fraction of the full
parse's cost. Any body the skim cannot read goes on to the full parse, which names the problem
(and counts the messages again: a small body is not skimmed).
"""

from __future__ import annotations

import asyncio

# The standard library's decoder, on purpose, for the skim alone (``_skim``): it calls back into
# Python for each object and number, where orjson and pydantic-core hold the interpreter's lock
# for the whole body.
import json  # noqa: TID251
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from pydantic import BaseModel

from context_assembly.core.assemble import Assembly
from context_assembly.core.request import CONVERSATION, PrepareRequest, too_many_messages
from context_assembly.core.sources import SourceInput, SourceSetup
from context_assembly.engine import ModelContext, run_assembly
from context_assembly.errors import InvalidError
from context_assembly.validation import invalid_from_errors, parse_model

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

LARGE_BYTES = 256 * 1024
MOST_BLOCKS = 2048


# The members of the body's objects the skim keeps (every other member is dropped as it is read):
# the blocks are ``contributions[].blocks``, the messages ``history`` and ``input``.
_SKIMMED: Final = frozenset({"contributions", "blocks", *CONVERSATION})
_DROPPED: Final[dict[str, Any]] = {}


def _kept(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return {key: value for key, value in pairs if key in _SKIMMED} or _DROPPED


def _number(text: str) -> int:
    return 0  # counted, never read


def _skim(raw: bytes) -> dict[str, int]:
    """The counts of ``raw``: ``{"blocks": ..., "history": ..., "input": ...}`` (a field that is
    not a list is not counted); empty when the standard library does not read ``raw`` as a JSON
    object (the full parse then names the problem).

    Read by the standard library's JSON decoder, which calls back into Python for every object
    and number (``_kept``, ``_number``): the interpreter may hand its lock to the event loop at
    each call, so a body of many small values does not hold the loop while it is counted, as
    pydantic-core, which holds the lock from the first byte to the last, would."""
    try:
        body = json.loads(
            raw,
            object_pairs_hook=_kept,
            parse_int=_number,
            parse_float=_number,
            parse_constant=_number,
        )
    except (ValueError, RecursionError):
        return {}
    if not isinstance(body, dict):
        return {}
    contributions = body.get("contributions")
    counts = {
        "blocks": sum(
            len(c["blocks"])
            for c in contributions
            if isinstance(c, dict) and isinstance(c.get("blocks"), list)
        )
        if isinstance(contributions, list)
        else 0
    }
    counts |= {
        field: len(body[field]) for field in CONVERSATION if isinstance(body.get(field), list)
    }
    return counts


def parse_body(model: type[M], raw: bytes) -> M:
    """``raw`` parsed into ``model`` (``validation.parse_model``); a large body is first skimmed
    for its block and message counts.

    Raises:
        InvalidError: the body has more than ``MOST_BLOCKS`` blocks or ``MAX_MESSAGES``
            messages, or does not parse.
    """
    if len(raw) > LARGE_BYTES:
        counts = _skim(raw)
        blocks = counts.pop("blocks", 0)
        if blocks > MOST_BLOCKS:
            raise InvalidError(
                f"{blocks} blocks in this preparation, over {MOST_BLOCKS}, the most that "
                "max_blocks allows",
                field="max_blocks",
            )
        over = too_many_messages(counts)
        if over is not None:  # as the full parse says it
            errors = over.errors(include_url=False, include_input=False)
            raise invalid_from_errors(errors, model=model) from None
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
    if large_body or large_inputs(inputs):
        return await asyncio.to_thread(run_assembly, request, setups, inputs, **options)
    return run_assembly(request, setups, inputs, **options)


def large_inputs(inputs: Sequence[SourceInput]) -> bool:
    """Whether the block text of ``inputs`` is over ``LARGE_BYTES`` characters (the assembly of
    a request with them runs in a worker thread)."""
    return _text_chars(inputs) > LARGE_BYTES


async def off_loop(work: Callable[[], T], large: bool) -> T:
    """``work()``: in a worker thread when ``large`` (the request's body or block text was), on
    the loop otherwise."""
    if large:
        return await asyncio.to_thread(work)
    return work()


def _text_chars(inputs: Sequence[SourceInput]) -> int:
    # Within max_blocks blocks: a short loop.
    return sum(len(block.text) for source in inputs for block in source.blocks)
