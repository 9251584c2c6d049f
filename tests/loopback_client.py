"""The production contributor client with every name resolving to one loopback port.

``LoopbackClient(port)`` is the production :class:`ContributorClient` with one change: every
name, registered or inline, resolves to that loopback port, where a test serves a
``context_assembly_client.testing.ScriptedContributor`` (whose record shows the host the service
meant to call). The rest (the pin check of inline URLs, caps, no redirects) is the production
path.
"""

from __future__ import annotations

import socket

from aiohttp.abc import AbstractResolver, ResolveResult

from context_assembly.contributors import ContributorClient


class _ToLoopback(AbstractResolver):
    def __init__(self, port: int) -> None:
        self.port = port

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            {
                "hostname": host,
                "host": "127.0.0.1",
                "port": self.port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            }
        ]

    async def close(self) -> None:
        return None


class LoopbackClient(ContributorClient):
    """The production contributor client, with every name resolving to one loopback port."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port

    def _resolver(self, *, inline: bool) -> AbstractResolver | None:
        return _ToLoopback(self.port)
