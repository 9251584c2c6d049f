"""The SSRF vectors, through ``POST /v1/prepare`` (docs/contract.md, "Inline URLs").

Each inline URL is inside the allowlist, so only the address check can refuse it: under
``fail`` the prepare is a 422 ``CONTRIBUTOR_URL_REJECTED`` naming the source and not the address,
and the contributor transport sees no request (the resolver seam shows that a name was looked
up, so the refusal is the address check's). A public address is called: the control that lets
each case fail. "A redirect to a private address" is in ``test_inline_dns.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from api_support import AppFactory, basic_request

PUBLIC = "93.184.216.34"
NAMES = {
    "loopback.test": ["127.0.0.1"],
    "loopback6.test": ["::1"],
    "mixed.test": [PUBLIC, "10.1.2.3"],  # any forbidden address refuses the name
    "metadata.test": ["169.254.169.254"],
    "public.test": [PUBLIC],
}
VECTORS = [
    "http://169.254.169.254/latest/meta-data",
    "http://[::ffff:127.0.0.1]/c",
    "http://[::ffff:10.0.0.1]/c",
    "http://0.0.0.0/c",
    "http://10.0.0.1/c",
    "http://10.5.5.5/c",
    "http://10.255.255.254/c",
    "http://100.64.0.1/c",
    "http://100.127.255.254/c",
    "http://[fd00::1]/c",
    "http://[fd12:3456::1]/c",
    "http://loopback.test/c",
    "http://loopback6.test/c",
    "http://mixed.test/c",
    "http://metadata.test/c",
]


class Resolver:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append(host)
        if host not in NAMES:
            raise OSError("no such host")
        return NAMES[host]


def _prepare(make_client: AppFactory, url: str, policy: str) -> tuple[Any, Resolver, list[str]]:
    sent: list[str] = []

    def contributor(request: httpx.Request) -> httpx.Response:
        sent.append(str(request.url))
        return httpx.Response(200, json={"revision": "r1", "blocks": [{"id": "a", "text": "t"}]})

    resolver = Resolver()
    parts = urlsplit(url)
    client = make_client(
        contributor_transport=httpx.MockTransport(contributor),
        resolver=resolver,
        inline_urls={"allow": [f"{parts.scheme}://{parts.netloc}/"]},
    )
    body = basic_request(contributors=[{"source": "web", "url": url, "failure_policy": policy}])
    body["plugins"] = [*body["plugins"], {"name": "web"}]
    return client.post("/v1/prepare", json=body), resolver, sent


@pytest.mark.parametrize("url", VECTORS)
def test_each_vector_is_refused_before_any_connection(make_client: AppFactory, url: str) -> None:
    response, resolver, sent = _prepare(make_client, url, "fail")
    assert response.status_code == 422, response.text
    problem = response.json()
    assert (problem["code"], problem["source"]) == ("CONTRIBUTOR_URL_REJECTED", "web")
    assert sent == []
    host = urlsplit(url).hostname or ""
    if host in NAMES:
        assert resolver.asked == [host]  # looked up, then refused for what it resolved to
        for address in NAMES[host]:
            assert address not in response.text  # the answer does not say what a name resolves to


@pytest.mark.parametrize("url", ["http://10.0.0.1/c", "http://loopback.test/c"])
def test_under_omit_a_refused_vector_is_rejected_and_the_prepare_answers(
    make_client: AppFactory, url: str
) -> None:
    response, _, sent = _prepare(make_client, url, "omit")
    assert response.status_code == 200, response.text
    statuses = {s["source"]: s["status"] for s in response.json()["selection"]["sources"]}
    assert statuses["web"] == "rejected"
    assert sent == []


def test_a_public_address_is_called(make_client: AppFactory) -> None:
    """The control: the same set-up with a name resolving to a public address makes the call."""
    response, resolver, sent = _prepare(make_client, "http://public.test/c", "fail")
    assert response.status_code == 200, response.text
    assert resolver.asked == ["public.test"] and len(sent) == 1
    statuses = {s["source"]: s["status"] for s in response.json()["selection"]["sources"]}
    assert statuses["web"] == "ok"
