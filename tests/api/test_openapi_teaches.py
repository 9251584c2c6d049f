"""The OpenAPI document teaches the API: every property described, request examples the service
answers 200, routes grouped by tag, the rules the service enforces stated in the schema, the keys
optional exactly when auth is off, and optional fields that ReDoc names by their type.

The committed document (``openapi/openapi.json``) and the one a running app serves are both
checked; the examples are posted to the real app in-process, with a real SQLite file and a
registered contributor answering on a loopback server.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import orjson
import pytest
import schemathesis
from api_support import KEYS, AppFactory
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode

from context_assembly.core.blocks import MAX_PRIORITY, MIN_PRIORITY
from context_assembly.core.request import INT64_MAX, INT64_MIN
from hypothesis_budget import DEEP, examples

ROOT = Path(__file__).resolve().parents[2]
COMMITTED: dict[str, Any] = orjson.loads((ROOT / "openapi" / "openapi.json").read_bytes())
UNION_KEYS = ("anyOf", "oneOf", "allOf")


# --------------------------------------------------------------------------- document walks


def undescribed(document: dict[str, Any]) -> list[str]:
    """Every schema property of ``document`` without a description, as ``Schema.property`` (and
    ``Schema.property.nested`` for inline objects). The subschemas of ``not`` state refused
    combinations of fields, not fields, and are not walked."""
    found: list[str] = []

    def walk(schema: Any, where: str) -> None:
        if not isinstance(schema, dict):
            return
        for name, prop in schema.get("properties", {}).items():
            if not (isinstance(prop, dict) and str(prop.get("description", "")).strip()):
                found.append(f"{where}.{name}")
            walk(prop, f"{where}.{name}")
        for key in ("items", "additionalProperties"):
            walk(schema.get(key), where)
        for key in UNION_KEYS:
            for member in schema.get(key, []):
                walk(member, where)

    for name, schema in document["components"]["schemas"].items():
        walk(schema, name)
    return found


def redoc_labels(prop: dict[str, Any]) -> list[str]:
    """The names ReDoc gives the members of a union property: a member's own title, else its
    ``$ref``'s schema name, else the property's title (ReDoc merges the property into each
    member), shown as ``Title (type)``; an untitled member shows its type alone."""
    labels = []
    for member in prop.get("anyOf", prop.get("oneOf", [])):
        ref = str(member.get("$ref", "")).rsplit("/", 1)[-1]
        title = member.get("title") or ref or prop.get("title")
        kind = member.get("type", "object")
        labels.append(f"{title} ({kind})" if title else str(kind))
    return labels


def union_properties(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property of a component schema whose value is a union (``anyOf``/``oneOf``)."""
    for name, schema in document["components"]["schemas"].items():
        for prop_name, prop in schema.get("properties", {}).items():
            if "anyOf" in prop or "oneOf" in prop:
                yield f"{name}.{prop_name}", prop


def body_examples(document: dict[str, Any], path: str) -> dict[str, dict[str, Any]]:
    """The OpenAPI ``examples`` of the JSON request body of ``POST path``."""
    body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    examples_: dict[str, dict[str, Any]] = body["examples"]
    return examples_


def schema_validator(document: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    """A JSON Schema validator of the component ``name``, its references resolved in place."""
    root = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return jsonschema.Draft202012Validator(root)


@pytest.fixture
def live(make_client: AppFactory) -> dict[str, Any]:
    """The document a running app (default settings: auth off) serves."""
    answer = make_client().get("/openapi.json")
    assert answer.status_code == 200
    document: dict[str, Any] = answer.json()
    return document


# --------------------------------------------------------------------------- descriptions


def test_every_property_of_the_committed_document_is_described() -> None:
    """Each schema property of openapi/openapi.json has a description: the one place a field is
    explained, which ReDoc, Swagger UI and every generated client show."""
    assert undescribed(COMMITTED) == [], "add Field(description=...) to these"


def test_every_property_of_the_served_document_is_described(live: dict[str, Any]) -> None:
    assert undescribed(live) == [], "add Field(description=...) to these"


def test_the_walk_names_an_undescribed_property_at_any_depth() -> None:
    """The check itself finds a property without a description, nested ones too, and ignores
    the field combinations stated under ``not``."""
    document = copy.deepcopy(COMMITTED)
    schemas = document["components"]["schemas"]
    del schemas["Block"]["properties"]["priority"]["description"]
    schemas["Scope"]["properties"]["connector_accounts"]["additionalProperties"] = {
        "type": "object",
        "properties": {"region": {"type": "string"}},
    }
    assert undescribed(document) == ["Block.priority", "Scope.connector_accounts.region"]


def test_operations_have_a_tag_a_summary_and_described_answers(live: dict[str, Any]) -> None:
    """Every route, and every webhook the service calls, sits in one described tag group (none
    under "default"), with a summary, a description, and answers that say what they mean (not
    FastAPI's "Successful Response")."""
    tags = {tag["name"]: tag.get("description", "") for tag in live["tags"]}
    assert all(description.strip() for description in tags.values()), tags
    used: set[str] = set()
    for path, operations in [*live["paths"].items(), *live["webhooks"].items()]:
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            assert len(operation["tags"]) == 1 and operation["tags"][0] in tags, where
            used.update(operation["tags"])
            assert operation["summary"].strip() and operation["description"].strip(), where
            for status, response in operation["responses"].items():
                assert response["description"] not in {"", "Successful Response"}, (where, status)
                if status.isdigit() and int(status) >= 400:
                    assert response["description"].startswith("`"), (where, status)  # its code
    assert used == set(tags)


# --------------------------------------------------------------------------- examples


def _contributor(calls: list[str]) -> httpx.MockTransport:
    """A contributor answering one block; the transport's handler serves a loopback port."""

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        block = {"id": "preference", "text": "Prefers answers in EUR.", "priority": 5}
        return httpx.Response(200, json={"revision": "r1", "blocks": [block]})

    return httpx.MockTransport(answer)


@pytest.fixture
def served(make_client: AppFactory) -> tuple[TestClient, list[str]]:
    """The app with the `memory` contributor the contributor example names, and its calls."""
    calls: list[str] = []
    client = make_client(
        contributor_transport=_contributor(calls),
        contributors={"memory": {"url": "http://memory.test/contribute"}},
    )
    return client, calls


def test_every_body_has_examples_named_in_sorted_order(live: dict[str, Any]) -> None:
    """Every request body has examples. The committed document sorts its keys, so the examples
    are named in the order they are given: Swagger UI pre-fills the first, the same one in the
    committed and the served document (for prepare-shaped bodies, the minimal one)."""
    bodies = 0
    for path, operations in live["paths"].items():
        if "requestBody" in operations.get("post", {}):
            names = list(body_examples(live, path))
            assert names and names == sorted(names), path
            assert names == list(body_examples(COMMITTED, path)), path
            bodies += 1
    assert bodies == 6  # prepare, budget, refresh, validate, repair, usage
    for path in ("/v1/prepare", "/v1/budget", "/v1/preparations/{preparation_id}/refresh"):
        assert next(iter(body_examples(live, path))) == "minimal", path


def test_the_prepare_and_budget_examples_are_answered_200(
    served: tuple[TestClient, list[str]], live: dict[str, Any]
) -> None:
    """Every example of prepare and budget (Swagger UI's "Try it out" starts from the first,
    ReDoc shows them all) is a request the service answers 200; the contributor example calls
    the registered contributor, whose block enters the frame's data."""
    client, calls = served
    for path in ("/v1/prepare", "/v1/budget"):
        for name, example in body_examples(live, path).items():
            answer = client.post(path, json=example["value"])
            assert answer.status_code == 200, (path, name, answer.text)
    prepared = client.post(
        "/v1/prepare", json=body_examples(live, "/v1/prepare")["with_contributor"]["value"]
    ).json()
    assert calls == ["/contribute", "/contribute"]  # once per prepare; budget calls no one
    assert [(s["source"], s["status"]) for s in prepared["selection"]["sources"]] == [
        ("memory", "ok")
    ]
    assert [(b["id"], b["status"]) for b in prepared["selection"]["blocks"]] == [
        ("preference", "selected")
    ]


def test_the_examples_teach_what_they_say(
    served: tuple[TestClient, list[str]], live: dict[str, Any]
) -> None:
    """The blocks example meets the reasons its description names, the cache example answers a
    cache plan, the routing example routes."""
    client, _ = served
    examples_ = body_examples(live, "/v1/prepare")
    blocks = client.post("/v1/prepare", json=examples_["with_blocks_and_whiteboard"]["value"])
    reasons = {(b["source"], b["id"]): b["reason"] for b in blocks.json()["selection"]["blocks"]}
    assert reasons[("orders", "receipt")] == "protected"
    assert reasons[("memory", "customer")] == "protected"
    assert reasons[("orders", "faq")] == "expired"
    assert reasons[("orders", "glossary")] == "dependency"
    cache = client.post("/v1/prepare", json=examples_["with_cache"]["value"]).json()
    assert cache["render"] == "anthropic"
    assert "cache" in cache["selection"]
    routed = client.post("/v1/prepare", json=examples_["with_routing"]["value"]).json()
    assert routed["selection"]["routing"]["chosen"] == routed["model"]


def test_the_lifecycle_examples_are_answered_200_after_a_prepare(
    served: tuple[TestClient, list[str]], live: dict[str, Any]
) -> None:
    """Validate, repair and usage examples hold for a preparation made with the minimal prepare
    example (only its id substituted); each refresh example refreshes a preparation made with
    the same body."""
    client, _ = served
    minimal = body_examples(live, "/v1/prepare")["minimal"]["value"]
    prep_id = client.post("/v1/prepare", json=minimal).json()["preparation_id"]
    for operation in ("validate", "repair", "usage"):
        path = f"/v1/preparations/{{preparation_id}}/{operation}"
        for name, example in body_examples(live, path).items():
            answer = client.post(path.format(preparation_id=prep_id), json=example["value"])
            assert answer.status_code == 200, (operation, name, answer.text)
    refresh = "/v1/preparations/{preparation_id}/refresh"
    for name, example in body_examples(live, refresh).items():
        made = client.post("/v1/prepare", json=example["value"]).json()["preparation_id"]
        answer = client.post(refresh.format(preparation_id=made), json=example["value"])
        assert answer.status_code == 200, (name, answer.text)
        assert answer.json()["attempt"] == 2


# --------------------------------------------------------------------------- rules in the schema

# Bodies and whether the service accepts them: the schema must say the same.
MODEL_RULES = [
    ({"model": "gpt-4o-mini"}, True),
    ({"models": ["gpt-4o-mini"]}, True),
    ({"model": "gpt-4o-mini", "models": None}, True),
    ({"model": None, "models": ["gpt-4o-mini"], "routing": {"policy": "first_fit"}}, True),
    ({"model": "gpt-4o-mini", "max_context_tokens": 8000}, True),
    ({"model": "gpt-4o-mini", "routing": None}, True),
    ({"model": "gpt-4o-mini", "models": ["gpt-4o-mini"]}, False),
    ({}, False),
    ({"model": None}, False),
    ({"models": ["gpt-4o-mini"], "max_context_tokens": 8000}, False),
    ({"model": "gpt-4o-mini", "routing": {"policy": "first_fit"}}, False),
]


@pytest.mark.parametrize(("fields", "accepted"), MODEL_RULES)
def test_the_schema_states_the_model_rules_the_service_enforces(
    make_client: AppFactory, fields: dict[str, Any], accepted: bool
) -> None:
    """Exactly one of `model` and `models`, `max_context_tokens` and `routing` only where they
    mean something: the document refuses what the service refuses, and accepts what it accepts
    (an absent field and `null` read the same)."""
    body = {**fields, "input": [{"role": "user", "content": "hi"}]}
    answer = make_client().post("/v1/budget", json=body)
    assert (answer.status_code == 200) is accepted, answer.text
    assert schema_validator(COMMITTED, "PrepareRequest").is_valid(body) is accepted


@pytest.mark.parametrize(
    ("endpoint", "url", "accepted"),
    [("memory", None, True), (None, "http://memory.test/x", True), ("memory", "http://x/", False)],
)
def test_the_schema_states_that_a_contributor_has_one_target(
    endpoint: str | None, url: str | None, accepted: bool
) -> None:
    ref = {"source": "memory", "endpoint": endpoint, "url": url}
    assert schema_validator(COMMITTED, "ContributorRef").is_valid(ref) is accepted
    assert schema_validator(COMMITTED, "ContributorRef").is_valid({"source": "memory"}) is False


@pytest.mark.parametrize(
    ("priority", "accepted"),
    [(MIN_PRIORITY, True), (MAX_PRIORITY, True), (MAX_PRIORITY + 1, False), (2**64, False)],
)
def test_the_schema_states_the_priority_range(
    make_client: AppFactory, priority: int, accepted: bool
) -> None:
    """A block's priority is bounded in the schema as the service bounds it."""
    block = {"id": "b", "text": "t", "priority": priority}
    assert schema_validator(COMMITTED, "Block").is_valid(block) is accepted
    body = {
        "model": "gpt-4o-mini",
        "plugins": [{"name": "notes"}],
        "contributions": [{"source": "notes", "revision": 1, "blocks": [block]}],
    }
    answer = make_client().post("/v1/budget", json=body)
    assert (answer.status_code == 200) is accepted, answer.text


def test_the_schema_states_the_64_bit_range_of_an_integer_revision(make_client: AppFactory) -> None:
    """An integer revision is within signed 64 bits: the schema's integer member says exactly
    the range the service accepts."""
    (integer,) = [
        member
        for member in COMMITTED["components"]["schemas"]["Contribution"]["properties"]["revision"][
            "anyOf"
        ]
        if member.get("type") == "integer"
    ]
    validator = jsonschema.Draft202012Validator(integer)
    for revision, accepted in [(INT64_MIN, True), (INT64_MAX, True), (INT64_MAX + 1, False)]:
        assert validator.is_valid(revision) is accepted, revision
        body = {
            "model": "gpt-4o-mini",
            "plugins": [{"name": "notes"}],
            "contributions": [{"source": "notes", "revision": revision, "blocks": []}],
        }
        answer = make_client().post("/v1/budget", json=body)
        assert (answer.status_code == 200) is accepted, (revision, answer.text)
    assert not validator.is_valid(INT64_MIN - 1)


SCHEMA = schemathesis.openapi.from_dict(COMMITTED)
GENERATED_PREPARE = SCHEMA["/v1/prepare"]["POST"].as_strategy(
    generation_mode=GenerationMode.POSITIVE
)


@settings(
    max_examples=examples(25),
    derandomize=not DEEP,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(case=GENERATED_PREPARE)
def test_a_schema_driven_sample_names_exactly_one_of_model_and_models(
    case: schemathesis.Case[Any],
) -> None:
    """What a generator builds from the schema (schemathesis here, as a client's or a docs
    page's sample would) never sets both `model` and `models`, nor neither."""
    assert isinstance(case.body, dict), case.body
    given_fields = [name for name in ("model", "models") if case.body.get(name) is not None]
    assert len(given_fields) == 1, case.body


# --------------------------------------------------------------------------- how it renders


def test_optional_fields_render_as_their_type_or_null() -> None:
    """ReDoc names an optional field's members by their types ("string or null"), never by the
    field's title repeated ("Model (string) or Model (null)"): no property carries a title."""
    model = COMMITTED["components"]["schemas"]["PrepareRequest"]["properties"]["model"]
    assert redoc_labels(model) == ["string", "null"]
    assembly = COMMITTED["components"]["schemas"]["PrepareRequest"]["properties"]["assembly"]
    assert redoc_labels(assembly) == ["AssemblyOptions (object)", "null"]
    inherited = []
    for where, prop in union_properties(COMMITTED):
        members = prop["anyOf"] if "anyOf" in prop else prop["oneOf"]
        expected = [
            f"{m['$ref'].rsplit('/', 1)[-1]} (object)" if "$ref" in m else m.get("type", "object")
            for m in members
        ]
        if redoc_labels(prop) != expected:
            inherited.append((where, redoc_labels(prop)))
    assert inherited == []
    # What the labels were with pydantic's property titles:
    assert redoc_labels({**model, "title": "Model"}) == ["Model (string)", "Model (null)"]


# --------------------------------------------------------------------------- keys


def test_the_keys_are_optional_when_auth_is_off(live: dict[str, Any]) -> None:
    """With `[auth] mode = "none"` (the committed document's settings) a keyed route also takes
    no key (`{}`): Swagger UI and generated clients need not send one."""
    for document in (COMMITTED, live):
        security = document["paths"]["/v1/prepare"]["post"]["security"]
        assert security == [{"ApiKey": []}, {"Bearer": []}, {}]


def test_the_keys_are_required_when_auth_is_on(make_client: AppFactory) -> None:
    """A service with API keys serves a document whose keyed routes require one, and does as
    it says: the examples without a key are 401, with one 200."""
    client = make_client(auth=True)
    document = client.get("/openapi.json").json()
    keyed = [
        operation
        for path, operations in document["paths"].items()
        for operation in operations.values()
        if path.startswith("/v1/prepar") or path == "/v1/budget"
    ]
    assert keyed and all(op["security"] == [{"ApiKey": []}, {"Bearer": []}] for op in keyed)
    minimal = body_examples(document, "/v1/prepare")["minimal"]["value"]
    assert client.post("/v1/prepare", json=minimal).status_code == 401
    answer = client.post("/v1/prepare", json=minimal, headers={"X-API-Key": KEYS["acme"]})
    assert answer.status_code == 200, answer.text
