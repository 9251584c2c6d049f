"""How an MCP server's answers become blocks, revisions and skipped items (no I/O, no clock).

docs/contributors.md states the mapping for users; in short:

- each text content of a read resource is one block, its id the content's URI;
- each text item of a tool result is one block, its id ``<tool>#<hash>`` (a short hash of the
  item), except that a result with ``structuredContent`` is one block of that JSON (its text
  items are the same data serialised, as the protocol asks servers to send them);
- an embedded text resource in a tool result is a block with the resource's URI as id; a
  ``resource_link`` is read by the caller within the same deadline and mapped like a resource;
- ``annotations.priority`` (0 to 1) scales linearly to the block range, 0 → −1000, 0.5 → 0,
  1 → 1000; no priority is 0, like a webhook block without one;
- an item whose ``annotations.audience`` is set without ``"assistant"`` is meant for the user
  only and does not become a block;
- a result's ``ttlMs`` above 0 becomes the blocks' ``expires_at`` on a session of a revision
  that defines it (2026-07-28 on); at the handshake revisions the service speaks a server's
  ``ttlMs`` is not the protocol's and is ignored. It is clamped to ``MAX_TTL_MS``;
- binary contents (blobs, images, audio) never become text: each is a :class:`Skipped` item
  with the reason ``binary_content``, which the manifest reports as an omitted item.

A resource's revision is its ``annotations.lastModified`` from the listing, else a hash of its
contents; the source's revision is a hash of its resources' revisions (tool results are not in
it: validate re-reads resources, not tools).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson
import pydantic_core
from mcp_types import (
    Annotations,
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ReadResourceResult,
    Resource,
    ResourceLink,
    TextContent,
    TextResourceContents,
)
from mcp_types.version import is_version_at_least

from context_assembly.core.blocks import MAX_ID_CHARS, MAX_PRIORITY
from context_assembly.core.request import Block
from context_assembly.core.sources import SkipReason

HASH_CHARS: Final = 12  # hex digits of an item hash in a block id (48 bits: ids within one answer)
TTL_REVISION: Final = "2026-07-28"
"""The first protocol revision whose results carry ``ttlMs``."""
MAX_TTL_MS: Final = 30 * 24 * 3600 * 1000
"""The longest lifetime a ``ttlMs`` gives blocks: 30 days, the longest a preparation is kept."""


@dataclass(frozen=True, slots=True)
class Skipped:
    """An item that did not become a block: its id, why, its media type and its size in bytes
    (of the decoded content, from the base64 length)."""

    id: str
    reason: SkipReason
    mime_type: str | None
    size: int


@dataclass(slots=True)
class Mapped:
    """The blocks and skipped items of one source, in answer order; a later item with an id
    already taken is dropped (a resource read both as pinned and through a link, say)."""

    blocks: list[Block] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    _ids: set[str] = field(default_factory=set)

    def _claim(self, block_id: str) -> bool:
        if block_id in self._ids:
            return False
        self._ids.add(block_id)
        return True

    def block(
        self, block_id: str, text: str, annotations: Annotations | None, expires_at: str | None
    ) -> None:
        if self._claim(block_id):
            self.blocks.append(
                Block(
                    id=block_id,
                    text=text,
                    priority=block_priority(annotations),
                    expires_at=expires_at,
                )
            )

    def skip(self, block_id: str, mime_type: str | None, data: str) -> None:
        if self._claim(block_id):
            size = len(data) * 3 // 4 - data[-2:].count("=")  # the decoded size of base64
            self.skipped.append(Skipped(block_id, "binary_content", mime_type, size))


def block_priority(annotations: Annotations | None) -> int:
    """MCP's ``priority`` (0 to 1) scaled to −1000..1000; absent: 0."""
    if annotations is None or annotations.priority is None:
        return 0
    return round((annotations.priority * 2 - 1) * MAX_PRIORITY)


def for_assistant(annotations: Annotations | None) -> bool:
    """Whether an item may go to the model: no audience given, or one naming the assistant."""
    return (
        annotations is None or annotations.audience is None or "assistant" in annotations.audience
    )


def listed_for_assistant(annotations: Annotations | None) -> bool:
    """``resources = "listed"`` keeps the resources whose audience names the assistant."""
    return annotations is not None and "assistant" in (annotations.audience or ())


def compact_json(value: Any, *, sort_keys: bool = False) -> bytes:
    """``value`` as compact JSON. A server's JSON may hold integers beyond 64 bits, which orjson
    refuses: such a value is written by pydantic-core instead (a number beyond a float's range
    as ``null``, as orjson writes it)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except orjson.JSONEncodeError:
        return pydantic_core.to_json(
            _keys_sorted(value) if sort_keys else value, inf_nan_mode="null"
        )


def _keys_sorted(value: Any) -> Any:
    if isinstance(value, list):
        return [_keys_sorted(item) for item in value]
    if isinstance(value, dict):
        return {key: _keys_sorted(value[key]) for key in sorted(value)}
    return value


def _digest(value: Any) -> str:
    return hashlib.sha256(compact_json(value, sort_keys=True)).hexdigest()


def uri_id(uri: str) -> str:
    """A resource's block id: its URI; one longer than a block id may be is cut, with a hash of
    the whole URI after ``#`` so that two long URIs stay apart."""
    if len(uri) <= MAX_ID_CHARS:
        return uri
    suffix = "#" + _digest(uri)[:HASH_CHARS]
    return uri[: MAX_ID_CHARS - len(suffix)] + suffix


def item_id(tool: str, item: Any) -> str:
    """A tool result item's block id: ``<tool>#<hash of the item's JSON>``."""
    return uri_id(f"{tool}#{_digest(item)[:HASH_CHARS]}")


def expiry(result: ReadResourceResult, now_ms: int, protocol_version: str) -> str | None:
    """``expires_at`` of a read's blocks: now plus the result's ``ttlMs`` (at most
    ``MAX_TTL_MS``) when the server gave one above 0 on a session of a revision that defines it
    (0, the protocol's "do not cache", an absent value and any value at an earlier revision give
    no expiry)."""
    if not is_version_at_least(protocol_version, TTL_REVISION):
        return None
    if "ttl_ms" not in result.model_fields_set or result.ttl_ms <= 0:
        return None
    moment = datetime.fromtimestamp((now_ms + min(result.ttl_ms, MAX_TTL_MS)) / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def resource_revision(listed: Resource | None, result: ReadResourceResult | None) -> str:
    """A resource's revision: ``lastModified`` from its listing, else a hash of its contents."""
    if listed is not None and listed.annotations is not None and listed.annotations.last_modified:
        return listed.annotations.last_modified
    assert result is not None, "a resource without lastModified is read to hash it"
    return (
        "sha256:"
        + _digest([item.model_dump(mode="json", by_alias=True) for item in result.contents])[:32]
    )


def needs_read_for_revision(listed: Resource | None) -> bool:
    """Whether a resource's revision needs its contents (it has no ``lastModified``)."""
    return not (
        listed is not None and listed.annotations is not None and listed.annotations.last_modified
    )


def source_revision(revisions: Mapping[str, str]) -> str:
    """The source's revision: a hash of its resources' revisions by URI (constant without any)."""
    return "mcp:" + _digest(sorted(revisions.items()))[:32]


def add_resource(
    mapped: Mapped,
    result: ReadResourceResult,
    annotations: Annotations | None,
    now_ms: int,
    protocol_version: str,
) -> None:
    """One block per text content of a read resource (read on a session of
    ``protocol_version``); each binary content skipped."""
    expires_at = expiry(result, now_ms, protocol_version)
    for content in result.contents:
        if isinstance(content, TextResourceContents):
            mapped.block(uri_id(content.uri), content.text, annotations, expires_at)
        elif isinstance(content, BlobResourceContents):
            mapped.skip(uri_id(content.uri), content.mime_type, content.blob)


def add_tool_result(mapped: Mapped, tool: str, result: CallToolResult) -> list[ResourceLink]:
    """The blocks of a tool result (see the module docstring); returns its resource links, for
    the caller to read."""
    links: list[ResourceLink] = []
    structured = result.structured_content is not None
    if structured:
        text = compact_json(result.structured_content).decode()
        mapped.block(item_id(tool, result.structured_content), text, None, None)
    for item in result.content:
        if not for_assistant(item.annotations):
            continue
        if isinstance(item, TextContent):
            if not structured:
                mapped.block(item_id(tool, item.text), item.text, item.annotations, None)
        elif isinstance(item, ImageContent | AudioContent):
            mapped.skip(item_id(tool, item.data), item.mime_type, item.data)
        elif isinstance(item, EmbeddedResource):
            resource = item.resource
            if isinstance(resource, TextResourceContents):
                mapped.block(uri_id(resource.uri), resource.text, item.annotations, None)
            else:
                mapped.skip(uri_id(resource.uri), resource.mime_type, resource.blob)
        elif isinstance(item, ResourceLink):
            links.append(item)
    return links


def unread_links(links: Sequence[ResourceLink], read: set[str]) -> list[ResourceLink]:
    """The links to read: each URI once, none already read."""
    chosen: list[ResourceLink] = []
    for link in links:
        if link.uri not in read:
            read.add(link.uri)
            chosen.append(link)
    return chosen
