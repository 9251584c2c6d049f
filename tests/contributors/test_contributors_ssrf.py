"""SSRF guard: allowlist matching, forbidden addresses, resolution, and no connection on refusal."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Iterator

import httpx
import pytest
from context_assembly_client.testing import ScriptedContributor
from doubles import RecordingResolver
from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembly.contributors import (
    ContributorTarget,
    PacketFields,
    UrlPolicy,
    check_url,
    contribute_all,
    forbidden_category,
)
from context_assembly.core.request import Scope
from context_assembly.errors import AssemblyTimeoutError, UrlRejectedError
from hypothesis_budget import examples
from loopback_client import LoopbackClient

PUBLIC = "93.184.216.34"

# Each vector is allowlisted itself, so the address rules (not the allowlist) must refuse it.
ADDRESS_VECTORS = [
    ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ("http://[::ffff:127.0.0.1]/", "loopback (IPv4-mapped)"),
    ("http://[::ffff:169.254.169.254]/", "metadata (IPv4-mapped)"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://10.0.0.1/", "private"),
    ("http://172.16.0.1/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://100.64.0.1/", "cgnat"),
    ("http://127.0.0.1/", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://[fd00::1]/", "unique-local"),
    ("http://[fd00:ec2::254]/", "metadata"),
    ("http://100.100.100.200/", "metadata"),
    ("http://168.63.129.16/", "metadata"),
    ("http://192.0.0.192/", "metadata"),
    ("http://[64:ff9b::a9fe:a9fe]/", "metadata (NAT64)"),
    ("http://[2002:a9fe:a9fe::]/", "metadata (6to4)"),
    ("http://224.0.0.1/", "multicast"),
    ("http://[ff02::1]/", "multicast"),
    ("http://[fec0::1]/", "site-local"),  # deprecated, but Python calls it global
    ("http://[::ffff:0:7f00:1]/", "reserved"),  # IPv4-translated loopback
    ("http://[::ffff:0:808:808]/", "reserved"),  # IPv4-translated, whatever it carries
    ("http://2130706433/", "non-canonical numeric IPv4 host (loopback)"),
    ("http://0x7f000001/", "non-canonical numeric IPv4 host (loopback)"),
    ("http://127.1/", "non-canonical numeric IPv4 host (loopback)"),
    ("http://localhost/", "localhost"),
    ("http://metadata.google.internal/", "metadata service"),
]


def allow_only(url: str, *, allow_private: bool = False) -> UrlPolicy:
    """A policy whose allowlist is exactly the origin of ``url``."""
    parsed = httpx.URL(url)
    return UrlPolicy(
        allow=[str(parsed.copy_with(path="/", query=None))], allow_private=allow_private
    )


@pytest.fixture
def contributor() -> Iterator[ScriptedContributor]:
    """The contributor double every name reaches (``LoopbackClient``); it records each call."""
    with ScriptedContributor() as double:
        yield double


async def guarded_call(
    url: str, policy: UrlPolicy, resolver: RecordingResolver, contributor: ScriptedContributor
) -> None:
    """The production flow for an inline URL: check it, then fan out to it."""
    checked = await check_url(url, policy, resolver, source="memory")
    target = ContributorTarget(source="memory", url=url, kind="inline", checked=checked)
    fields = PacketFields("prep", "m", [], 100, Scope(), 0)
    async with LoopbackClient(contributor.port) as client:  # every name reaches the double
        await contribute_all(client, [target], fields, time.monotonic() + 1, 1024)


@pytest.mark.parametrize(("url", "reason"), ADDRESS_VECTORS)
async def test_forbidden_literal_or_name_is_refused_before_any_connection(
    url: str, reason: str, contributor: ScriptedContributor
) -> None:
    """Every SSRF vector is refused with UrlRejectedError and the contributor sees no request."""
    resolver = RecordingResolver({})
    with pytest.raises(UrlRejectedError) as info:
        await guarded_call(url, allow_only(url), resolver, contributor)
    assert reason in info.value.detail
    assert info.value.extensions["source"] == "memory"
    assert contributor.calls() == []
    if httpx.URL(url).host[0].isdigit() or ":" in httpx.URL(url).host:
        assert resolver.calls == []  # literal addresses are never looked up


@pytest.mark.parametrize("port", [0, 65536, 99999])
async def test_a_port_outside_the_tcp_range_is_refused(port: int) -> None:
    """A port httpx parses but TCP cannot use is refused at the check, not left to the call."""
    url = f"http://{PUBLIC}:{port}/"
    policy = UrlPolicy(allow=[f"http://{PUBLIC}/"])
    with pytest.raises(UrlRejectedError) as info:
        await check_url(url, policy, RecordingResolver({}), source="memory")
    assert "port" in info.value.detail


async def test_name_resolving_to_loopback_is_refused_without_naming_the_address(
    contributor: ScriptedContributor,
) -> None:
    """A public-looking name whose answer is 127.0.0.1 is refused; the error names the category only."""
    resolver = RecordingResolver({"hooks.example.com": ["127.0.0.1"]})
    url = "https://hooks.example.com/contribute"
    with pytest.raises(UrlRejectedError) as info:
        await guarded_call(url, allow_only(url), resolver, contributor)
    assert "loopback" in info.value.detail
    assert "127.0.0.1" not in info.value.detail
    assert resolver.calls == [("hooks.example.com", 443)]
    assert contributor.calls() == []


async def test_one_private_answer_among_public_ones_refuses_the_name() -> None:
    """Every resolved address is checked: [public, 10.0.0.5] is refused."""
    resolver = RecordingResolver({"hooks.example.com": [PUBLIC, "10.0.0.5"]})
    url = "https://hooks.example.com/"
    with pytest.raises(UrlRejectedError, match="private"):
        await check_url(url, allow_only(url), resolver, source="memory")


async def test_public_answers_are_returned_as_the_pinned_addresses() -> None:
    """A name with only public answers passes and the checked target keeps exactly those addresses."""
    resolver = RecordingResolver({"hooks.example.com": [PUBLIC, PUBLIC, "2606:4700:4700::1111"]})
    url = "https://Hooks.Example.COM./contribute?x=1"
    checked = await check_url(
        url, UrlPolicy(allow=["https://hooks.example.com/contribute"]), resolver, source="memory"
    )
    assert checked.addresses == (PUBLIC, "2606:4700:4700::1111")
    assert (checked.scheme, checked.host, checked.port) == ("https", "hooks.example.com", 443)


async def test_rebinding_name_keeps_the_first_checked_answer() -> None:
    """A name that later resolves to loopback stays pinned to the address that was checked."""
    resolver = RecordingResolver(
        {"hooks.example.com": [PUBLIC]}, later={"hooks.example.com": ["127.0.0.1"]}
    )
    url = "https://hooks.example.com/"
    checked = await check_url(url, allow_only(url), resolver, source="memory")
    assert checked.addresses == (PUBLIC,)
    with pytest.raises(UrlRejectedError):  # a second check sees the rebound answer and refuses
        await check_url(url, allow_only(url), resolver, source="memory")


@pytest.mark.parametrize(
    "url",
    [
        "http://a.example.com.evil/hooks/x",
        "http://evil.a.example.com/hooks/x",
        "http://a.example.com:8080/hooks/x",
        "http://a.example.com:22/hooks/x",
        "https://a.example.com/hooks/x",
        "http://a.example.com/hooksx",
        "http://a.example.com/other",
        "http://a.example.com/hooks/../admin",
        "http://a.example.com/hooks/%2e%2e/admin",
        "http://a.example.com/hooks%2f..%2fadmin",
        "http://user@a.example.com/hooks/x",
        "http://a.example.com@evil.example/hooks/x",
        "http://ok.example@169.254.169.254/hooks/x",
        "http://a.example.com/hooks/x#frag",
        "ftp://a.example.com/hooks/x",
        "file:///etc/passwd",
        "gopher://a.example.com/hooks/x",
        "http://0177.0.0.1/hooks/x",
        "not a url",
    ],
)
async def test_allowlist_prefix_tricks_are_refused(url: str) -> None:
    """Prefix matching compares parsed origin and path, so look-alike URLs never match."""
    resolver = RecordingResolver({"a.example.com": [PUBLIC]})
    with pytest.raises(UrlRejectedError):
        await check_url(url, UrlPolicy(allow=["http://a.example.com/hooks/"]), resolver, source="s")
    assert resolver.calls == []


@pytest.mark.parametrize(
    ("prefix", "url", "admitted"),
    [
        ("http://a.example.com/hooks", "http://a.example.com/hooks", True),
        ("http://a.example.com/hooks", "http://a.example.com/hooks/x", True),
        ("http://a.example.com/hooks", "http://a.example.com/hooks-admin", False),
        ("http://a.example.com/hooks/", "http://a.example.com/hooks", False),
        ("http://a.example.com", "http://A.EXAMPLE.com:80/anything?q=%2F", True),
        ("https://a.example.com:8443/", "https://a.example.com:8443/x", True),
        ("https://a.example.com:8443/", "https://a.example.com/x", False),
    ],
)
async def test_allowlist_path_boundaries(prefix: str, url: str, admitted: bool) -> None:
    """A prefix admits its own path and paths below it, never a sibling sharing its letters."""
    resolver = RecordingResolver({"a.example.com": [PUBLIC]})
    policy = UrlPolicy(allow=[prefix])
    if admitted:
        assert (await check_url(url, policy, resolver, source="s")).addresses == (PUBLIC,)
    else:
        with pytest.raises(UrlRejectedError, match="allowlist"):
            await check_url(url, policy, resolver, source="s")


async def test_empty_allowlist_admits_nothing() -> None:
    """With no allowlist entry no inline URL is accepted."""
    with pytest.raises(UrlRejectedError, match="allowlist"):
        await check_url(
            "https://a.example.com/", UrlPolicy(allow=[]), RecordingResolver({}), source="s"
        )


@pytest.mark.parametrize(
    "prefix", ["ftp://a.example.com/", "http://u@a.example.com/", "http://a.example.com/?q=1", "/x"]
)
def test_malformed_allowlist_entries_fail_fast(prefix: str) -> None:
    """A prefix that is not a plain http(s) origin and path is a configuration error."""
    with pytest.raises(ValueError, match="allowlist entry"):
        UrlPolicy(allow=[prefix])


async def test_allow_private_permits_a_loopback_sidecar() -> None:
    """allow_private admits loopback by literal and by name (a sidecar deployment)."""
    resolver = RecordingResolver({"sidecar.internal": ["127.0.0.1", "::1"]})
    literal = await check_url(
        "http://127.0.0.1:9001/c", UrlPolicy(["http://127.0.0.1:9001/"], True), resolver, source="s"
    )
    named = await check_url(
        "http://sidecar.internal:9001/c",
        UrlPolicy(["http://sidecar.internal:9001/"], True),
        resolver,
        source="s",
    )
    assert literal.addresses == ("127.0.0.1",)
    assert named.addresses == ("127.0.0.1", "::1")


@pytest.mark.parametrize(
    "url",
    ["http://169.254.169.254/", "http://[fd00:ec2::254]/", "http://0.0.0.0/", "http://224.0.0.1/"],
)
async def test_allow_private_never_permits_metadata_unspecified_or_multicast(url: str) -> None:
    """Metadata endpoints, 0.0.0.0 and multicast stay refused even for sidecar deployments."""
    with pytest.raises(UrlRejectedError):
        await check_url(url, allow_only(url, allow_private=True), RecordingResolver({}), source="s")


async def test_unresolvable_name_is_refused() -> None:
    """A name the resolver cannot answer is refused, not retried elsewhere."""
    url = "https://nowhere.example/"
    with pytest.raises(UrlRejectedError, match="does not resolve"):
        await check_url(url, allow_only(url), RecordingResolver({}), source="s")


async def test_resolution_is_bounded_by_the_deadline() -> None:
    """A resolver that never answers ends in AssemblyTimeoutError naming the source at the
    deadline (DNS is inside it): the lookup is cancelled, not left running."""
    never = asyncio.Event()
    cancelled = asyncio.Event()

    async def stuck(host: str, port: int) -> list[str]:
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return [PUBLIC]

    url = "https://slow.example/"
    deadline = time.monotonic() + 0.05
    with pytest.raises(AssemblyTimeoutError) as info:
        await check_url(url, allow_only(url), stuck, source="s", deadline_monotonic=deadline)
    assert info.value.extensions["sources"] == ["s"]
    assert cancelled.is_set()


async def test_system_resolver_is_the_default() -> None:
    """Without an injected resolver the loop's getaddrinfo answers (localhost, from the hosts file)."""
    policy = UrlPolicy(["http://localhost:9/"], allow_private=True)
    checked = await check_url("http://localhost:9/x", policy, source="s")
    assert "127.0.0.1" in checked.addresses or "::1" in checked.addresses


@settings(max_examples=examples(200), deadline=None)
@given(st.ip_addresses(v=4))
def test_ipv4_mapped_form_gets_the_same_verdict_as_its_ipv4_address(
    ip: ipaddress.IPv4Address,
) -> None:
    """::ffff:a.b.c.d is refused exactly when a.b.c.d is (with and without allow_private)."""
    mapped = ipaddress.IPv6Address(f"::ffff:{ip}")
    for allow_private in (False, True):
        plain = forbidden_category(ip, allow_private=allow_private)
        wrapped = forbidden_category(mapped, allow_private=allow_private)
        assert (plain is None) == (wrapped is None)


@settings(max_examples=examples(200), deadline=None)
@given(st.ip_addresses(v=4, network="10.0.0.0/8") | st.ip_addresses(v=4, network="127.0.0.0/8"))
def test_private_ipv4_inside_6to4_and_nat64_is_refused(ip: ipaddress.IPv4Address) -> None:
    """A private or loopback IPv4 address embedded in 6to4 or NAT64 form is refused."""
    six_to_four = ipaddress.IPv6Address((0x2002 << 112) | (int(ip) << 80))
    nat64 = ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) | int(ip))
    assert forbidden_category(six_to_four) is not None
    assert forbidden_category(nat64) is not None


async def test_private_answers_are_admitted_only_under_an_entry_that_permits_them() -> None:
    """``(prefix, True)`` admits a loopback sidecar; a plain entry beside it still refuses a
    name that resolves to a private address (the global ``allow_private`` admitted both)."""
    resolver = RecordingResolver({"hooks.example.com": ["10.0.0.1"], "sidecar.test": ["127.0.0.1"]})
    policy = UrlPolicy(allow=["https://hooks.example.com/", ("http://sidecar.test:9001/", True)])
    checked = await check_url(
        "http://sidecar.test:9001/contribute", policy, resolver, source="memory"
    )
    assert checked.addresses == ("127.0.0.1",)
    with pytest.raises(UrlRejectedError) as info:
        await check_url("https://hooks.example.com/c", policy, resolver, source="memory")
    assert "private" in info.value.detail
    broad = UrlPolicy(allow=["https://hooks.example.com/"], allow_private=True)
    assert await check_url("https://hooks.example.com/c", broad, resolver, source="memory")
    with pytest.raises(UrlRejectedError) as info:  # never metadata, whatever the entry says
        await check_url(
            "http://169.254.169.254/",
            UrlPolicy(allow=[("http://169.254.169.254/", True)]),
            resolver,
            source="memory",
        )
    assert "metadata" in info.value.detail


def test_the_allowlist_takes_strings_and_entries_from_the_configuration() -> None:
    from context_assembly.config import load_settings

    settings = load_settings(
        inline_urls={
            "allow": [
                "https://hooks.example.com/",
                {"prefix": "http://127.0.0.1:9001/", "allow_private": True},
            ]
        }
    )
    assert settings.inline_urls.entries() == [
        "https://hooks.example.com/",
        ("http://127.0.0.1:9001/", True),
    ]
