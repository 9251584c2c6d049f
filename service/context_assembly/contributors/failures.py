"""A failed contributor call classified, once, where it is seen: a transport exception or an
answer that is not the protocol's shape, as a status and a
:class:`~context_assembly.core.sources.SourceFailure` (a cause's name, the HTTP status or the
path of the field, and the same in words). The words never quote the body. Webhook calls
(``calls.py``) and MCP requests (``mcp.py``, ``mcp_exchange.py``) share these rules.
"""

from __future__ import annotations

import socket
import ssl

import aiohttp
from pydantic import ValidationError

from context_assembly.contributors.client import PinRefusedError
from context_assembly.contributors.outcomes import Status
from context_assembly.core.sources import SourceFailure

_UNION_TAGS = frozenset({"str", "int", "float"})  # pydantic's location tags for Revision's members


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def classify(exc: BaseException) -> tuple[Status, SourceFailure]:
    """Status and failure of a transport exception, judged by the exceptions in its chain."""
    chain = _chain(exc)

    def has(*types: type[BaseException]) -> bool:
        return any(isinstance(e, types) for e in chain)

    if has(ConnectionRefusedError):
        return "error", SourceFailure("connect_refused", "connect refused")
    if has(aiohttp.ClientConnectorCertificateError, ssl.SSLCertVerificationError):
        return "error", SourceFailure("tls_certificate", "TLS certificate verification failed")
    if has(aiohttp.ClientSSLError, ssl.SSLError):
        return "error", SourceFailure("tls", "TLS error")
    if has(aiohttp.ClientConnectorDNSError, socket.gaierror):
        return "error", SourceFailure("name_resolution", "name resolution failed")
    if has(ConnectionResetError):
        return "error", SourceFailure("connection_reset", "connection reset")
    if has(aiohttp.ServerDisconnectedError):
        return "error", SourceFailure("connection_closed", "server closed the connection")
    if has(aiohttp.ClientPayloadError):
        return "error", SourceFailure(
            "connection_closed", "connection closed before the body was complete"
        )
    if has(aiohttp.ClientResponseError):
        return "error", SourceFailure("protocol_error", "HTTP protocol error")
    if has(aiohttp.ClientConnectorError):
        return "error", SourceFailure("connect_failed", "connect failed")
    if has(PinRefusedError):
        return "error", SourceFailure("transport_refused", "request refused by the transport")
    return "error", SourceFailure("transport_error", f"transport error ({type(exc).__name__})")


def _schema_locations(err: ValidationError) -> list[tuple[list[str], str]]:
    """Each distinct location of ``err`` as its parts, with its message, in pydantic's order.

    No body text: inputs are excluded, and the one location part that comes from the body (the
    name of an unexpected member) is replaced by ``<unknown field>``. Union member tags
    (``revision.str``) are dropped so that one bad revision is one entry.
    """
    found: list[tuple[list[str], str]] = []
    seen: set[str] = set()
    for item in err.errors(include_input=False, include_url=False):
        loc_parts = [str(p) for p in item["loc"] if p not in _UNION_TAGS]
        if item["type"] == "extra_forbidden" and loc_parts:
            loc_parts[-1] = "<unknown field>"
        loc = ".".join(loc_parts)
        if loc in seen:
            continue
        seen.add(loc)
        found.append((loc_parts, item["msg"]))
    return found


def _schema_cause(err: ValidationError) -> str:
    """``schema: blocks.3.priority: Input should be a valid integer`` (at most three
    locations; :func:`_schema_locations` says what is left out)."""
    found = _schema_locations(err)
    parts = [f"{'.'.join(loc) or '(root)'}: {msg}" for loc, msg in found]
    extra = len(found) - 3
    text = "; ".join(parts[:3]) + (f" (and {extra} more)" if extra > 0 else "")
    return f"schema: {text}"


def schema_failure(err: ValidationError) -> SourceFailure:
    """``invalid_answer``, the :func:`_schema_cause` words, and the path of the first offending
    field (an unexpected member: the object that holds it); none for the answer as a whole."""
    found = _schema_locations(err)
    loc = found[0][0] if found else []
    if loc and loc[-1] == "<unknown field>":
        loc = loc[:-1]
    return SourceFailure("invalid_answer", _schema_cause(err), field=".".join(loc) or None)
