"""The edges of the contract in the OpenAPI document, built from the service's own code: the
problem codes (``ProblemCode``, from the error classes of ``errors.py``) and the contributor
protocol (``webhooks``, from ``contributors/packets.py``). The clients are generated from them,
or checked against them (tests/clients, clients/typescript/test)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest
from api_support import AppFactory

import context_assembly
from context_assembly.api.app import openapi_document
from context_assembly.contributors.calls import TIMEOUT_HEADER
from context_assembly.errors import PROBLEM_KINDS, ServiceError

DOCUMENT: dict[str, Any] = openapi_document()
SCHEMAS: dict[str, Any] = DOCUMENT["components"]["schemas"]
PROTOCOL = [
    ("contribute", "ContributePacket", "ContributorAnswer"),
    ("revision", "RevisionPacket", "RevisionAnswer"),
    ("summarize", "SummarizePacket", "SummaryAnswer"),
]


def every_error_class() -> set[type[ServiceError]]:
    """Every ``ServiceError`` class of the service, its modules all imported."""
    for module in pkgutil.walk_packages(context_assembly.__path__, "context_assembly."):
        importlib.import_module(module.name)
    found: set[type[ServiceError]] = set()
    pending: list[type[ServiceError]] = [ServiceError]
    while pending:
        kind = pending.pop()
        found.add(kind)
        pending.extend(kind.__subclasses__())
    return found


def test_the_problem_codes_are_the_error_classes() -> None:
    """``ProblemCode`` enumerates the code of each error class, in the hierarchy's order, once
    each, and a problem's ``code`` names it."""
    codes = [kind.code for kind in PROBLEM_KINDS]
    assert SCHEMAS["ProblemCode"]["enum"] == codes
    assert len(set(codes)) == len(codes)
    code = SCHEMAS["Problem"]["properties"]["code"]
    assert {"$ref": "#/components/schemas/ProblemCode"} in code["anyOf"]
    for kind in PROBLEM_KINDS:
        assert (
            f"`{kind.code}` ({kind.status}): {kind.title}." in SCHEMAS["ProblemCode"]["description"]
        )


def test_every_error_the_service_raises_has_a_listed_code() -> None:
    """An error class anywhere in the service answers with a code of ``ProblemCode``: a new code
    is a class of ``errors.py``, where the document finds it."""
    listed = set(SCHEMAS["ProblemCode"]["enum"])
    assert {kind.code for kind in every_error_class()} <= listed


@pytest.mark.parametrize(("name", "packet", "answer"), PROTOCOL)
def test_the_webhooks_describe_the_contributor_protocol(
    name: str, packet: str, answer: str
) -> None:
    """Each packet the service posts to a contributor or a summarizer is a webhook of the
    document, with its body, its headers and the answer the service takes back."""
    operation = DOCUMENT["webhooks"][name]["post"]
    assert operation["operationId"] == name
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": f"#/components/schemas/{packet}"}
    taken = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert taken == {"$ref": f"#/components/schemas/{answer}"}
    assert "default" in operation["responses"]  # any other answer fails the call
    headers = {p["name"]: p["required"] for p in operation["parameters"] if p["in"] == "header"}
    assert headers == {
        TIMEOUT_HEADER: True,
        "webhook-id": True,
        "webhook-timestamp": False,
        "webhook-signature": False,
    }
    assert SCHEMAS[packet]["properties"]["type"]["const"] == name
    assert set(SCHEMAS[packet]["required"]) == set(SCHEMAS[packet]["properties"])


def test_the_webhooks_are_described_not_served(make_client: AppFactory) -> None:
    """The webhooks are calls the service makes: none of them is a route of its own."""
    client = make_client()
    for name, _, _ in PROTOCOL:
        assert client.post(f"/{name}", json={}).status_code == 404
    assert "webhooks" in client.get("/openapi.json").json()
