"""Both clients against a real ``context-assembly serve`` process over loopback TCP."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from client_support import API_KEY, prepare_body, serve_process
from context_assembly_client import APIConnectionError, AsyncClient, AuthenticationError, Client

pytestmark = pytest.mark.e2e


def config(tmp_path: Path) -> str:
    """A TOML config: API-key auth with one key, SQLite under ``tmp_path``."""
    digest = hashlib.sha256(API_KEY.encode()).hexdigest()
    return (
        f'[auth]\nmode = "api_key"\n[[auth.keys]]\ntenant = "acme"\nkey_sha256 = "{digest}"\n'
        f'[store]\nbackend = "sqlite"\npath = "{tmp_path / "served.db"}"\n'
    )


async def test_clients_against_a_served_process(tmp_path: Path) -> None:
    """Over real HTTP the sync client runs the lifecycle, the async client reads it back, and a bad
    key is refused."""
    with serve_process(tmp_path, config(tmp_path)) as url:
        with Client(url, api_key=API_KEY, timeout=10.0) as client:
            prep = client.prepare(prepare_body())
            assert client.validate(prep.preparation_id, model=prep.model, frame=prep.frame).valid
            client.report_usage(
                prep.preparation_id,
                report_id="r1",
                provider="normalized",
                usage={"provider_input_tokens": prep.budget.total_input_tokens},
            )
        async with AsyncClient(url, api_key=API_KEY, timeout=10.0) as aclient:
            view = await aclient.get_preparation(prep.preparation_id)
            assert view.accounting.last is not None
            assert view.accounting.last.provider_input_tokens == prep.budget.total_input_tokens
            assert "gpt-4o-mini" in {m.name for m in (await aclient.models()).models}
            assert prep.preparation_id in await aclient.breakdown(prep.preparation_id)
        async with AsyncClient(url, api_key="wrong", max_retries=0) as wrong:
            with pytest.raises(AuthenticationError):
                await wrong.get_preparation(prep.preparation_id)
    with Client(url, max_retries=0, timeout=2.0) as gone, pytest.raises(APIConnectionError):
        gone.health()
