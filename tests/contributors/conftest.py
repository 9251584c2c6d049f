"""Fixtures for contributor tests: the real shared client, packet fields, a recording resolver."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from context_assembly.contributors import ContributorClient, PacketFields, create_client
from context_assembly.core.request import Message, Scope


@pytest.fixture
async def client() -> AsyncIterator[ContributorClient]:
    """The production client (two aiohttp pools, pinning for inline URLs), closed after the test."""
    async with create_client() as shared:
        yield shared


@pytest.fixture
def fields() -> PacketFields:
    """Packet fields of one preparation with a per-source limit for ``memory``."""
    return PacketFields(
        preparation_id="prep_test",
        model="gpt-4o-mini",
        input=[Message(role="user", content="what is due today?")],
        data_budget_tokens=2048,
        scope=Scope(account_id="acct_1", roles=["reader"]),
        deadline_unix_ms=int(time.time() * 1000) + 1000,
        source_token_limits={"memory": 512},
    )
