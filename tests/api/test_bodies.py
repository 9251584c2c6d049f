"""Request bodies (api/bodies.py): parsed from the raw bytes with ``model_validate_json``, every
problem one named ``CONTEXT_ASSEMBLY_INVALID``, the tenant resolved before the body."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from api_support import KEYS, AppFactory, basic_request

from context_assembly.api import bodies
from context_assembly.offload import parse_body


@pytest.mark.parametrize(
    ("headers", "content", "needle"),
    [
        ({"content-type": "text/plain"}, b"{}", "must be JSON"),
        ({}, b"{}", "must be JSON"),
        ({"content-type": "application/json"}, b"", "Field required"),
        ({"content-type": "application/json"}, b"[1, 2]", "(body)"),
        ({"content-type": "application/json; charset=utf-8"}, b'{"model": 5}', "model"),
    ],
)
def test_bad_bodies_are_named_problems(
    make_client: AppFactory, headers: dict[str, str], content: bytes, needle: str
) -> None:
    client = make_client()
    response = client.post("/v1/prepare", content=content, headers=headers)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == "CONTEXT_ASSEMBLY_INVALID"
    assert needle in body["detail"]


def test_bodies_are_parsed_from_the_raw_bytes(
    make_client: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every body-taking route hands the bytes as sent to ``offload.parse_body`` (which ends in
    ``model_validate_json``), not a parsed Python value."""
    client = make_client()
    seen: list[tuple[str, bytes]] = []
    original = parse_body

    def spy(model: Any, raw: bytes) -> Any:
        seen.append((model.__name__, raw))
        return original(model, raw)

    monkeypatch.setattr(bodies, "parse_body", spy)
    raw = orjson.dumps(basic_request())
    headers = {"content-type": "application/json"}
    prep = client.post("/v1/prepare", content=raw, headers=headers).json()
    validate = orjson.dumps({"model": prep["model"], "frame": prep["frame"]})
    path = f"/v1/preparations/{prep['preparation_id']}"
    assert client.post("/v1/budget", content=raw, headers=headers).status_code == 200
    assert client.post(f"{path}/validate", content=validate, headers=headers).status_code == 200
    usage = orjson.dumps({"report_id": "r1", "provider": "openai", "usage": {}})
    client.post(f"{path}/usage", content=usage, headers=headers)
    assert seen == [
        ("PrepareRequest", raw),
        ("PrepareRequest", raw),
        ("ValidateRequest", validate),
        ("UsageRequest", usage),
    ]


def test_an_integer_beyond_64_bits_stays_an_integer(make_client: AppFactory) -> None:
    """Read from the bytes, a huge integer is refused as a number out of range, never turned
    into a float first."""
    client = make_client()
    body = orjson.dumps(basic_request()).replace(
        b"{", b'{"response_reserve":' + b"9" * 30 + b",", 1
    )
    response = client.post(
        "/v1/prepare", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert "response_reserve" in response.json()["detail"]


def test_vendor_json_media_type_is_accepted(make_client: AppFactory) -> None:
    """``application/*+json`` is JSON, as FastAPI accepts it."""
    client = make_client()
    response = client.post(
        "/v1/prepare",
        content=orjson.dumps(basic_request()),
        headers={"content-type": "application/vnd.example+json"},
    )
    assert response.status_code == 200, response.text


def test_missing_key_is_401_before_a_bad_body(make_client: AppFactory) -> None:
    """The tenant is resolved first: without a key the answer is 401 even for a broken body."""
    client = make_client(auth=True)
    response = client.post(
        "/v1/prepare", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 401, response.text
    key = next(iter(KEYS.values()))
    ok = client.post("/v1/prepare", json=basic_request(), headers={"x-api-key": key})
    assert ok.status_code == 200, ok.text


def test_lifecycle_answers_are_their_models_json(make_client: AppFactory) -> None:
    """validate, repair and usage answer their response models' JSON."""
    client = make_client()
    request = basic_request()
    prep = client.post("/v1/prepare", json=request).json()
    path = f"/v1/preparations/{prep['preparation_id']}"
    answer = client.post(f"{path}/validate", json={"model": prep["model"], "frame": prep["frame"]})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["valid"] is True
    assert answer.json()["preparation_id"] == prep["preparation_id"]
    repair = client.post(
        f"{path}/repair",
        json={
            "model": prep["model"],
            "instructions": request["instructions"],
            "frame": prep["frame"],
            "answer": "yes",
            "schema": {},
        },
    )
    assert repair.status_code == 200, repair.text
    assert set(repair.json()) == {"preparation_id", "frame", "estimated_input_tokens"}
