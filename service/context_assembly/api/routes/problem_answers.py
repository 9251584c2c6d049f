"""The error answers the OpenAPI document lists for each route: the ``Problem`` schema of
``application/problem+json`` and what each status means (the answers themselves are built in
``api/problems.py``)."""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from context_assembly.api.problems import PROBLEM_JSON, ProblemCode
from context_assembly.core.request import wire_schema


class Problem(BaseModel):
    """An RFC 9457 problem (`application/problem+json`), with the field or source it is about
    where there is one: `field`, `sources`, `block_ids`, `reasons`, `errors`, `candidates`."""

    model_config = ConfigDict(extra="allow", json_schema_extra=wire_schema)
    type: str = Field(
        description="`urn:context-assembly:problem:` and the code in lower case with hyphens: a "
        "name for the kind of problem, not an address to fetch."
    )
    title: str = Field(description="A short summary of the kind of problem.")
    status: int = Field(description="The HTTP status.")
    detail: str = Field(description="What went wrong with this request.")
    code: ProblemCode | str = Field(
        description="The error code, one of `ProblemCode` (a newer service may answer with one "
        "this document does not list); the clients raise one error class per code."
    )
    instance: str | None = Field(default=None, description="The path of the request.")


# What each error status means, in the words of the error table (docs/api.md).
PROBLEMS: dict[int, str] = {
    401: "`UNAUTHENTICATED`: no key, or an unknown one.",
    404: "`NOT_FOUND`: an unknown id, an expired one, or another tenant's.",
    409: "`CONTEXT_ASSEMBLY_STALE`: the preparation no longer holds; `reasons` lists why.",
    413: "`PAYLOAD_TOO_LARGE`: a body over `[limits] max_body_bytes`.",
    422: "`CONTEXT_ASSEMBLY_INVALID`: a malformed request or body; `field` names the field.",
    502: "`CONTRIBUTOR_FAILED`: a contributor with failure policy `fail` failed; the body names "
    "the source and the cause.",
    503: "`STORE_UNAVAILABLE`: the store did not answer in time; retry later. "
    "`RECORD_TOO_NEW` (the calls on a preparation): a newer version of the service wrote it; "
    "retry.",
    504: "`CONTEXT_ASSEMBLY_TIMEOUT`: a contributor with failure policy `fail` did not answer "
    "within the deadline.",
}
# The GET routes read their parameters as FastAPI does, which lists a 422 for them.
PARAMETER_422 = "`CONTEXT_ASSEMBLY_INVALID`: a malformed parameter; `field` names it."
ASSEMBLY_422 = (
    "`CONTEXT_ASSEMBLY_INVALID`: a malformed request or block, a duplicate, a dependency cycle, "
    "a missing or expired protected dependency, an unknown source or endpoint (`field` names "
    "it). `CONTEXT_ASSEMBLY_OVERFLOW`: the protected blocks and their dependencies exceed "
    "`max_data_tokens` or a source limit. `CONTEXT_OVERFLOW`: the frame cannot fit the window. "
    "`CONTRIBUTOR_URL_REJECTED`: an inline URL outside the allowlist."
)


def problems(*statuses: int, **described: str) -> dict[int | str, dict[str, Any]]:
    """The error answers of a route: problem+json, each described (``described`` overrides a
    status's description, keyed ``s422``)."""
    return {
        status: {
            "model": Problem,
            "description": described.get(f"s{status}", PROBLEMS[status]),
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }


COMMON: Final = (401, 413, 422, 503)
"""The error statuses of every route that takes a JSON body."""
