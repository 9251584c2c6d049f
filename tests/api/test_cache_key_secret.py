"""Automatic ``prompt_cache_key``s are keyed by a server secret (docs/api.md, the ``cache``
object): the configured one, or one generated once and kept in the store, so that a key is the
same after a restart and on every replica, and differs between services that share nothing."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

import orjson
from fastapi.testclient import TestClient

from context_assembly.api.app import create_app
from context_assembly.config import load_settings

SCOPE = {"account_id": "acct-7", "task_id": "t-1"}
BODY = {
    "model": "gpt-4o",
    "render": "openai-chat",
    "scope": SCOPE,
    "cache": {"key": "auto"},
    "input": [{"role": "user", "content": "hi"}],
}


def auto_key(path: Path, **cache: Any) -> str:
    """The automatic key of BODY from a fresh app on the SQLite file ``path``."""
    settings = load_settings(store={"path": str(path)}, cache=cache)
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/prepare", json=BODY)
        assert response.status_code == 200, response.text
        key: str = response.json()["frame"]["prompt_cache_key"]
        return key


def test_the_generated_secret_survives_a_restart_and_is_not_shared(tmp_path: Path) -> None:
    """Two starts on one store give one key; another store (another service) another key."""
    first = auto_key(tmp_path / "a.db")
    assert auto_key(tmp_path / "a.db") == first
    assert auto_key(tmp_path / "b.db") != first


def test_a_configured_secret_keys_the_hmac(tmp_path: Path) -> None:
    """With ``[cache] key_secret`` the key is HMAC-SHA256 of tenant and scope under it."""
    secret = "a shared secret of the replicas"
    raw = orjson.dumps(
        [
            "default",
            {**SCOPE, "connector_accounts": {}, "principal": None, "identities": [], "roles": []},
        ],
        option=orjson.OPT_SORT_KEYS,
    )
    expected = "ca-" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()[:32]
    assert auto_key(tmp_path / "c.db", key_secret=secret) == expected
    assert auto_key(tmp_path / "d.db", key_secret=secret) == expected
