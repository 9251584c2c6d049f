"""The one shared HTTP client for contributor webhooks, and connection pinning for inline URLs.

httpx stays the client API (so respx, timeouts and the request/response types are the usual
ones), and requests sent through that API travel over aiohttp through
``httpx_aiohttp.AiohttpTransport``: on this project's 2-core machines httpx's own pool costs
~0.9 ms of CPU per request and collapses at 128 requests in flight. The contributor calls of
``calls.py`` take a faster path still when the client came from :func:`create_client`: the
transport's :class:`~.wire.WireClient`, an HTTP/1.1 client over asyncio protocols and httptools
with the same pinning rules and TLS context (``wire.py`` says why and what it does;
``bench/bench_fanout.py`` prints all three paths side by side).

Create the client **once per app** (lifespan) with :func:`create_client` and ``await
client.aclose()`` at shutdown; never one per request (an SSL context alone costs ~20 ms).

Pinning (no DNS rebinding). :class:`ContributorTransport` keeps two aiohttp sessions:

* ``trusted``: registered contributors from the configuration, normal DNS, normal pooling;
* ``pinned``: inline URLs. Its connector's resolver (:class:`PinnedResolver`) never performs a
  lookup: it answers with the addresses of the :class:`~.ssrf.CheckedTarget` that the *current
  request* carries in its ``extensions[PIN_EXTENSION]``, handed over through a ``ContextVar``
  that is set only while that request connects (aiohttp resolves in the calling task when its
  DNS cache is off). A request without a pin, or whose URL does not match its pin, cannot
  connect through this pool. Literal-IP URLs skip the resolver and connect to the literal
  address, which is exactly the one that was checked. TLS SNI and certificate checks use the
  URL's host name. Keep-alive connections in the pinned pool were opened to checked addresses
  only, and the pool is never shared with the trusted one.

This was chosen over one connector per checked target because it keeps connection reuse and
needs no per-call session lifecycle, and over a host→address map because the ContextVar ties the
answer to the request that was checked, so concurrent requests never see each other's answers.
Redirects are never followed (a 3xx is a contributor failure), no proxy is read from the
environment (a proxy would resolve the name itself and defeat pinning), and cookies are never
kept (a contributor must not be able to correlate requests of different tenants).
"""

from __future__ import annotations

import socket
import ssl
import weakref
from contextvars import ContextVar
from http.cookiejar import CookieJar, DefaultCookiePolicy

import aiohttp
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult
from httpx_aiohttp import AiohttpTransport

from context_assembly.contributors.ssrf import CheckedTarget
from context_assembly.contributors.wire import WireClient

PIN_EXTENSION = "context_assembly.pinned_target"
"""Request extension holding the :class:`CheckedTarget` an inline request must connect to."""

_CURRENT_PIN: ContextVar[CheckedTarget | None] = ContextVar("contributor_pin", default=None)
_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV

DEFAULT_HEADERS = {
    "user-agent": "context-assembly",
    "accept": "application/json",
    # Bodies are capped on the wire bytes; a compressed body would defeat the cap, so ask for none.
    "accept-encoding": "identity",
}


class PinnedResolver(AbstractResolver):
    """An aiohttp resolver that answers only with the current request's checked addresses."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """Return the pinned addresses for ``host``; raise ``OSError`` when nothing is pinned."""
        pin = _CURRENT_PIN.get()
        if pin is None or host.lower().rstrip(".") != pin.host or port != pin.port:
            raise OSError("no checked address is pinned for this host")
        results: list[ResolveResult] = []
        for address in pin.addresses:
            fam = socket.AF_INET6 if ":" in address else socket.AF_INET
            if family not in (socket.AF_UNSPEC, fam):
                continue
            results.append(
                {
                    "hostname": host,
                    "host": address,
                    "port": port,
                    "family": fam,
                    "proto": 0,
                    "flags": _NUMERIC,
                }
            )
        if not results:
            raise OSError("no checked address of the requested family")
        return results

    async def close(self) -> None:
        """Nothing to release: no lookups are ever made."""


def _session(
    limits: httpx.Limits, ssl_context: ssl.SSLContext, *, pinned: bool
) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=limits.max_connections or 0,
        keepalive_timeout=limits.keepalive_expiry,
        ssl=ssl_context,
        # The pinned pool must ask its resolver on every new connection, in the caller's task.
        resolver=PinnedResolver() if pinned else None,
        use_dns_cache=not pinned,
    )
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        headers=DEFAULT_HEADERS,
        # Compressed answers are refused (the size cap is on wire bytes): never inflate one.
        auto_decompress=False,
    )


class ContributorTransport(httpx.AsyncBaseTransport):
    """An httpx transport over two aiohttp pools: trusted (registered) and pinned (inline)."""

    def __init__(self, *, limits: httpx.Limits, ssl_context: ssl.SSLContext) -> None:
        # The fast path of calls.py (wire.py): same TLS context, same pinning rules, own pools.
        self.wire = WireClient(
            ssl_context, DEFAULT_HEADERS, max_connections=limits.max_connections or 100
        )
        # Sessions are created lazily, inside the running loop, on first use.
        self._trusted = AiohttpTransport(
            verify=ssl_context,
            client=lambda: _session(limits, ssl_context, pinned=False),
        )
        self._pinned = AiohttpTransport(
            verify=ssl_context,
            client=lambda: _session(limits, ssl_context, pinned=True),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send through the trusted pool, or through the pinned pool when a pin is attached."""
        pin = request.extensions.get(PIN_EXTENSION)
        if pin is None:
            response: httpx.Response = await self._trusted.handle_async_request(request)
            return response
        if not isinstance(pin, CheckedTarget):
            raise httpx.UnsupportedProtocol("the pinned-target extension must be a CheckedTarget")
        url = request.url
        host = url.raw_host.decode("ascii").lower().rstrip(".")
        port = url.port if url.port is not None else (443 if url.scheme == "https" else 80)
        if (url.scheme, host, port) != (pin.scheme, pin.host, pin.port):
            raise httpx.UnsupportedProtocol("request URL does not match its pinned target")
        token = _CURRENT_PIN.set(pin)
        try:
            response = await self._pinned.handle_async_request(request)
        finally:
            _CURRENT_PIN.reset(token)
        return response

    async def aclose(self) -> None:
        """Close both pools and the fast path's connections."""
        await self.wire.aclose()
        await self._trusted.aclose()
        await self._pinned.aclose()


def contributor_limits(max_connections: int = 256) -> httpx.Limits:
    """The contributor client's pool limits: ``max_connections`` calls in flight at once (the
    service passes ``limits.max_contributor_connections``)."""
    return httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=20, keepalive_expiry=5.0
    )


def create_client(
    *,
    limits: httpx.Limits | None = None,
    timeout: httpx.Timeout | None = None,
    ssl_context: ssl.SSLContext | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    fast: bool = True,
) -> httpx.AsyncClient:
    """The shared contributor client: aiohttp transport with pinning, no redirects, no cookies.

    ``timeout`` holds httpx's per-phase timeouts, a second line only (the deadline is enforced
    around each call by ``calls.py``). ``transport`` replaces the aiohttp transport (tests,
    benchmarks); inline URLs then lose pinning unless that transport honours
    :data:`PIN_EXTENSION`. ``fast=False`` keeps every call on httpx's own send path (respx
    mocks patch that path; the default fast path posts straight through the aiohttp pools, see
    :meth:`ContributorTransport.post`). Call ``await client.aclose()`` at shutdown.
    """
    limits = limits or contributor_limits()
    if transport is None:
        ctx = ssl_context or httpx.create_ssl_context(trust_env=False)
        transport = ContributorTransport(limits=limits, ssl_context=ctx)
    client = httpx.AsyncClient(
        transport=transport,
        follow_redirects=False,
        trust_env=False,
        timeout=timeout or httpx.Timeout(5.0),
        headers=DEFAULT_HEADERS,
        # A jar whose policy accepts no domain: responses can never set cookies.
        cookies=_no_cookies(),
    )
    if fast and isinstance(transport, ContributorTransport):
        _FAST[client] = transport
    return client


_FAST: weakref.WeakKeyDictionary[httpx.AsyncClient, ContributorTransport] = (
    weakref.WeakKeyDictionary()
)


def fast_transport(client: httpx.AsyncClient) -> ContributorTransport | None:
    """The aiohttp transport under a client made by :func:`create_client` (``None`` otherwise,
    e.g. a test client on respx or a mock transport, which then goes through httpx as usual)."""
    return _FAST.get(client)


def _no_cookies() -> CookieJar:
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
