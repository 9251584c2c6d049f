"""No memory kept from refused contributor answers, in a real service process.

A contributor answers without ``Content-Length`` (close-delimited or chunked), with bodies just
under and just over the body cap. After 200 prepares the service's resident memory has not
grown by anything like the bytes it read (a client that kept each refused body referenced
until the cyclic collector ran would grow by about 8 MB a call: over 1 GB in 600 prepares).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from context_assembly_client.testing import ScriptedContributor
from e2e_support import ServiceFactory

pytestmark = pytest.mark.e2e

CAP = 2 * 1024 * 1024
PREPARES = 200
GROWTH_LIMIT = 100 * 1024 * 1024  # 200 kept bodies would be ~400 MiB
ANSWER = b'{"revision": 1, "blocks": [{"id": "a", "text": "fact"}]}'


def _answer(request: httpx.Request) -> httpx.Response:
    """``/<chunked|close>/<under|over>``: a valid answer padded to just under or over the cap."""
    _, framing, size = request.url.path.split("/")
    body = ANSWER + b" " * ((CAP - 100 if size == "under" else CAP + 100) - len(ANSWER))
    if framing == "chunked":

        async def pieces() -> AsyncIterator[bytes]:
            for start in range(0, len(body), 65536):
                yield body[start : start + 65536]

        return httpx.Response(200, content=pieces(), headers={"content-type": "application/json"})
    response = httpx.Response(200, content=body, headers={"content-type": "application/json"})
    del response.headers["content-length"]  # delimited by the close of the connection
    return response


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def test_refused_and_unframed_answers_leave_no_memory_behind(
    service_factory: ServiceFactory,
) -> None:
    routes = [f"/{f}/{s}" for f in ("close", "chunked") for s in ("under", "over")]
    with ScriptedContributor(handler=_answer) as contributor:
        contributors = "".join(
            f'[contributors.c{i}]\nurl = "{contributor.url(path)}"\nfailure_policy = "omit"\n\n'
            for i, path in enumerate(routes)
        )
        config = (
            f'[store]\nbackend = "sqlite"\npath = "{{db}}"\n\n[limits]\n'
            f"max_contributor_response_bytes = {CAP}\n\n{contributors}"
        )
        svc = service_factory(config)
        with httpx.Client(base_url=svc.base, timeout=30) as client:

            def prepare(index: int) -> dict[str, str]:
                name = f"c{index % len(routes)}"
                body = {
                    "model": "gpt-4o-mini",
                    "assembly": {"timeout_ms": 10_000, "max_data_tokens": 4000},
                    "plugins": [{"name": name}],
                    "contributors": [{"source": name, "endpoint": name}],
                    "input": [{"role": "user", "content": "hello"}],
                }
                response = client.post("/v1/prepare", json=body)
                assert response.status_code == 200, response.text
                return {s["source"]: s["status"] for s in response.json()["selection"]["sources"]}

            for i in range(8):  # warm up: pools, encodings, first allocations
                prepare(i)
            before = _rss_bytes(svc.proc.pid)
            seen = [prepare(i) for i in range(PREPARES)]
            after = _rss_bytes(svc.proc.pid)
    statuses = {name: status for answer in seen for name, status in answer.items()}
    assert statuses == {"c0": "ok", "c1": "too_large", "c2": "ok", "c3": "too_large"}
    assert after - before < GROWTH_LIMIT, f"RSS grew by {(after - before) / 2**20:.0f} MiB"
