"""``/docs`` and ``/redoc`` work offline: every asset the pages load is served by the service."""

from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest
from api_support import AppFactory


class Assets(HTMLParser):
    """Every URL a page's elements load (their ``src`` and ``href`` attributes)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_page_loads_only_same_origin_assets_that_answer(
    make_client: AppFactory, page: str
) -> None:
    client = make_client(auth=True)  # the pages and the document need no key
    answer = client.get(page)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    parsed = Assets()
    parsed.feed(answer.text)
    assert parsed.urls, "the page names its assets"
    assert "//" not in answer.text  # no absolute or protocol-relative address anywhere
    assert "'/openapi.json'" in answer.text or '"/openapi.json"' in answer.text
    for url in parsed.urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, url
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 1000, url  # a real file, not an empty placeholder
    assert client.get("/openapi.json").status_code == 200


def test_the_pages_are_not_in_the_openapi_document(make_client: AppFactory) -> None:
    paths = make_client().get("/openapi.json").json()["paths"]
    assert not {"/docs", "/redoc", "/docs-assets"} & set(paths)


def _policy(header: str) -> dict[str, list[str]]:
    """A Content-Security-Policy header's directives and their sources."""
    directives = {}
    for directive in header.split(";"):
        name, *sources = directive.split()
        directives[name] = sources
    return directives


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_page_sends_a_content_security_policy(make_client: AppFactory, page: str) -> None:
    """Scripts from the service only (Swagger UI's inline start-up script by its hash, which
    matches the script the page holds), connections to the service only, nothing by default,
    and no framing."""
    answer = make_client().get(page)
    policy = _policy(answer.headers["content-security-policy"])
    assert policy["default-src"] == ["'none'"]
    assert policy["connect-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"] and policy["form-action"] == ["'none'"]
    scripts = policy["script-src"]
    assert scripts[0] == "'self'" and "'unsafe-inline'" not in scripts
    inline = re.findall(r"<script>(.*?)</script>", answer.text, re.DOTALL)
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in inline
    ]
    if page == "/docs":
        assert inline and scripts[1:] == hashes
    else:  # ReDoc: no inline script; its bundle compiles schemas, its search runs in a worker
        assert not inline and scripts[1:] == ["'unsafe-eval'"]
        assert policy["worker-src"] == ["blob:"]
