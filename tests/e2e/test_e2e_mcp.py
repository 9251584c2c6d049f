"""MCP servers as contributors, end to end: a real ``context-assembly serve`` process with a TOML
file registering MCP servers built with the official SDK (subprocesses), and a webhook beside
them for the deadline comparison; an MCP server named by an inline URL; the sessions' end on the
server and their gauge in ``/metrics``."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from context_assembly_client.testing import Step
from e2e_support import Contributor, ServiceFactory
from prometheus_client.parser import text_string_to_metric_families

from contributors.faults import DEADLINE
from contributors.mcp_servers import McpProcess, mcp_server

pytestmark = pytest.mark.e2e

TOKEN = "tok-e2e-" + "0123456789abcdef" * 2


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpProcess]:
    """The SDK test server, guarded by a bearer token."""
    with mcp_server(tmp_path_factory.mktemp("mcp"), token=TOKEN) as server:
        yield server


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpProcess]:
    """The SDK test server without a token (a request names no header)."""
    with mcp_server(tmp_path_factory.mktemp("mcp")) as server:
        yield server


def open_sessions(client: httpx.Client) -> float:
    """The gauge of open MCP sessions in ``/metrics``."""
    text = client.get("/metrics").text
    [family] = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "context_assembly_mcp_sessions_open"
    ]
    [sample] = family.samples
    return sample.value


def wait_until(holds: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Bounded polling: the MCP server is another process, which notes what happened to each
    call in its record file (a session is ended in the background, after the call that used
    it); ``timeout`` is a hang guard."""
    deadline = time.monotonic() + timeout
    while not holds():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def wait_for_lines(server: McpProcess, line: str, count: int) -> None:
    """Wait until the server's record holds ``count`` of ``line``."""
    wait_until(lambda: server.lines().count(line) >= count, f"{count} x {line!r} recorded")


def mcp_entry(name: str, url: str, **keys: str) -> str:
    lines = [f"[contributors.{name}]", 'kind = "mcp"', f'url = "{url}"']
    lines += [f"{key} = {value}" for key, value in keys.items()]
    lines.append('headers = { authorization = "env:DOCS_MCP_TOKEN" }')
    return "\n".join(lines) + "\n\n"


def config(docs: McpProcess, contributor: Contributor, db: str = "{db}", top_k: int = 2) -> str:
    return (
        f'[store]\npath = "{db}"\n\n'
        # The documented registration (docs/contributors.md).
        + mcp_entry(
            "docs",
            docs.url,
            resources='["docs://guide/refunds", "docs://guide/limits"]',
            tool='"search"',
            tool_arguments=f'{{ query = "{{input}}", top_k = {top_k} }}',
            failure_policy='"omit"',
        )
        + mcp_entry("counter", docs.url, resources='["docs://counter"]')
        + mcp_entry("bumper", docs.url, tool='"bump"')
        + mcp_entry("hang", docs.url, tool='"hang"', tool_arguments='{ query = "{input}" }')
        + f'[contributors.slow]\nurl = "{contributor.url("/hang")}"\n'
    )


@pytest.fixture(autouse=True)
def hung_webhook(contributor: Contributor) -> None:
    """The webhook beside the MCP servers never answers (``/hang``)."""
    contributor.script("/hang", Step(fault="hang"))


def body(*contributors: dict[str, Any], timeout_ms: int = 5000) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "assembly": {"max_data_tokens": 2000, "timeout_ms": timeout_ms},
        "plugins": [{"name": c["source"]} for c in contributors],
        "contributors": list(contributors),
        "input": [{"role": "user", "content": "What is the refund policy?"}],
    }


def test_an_mcp_contributor_through_the_service(
    monkeypatch: pytest.MonkeyPatch,
    service_factory: ServiceFactory,
    docs_server: McpProcess,
    contributor: Contributor,
) -> None:
    """The documented MCP configuration works against an official-SDK server: its resources and tool
    results are blocks with the mapped priorities; validate re-reads the resources' revisions
    and sees a change; the header value never appears in an answer or a log line."""
    monkeypatch.setenv("DOCS_MCP_TOKEN", f"Bearer {TOKEN}")
    svc = service_factory(config(docs_server, contributor))
    answers: list[str] = []
    with httpx.Client(base_url=svc.base, timeout=10) as client:
        first = client.post(
            "/v1/prepare",
            json=body(
                {"source": "docs", "endpoint": "docs"}, {"source": "counter", "endpoint": "counter"}
            ),
        )
        answers.append(first.text)
        assert first.status_code == 200, first.text
        prep = first.json()
        sources = {s["source"]: s["status"] for s in prep["selection"]["sources"]}
        assert sources == {"docs": "ok", "counter": "ok"}
        reports = {(b["source"], b["id"]): b for b in prep["selection"]["blocks"]}
        assert reports["docs", "docs://guide/refunds"]["priority"] == 800
        assert reports["docs", "docs://guide/limits"]["priority"] == -600
        assert sorted(
            b["priority"] for (s, i), b in reports.items() if i.startswith("search#")
        ) == [0, 1000]
        assert all(b["status"] == "selected" for b in reports.values())
        sent = str(prep["frame"]["messages"])
        assert "hit 0 for What is the refund policy?" in sent  # {input}, filled

        check = {"model": prep["model"], "frame": prep["frame"]}
        valid = client.post(f"/v1/preparations/{prep['preparation_id']}/validate", json=check)
        answers.append(valid.text)
        assert valid.status_code == 200, valid.text
        bumped = client.post("/v1/prepare", json=body({"source": "bumper", "endpoint": "bumper"}))
        assert bumped.status_code == 200
        stale = client.post(f"/v1/preparations/{prep['preparation_id']}/validate", json=check)
        answers.append(stale.text)
        assert stale.status_code == 409
        assert stale.json()["reasons"] == ["revision_changed:counter"]
    assert all(TOKEN not in text for text in answers)
    assert TOKEN not in svc.log.read_text()


def short_prepare(client: httpx.Client, *contributors: dict[str, Any]) -> httpx.Response:
    """A prepare whose deadline is the fault tests' ``DEADLINE``."""
    return client.post("/v1/prepare", json=body(*contributors, timeout_ms=int(DEADLINE * 1000)))


def test_a_hanging_mcp_server_answers_like_a_hanging_webhook(
    monkeypatch: pytest.MonkeyPatch,
    service_factory: ServiceFactory,
    docs_server: McpProcess,
    contributor: Contributor,
) -> None:
    """With ``timeout_ms = 300``, a hanging MCP server and a hanging webhook are both cut at the
    deadline (the MCP tool is cancelled on the server, the webhook's connection closed): under
    ``omit`` the prepare answers 200 with both sources ``timeout``; under ``fail`` each answers
    504."""
    monkeypatch.setenv("DOCS_MCP_TOKEN", f"Bearer {TOKEN}")
    svc = service_factory(config(docs_server, contributor))
    mcp = {"source": "docs", "endpoint": "hang"}
    webhook = {"source": "notes", "endpoint": "slow"}
    cancelled = docs_server.lines().count("hang cancelled")
    closed = contributor.count("closed", "/hang")  # the calls of earlier tests
    with httpx.Client(base_url=svc.base, timeout=10) as client:
        omitted = short_prepare(
            client, {**mcp, "failure_policy": "omit"}, {**webhook, "failure_policy": "omit"}
        )
        assert omitted.status_code == 200, omitted.text
        statuses = {s["source"]: s["status"] for s in omitted.json()["selection"]["sources"]}
        assert statuses == {"docs": "timeout", "notes": "timeout"}
        wait_for_lines(docs_server, "hang cancelled", cancelled + 1)
        contributor.wait_for("closed", "/hang", count=closed + 1)
        failed = short_prepare(client, {**mcp, "failure_policy": "fail"})
        assert failed.status_code == 504, failed.text
        assert failed.json()["code"] == "CONTEXT_ASSEMBLY_TIMEOUT"
        wait_for_lines(docs_server, "hang cancelled", cancelled + 2)
        failed = short_prepare(client, {**webhook, "failure_policy": "fail"})
        assert failed.status_code == 504, failed.text
        assert failed.json()["code"] == "CONTEXT_ASSEMBLY_TIMEOUT"
        contributor.wait_for("closed", "/hang", count=closed + 2)


def test_a_reload_that_changes_the_registration_opens_a_new_session(
    monkeypatch: pytest.MonkeyPatch,
    service_factory: ServiceFactory,
    docs_server: McpProcess,
    contributor: Contributor,
) -> None:
    """Prepares reuse one session; a reload that changes the registration ends it on the server
    (``DELETE``), and the next prepare initialises a new one; ``/metrics`` counts the sessions
    open; the shutdown ends the last one."""
    monkeypatch.setenv("DOCS_MCP_TOKEN", f"Bearer {TOKEN}")
    svc = service_factory(config(docs_server, contributor))
    db = next(
        line.split('"')[1]
        for line in svc.config.read_text().splitlines()
        if line.startswith("path")
    )
    ref = {"source": "docs", "endpoint": "docs"}

    def opened() -> int:
        return svc.log.read_text().count('"mcp_session_opened"')

    deletes = docs_server.lines().count("DELETE -")
    with httpx.Client(base_url=svc.base, timeout=10) as client:
        assert open_sessions(client) == 0
        for _ in range(3):
            assert client.post("/v1/prepare", json=body(ref)).status_code == 200
        assert opened() == 1
        assert open_sessions(client) == 1
        svc.config.write_text(config(docs_server, contributor, db=db, top_k=1))
        svc.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while '"config_reloaded"' not in svc.log.read_text():  # bounded: the signal is async
            assert time.monotonic() < deadline, "the reload was never logged"
            time.sleep(0.05)
        wait_for_lines(docs_server, "DELETE -", deletes + 1)
        assert open_sessions(client) == 0
        again = client.post("/v1/prepare", json=body(ref))
        assert again.status_code == 200
        ids = [
            b["id"] for b in again.json()["selection"]["blocks"] if b["id"].startswith("search#")
        ]
        assert len(ids) == 1  # the new tool_arguments apply
        assert opened() == 2
        assert open_sessions(client) == 1
    svc.stop()  # the shutdown waits for the DELETE's answer
    assert docs_server.lines().count("DELETE -") == deletes + 2


def test_an_inline_mcp_url_through_the_service(
    service_factory: ServiceFactory, open_server: McpProcess
) -> None:
    """An MCP server named inline, admitted by ``[inline_urls]`` (loopback, ``allow_private``):
    its resources are blocks, its binary resource is an omitted ``binary_content`` report with
    0 tokens (shown by the breakdown too, never sent), the source's kind is ``mcp``; validate
    re-reads the resources' revision from what the record kept and sees a change; each call's
    session is ended on the server after it. Off the allowlist the URL is refused."""
    prefix = f"http://127.0.0.1:{open_server.port}/"
    svc = service_factory(
        f'[store]\npath = "{{db}}"\n\n'
        f'[inline_urls]\nallow = [{{ prefix = "{prefix}", allow_private = true }}]\n'
    )
    mcp = {"source": "docs", "url": open_server.url, "kind": "mcp"}
    read = {**mcp, "resources": ["docs://guide/refunds", "docs://counter", "docs://logo.png"]}
    initialized = open_server.lines().count("POST initialize")
    deletes = open_server.lines().count("DELETE -")
    with httpx.Client(base_url=svc.base, timeout=10) as client:
        first = client.post("/v1/prepare", json=body(read))
        assert first.status_code == 200, first.text
        prep = first.json()
        [source] = prep["selection"]["sources"]
        assert (source["kind"], source["status"], source["block_count"]) == ("mcp", "ok", 2)
        reports = [
            (b["id"], b["status"], b["reason"], b["tokens"], b["full_tokens"])
            for b in prep["selection"]["blocks"]
        ]
        assert [r[:3] for r in reports] == [
            ("docs://guide/refunds", "selected", "fits"),
            ("docs://counter", "selected", "fits"),
            ("docs://logo.png", "omitted", "binary_content"),
        ]
        assert reports[2][3:] == (0, 0)
        assert "docs://logo.png" not in str(prep["frame"])
        prep_id = prep["preparation_id"]
        page = client.get(f"/v1/preparations/{prep_id}/breakdown").text
        assert "binary_content" in page and "docs://logo.png" in page

        check = {"model": prep["model"], "frame": prep["frame"]}
        valid = client.post(f"/v1/preparations/{prep_id}/validate", json=check)
        assert valid.status_code == 200, valid.text
        bump = client.post("/v1/prepare", json=body({**mcp, "tool": "bump"}))
        assert bump.status_code == 200, bump.text
        stale = client.post(f"/v1/preparations/{prep_id}/validate", json=check)
        assert stale.status_code == 409, stale.text
        assert stale.json()["reasons"] == ["revision_changed:docs"]

        refused = client.post(
            "/v1/prepare",
            json=body({**read, "url": "http://127.0.0.2:9/mcp", "failure_policy": "omit"}),
        )
        assert refused.status_code == 200, refused.text
        [source] = refused.json()["selection"]["sources"]
        assert (source["kind"], source["status"]) == ("mcp", "rejected")
        assert open_sessions(client) == 0
    # prepare, validate twice, bump: a session each, each ended after its call
    assert open_server.lines().count("POST initialize") == initialized + 4
    wait_for_lines(open_server, "DELETE -", deletes + 4)
