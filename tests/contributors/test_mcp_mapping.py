"""The MCP mapping rules on the SDK's own result types (``mcp_types``): priorities, ids,
expiry, revisions, binary contents, structured results."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from mcp_types import (
    Annotations,
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ReadResourceResult,
    Resource,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from context_assembly.contributors.mcp import fill_arguments, latest_user_text
from context_assembly.contributors.mcp_mapping import (
    MAX_TTL_MS,
    TTL_REVISION,
    Mapped,
    Skipped,
    add_resource,
    add_tool_result,
    block_priority,
    resource_revision,
    source_revision,
    uri_id,
)
from context_assembly.core.blocks import MAX_ID_CHARS
from context_assembly.core.request import Message, TextPart

NOW_MS = int(datetime(2026, 12, 1, 7, 0, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("priority", "expected"),
    [(None, 0), (0.0, -1000), (0.25, -500), (0.5, 0), (0.9, 800), (1.0, 1000), (0.0004, -999)],
)
def test_priority_scales_linearly_onto_the_block_range(
    priority: float | None, expected: int
) -> None:
    """MCP's 0..1 maps to −1000..1000 through 0.5 → 0; no priority is the neutral 0."""
    annotations = None if priority is None else Annotations(priority=priority)
    assert block_priority(annotations) == expected


def test_a_long_uri_is_cut_to_a_block_id_that_stays_unique() -> None:
    """URIs past the id limit keep their start and end in a hash of the whole URI."""
    first, second = "docs://" + "a" * 300 + "/1", "docs://" + "a" * 300 + "/2"
    assert uri_id("docs://short") == "docs://short"
    assert len(uri_id(first)) == MAX_ID_CHARS
    assert uri_id(first) != uri_id(second)


def test_a_time_to_live_becomes_the_blocks_expiry_at_the_revision_that_defines_it() -> None:
    """On a session of revision 2026-07-28, a read with ``ttlMs`` above 0 gives its blocks
    ``expires_at`` = now + ttl (RFC 3339, UTC), at most ``MAX_TTL_MS`` away (10^20 ms included);
    ``ttlMs`` 0 (do not cache) and an absent one give none. At the handshake revisions a
    server's ``ttlMs`` is not the protocol's: 1 ms gives no expiry either."""
    contents = [TextResourceContents(uri="docs://a", text="A")]
    longest = datetime.fromtimestamp((NOW_MS + MAX_TTL_MS) / 1000, tz=UTC)
    for result, version, expected in [
        (
            ReadResourceResult(contents=contents, ttl_ms=90_000),
            TTL_REVISION,
            "2026-12-01T07:01:30.000Z",
        ),
        (
            ReadResourceResult(contents=contents, ttl_ms=10**20),
            TTL_REVISION,
            longest.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        ),
        (ReadResourceResult(contents=contents, ttl_ms=0), TTL_REVISION, None),
        (
            ReadResourceResult.model_validate({"contents": [{"uri": "docs://a", "text": "A"}]}),
            TTL_REVISION,
            None,
        ),
        (ReadResourceResult(contents=contents, ttl_ms=1), "2025-11-25", None),
        (ReadResourceResult(contents=contents, ttl_ms=10**20), "2024-11-05", None),
    ]:
        mapped = Mapped()
        add_resource(mapped, result, None, NOW_MS, version)
        assert [b.expires_at for b in mapped.blocks] == [expected], (result.ttl_ms, version)
    assert MAX_TTL_MS == 30 * 24 * 3600 * 1000


def test_integers_beyond_64_bits_are_kept_in_ids_revisions_and_structured_text() -> None:
    """A server's JSON may hold integers beyond 64 bits (in ``_meta``, in ``structuredContent``):
    the revision hash and the structured block take them as they are."""
    big = 10**30
    read = ReadResourceResult.model_validate(
        {"contents": [{"uri": "docs://a", "text": "A", "_meta": {"n": big}}]}
    )
    assert resource_revision(None, read).startswith("sha256:")
    mapped = Mapped()
    add_tool_result(mapped, "lookup", CallToolResult(content=[], structured_content={"n": big}))
    assert [b.text for b in mapped.blocks] == [f'{{"n":{big}}}']


def test_binary_contents_are_skipped_with_their_size_never_text() -> None:
    """A blob content, an image or audio item, or an embedded blob is a skipped item with the
    reason ``binary_content`` and its decoded size; the text contents beside it are blocks."""
    mapped = Mapped()
    read = ReadResourceResult(
        contents=[
            TextResourceContents(uri="docs://a", text="A"),
            BlobResourceContents(uri="docs://a.png", blob="iVBORw0KGgo=", mime_type="image/png"),
        ]
    )
    add_resource(mapped, read, Annotations(priority=1.0), NOW_MS, "2025-11-25")
    result = CallToolResult(
        content=[
            AudioContent(data="AAAA", mime_type="audio/wav"),
            EmbeddedResource(resource=BlobResourceContents(uri="docs://b.bin", blob="AA==")),
        ]
    )
    add_tool_result(mapped, "search", result)
    assert [(b.id, b.text, b.priority) for b in mapped.blocks] == [("docs://a", "A", 1000)]
    assert [(s.id, s.reason, s.mime_type, s.size) for s in mapped.skipped] == [
        ("docs://a.png", "binary_content", "image/png", 8),
        (mapped.skipped[1].id, "binary_content", "audio/wav", 3),
        ("docs://b.bin", "binary_content", None, 1),
    ]
    assert mapped.skipped[1].id.startswith("search#")
    assert all(isinstance(s, Skipped) for s in mapped.skipped)


def test_tool_items_for_the_user_only_are_left_out_and_links_returned() -> None:
    """An item whose audience is only the user is no block; links are handed back for reading."""
    link = ResourceLink(uri="docs://linked", name="linked")
    result = CallToolResult(
        content=[
            TextContent(text="for the model", annotations=Annotations(audience=["assistant"])),
            TextContent(text="for the person", annotations=Annotations(audience=["user"])),
            link,
        ]
    )
    mapped = Mapped()
    assert add_tool_result(mapped, "search", result) == [link]
    assert [b.text for b in mapped.blocks] == ["for the model"]


def test_the_same_item_twice_is_one_block() -> None:
    """Ids are the items' hashes: an item repeated is one block, as is a URI read twice."""
    result = CallToolResult(content=[TextContent(text="same"), TextContent(text="same")])
    mapped = Mapped()
    add_tool_result(mapped, "search", result)
    add_tool_result(mapped, "search", result)
    assert len(mapped.blocks) == 1


def test_revisions_prefer_last_modified_and_hash_contents_otherwise() -> None:
    """A listed ``lastModified`` is the resource's revision; without it the contents' hash is,
    changing with the text; the source's revision does not depend on the order of resources."""
    listed = Resource(
        uri="docs://a", name="a", annotations=Annotations(last_modified="2026-11-02T10:00:00Z")
    )
    one = ReadResourceResult(contents=[TextResourceContents(uri="docs://a", text="one")])
    two = ReadResourceResult(contents=[TextResourceContents(uri="docs://a", text="two")])
    assert resource_revision(listed, one) == "2026-11-02T10:00:00Z"
    assert resource_revision(None, one) != resource_revision(None, two)
    assert source_revision({"a": "1", "b": "2"}) == source_revision({"b": "2", "a": "1"})
    assert source_revision({"a": "1"}) != source_revision({"a": "2"})


def test_tool_arguments_take_the_latest_user_text() -> None:
    """``{input}`` in every string of the template, nested too, is the last user message's
    text (its text parts joined by lines); other values pass as they are."""
    messages = [
        Message(role="user", content="old question"),
        Message(role="assistant", content="an answer"),
        Message(
            role="user",
            content=[TextPart(type="text", text="new"), TextPart(type="text", text="question")],
        ),
    ]
    text = latest_user_text(messages)
    assert text == "new\nquestion"
    template = {"query": "q: {input}", "top_k": 8, "filters": [{"text": "{input}"}]}
    assert fill_arguments(template, text) == {
        "query": "q: new\nquestion",
        "top_k": 8,
        "filters": [{"text": "new\nquestion"}],
    }
    assert latest_user_text([]) == ""
