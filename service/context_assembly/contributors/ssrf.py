"""SSRF guard for contributor URLs named inline in a request (docs/contract.md, "Inline URLs").

An inline URL is accepted only when it matches an allowlist prefix (compared on the parsed
origin and path, never as a string prefix) and when **every** address its host resolves to is
public. The check returns a :class:`CheckedTarget` holding the addresses it validated; the
transport in ``client.py`` connects only to those (no second DNS lookup, so no DNS rebinding),
while TLS SNI and certificate verification still use the host name.

Address rules follow stripe/smokescreen (``pkg/smokescreen/ip_policy.go``) and the OWASP SSRF
cheat sheet: explicit deny tables first, then ``not is_global`` as a catch-all. Python's own
``is_private``/``is_global`` were wrong for some ranges before 3.12.4 (CVE-2024-4032,
python/cpython#113171) and count multicast as global, so they are never the only test.

``allow_private`` is for sidecar deployments on loopback or a private network: it permits
loopback, RFC 1918, link-local, CGNAT and unique-local addresses, but never cloud-metadata
endpoints, unspecified, multicast or reserved addresses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from context_assembly.errors import AssemblyTimeoutError, UrlRejectedError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_DEFAULT_PORTS = {"http": 80, "https": 443}


class Resolver(Protocol):
    """Resolves a host name to IP address strings (the seam tests replace)."""

    def __call__(self, host: str, port: int) -> Awaitable[Sequence[str]]:
        """Return every address ``host`` resolves to; raise ``OSError`` when it does not."""
        ...


async def system_resolver(host: str, port: int) -> Sequence[str]:
    """Resolve through the event loop's ``getaddrinfo`` (A and AAAA answers, TCP only)."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return [str(info[4][0]) for info in infos]


# --------------------------------------------------------------------------- address rules


def _nets(*cidrs: str) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


# Blocked even with allow_private: metadata endpoints (AWS/GCP/Azure IMDS, ECS task metadata,
# Alibaba, Azure WireServer which is a *public* address, Oracle, AWS IPv6 IMDS).
_METADATA = _nets(
    "169.254.169.254/32",
    "169.254.170.2/32",
    "100.100.100.200/32",
    "168.63.129.16/32",
    "192.0.0.192/32",
    "fd00:ec2::254/128",
)
_ALWAYS_DENIED: tuple[tuple[str, tuple[Network, ...]], ...] = (
    ("unspecified", _nets("0.0.0.0/8", "::/128")),
    ("multicast", _nets("224.0.0.0/4", "ff00::/8")),
    # IPv4-translated ::ffff:0:a.b.c.d (SIIT, RFC 2765) is not for hosts on the Internet:
    # refused whatever it carries, like the documentation and discard ranges.
    (
        "reserved",
        _nets("240.0.0.0/4", "192.0.0.0/24", "100::/64", "2001:db8::/32", "::ffff:0:0:0/96"),
    ),
)
# Permitted only with allow_private (a loopback or private-network sidecar).
_PRIVATE: tuple[tuple[str, tuple[Network, ...]], ...] = (
    ("loopback", _nets("127.0.0.0/8", "::1/128")),
    ("private", _nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")),
    ("link-local", _nets("169.254.0.0/16", "fe80::/10")),
    ("cgnat", _nets("100.64.0.0/10")),
    ("unique-local", _nets("fc00::/7")),
    # Deprecated site-local (RFC 3879): Python still calls it global, networks still route it.
    ("site-local", _nets("fec0::/10")),
)
_NAT64 = _nets("64:ff9b::/96")[0]
_IPV4_COMPAT = _nets("::/96")[0]

# Names that are metadata services whatever they resolve to.
_METADATA_NAMES = frozenset({"metadata.google.internal", "metadata.azure.internal", "metadata"})


def _in(ip: IPAddress, nets: Sequence[Network]) -> bool:
    return any(ip.version == net.version and ip in net for net in nets)


def _embedded_v4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 form carries, with the form's name, or ``None``."""
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", ip.ipv4_mapped
    if ip in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return "6to4", ip.sixtofour
    if ip.teredo is not None:
        return "Teredo", ip.teredo[1]
    if ip in _IPV4_COMPAT and int(ip) > 1:  # deprecated IPv4-compatible ::a.b.c.d (not :: or ::1)
        return "IPv4-compatible", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _category(ip: IPAddress, allow_private: bool) -> str | None:
    if _in(ip, _METADATA):
        return "metadata"
    for name, nets in _ALWAYS_DENIED:
        if _in(ip, nets):
            return name
    for name, nets in _PRIVATE:
        if _in(ip, nets):
            return None if allow_private else name
    if not ip.is_global:
        return "non-global"
    return None


def forbidden_category(ip: IPAddress, *, allow_private: bool = False) -> str | None:
    """Why ``ip`` must not be contacted (a category name such as ``"loopback"``), or ``None``.

    IPv6 forms that embed an IPv4 address are judged by the address they carry: IPv4-mapped,
    IPv4-compatible and NAT64 forms take the embedded address's verdict; 6to4 and Teredo
    (tunnels through third-party relays) are refused even when the embedded address is public.
    """
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_v4(ip)
        if embedded is not None:
            form, v4 = embedded
            inner = _category(v4, allow_private)
            if inner is not None:
                return f"{inner} ({form})"
            if form in ("6to4", "Teredo"):
                return form
            return None
    return _category(ip, allow_private)


# --------------------------------------------------------------------------- URL policy


def _host_key(url: httpx.URL) -> str:
    """The host as compared and pinned: ASCII (IDNA), lower case, without a trailing dot."""
    return url.raw_host.decode("ascii").lower().rstrip(".")


@dataclass(frozen=True, slots=True)
class _Prefix:
    scheme: str
    host: str
    port: int
    path: str

    def matches(self, scheme: str, host: str, port: int, path: str) -> bool:
        if (scheme, host, port) != (self.scheme, self.host, self.port):
            return False
        if self.path.endswith("/"):
            return path.startswith(self.path)
        # "/hooks" admits "/hooks" and "/hooks/x", never "/hooks-admin".
        return path == self.path or path.startswith(self.path + "/")


def _parse_prefix(prefix: str) -> _Prefix:
    try:
        url = httpx.URL(prefix)
    except httpx.InvalidURL as err:
        raise ValueError(f"allowlist entry {prefix!r} is not a URL") from err
    if url.scheme not in _DEFAULT_PORTS:
        raise ValueError(f"allowlist entry {prefix!r} must be http or https")
    if not url.raw_host or url.userinfo or url.query or url.fragment:
        raise ValueError(
            f"allowlist entry {prefix!r} needs a host and no credentials, query or fragment"
        )
    return _Prefix(
        scheme=url.scheme,
        host=_host_key(url),
        port=url.port if url.port is not None else _DEFAULT_PORTS[url.scheme],
        path=url.path or "/",
    )


@dataclass(frozen=True)
class UrlPolicy:
    """Which inline contributor URLs a request may name.

    ``allow`` holds URL prefixes (``"https://hooks.example.com/contribute/"``), each a string or
    a ``(prefix, allow_private)`` pair; an empty list admits no inline URL. Private answers
    (loopback and private networks: a sidecar) are admitted for a URL under an entry that
    permits them, or under every entry with ``allow_private``; never metadata, unspecified,
    multicast or reserved addresses. Raises ``ValueError`` for a malformed prefix, so
    configuration fails fast.
    """

    allow: Sequence[str | tuple[str, bool]]
    allow_private: bool = False
    _prefixes: tuple[tuple[_Prefix, bool], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow", tuple(self.allow))
        entries = [(e, False) if isinstance(e, str) else e for e in self.allow]
        prefixes = tuple((_parse_prefix(p), private) for p, private in entries)
        object.__setattr__(self, "_prefixes", prefixes)

    def admission(self, scheme: str, host: str, port: int, path: str) -> bool | None:
        """``None`` outside the allowlist; else whether private answers are admitted for it."""
        matched = [private for p, private in self._prefixes if p.matches(scheme, host, port, path)]
        if not matched:
            return None
        return self.allow_private or any(matched)


@dataclass(frozen=True, slots=True)
class CheckedTarget:
    """An inline URL that passed the guard, with the only addresses it may be connected to."""

    url: str
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]


# Percent-encoded ".", "/" and "\" let a server decode its way out of the allowed path.
_ENCODED_PATH_TRICKS = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)
_LEGACY_V4 = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$", re.IGNORECASE)


def _legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The address ``inet_aton`` would make of a non-canonical numeric host ("2130706433", "127.1")."""
    if not _LEGACY_V4.match(host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _literal_ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def check_url(
    url: str,
    policy: UrlPolicy,
    resolver: Resolver | None = None,
    *,
    source: str,
    deadline_monotonic: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> CheckedTarget:
    """Check an inline contributor URL and return the addresses it may be connected to.

    Refuses (``UrlRejectedError`` naming ``source`` and the reason category, never the resolved
    addresses): a URL that does not parse, is not http(s), carries credentials or a fragment,
    has percent-encoded path separators, is outside every allowlist prefix, is a non-canonical
    numeric IP, names a metadata host, does not resolve, or has **any** resolved address that
    :func:`forbidden_category` refuses. Name resolution goes through ``resolver`` (default: the
    loop's ``getaddrinfo``) and, with ``deadline_monotonic``, must finish before it (else
    ``AssemblyTimeoutError``): DNS is part of the contributor deadline.
    """

    def reject(reason: str) -> UrlRejectedError:
        return UrlRejectedError(
            f"inline contributor URL for source {source!r} rejected: {reason}",
            source=source,
            reason=reason,
        )

    try:
        parsed = httpx.URL(url)
        host = _host_key(parsed)
    except (httpx.InvalidURL, UnicodeError) as err:
        raise reject("malformed URL") from err
    if parsed.scheme not in _DEFAULT_PORTS:
        raise reject("only http and https URLs are allowed")
    if parsed.userinfo:
        raise reject("credentials in the URL are not allowed")
    if parsed.fragment:
        raise reject("a fragment is not allowed")
    if not host:
        raise reject("the URL has no host")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise reject("the port is outside 1-65535")
    path = parsed.path or "/"
    if _ENCODED_PATH_TRICKS.search(parsed.raw_path.decode("ascii").split("?", 1)[0]):
        raise reject("percent-encoded '.', '/' or '\\' in the path")
    port = parsed.port if parsed.port is not None else _DEFAULT_PORTS[parsed.scheme]
    allow_private = policy.admission(parsed.scheme, host, port, path)
    if allow_private is None:
        raise reject("not in the inline URL allowlist")
    checked_url = str(parsed)

    if "%" in host:
        raise reject("IPv6 zone identifiers are not allowed")
    literal = _literal_ip(host)
    if literal is not None:
        category = forbidden_category(literal, allow_private=allow_private)
        if category is not None:
            raise reject(f"address is {category}")
        return CheckedTarget(checked_url, parsed.scheme, host, port, (str(literal),))
    legacy = _legacy_ipv4(host)
    if legacy is not None:
        category = forbidden_category(legacy, allow_private=allow_private)
        suffix = f" ({category})" if category is not None else ""
        raise reject(f"non-canonical numeric IPv4 host{suffix}")
    if host in _METADATA_NAMES:
        raise reject("host is a cloud metadata service")
    if not allow_private and (host == "localhost" or host.endswith(".localhost")):
        raise reject("host is loopback (localhost)")

    resolve = resolver if resolver is not None else system_resolver
    try:
        if deadline_monotonic is None:
            answers = await resolve(host, port)
        else:
            async with asyncio.timeout(max(0.0, deadline_monotonic - clock())):
                answers = await resolve(host, port)
    except TimeoutError as err:
        raise AssemblyTimeoutError(
            f"resolving the contributor host for source {source!r} did not finish in time",
            sources=[source],
        ) from err
    except OSError as err:
        raise reject("the host name does not resolve") from err

    addresses: list[str] = []
    for answer in answers:
        ip = _literal_ip(answer.split("%", 1)[0])
        if ip is None:
            raise reject("the resolver returned a non-address answer")
        category = forbidden_category(ip, allow_private=allow_private)
        if category is not None:
            raise reject(f"host resolves to a {category} address")
        if str(ip) not in addresses:
            addresses.append(str(ip))
    if not addresses:
        raise reject("the host name does not resolve")
    return CheckedTarget(checked_url, parsed.scheme, host, port, tuple(addresses))
