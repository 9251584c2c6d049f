"""Free-form JSON the service could not encode again is a named 422, never a 500; so is a typed
integer beyond 64 bits (a revision, a block's priority).

Tool schemas, tool-call arguments, opaque parts, whiteboard values, repair schemas and usage
objects are carried as given; the service serialises them again to count, hash, render and
store, and an integer beyond 64 bits cannot be. Unchecked, it would fail deep inside as
``INTERNAL`` (500); the request is refused up front instead, naming the field.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from api_support import AppFactory, basic_request, neutral_frame

BIG = 2**70
INPUT = [{"role": "user", "content": "hi"}]


def _prepare(**fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "input": INPUT, **fields}


PREPARE_CASES = [
    ("tools.0.parameters", _prepare(tools=[{"name": "t", "parameters": {"maximum": BIG}}])),
    (
        "history.0.tool_calls.0.arguments",
        _prepare(
            history=[
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "c1", "name": "t", "arguments": {"x": [BIG]}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ]
        ),
    ),
    (
        "input.0.content.0.opaque",
        _prepare(input=[{"role": "user", "content": [{"type": "opaque", "data": BIG}]}]),
    ),
    (
        "whiteboard.entries.0.value",
        _prepare(
            plugins=[{"name": "wb"}],
            whiteboard={"source": "wb", "entries": [{"key": "k", "value": {"n": -BIG}}]},
        ),
    ),
]


@pytest.mark.parametrize("render", ["neutral", "anthropic"])
@pytest.mark.parametrize(("field", "body"), PREPARE_CASES, ids=[c[0] for c in PREPARE_CASES])
def test_prepare_and_budget_name_the_field(
    make_client: AppFactory, field: str, body: dict[str, Any], render: str
) -> None:
    client = make_client()
    for path in ("/v1/prepare", "/v1/budget"):
        response = client.post(path, json={**body, "render": render})
        assert response.status_code == 422, response.text
        problem = response.json()
        assert problem["code"] == "CONTEXT_ASSEMBLY_INVALID"
        assert problem["detail"].startswith(f"invalid request: {field}: JSON the service cannot")
        assert str(BIG) not in response.text  # the offending value is never echoed


def test_64_bit_integers_are_fine(make_client: AppFactory) -> None:
    body = _prepare(
        tools=[{"name": "t", "parameters": {"maximum": 2**63 - 1, "minimum": -(2**63)}}]
    )
    assert make_client().post("/v1/prepare", json=body).status_code == 200


def test_repair_schema_and_usage_object_name_the_field(make_client: AppFactory) -> None:
    client = make_client()
    prep = client.post("/v1/prepare", json=basic_request()).json()
    base = f"/v1/preparations/{prep['preparation_id']}"
    repair = client.post(
        f"{base}/repair",
        json={
            "model": "gpt-4o-mini",
            "instructions": basic_request()["instructions"],
            "frame": neutral_frame(prep),
            "answer": "x",
            "schema": {"type": "integer", "maximum": BIG},
        },
    )
    assert repair.status_code == 422, repair.text
    assert "schema" in repair.json()["detail"]
    usage = client.post(
        f"{base}/usage",
        json={"report_id": "r1", "provider": "openai", "usage": {"prompt_tokens": BIG}},
    )
    assert usage.status_code == 422, usage.text
    assert "usage" in usage.json()["detail"]


def _contribution(revision: int, priority: int = 0) -> dict[str, Any]:
    return _prepare(
        plugins=[{"name": "memory"}],
        contributions=[
            {
                "source": "memory",
                "revision": revision,
                "blocks": [{"id": "a", "text": "t", "priority": priority}],
            }
        ],
    )


TYPED_CASES = [
    ("contributions.0.revision", _contribution(BIG)),
    ("contributions.0.revision", _contribution(-(2**63) - 1)),
    ("contributions.0.blocks.0.priority", _contribution(1, priority=BIG)),
    ("contributions.0.blocks.0.priority", _contribution(1, priority=-BIG)),
]


@pytest.mark.parametrize(("field", "body"), TYPED_CASES)
def test_a_typed_integer_beyond_64_bits_is_a_named_422(
    make_client: AppFactory, field: str, body: dict[str, Any]
) -> None:
    """Found by a longer fuzz run: the revision went into the record and the priority into the
    blocks' digest, and orjson refused both (500)."""
    client = make_client()
    for path in ("/v1/prepare", "/v1/budget"):
        response = client.post(path, json=body)
        assert response.status_code == 422, response.text
        problem = response.json()
        assert problem["code"] == "CONTEXT_ASSEMBLY_INVALID"
        assert problem["detail"].startswith(f"invalid request: {field}: ")
        assert str(abs(BIG)) not in response.text


def test_a_64_bit_revision_prepares_and_a_64_bit_priority_meets_the_block_rule(
    make_client: AppFactory,
) -> None:
    client = make_client()
    for revision in (2**63 - 1, -(2**63)):
        response = client.post("/v1/prepare", json=_contribution(revision))
        assert response.status_code == 200, response.text
    response = client.post("/v1/prepare", json=_contribution(1, priority=2**63 - 1))
    assert response.status_code == 422
    assert "priority" in response.json()["detail"] and "-1000..1000" in response.json()["detail"]


# Raw JSON bodies: the JSON parser reads NaN, Infinity and 1e400 (a float overflow) as floats,
# which orjson would write back as null.
NON_FINITE = [
    ("tools.0.parameters", b'"tools":[{"name":"t","parameters":{"type":"object","x":NaN}}]'),
    (
        "whiteboard.entries.0.value",
        b'"plugins":[{"name":"wb"}],"whiteboard":{"source":"wb","entries":'
        b'[{"key":"k","value":[1e400,-Infinity]}]}',
    ),
]


def _raw(fields: bytes) -> bytes:
    return b'{"model":"gpt-4o-mini","input":[{"role":"user","content":"hi"}],' + fields + b"}"


@pytest.mark.parametrize(("field", "fields"), NON_FINITE, ids=[c[0] for c in NON_FINITE])
def test_non_finite_numbers_are_refused_not_written_as_null(
    make_client: AppFactory, field: str, fields: bytes
) -> None:
    """NaN or Infinity in a body is a 422 naming the field, never a 200 whose frame says
    ``"x": null`` where the caller sent it."""
    client = make_client()
    headers = {"content-type": "application/json"}
    response = client.post("/v1/prepare", content=_raw(fields), headers=headers)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail.startswith(f"invalid request: {field}: JSON the service cannot encode again")
    assert "NaN, Infinity" in detail


def test_a_null_that_was_sent_stays_a_null(make_client: AppFactory) -> None:
    """The check looks for non-finite floats only where the encoding holds a null."""
    body = _prepare(tools=[{"name": "t", "parameters": {"default": None, "x": [1.5, None]}}])
    assert make_client().post("/v1/prepare", json=body).status_code == 200


@pytest.mark.parametrize(
    "fields",
    [fields for _, fields in NON_FINITE]
    + [b'"tools":[{"name":"t","parameters":{"maximum":100000000000000000000000}}]'],
)
def test_the_cli_refuses_what_http_refuses(
    make_client: AppFactory,
    tmp_path: Any,
    capsysbinary: pytest.CaptureFixture[bytes],
    fields: bytes,
) -> None:
    """``context-assembly assemble`` reads a body as the service does: the same 422 (exit 2,
    the same problem detail), not a parse error of its own or a big integer read as a float."""
    from context_assembly.cli import main

    path = tmp_path / "request.json"
    path.write_bytes(_raw(fields))
    code = main(["assemble", str(path)])
    printed = orjson.loads(capsysbinary.readouterr().out)
    served = make_client().post(
        "/v1/prepare", content=_raw(fields), headers={"content-type": "application/json"}
    )
    assert code == 2 and served.status_code == 422
    assert printed["code"] == served.json()["code"] == "CONTEXT_ASSEMBLY_INVALID"
    assert printed["detail"] == served.json()["detail"]
