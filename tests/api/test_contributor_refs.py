"""A request's contributor refs with the MCP options: `kind: "mcp"` and what it reads are for an
inline `url` only (a registered endpoint has its registration's kind), each refusal a 422 naming
the field; the committed document refuses exactly what the service refuses; and a webhook ref
dumps as it did before the options existed, so stored shape hashes still match."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from api_support import AppFactory

from context_assembly.core.request import ContributorRef
from context_assembly.preparations.record import _REF_FIELDS, CONTRIBUTOR_REFS

ROOT = Path(__file__).resolve().parents[2]
COMMITTED: dict[str, Any] = orjson.loads((ROOT / "openapi" / "openapi.json").read_bytes())
URL = "http://mcp.invalid/mcp"
DOCS = {"kind": "mcp", "url": "http://127.0.0.1:9/mcp", "tool": "search"}

REFS: list[tuple[dict[str, Any], str | None]] = [
    # (the ref without its source, the field a refusal names; None: accepted)
    ({"endpoint": "docs"}, None),
    ({"url": URL}, None),
    ({"url": URL, "kind": "webhook"}, None),
    ({"url": URL, "kind": "mcp", "resources": ["docs://a", "docs://b"]}, None),
    ({"url": URL, "kind": "mcp", "resources": "listed"}, None),
    ({"url": URL, "kind": "mcp", "tool": "search", "tool_arguments": {"q": "{input}"}}, None),
    ({"url": URL, "kind": "mcp", "resources": None, "tool": "search"}, None),
    ({"endpoint": "docs", "kind": "mcp", "resources": ["docs://a"]}, "contributors.0.kind"),
    ({"endpoint": "docs", "kind": "webhook"}, "contributors.0.kind"),
    ({"endpoint": "docs", "tool": "search"}, "contributors.0.tool"),
    ({"url": URL, "resources": ["docs://a"]}, "contributors.0.resources"),
    ({"url": URL, "kind": "webhook", "tool_arguments": {"q": 1}}, "contributors.0.tool_arguments"),
    ({"url": URL, "kind": "mcp"}, "contributors.0"),
    ({"url": URL, "kind": "mcp", "resources": ["docs://a"], "tool_arguments": {}}, "contributors.0.tool_arguments"),
    ({"url": URL, "kind": "mcp", "resources": ["docs://a", "docs://a"]}, "contributors.0.resources"),
    ({"url": URL, "kind": "mcp", "resources": []}, "contributors.0.resources"),
    ({"url": URL, "kind": "mcp", "resources": "all"}, "contributors.0.resources"),
    ({"url": URL, "kind": "mcp", "tool": "s", "headers": {"authorization": "x"}}, "contributors.0.headers"),
]  # fmt: skip


def schema_validator(name: str) -> jsonschema.Draft202012Validator:
    root = {"$ref": f"#/components/schemas/{name}", "components": COMMITTED["components"]}
    return jsonschema.Draft202012Validator(root)


@pytest.mark.parametrize(("ref", "field"), REFS)
def test_mcp_options_are_for_an_inline_url_only(
    make_client: AppFactory, ref: dict[str, Any], field: str | None
) -> None:
    """Each ref is accepted or refused with a 422 whose first error names the field, by the
    service and by the committed document alike (budget calls nobody, so it checks refs
    alone)."""
    client = make_client(contributors={"docs": DOCS})
    body = {
        "model": "gpt-4o-mini",
        "plugins": [{"name": "docs"}],
        "contributors": [{"source": "docs", **ref}],
    }
    answer = client.post("/v1/budget", json=body)
    if field is None:
        assert answer.status_code == 200, answer.text
    else:
        assert answer.status_code == 422, answer.text
        problem = answer.json()
        assert problem["code"] == "CONTEXT_ASSEMBLY_INVALID"
        assert problem["errors"][0]["loc"] == field, problem
    assert schema_validator("ContributorRef").is_valid({"source": "docs", **ref}) is (field is None)


def test_a_webhook_ref_dumps_as_before_and_an_inline_mcp_ref_keeps_what_validate_reads() -> None:
    """A webhook ref leaves the MCP fields out of every dump (the request's shape hash is what
    it was); the record keeps an inline MCP ref's kind, resources and tool, not its tool's
    arguments."""
    webhook = ContributorRef(source="docs", url=URL, kind="webhook")
    assert set(webhook.model_dump(mode="json")) == {
        "source",
        "endpoint",
        "url",
        "instructions",
        "failure_policy",
        "recovery_tool",
    }
    mcp = ContributorRef(
        source="docs",
        url=URL,
        kind="mcp",
        resources=["docs://a"],
        tool="search",
        tool_arguments={"query": "{input}"},
    )
    stored = CONTRIBUTOR_REFS.dump_python(
        [webhook, mcp], mode="json", exclude_none=True, include=_REF_FIELDS
    )
    assert stored == [
        {"source": "docs", "url": URL},
        {"source": "docs", "url": URL, "kind": "mcp", "resources": ["docs://a"], "tool": "search"},
    ]
    assert ContributorRef.model_validate(stored[1]).resources == ["docs://a"]
