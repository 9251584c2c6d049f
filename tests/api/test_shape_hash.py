"""The request shape hash refresh compares (preparations/shape.py): what it covers and ignores.

It must change when anything but history, input and render changes (a refresh of such a
request is ``prefix_changed``), must not change with those or with the order of object keys,
and must still recognise records stored with the first version of the hash.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembly.core.request import Block, Contribution, PrepareRequest
from context_assembly.preparations.shape import (
    BLOCK_FIELDS,
    CONTRIBUTION_FIELDS,
    SHAPE_V2,
    blocks_digest,
    same_shape,
    shape_hash,
    shape_hash_v1,
)
from hypothesis_budget import examples

WORDS = st.sampled_from(["alpha", "beta", "é", "日本", '"q"', "\\", "x" * 40])


def test_the_hash_covers_every_field_of_a_block_and_a_contribution() -> None:
    assert set(Block.model_fields) == set(BLOCK_FIELDS)
    assert len(BLOCK_FIELDS) == len(set(BLOCK_FIELDS))
    assert set(CONTRIBUTION_FIELDS) | {"blocks"} == set(Contribution.model_fields)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    blocks = [
        {
            "id": f"b{i}",
            "text": " ".join(draw(st.lists(WORDS, min_size=1, max_size=5))),
            "priority": draw(st.integers(-5, 5)),
            "protected": draw(st.booleans()),
            "dependencies": [f"notes/b{j}" for j in range(i) if draw(st.booleans())],
            "expires_at": draw(st.sampled_from([None, "2027-01-01T00:00:00Z"])),
            "projection": draw(st.sampled_from([None, "short"])),
        }
        for i in range(draw(st.integers(0, 4)))
    ]
    return {
        "model": "gpt-4o-mini",
        "instructions": draw(WORDS),
        "plugins": [{"name": "notes"}, {"name": "memory"}],
        "contributions": [
            {"source": "notes", "revision": draw(st.integers(0, 3)), "blocks": blocks}
        ],
        "assembly": {"source_token_limits": {"notes": 100, "memory": 50}},
        "scope": {"connector_accounts": {"a": "1", "b": "2"}},
        "tools": [{"name": "t", "parameters": {"type": "object", "properties": {"x": {}}}}],
        "history": [{"role": "user", "content": draw(WORDS)}],
        "input": [{"role": "user", "content": draw(WORDS)}],
    }


def _hash(body: dict[str, Any]) -> str:
    return shape_hash(PrepareRequest.model_validate(body))


def _reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(item) for item in value]
    return value


MUTATIONS = [
    ("instructions", lambda b: b.update(instructions=b["instructions"] + "!")),
    ("revision", lambda b: b["contributions"][0].update(revision=9)),
    ("contribution instructions", lambda b: b["contributions"][0].update(instructions="new")),
    ("source limit", lambda b: b["assembly"]["source_token_limits"].update(notes=101)),
    ("scope", lambda b: b["scope"]["connector_accounts"].update(a="9")),
    ("tool", lambda b: b["tools"][0]["parameters"].update(type="array")),
    ("a new block", lambda b: b["contributions"][0]["blocks"].append({"id": "new", "text": "t"})),
]
BLOCK_MUTATIONS = [
    ("text", lambda k: k.update(text=k["text"] + ".")),
    ("priority", lambda k: k.update(priority=k["priority"] + 1)),
    ("protected", lambda k: k.update(protected=not k["protected"])),
    ("dependencies", lambda k: k.update(dependencies=[*k["dependencies"], "memory/x"])),
    ("expiry", lambda k: k.update(expires_at="2028-01-01T00:00:00Z")),
    ("projection", lambda k: k.update(projection=(k["projection"] or "") + "+")),
    ("id", lambda k: k.update(id=k["id"] + "z")),
]


@settings(max_examples=examples(150), deadline=None)
@given(requests(), st.data())
def test_what_changes_the_hash_and_what_does_not(body: dict[str, Any], data: st.DataObject) -> None:
    original = _hash(body)
    assert original.startswith(SHAPE_V2)
    same = _reversed_keys(body)
    same["history"] = [*same["history"], {"role": "assistant", "content": "later"}]
    same["input"] = [{"role": "user", "content": "another question"}]
    same["render"] = "openai-chat"
    assert _hash(same) == original, "history, input, render and key order are not the shape"
    name, mutate = data.draw(st.sampled_from(MUTATIONS))
    changed = _reversed_keys(body)
    mutate(changed)
    assert _hash(changed) != original, name
    blocks = body["contributions"][0]["blocks"]
    if blocks:
        index = data.draw(st.integers(0, len(blocks) - 1))
        field, mutate_block = data.draw(st.sampled_from(BLOCK_MUTATIONS))
        changed = _reversed_keys(body)
        mutate_block(changed["contributions"][0]["blocks"][index])
        assert _hash(changed) != original, field


def test_records_stored_with_the_first_version_still_compare() -> None:
    """A record written before the second version keeps its hash; refresh compares in kind."""
    body: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "instructions": "Be exact.",
        "plugins": [{"name": "notes"}],
        "contributions": [{"source": "notes", "revision": 1, "blocks": [{"id": "a", "text": "x"}]}],
    }
    request = PrepareRequest.model_validate(body)
    stored_v1 = shape_hash_v1(request)
    assert stored_v1.startswith("sha256:")
    assert same_shape(request, stored_v1)
    assert same_shape(request, shape_hash(request))
    body["contributions"][0]["blocks"][0]["text"] = "y"
    edited = PrepareRequest.model_validate(body)
    assert not same_shape(edited, stored_v1)
    assert not same_shape(edited, shape_hash(request))


# Pinned: a stored record's shape hash is made of these digests, so their bytes never change.
GOLDEN_BLOCKS = (
    Block(
        id="a", text='Entry é 日本 "q" \\ \n', priority=-3, protected=True,
        dependencies=["memory/b"], expires_at="2026-12-04T00:00:00Z", projection="short",
    ),
    Block(id="b", text="plain"),
    Block.model_validate_json(b'{"projection":"p","text":"t","id":"c","priority":7}'),
)  # fmt: skip


def test_the_blocks_digest_is_pinned() -> None:
    assert blocks_digest(GOLDEN_BLOCKS).hex() == (
        "5f5c9430e00b135a54f4b846a40ce2f08b9961220e9fc8b8539488cb25798d30"
    )
    assert blocks_digest(()).hex() == (
        "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"
    )


def _reference_digest(blocks: Any) -> bytes:
    """The digest's definition: each block's fields read by name, in ``BLOCK_FIELDS`` order."""
    import hashlib

    import orjson

    rows = [tuple(getattr(b, name) for name in BLOCK_FIELDS) for b in blocks]
    return hashlib.sha256(orjson.dumps(rows)).digest()


@st.composite
def blocks(draw: st.DrawFn) -> Block:
    fields: dict[str, Any] = {"id": draw(WORDS), "text": draw(st.text(max_size=30))}
    if draw(st.booleans()):
        fields["priority"] = draw(st.integers(-(2**63), 2**63 - 1))
    if draw(st.booleans()):
        fields["protected"] = draw(st.booleans())
    if draw(st.booleans()):
        fields["dependencies"] = draw(st.lists(WORDS, max_size=3))
    if draw(st.booleans()):
        fields["expires_at"] = draw(st.sampled_from([None, "2026-12-04T00:00:00Z"]))
    if draw(st.booleans()):
        fields["projection"] = draw(st.one_of(st.none(), WORDS))
    how = draw(st.sampled_from(["validate", "construct", "copy", "json"]))
    if how == "construct":
        return Block.model_construct(**fields)
    block = Block.model_validate(fields)
    if how == "copy":
        return block.model_copy(update={"text": block.text + "!"})
    if how == "json":
        return Block.model_validate_json(block.model_dump_json())
    return block


@settings(max_examples=examples(200), deadline=None)  # the first example may be slow (cold)
@given(st.lists(blocks(), max_size=6))
def test_the_blocks_digest_reads_every_field_in_order(items: list[Block]) -> None:
    """However a block was made (validated, constructed, copied, parsed), its digest is the
    digest's definition over its fields by name."""
    assert blocks_digest(items) == _reference_digest(items)
