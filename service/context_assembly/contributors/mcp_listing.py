"""An MCP server's ``resources/list`` answers: bounded, validated off the event loop, and chosen
from.

A listing holds at most ``MAX_LISTING_RESOURCES`` resources over its pages (more is
``too_large``); a large page is counted before it is parsed (:func:`listing_screen`), and a page
of many resources is validated in a worker thread, a chunk at a time, so that the event loop
serves the other requests meanwhile (:func:`listing_page`). With ``resources = "listed"`` the
resources meant for the assistant are read, the first ``MAX_LISTED_RESOURCES`` by priority, then
URI (:func:`listed_off_loop`). The pages are asked for by the endpoint (``mcp.py``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any, Final

from mcp_types import ListResourcesResult, Resource
from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from context_assembly.contributors.mcp_exchange import McpFailure, ReadInFull, Screen, parse_result
from context_assembly.contributors.mcp_mapping import listed_for_assistant
from context_assembly.core.sources import SourceFailure

MAX_LIST_PAGES: Final = 16
"""``resources/list`` pages read at most (a server that pages forever cannot hold a call)."""
MAX_LISTED_RESOURCES: Final = 64
"""Resources read at most with ``resources = "listed"``: the first by priority, then URI."""
MAX_LISTING_RESOURCES: Final = 4096
"""Resources one ``resources/list`` may hold over all its pages; a listing of more is
``too_large`` (validating and sorting it would hold the process for the other requests)."""
SKIM_BYTES: Final = 64 * 1024
"""A listing page at least this large is counted (a skim that builds no resource) before it is
parsed; a smaller one cannot hold enough resources to matter."""
VALIDATE_CHUNK: Final = 256
"""Listed resources validated at once: a page of more is validated in a worker thread, a chunk
at a time (pydantic holds the GIL while it validates; between chunks the loop gets it)."""


class _Empty(TypedDict, total=False):
    """A listed resource, none of its fields read."""


class _SkimResult(TypedDict, total=False):
    resources: list[_Empty]


class _Skim(TypedDict, total=False):
    result: _SkimResult


_SKIM: Final = TypeAdapter(_Skim)
_RESOURCES: Final = TypeAdapter(list[Resource])


def _listed(listing: Mapping[str, Resource]) -> list[str]:
    """The listed resources meant for the assistant, by priority (highest first), then URI, at
    most ``MAX_LISTED_RESOURCES``."""
    kept = [r for r in listing.values() if listed_for_assistant(r.annotations)]
    kept.sort(key=lambda r: (-(r.annotations.priority or 0.0) if r.annotations else 0.0, r.uri))
    return [r.uri for r in kept[:MAX_LISTED_RESOURCES]]


async def listed_off_loop(listing: Mapping[str, Resource]) -> list[str]:
    """:func:`_listed`, in a worker thread for a listing of many resources."""
    if len(listing) <= VALIDATE_CHUNK:
        return _listed(listing)
    return await asyncio.to_thread(_listed, listing)


def _too_many() -> McpFailure:
    return ReadInFull(
        "too_large",
        SourceFailure(
            "too_large", f"the listing holds more than {MAX_LISTING_RESOURCES} resources"
        ),
    )


def listing_screen(room: int) -> Screen:
    """Count a large listing page's resources before it is parsed: a page of more than
    ``room`` is ``too_large`` at a small fraction of the parse's cost."""

    def screen(raw: bytes) -> None:
        # Every resource names its "uri": fewer such keys than ``room`` (the common case) need
        # no skim. A key written with escapes escapes this count, not the one after the parse.
        if len(raw) < SKIM_BYTES or raw.count(b'"uri"') <= room:
            return
        try:
            skim = _SKIM.validate_json(raw)
        except ValidationError:
            return  # the parse names the problem
        if len(skim.get("result", {}).get("resources", ())) > room:
            raise _too_many()

    return screen


async def listing_page(data: dict[str, Any], room: int) -> ListResourcesResult:
    """One ``resources/list`` result validated: on the loop when it lists few resources, else
    in a worker thread, a chunk at a time, given up once the call no longer waits for it."""
    entries = data.get("resources")
    if isinstance(entries, list) and len(entries) > room:
        raise _too_many()
    if not isinstance(entries, list) or len(entries) <= VALIDATE_CHUNK:
        return parse_result(ListResourcesResult, data)
    abandoned = threading.Event()
    try:
        return await asyncio.to_thread(_validate_listing, data, entries, abandoned)
    finally:
        abandoned.set()  # the deadline or another failure: the thread stops at its next chunk


def _validate_listing(
    data: dict[str, Any], entries: list[Any], abandoned: threading.Event
) -> ListResourcesResult:
    """``ListResourcesResult`` of ``data``, its resources validated ``VALIDATE_CHUNK`` at a
    time; an invalid page is validated again whole, for the failure's exact path."""
    page = parse_result(ListResourcesResult, {**data, "resources": []})
    resources: list[Resource] = []
    for start in range(0, len(entries), VALIDATE_CHUNK):
        if abandoned.is_set():
            raise McpFailure.of("timeout", "timeout", "deadline reached")
        try:
            resources += _RESOURCES.validate_python(entries[start : start + VALIDATE_CHUNK])
        except ValidationError:
            return parse_result(ListResourcesResult, data)
    return page.model_copy(update={"resources": resources})
