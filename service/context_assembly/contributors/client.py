"""The one shared HTTP client for contributor webhooks: two aiohttp sessions, pinning for inline URLs.

Create it **once per app** (lifespan) with :func:`create_client` and ``await client.aclose()`` at
shutdown; never one per request (an SSL context alone costs ~20 ms). The sessions are made on
first use, inside the running event loop.

Two pools, never shared:

* ``registered``: contributors from the configuration, normal DNS, normal pooling;
* ``inline``: SSRF-checked inline URLs. Its connector's resolver (:class:`PinnedResolver`) never
  performs a lookup: it answers with the addresses of the :class:`~.ssrf.CheckedTarget` of the
  *current call*, handed over through a ``ContextVar`` set only around that call (aiohttp asks
  the resolver from the calling task's context when its DNS cache is off). A call without a pin,
  or whose URL does not match its pin, cannot connect through this pool (no DNS rebinding).
  Literal-IP URLs skip the resolver and connect to the literal address, which is exactly the one
  that was checked. TLS SNI and certificate checks use the URL's host name.

Both pools follow the same rules: redirects are never followed (a 3xx is a contributor failure),
no proxy is read from the environment (a proxy would resolve the name itself and defeat
pinning), no cookie is kept (a contributor must not correlate requests of different tenants),
answers are never decompressed (the body cap is on wire bytes; a compressed answer is refused).
The response head is bounded by aiohttp's parser: 8190 bytes per line and per header field, at
most 128 header fields. Each pool holds at most ``max_connections`` connections; an idle one is
closed after ``keepalive_seconds`` (below the 5 s that common servers, uvicorn included, keep an
idle connection, so the client closes first), and one whose server closed it is dropped at once.
"""

from __future__ import annotations

import socket
import ssl
from contextvars import ContextVar
from types import TracebackType

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from context_assembly.contributors.ssrf import CheckedTarget

MAX_LINE_BYTES = 8190
"""Longest status line, header line or header field the client reads (aiohttp's parser limit)."""
MAX_HEADERS = 128
KEEPALIVE_SECONDS = 4.0

_CURRENT_PIN: ContextVar[CheckedTarget | None] = ContextVar("contributor_pin", default=None)
_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV

DEFAULT_HEADERS = {
    "user-agent": "context-assembly",
    "accept": "application/json",
    # Bodies are capped on the wire bytes; a compressed body would defeat the cap, so ask for none.
    "accept-encoding": "identity",
}


class PinRefusedError(aiohttp.ClientError):
    """An inline call whose URL does not match the checked target it carries."""


class PinnedResolver(AbstractResolver):
    """An aiohttp resolver that answers only with the current call's checked addresses."""

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


class ContributorClient:
    """The two contributor pools (registered and inline) and the one way to call through them."""

    def __init__(
        self,
        *,
        max_connections: int = 256,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_seconds: float = KEEPALIVE_SECONDS,
    ) -> None:
        self.max_connections = max_connections
        self.keepalive_seconds = keepalive_seconds
        # Made here, once (~20 ms), not on a first call: the sessions are made on first use.
        self._ssl = ssl_context or ssl.create_default_context()
        self._registered: aiohttp.ClientSession | None = None
        self._inline: aiohttp.ClientSession | None = None

    def _resolver(self, *, inline: bool) -> AbstractResolver | None:
        """The pool's resolver: pinned for inline URLs, aiohttp's default for registered ones."""
        return PinnedResolver() if inline else None

    def _session(self, *, inline: bool) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            keepalive_timeout=self.keepalive_seconds,
            ssl=self._ssl,
            resolver=self._resolver(inline=inline),
            # The inline pool asks its resolver on every new connection, in the caller's context.
            use_dns_cache=not inline,
        )
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            headers=DEFAULT_HEADERS,
            auto_decompress=False,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES,
            max_headers=MAX_HEADERS,
            # The deadline is the caller's (one asyncio.timeout around the call).
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], pin: CheckedTarget | None
    ) -> aiohttp.ClientResponse:
        """POST ``body`` and return the response once its head is read (the caller reads the
        body, then ``release()``s or ``close()``s it). ``pin``: the checked target of an inline
        URL, whose addresses are the only ones the call may connect to."""
        return await self._send("POST", url, body, headers, pin)

    async def delete(
        self, url: str, headers: dict[str, str], pin: CheckedTarget | None
    ) -> aiohttp.ClientResponse:
        """DELETE ``url`` (an MCP session's end) and return the response once its head is read;
        the same pools, pinning and rules as :meth:`post`."""
        return await self._send("DELETE", url, None, headers, pin)

    async def _send(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: dict[str, str],
        pin: CheckedTarget | None,
    ) -> aiohttp.ClientResponse:
        if pin is None:
            if self._registered is None:
                self._registered = self._session(inline=False)
            return await self._registered.request(
                method, url, data=body, headers=headers, allow_redirects=False
            )
        parsed = URL(url)
        host = (parsed.raw_host or "").lower().rstrip(".")
        if (parsed.scheme, host, parsed.port) != (pin.scheme, pin.host, pin.port):
            raise PinRefusedError("request URL does not match its checked target")
        if self._inline is None:
            self._inline = self._session(inline=True)
        token = _CURRENT_PIN.set(pin)
        try:
            return await self._inline.request(
                method, url, data=body, headers=headers, allow_redirects=False
            )
        finally:
            _CURRENT_PIN.reset(token)

    async def aclose(self) -> None:
        """Close both pools and their connections."""
        for session in (self._registered, self._inline):
            if session is not None:
                await session.close()
        self._registered = self._inline = None

    async def __aenter__(self) -> ContributorClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def create_client(
    *, max_connections: int = 256, ssl_context: ssl.SSLContext | None = None
) -> ContributorClient:
    """The shared contributor client (the service passes ``limits.max_contributor_connections``
    as ``max_connections``); ``ssl_context`` replaces the system trust store (tests with a
    private CA). Call ``await client.aclose()`` at shutdown."""
    return ContributorClient(max_connections=max_connections, ssl_context=ssl_context)
