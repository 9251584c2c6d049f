"""``kind = "mcp"`` registrations: validation at load, header values by environment reference,
tenancy, and the sessions a reload keeps or drops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from context_assembly.config import Settings, load_settings
from context_assembly.contributors import create_client
from context_assembly.contributors.mcp import McpEndpoints, McpSpec
from context_assembly.core.request import ContributorRef
from context_assembly.errors import InvalidError
from context_assembly.preparations.clock import Clock
from context_assembly.preparations.targets import Contributors

TOKEN = "tok-not-for-any-log-0123456789"
DOCS: dict[str, Any] = {
    "kind": "mcp",
    "url": "http://127.0.0.1:9000/mcp",
    "resources": ["docs://guide/refunds", "docs://guide/limits"],
    "tool": "search",
    "tool_arguments": {"query": "{input}", "top_k": 8},
    "headers": {"Authorization": "env:DOCS_MCP_TOKEN"},
    "failure_policy": "omit",
}


def problems(**contributor: Any) -> list[str]:
    """The messages of a refused registration (as the service prints them: no input values)."""
    with pytest.raises(ValidationError) as raised:
        Settings(contributors={"docs": contributor})
    return [e["msg"] for e in raised.value.errors(include_input=False, include_url=False)]


def test_the_documented_registration_loads_with_its_header_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The documented TOML loads; the header value comes from the environment, is held as a
    secret (never in the settings' repr), and its name is lower-cased."""
    monkeypatch.setenv("DOCS_MCP_TOKEN", TOKEN)
    config = tmp_path / "service.toml"
    config.write_text(
        "[contributors.docs]\n"
        'kind = "mcp"\n'
        'url = "http://127.0.0.1:9000/mcp"\n'
        'resources = ["docs://guide/refunds", "docs://guide/limits"]\n'
        'tool = "search"\n'
        'tool_arguments = { query = "{input}", top_k = 8 }\n'
        'headers = { authorization = "env:DOCS_MCP_TOKEN" }\n'
        'failure_policy = "omit"\n'
    )
    docs = load_settings(config).contributors["docs"]
    assert (docs.kind, docs.tool, docs.tool_arguments) == (
        "mcp",
        "search",
        {"query": "{input}", "top_k": 8},
    )
    assert docs.headers["authorization"].get_secret_value() == TOKEN
    assert TOKEN not in repr(load_settings(config))


def test_webhook_registrations_are_unchanged() -> None:
    """Without ``kind`` a registration is a webhook, as before."""
    memory = Settings(contributors={"memory": {"url": "http://127.0.0.1:9001/c"}}).contributors[
        "memory"
    ]
    assert (memory.kind, memory.resources, memory.tool, memory.headers) == (
        "webhook",
        None,
        None,
        {},
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kind": "webhook"}, 'resources, tool, tool_arguments, headers: only for kind = "mcp"'),
        (
            {"resources": None, "tool": None, "tool_arguments": None},
            'kind = "mcp" needs resources, a tool, or both',
        ),
        ({"resources": []}, 'resources: list at least one URI, or give "listed"'),
        ({"resources": ["docs://a", "docs://a"]}, "resources: a URI is listed twice"),
        ({"resources": "all"}, "Input should be 'listed'"),
        ({"tool": None}, "tool_arguments needs a tool"),
        ({"secret": "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1Q="}, "secret signs webhook calls"),
        ({"headers": {"authorization": TOKEN}}, 'must be a reference "env:VARIABLE"'),
        (
            {"headers": {"authorization": "env:NO_SUCH_VARIABLE_SET"}},
            "environment variable NO_SUCH_VARIABLE_SET is not set",
        ),
        ({"headers": {"mcp-session-id": "env:DOCS_MCP_TOKEN"}}, "is set by the service itself"),
    ],
)
def test_a_bad_registration_is_refused_without_its_values(
    monkeypatch: pytest.MonkeyPatch, changes: dict[str, Any], message: str
) -> None:
    """Each refusal names the problem; no message quotes a header value."""
    monkeypatch.setenv("DOCS_MCP_TOKEN", TOKEN)
    found = problems(**{**DOCS, **changes})
    assert any(message in text for text in found), found
    assert not any(TOKEN in text for text in found)


def test_a_header_variable_holding_a_control_character_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A value that would split the header is refused at load, without the value."""
    monkeypatch.setenv("DOCS_MCP_TOKEN", "Bearer a\r\nX-Injected: 1")
    found = problems(**DOCS)
    assert found == [
        "Value error, header 'Authorization': "
        "environment variable DOCS_MCP_TOKEN holds a control character"
    ]


def contributors(settings: Settings) -> Contributors:
    return Contributors(settings, create_client(), resolver=None, clock=Clock())


def test_targets_carry_one_endpoint_per_tenant_and_registration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each tenant gets its own endpoint (its own session) for a registration, reused by its
    later prepares; a tenant the registration does not list gets the usual 422."""
    monkeypatch.setenv("DOCS_MCP_TOKEN", TOKEN)
    calls = contributors(Settings(contributors={"docs": {**DOCS, "tenants": ["acme", "globex"]}}))
    ref = ContributorRef(source="docs", endpoint="docs")
    acme = calls.registered("acme", 0, ref)
    assert acme.mcp is not None and acme.failure_policy == "omit"
    assert acme.mcp.spec == McpSpec(
        url=DOCS["url"],
        resources=("docs://guide/refunds", "docs://guide/limits"),
        tool="search",
        tool_arguments={"query": "{input}", "top_k": 8},
        headers={"authorization": TOKEN},
    )
    assert calls.registered("acme", 0, ref).mcp is acme.mcp
    assert calls.registered("globex", 0, ref).mcp is not acme.mcp
    with pytest.raises(InvalidError):
        calls.registered("initech", 0, ref)


def test_a_reload_drops_the_sessions_of_changed_and_removed_registrations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a reload, an unchanged registration keeps its endpoint; a changed one (here its
    header's value, read again from the environment) and a removed one are dropped."""
    monkeypatch.setenv("DOCS_MCP_TOKEN", TOKEN)
    both = {"docs": DOCS, "wiki": {**DOCS, "url": "http://127.0.0.1:9002/mcp"}}
    calls = contributors(Settings(contributors=both))
    docs = calls.registered("default", 0, ContributorRef(source="docs", endpoint="docs")).mcp
    wiki = calls.registered("default", 0, ContributorRef(source="wiki", endpoint="wiki")).mcp
    calls.reconfigure(Settings(contributors=both))
    assert len(calls.mcp) == 2
    assert (
        calls.registered("default", 0, ContributorRef(source="docs", endpoint="docs")).mcp is docs
    )
    monkeypatch.setenv("DOCS_MCP_TOKEN", TOKEN + "-rotated")
    calls.reconfigure(Settings(contributors={"wiki": both["wiki"]}))
    assert len(calls.mcp) == 0
    fresh = calls.registered("default", 0, ContributorRef(source="wiki", endpoint="wiki")).mcp
    assert fresh is not None and fresh is not wiki
    assert fresh.spec.headers == {"authorization": TOKEN + "-rotated"}


def test_sessions_kept_are_bounded() -> None:
    """Past its bound the registry drops the least recently used endpoint."""
    endpoints = McpEndpoints(max_endpoints=2)
    spec = McpSpec(url="http://127.0.0.1:9000/mcp", tool="search")
    first = endpoints.registered("a", "docs", spec)
    endpoints.registered("b", "docs", spec)
    endpoints.registered("a", "docs", spec)  # used again: "b" is now the oldest
    endpoints.registered("c", "docs", spec)
    assert len(endpoints) == 2
    assert endpoints.registered("a", "docs", spec) is first
