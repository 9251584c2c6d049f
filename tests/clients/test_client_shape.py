"""The client's shape: twins with identical methods, complete exports, one error factory, and no
drift from the committed OpenAPI document."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import context_assembly_client
import httpx
import orjson
import pytest
from context_assembly_client import _exceptions, types
from context_assembly_client._base import OPERATIONS
from context_assembly_client.contributor import ContributionAnswer
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT: dict[str, Any] = orjson.loads((ROOT / "openapi" / "openapi.json").read_bytes())
SCHEMAS: dict[str, dict[str, Any]] = DOCUMENT["components"]["schemas"]
REQUEST_MODELS = {
    name
    for name in types.__all__
    if isinstance(getattr(types, name), type)
    and issubclass(getattr(types, name), BaseModel)
    and not issubclass(getattr(types, name), types.ResponseModel)
}


def client_models() -> dict[str, type[BaseModel]]:
    """Every pydantic model that ``types`` exports, by name."""
    found = {name: getattr(types, name) for name in types.__all__}
    return {n: m for n, m in found.items() if isinstance(m, type) and issubclass(m, BaseModel)}


def _facets(schema: Any, types_: set[str], values: set[str], refs: set[str]) -> None:
    """Collect JSON types, enum/const values and referenced schema names, without following refs."""
    if isinstance(schema, list):
        for item in schema:
            _facets(item, types_, values, refs)
        return
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key in {"title", "description", "default", "examples", "discriminator"}:
            continue
        if key == "type":
            types_.update([value] if isinstance(value, str) else value)
        elif key == "enum":
            values.update(repr(v) for v in value)
        elif key == "const":
            values.add(repr(value))
        elif key == "$ref":
            refs.add(value.rsplit("/", 1)[-1])
        else:
            _facets(value, types_, values, refs)


def facets(schema: dict[str, Any]) -> tuple[set[str], set[str], set[str]]:
    """``(json types, closed values, referenced schemas)`` of one property schema."""
    types_: set[str] = set()
    values: set[str] = set()
    refs: set[str] = set()
    _facets(schema, types_, values, refs)
    return types_, values, refs


def differences(name: str, model: type[BaseModel], schema: dict[str, Any]) -> list[str]:
    """How ``model`` differs from the document's ``schema``: properties, required set, and per
    property its JSON types, closed value sets and referenced schemas (constraints are ignored)."""
    mode = "validation" if name in REQUEST_MODELS else "serialization"
    mine = model.model_json_schema(by_alias=True, mode=mode, ref_template="#/$defs/{model}")
    problems: list[str] = []
    doc_props = schema.get("properties", {})
    my_props = mine.get("properties", {})
    if set(doc_props) != set(my_props):
        problems.append(
            f"{name}: properties differ: only in document {sorted(set(doc_props) - set(my_props))}, "
            f"only in client {sorted(set(my_props) - set(doc_props))}"
        )
    if set(schema.get("required", [])) != set(mine.get("required", [])):
        problems.append(
            f"{name}: required differ: document {sorted(schema.get('required', []))}, "
            f"client {sorted(mine.get('required', []))}"
        )
    for prop in sorted(set(doc_props) & set(my_props)):
        if facets(doc_props[prop]) != facets(my_props[prop]):
            problems.append(
                f"{name}.{prop}: document {facets(doc_props[prop])} != client {facets(my_props[prop])}"
            )
    return problems


def reachable_schemas() -> set[str]:
    """Schemas the client's operations use: bodies and answers, followed through every ``$ref``."""
    pending: set[str] = set()
    for op in OPERATIONS.values():
        _types: set[str] = set()
        _values: set[str] = set()
        _facets(DOCUMENT["paths"][op.path][op.method.lower()], _types, _values, pending)
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        _facets(SCHEMAS[name], set(), set(), pending)
    return seen


class TestOpenApiDrift:
    def test_client_models_are_document_schemas(self) -> None:
        """Every client model names a schema of the document (a renamed schema fails here)."""
        assert set(client_models()) - set(SCHEMAS) == set()

    def test_every_schema_the_operations_use_is_modelled(self) -> None:
        """Every schema reachable from an operation the client calls has a client model."""
        assert reachable_schemas() - set(client_models()) == set()

    @pytest.mark.parametrize("name", sorted(client_models()))
    def test_model_matches_schema(self, name: str) -> None:
        """Each client model has the document's properties, required set, types, closed values and refs."""
        assert name in SCHEMAS
        assert differences(name, client_models()[name], SCHEMAS[name]) == []

    def test_a_drifted_model_is_detected(self) -> None:
        """The comparison itself catches a renamed field, a dropped default and a changed enum."""

        class Drifted(BaseModel):
            preparation_id: str
            checked: str  # the schema's checked_at, renamed
            valid: bool  # required here, and not the schema's constant true

        found = differences("ValidateResponse", Drifted, SCHEMAS["ValidateResponse"])
        assert any("properties differ" in p for p in found)
        assert any("required differ" in p for p in found)
        assert any("ValidateResponse.valid" in p for p in found)

    def test_operations_match_the_document(self) -> None:
        """Every operation the client calls exists in the document with that method and operationId."""
        for operation_id, op in OPERATIONS.items():
            entry = DOCUMENT["paths"].get(op.path, {}).get(op.method.lower())
            assert entry is not None, f"{op.method} {op.path} is not in the document"
            assert entry["operationId"] == operation_id

    def test_contributor_answer_uses_the_block_model(self) -> None:
        """The contributor helper answers blocks with the same Block model the document describes."""
        fields = ContributionAnswer.model_json_schema()["$defs"]["Block"]["properties"]
        assert set(fields) == set(SCHEMAS["Block"]["properties"])


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


class TestTwins:
    def test_same_public_methods_and_signatures(self) -> None:
        """Client and AsyncClient expose the same methods with identical signatures (close ↔ aclose)."""
        sync = public_methods(context_assembly_client.Client)
        async_ = public_methods(context_assembly_client.AsyncClient)
        assert sync.pop("close") == async_.pop("aclose")
        assert sync == async_
        assert set(sync) >= {
            "prepare",
            "budget",
            "get_preparation",
            "validate",
            "refresh",
            "repair",
            "report_usage",
            "breakdown",
            "models",
            "health",
        }

    def test_async_methods_are_coroutines_and_sync_are_not(self) -> None:
        """Every public AsyncClient method is async; no Client method is."""
        for name in public_methods(context_assembly_client.AsyncClient):
            assert inspect.iscoroutinefunction(getattr(context_assembly_client.AsyncClient, name))
        for name in public_methods(context_assembly_client.Client):
            assert not inspect.iscoroutinefunction(getattr(context_assembly_client.Client, name))

    def test_same_constructor(self) -> None:
        """Both constructors take the same arguments (the injected client's type aside)."""
        sync = inspect.signature(context_assembly_client.Client.__init__).parameters
        async_ = inspect.signature(context_assembly_client.AsyncClient.__init__).parameters
        assert list(sync) == list(async_)
        assert list(sync) == [
            "self",
            "base_url",
            "api_key",
            "timeout",
            "max_retries",
            "http_client",
        ]


class TestExports:
    def test_all_is_complete_and_resolvable(self) -> None:
        """Every name in ``__all__`` exists, and every exception class is exported."""
        for name in context_assembly_client.__all__:
            assert hasattr(context_assembly_client, name), name
        errors = {
            name
            for name, obj in vars(_exceptions).items()
            if isinstance(obj, type) and issubclass(obj, Exception) and not name.startswith("_")
        }
        assert errors <= set(context_assembly_client.__all__)

    def test_package_is_typed(self) -> None:
        """The package ships ``py.typed``."""
        assert (Path(context_assembly_client.__file__).parent / "py.typed").is_file()


PROBLEM_CODES = [
    ("CONTEXT_ASSEMBLY_INVALID", 422, "InvalidRequestError"),
    ("CONTEXT_ASSEMBLY_OVERFLOW", 422, "AssemblyOverflowError"),
    ("CONTEXT_OVERFLOW", 422, "ContextOverflowError"),
    ("CONTEXT_ASSEMBLY_TIMEOUT", 504, "AssemblyTimeoutError"),
    ("CONTEXT_ASSEMBLY_STALE", 409, "StaleError"),
    ("CONTRIBUTOR_FAILED", 502, "ContributorFailedError"),
    ("CONTRIBUTOR_URL_REJECTED", 422, "ContributorUrlRejectedError"),
    ("UNAUTHENTICATED", 401, "AuthenticationError"),
    ("NOT_FOUND", 404, "NotFoundError"),
    ("BAD_REQUEST", 400, "BadRequestError"),
    ("PAYLOAD_TOO_LARGE", 413, "PayloadTooLargeError"),
    ("STORE_UNAVAILABLE", 503, "StoreUnavailableError"),
]


class TestMakeStatusError:
    @pytest.mark.parametrize(("code", "status", "cls"), PROBLEM_CODES)
    def test_each_code_has_its_class(self, code: str, status: int, cls: str) -> None:
        """A problem+json body with a service code becomes that code's class, with the parsed problem."""
        body = {"type": "t", "title": "x", "status": status, "detail": "why", "code": code}
        response = httpx.Response(
            status, json=body, headers={"content-type": "application/problem+json"}
        )
        err = _exceptions.make_status_error(response)
        assert type(err).__name__ == cls
        assert (err.status_code, err.code, err.problem, err.detail) == (status, code, body, "why")
        assert str(err) == f"{status} {code}: why"

    def test_builtin_timeout_is_not_shadowed(self) -> None:
        """The service-timeout class is not the builtin TimeoutError, nor one of its subclasses."""
        assert not issubclass(context_assembly_client.AssemblyTimeoutError, TimeoutError)
        assert "TimeoutError" not in context_assembly_client.__all__

    def test_stale_reasons_and_contributor_source(self) -> None:
        """StaleError exposes ``reasons`` and ContributorFailedError ``source`` from the problem."""
        stale = _exceptions.make_status_error(
            httpx.Response(409, json={"code": "CONTEXT_ASSEMBLY_STALE", "reasons": ["a", "b"]})
        )
        failed = _exceptions.make_status_error(
            httpx.Response(502, json={"code": "CONTRIBUTOR_FAILED", "source": "mem"})
        )
        assert isinstance(stale, context_assembly_client.StaleError)
        assert stale.reasons == ["a", "b"]
        assert isinstance(failed, context_assembly_client.ContributorFailedError)
        assert failed.source == "mem"

    @pytest.mark.parametrize(
        ("status", "cls"),
        [
            (400, "BadRequestError"),
            (401, "AuthenticationError"),
            (404, "NotFoundError"),
            (413, "PayloadTooLargeError"),
            (500, "InternalServerError"),
            (502, "InternalServerError"),
            (405, "APIStatusError"),
            (429, "APIStatusError"),
        ],
    )
    def test_unknown_code_falls_back_by_status(self, status: int, cls: str) -> None:
        """Without a known code (a proxy's HTML page) the class follows the status."""
        response = httpx.Response(status, text="<html>bad gateway</html>")
        err = _exceptions.make_status_error(response)
        assert type(err).__name__ == cls
        assert err.problem == {}
        assert err.code is None
