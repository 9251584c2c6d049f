"""The client's shape: twins with identical methods, complete exports, one error factory, and
models generated from the committed OpenAPI document."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import context_assembly_client
import httpx
import orjson
import pytest
from context_assembly_client import _exceptions, _models, types
from context_assembly_client._base import OPERATIONS
from context_assembly_client.contributor import (
    ContributePacket,
    ContributionAnswer,
    RevisionPacket,
)
from pydantic import BaseModel, ValidationError
from typing_extensions import TypeAliasType

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"
GENERATED = Path(_models.__file__)
DOCUMENT: dict[str, Any] = orjson.loads((ROOT / "openapi" / "openapi.json").read_bytes())
SCHEMAS: dict[str, dict[str, Any]] = DOCUMENT["components"]["schemas"]


def client_models() -> dict[str, type[BaseModel]]:
    """Every pydantic model that ``types`` exports, by name."""
    found = {name: getattr(types, name) for name in types.__all__}
    return {n: m for n, m in found.items() if isinstance(m, type) and issubclass(m, BaseModel)}


def _refs(schema: Any, refs: set[str]) -> None:
    """Collect the schema names ``schema`` references, without following them."""
    if isinstance(schema, list):
        for item in schema:
            _refs(item, refs)
    elif isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref":
                refs.add(value.rsplit("/", 1)[-1])
            else:
                _refs(value, refs)


def closure(pending: set[str]) -> set[str]:
    """The schemas named in ``pending`` and every schema they reach through a ``$ref``."""
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            _refs(SCHEMAS[name], pending)
    return seen


def operation_schemas(part: str, operations: list[dict[str, Any]]) -> set[str]:
    """Schemas that ``part`` (``requestBody`` or ``responses``) of ``operations`` reach."""
    pending: set[str] = set()
    for operation in operations:
        _refs(operation.get(part, {}), pending)
    return closure(pending)


ALL_OPERATIONS = [op for path in DOCUMENT["paths"].values() for op in path.values()]
REQUEST_SCHEMAS = operation_schemas("requestBody", ALL_OPERATIONS)
RESPONSE_SCHEMAS = operation_schemas("responses", ALL_OPERATIONS)
# The contributor protocol (``webhooks``): the packets the service sends, and what it takes back.
WEBHOOKS = [op for hook in DOCUMENT["webhooks"].values() for op in hook.values()]
PACKET_SCHEMAS = operation_schemas("requestBody", WEBHOOKS) - REQUEST_SCHEMAS
ANSWER_SCHEMAS = operation_schemas("responses", WEBHOOKS) - REQUEST_SCHEMAS
# The schemas that are objects, each a model (``ProblemCode``, a set of strings, is not one).
OBJECTS = {name for name, schema in SCHEMAS.items() if schema.get("type") == "object"}
PROBLEM_CODES: list[str] = SCHEMAS["ProblemCode"]["enum"]


def reachable_schemas() -> set[str]:
    """Schemas the client's operations use: bodies and answers, followed through every ``$ref``."""
    used = [DOCUMENT["paths"][op.path][op.method.lower()] for op in OPERATIONS.values()]
    return operation_schemas("requestBody", used) | operation_schemas("responses", used)


def generate_models(output: Path) -> None:
    """Run the generator as ``make client-types`` does, writing to ``output`` instead."""
    done = subprocess.run(
        [sys.executable, "-m", "datamodel_code_generator", "--output", str(output)],
        cwd=CLIENT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def plain(annotation: Any) -> Any:
    """``annotation`` without type-alias names and ``Annotated`` constraints, for comparison."""
    if isinstance(annotation, TypeAliasType):
        return plain(annotation.__value__)
    if get_origin(annotation) is Annotated:
        return plain(get_args(annotation)[0])
    return annotation


class TestGeneratedModels:
    def test_generated_module_matches_the_document(self, tmp_path: Path) -> None:
        """The committed generated module is what the generator writes from the committed document."""
        fresh = tmp_path / "_models.py"
        generate_models(fresh)
        assert fresh.read_text() == GENERATED.read_text(), (
            f"{GENERATED.relative_to(ROOT)} is not what the generator makes of "
            "openapi/openapi.json: run `make client-types`"
        )

    def test_client_models_are_document_schemas(self) -> None:
        """Every client model names a schema of the document (a renamed schema fails here)."""
        assert set(client_models()) - set(SCHEMAS) == set()

    def test_every_schema_the_operations_use_is_exported(self) -> None:
        """Every object schema reachable from an operation the client calls, or from the
        contributor protocol, has a model in ``types``."""
        used = (reachable_schemas() | PACKET_SCHEMAS | ANSWER_SCHEMAS) & OBJECTS
        assert used - set(client_models()) == set()

    def test_request_and_response_schemas_are_apart(self) -> None:
        """Each schema belongs to request bodies, to answers, to the packets the service sends a
        contributor or to a contributor's answers: one kind of model."""
        kinds = [REQUEST_SCHEMAS, RESPONSE_SCHEMAS, PACKET_SCHEMAS, ANSWER_SCHEMAS]
        assert sum(len(kind) for kind in kinds) == len(set(SCHEMAS))
        assert set().union(*kinds) == set(SCHEMAS)

    def test_the_contributor_protocol_is_in_the_webhooks(self) -> None:
        """The document's ``webhooks`` hold the three packets the service sends, each with the
        answer it takes back; the contributor helper serves those models."""
        assert PACKET_SCHEMAS == {"ContributePacket", "RevisionPacket", "SummarizePacket"}
        assert ANSWER_SCHEMAS == {"ContributorAnswer", "RevisionAnswer", "SummaryAnswer"}
        assert issubclass(ContributePacket, types.ContributePacket)
        assert RevisionPacket is types.RevisionPacket
        assert issubclass(ContributionAnswer, types.ContributorAnswer)

    @pytest.mark.parametrize("name", sorted((RESPONSE_SCHEMAS | PACKET_SCHEMAS) & OBJECTS))
    def test_response_models_are_frozen_and_open(self, name: str) -> None:
        """A model of an answer, or of a packet the service sends, is frozen and keeps members it
        does not know."""
        config = getattr(_models, name).model_config
        assert (config.get("frozen"), config.get("extra")) == (True, "allow"), (
            f"add {name} to [tool.datamodel-codegen.extra-template-data] in "
            "clients/python/pyproject.toml and run `make client-types`"
        )

    @pytest.mark.parametrize("name", sorted(REQUEST_SCHEMAS))
    def test_request_models_refuse_unknown_fields(self, name: str) -> None:
        """A model of a request body refuses unknown fields, unless the document opens it."""
        config = getattr(_models, name).model_config
        closed = SCHEMAS[name].get("additionalProperties") is False
        assert config.get("extra") == ("forbid" if closed else "allow")
        assert not config.get("frozen")

    def test_unknown_answer_members_are_kept(self) -> None:
        """A response model accepts and keeps a member a newer server adds; a request model refuses one."""
        health = types.Health.model_validate({"status": "ok", "added_later": 1})
        assert health.model_extra == {"added_later": 1}
        with pytest.raises(ValidationError, match="extra_forbidden"):
            types.Scope.model_validate({"principal": "u", "principle": "typo"})

    @pytest.mark.parametrize(
        ("alias", "model", "field"),
        [
            (types.Provider, types.UsageRequest, "provider"),
            (types.CallKind, types.UsageRequest, "call"),
            (types.Revision, types.Contribution, "revision"),
        ],
    )
    def test_aliases_match_their_fields(
        self, alias: Any, model: type[BaseModel], field: str
    ) -> None:
        """Each alias ``types`` names has the value set of the generated field it stands for."""
        annotation = model.model_fields[field].annotation
        assert {plain(a) for a in get_args(alias)} == {plain(a) for a in get_args(annotation)}

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


def status_classes() -> dict[str, type[_exceptions.APIStatusError]]:
    """The error classes of the client that name a problem code, by that code."""
    found = {
        obj.expected_code: obj
        for obj in vars(_exceptions).values()
        if isinstance(obj, type) and issubclass(obj, _exceptions.APIStatusError)
    }
    return {code: cls for code, cls in found.items() if code is not None}


class TestMakeStatusError:
    def test_the_classes_are_the_codes_of_the_document(self) -> None:
        """One class per code of the document's ``ProblemCode`` (the service's error classes),
        none for a code it does not have; the generated ``Problem`` names the same codes."""
        assert sorted(status_classes()) == sorted(PROBLEM_CODES)
        generated = plain(_models.Problem.model_fields["code"].annotation)
        literal = next(arm for arm in get_args(generated) if get_args(arm))
        assert sorted(get_args(literal)) == sorted(PROBLEM_CODES)

    @pytest.mark.parametrize("code", PROBLEM_CODES)
    def test_each_code_has_its_class(self, code: str) -> None:
        """A problem+json body with a code of the document becomes the class that names the
        code, with the parsed problem (418: a status no class stands for, so the code chooses)."""
        body = {"type": "t", "title": "x", "status": 418, "detail": "why", "code": code}
        response = httpx.Response(
            418, json=body, headers={"content-type": "application/problem+json"}
        )
        err = _exceptions.make_status_error(response)
        assert type(err) is status_classes()[code]
        assert (err.status_code, err.code, err.problem, err.detail) == (418, code, body, "why")
        assert str(err) == f"418 {code}: why"

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
