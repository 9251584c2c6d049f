"""The registry entry an answer used, unknown names with their nearest neighbours, and the
operator's ``[models."name"]`` entries: shown by ``GET /v1/models``, used by prepare and budget,
applied by a reload."""

from __future__ import annotations

import hashlib
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from api_support import AppFactory, basic_request
from fastapi.testclient import TestClient
from pydantic import ValidationError

from context_assembly.api import reload
from context_assembly.api.app import create_app
from context_assembly.config import explain, load_settings
from context_assembly.logs import configure_logging
from context_assembly.preparations import operations

ADMIN_KEY = "admin-key-for-model-tests"


@pytest.fixture
def log_lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.BytesIO]:
    """The service's log lines of this test. The service binds each module's logger on first use
    (to the stderr of then): here nothing is bound for good, and the two loggers this file reads
    are made afresh, in case an earlier test bound them."""
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", SimpleNamespace(buffer=out))
    before = structlog.get_config()
    configure_logging("info")
    structlog.configure(cache_logger_on_first_use=False)
    monkeypatch.setattr(operations, "log", structlog.get_logger("context_assembly.preparations"))
    monkeypatch.setattr(reload, "log", structlog.get_logger("context_assembly.reload"))
    try:
        yield out
    finally:
        structlog.configure(**before)


def _events(out: io.BytesIO, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    return [line for line in lines if line["event"] == event]


# ------------------------------------------------------------------- the entry an answer used


@pytest.mark.parametrize(
    ("model", "entry"),
    [
        ("gpt-4o-mini", "gpt-4o-mini"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("openai/gpt-5.6-sol", "gpt-5.6-sol"),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5"),
        ("claude-opus-4-6", "claude-opus-4-6"),
    ],
)
def test_prepare_and_budget_name_the_registry_entry(
    make_client: AppFactory, model: str, entry: str
) -> None:
    """``selection.model_entry`` is the entry the model resolved to, in prepare, budget and the
    stored record alike."""
    client = make_client()
    body = basic_request(model=model)
    prepared = client.post("/v1/prepare", json=body).json()
    assert prepared["selection"]["model_entry"] == entry
    assert "warnings" not in prepared["selection"]
    assert client.post("/v1/budget", json=body).json()["selection"]["model_entry"] == entry
    stored = client.get(f"/v1/preparations/{prepared['preparation_id']}").json()
    assert stored["selection"]["model_entry"] == entry


@pytest.mark.parametrize(
    ("model", "nearest"),
    [
        ("gpt-4o-mnii", "gpt-4o-mini"),
        ("gpt-5-turbo-typo", "gpt-5"),
        ("claude-opus-4-9", "claude-opus-4"),
    ],
)
def test_a_typo_is_unknown_and_the_warning_names_the_nearest_entries(
    make_client: AppFactory, log_lines: io.BytesIO, model: str, nearest: str
) -> None:
    """A name that only starts like, or is spelt like, a known one is not silently taken for it:
    the answer names no entry, counts with the estimate on the fallback window, and the warning
    and the log line name the nearest known names."""
    client = make_client()
    answer = client.post("/v1/prepare", json=basic_request(model=model)).json()
    selection = answer["selection"]
    assert selection["model_entry"] is None
    assert selection["tokenizer"] == "estimate"
    assert answer["budget"]["capacity_source"] == "fallback"
    [warning] = selection["warnings"]
    assert warning["code"] == "unknown_model"
    assert model in warning["detail"] and "nearest known names" in warning["detail"]
    assert nearest in warning["detail"]
    [line] = _events(log_lines, "unknown_model")
    assert line["model"] == model and nearest in line["nearest"]
    budget = client.post("/v1/budget", json=basic_request(model=model)).json()
    assert budget["selection"]["model_entry"] is None


def test_sonnet_5_counts_the_same_request_at_least_1_3_times_sonnet_4_5(
    make_client: AppFactory,
) -> None:
    """The newer Claude tokenizer counts ~30% more: every term of a Sonnet 5 budget, framing
    included, is at least 1.3 times the same request's for Sonnet 4.5."""
    client = make_client()
    body = basic_request(contributions=[], plugins=[])
    older = client.post("/v1/budget", json={**body, "model": "claude-sonnet-4-5"}).json()
    newer = client.post("/v1/budget", json={**body, "model": "claude-sonnet-5"}).json()
    assert newer["selection"]["model_entry"] == "claude-sonnet-5"
    assert older["selection"]["tokenizer"] == newer["selection"]["tokenizer"] == "estimate"
    assert newer["budget"]["total_input_tokens"] >= 1.3 * older["budget"]["total_input_tokens"]
    for term in ("instructions_tokens", "history_tokens", "input_tokens"):
        assert newer["budget"][term] >= 1.3 * older["budget"][term], term


# ------------------------------------------------------------------------ configured entries

CONFIGURED: dict[str, dict[str, Any]] = {
    "gpt-5.2": {
        "provider": "openai",
        "tokenizer": "o200k_base",
        "context_window": 400_000,
        "max_output_tokens": 128_000,
        "min_cacheable_prefix": 1024,
        "aliases": ["gpt-5.2-thinking"],
        "source": "OpenAI GPT-5.2 model page",
        "checked": "2026-12-06",
    },
    # Replaces the shipped entry of the same name.
    "gpt-4o-mini": {
        "provider": "openai",
        "tokenizer": "o200k_base",
        "context_window": 32_000,
        "max_output_tokens": 8_000,
        "min_cacheable_prefix": 1024,
    },
}


def test_configured_entries_are_listed_with_their_source(make_client: AppFactory) -> None:
    """``GET /v1/models`` marks each entry ``shipped`` or ``configured``; an override replaces
    the shipped entry of its name, a new name is added."""
    models = {
        m["name"]: m for m in make_client(models=CONFIGURED).get("/v1/models").json()["models"]
    }
    assert models["gpt-5.2"]["source"] == "configured"
    assert models["gpt-5.2"]["aliases"] == ["gpt-5.2-thinking"]
    assert models["gpt-5.2"]["read_from"] == "OpenAI GPT-5.2 model page"
    assert models["gpt-4o-mini"]["source"] == "configured"
    assert models["gpt-4o-mini"]["context_window"] == 32_000
    assert models["gpt-4o-mini"]["read_from"] is models["gpt-4o-mini"]["checked"] is None
    assert models["gpt-4o"]["source"] == "shipped"
    assert models["gpt-4o"]["read_from"] and models["gpt-4o"]["checked"]
    assert models["claude-sonnet-5"]["estimate_scale"] == 1.3
    shipped = make_client().get("/v1/models").json()["models"]
    assert {m["source"] for m in shipped} == {"shipped"}
    assert len(models) == len(shipped) + 1


def test_prepare_uses_the_configured_entry(make_client: AppFactory) -> None:
    """A configured override's window and output limit are the ones a prepare uses, and a
    configured alias (with a dated snapshot) resolves to its entry."""
    client = make_client(models=CONFIGURED)
    answer = client.post(
        "/v1/prepare", json=basic_request(model="gpt-4o-mini-2024-07-18", render="openai-chat")
    ).json()
    assert answer["selection"]["model_entry"] == "gpt-4o-mini"
    assert (answer["budget"]["capacity"], answer["budget"]["capacity_source"]) == (
        32_000,
        "registry",
    )
    added = client.post("/v1/prepare", json=basic_request(model="gpt-5.2-thinking-20261201")).json()
    assert added["selection"]["model_entry"] == "gpt-5.2"
    assert added["selection"]["tokenizer"] == "o200k_base" and added["selection"]["exact"]
    assert added["budget"]["capacity"] == 400_000
    assert "warnings" not in added["selection"]


@pytest.mark.parametrize(
    ("models", "message"),
    [
        (
            {"gpt-x": {"provider": "openai", "tokenizer": "o200k_base"}},
            "models.gpt-x.context_window",
        ),
        (
            {"gpt-x": {**CONFIGURED["gpt-5.2"], "aliaes": []}},
            "models.gpt-x.aliaes: unknown key; did you mean models.gpt-x.aliases?",
        ),
        ({"gpt-x": {**CONFIGURED["gpt-5.2"], "name": "gpt-y"}}, 'remove "name"'),
        ({"gpt-x": {**CONFIGURED["gpt-5.2"], "tokenizer": "estimate"}}, "not valid for provider"),
        ({"gpt-x": {**CONFIGURED["gpt-5.2"], "estimate_scale": 1.3}}, "estimate_scale"),
        ({"GPT-X": CONFIGURED["gpt-5.2"]}, "models.GPT-X"),
        ({"gpt-x": {**CONFIGURED["gpt-5.2"], "aliases": ["gpt-4o"]}}, "appears twice"),
    ],
)
def test_an_invalid_model_table_is_refused(models: dict[str, Any], message: str) -> None:
    """A ``[models."name"]`` table is validated like the data file's entries, and may not take a
    name or alias another entry answers to; the error names the key."""
    with pytest.raises(ValidationError) as raised:
        load_settings(models=models)
    explained = [explain(e) for e in raised.value.errors()]
    assert any(message in line for line in explained), explained


# ---------------------------------------------------------------------------------- reload


def _config(tmp_path: Path, models: str = "") -> Path:
    path = tmp_path / "service.toml"
    path.write_text(
        "[store]\n"
        f'path = "{tmp_path / "reload.db"}"\n'
        "\n[auth]\n"
        f'admin_key_sha256 = "{hashlib.sha256(ADMIN_KEY.encode()).hexdigest()}"\n'
        f"\n{models}"
    )
    return path


GPT_5_2 = """[models."gpt-5.2"]
provider = "openai"
tokenizer = "o200k_base"
context_window = 400000
max_output_tokens = 128000
min_cacheable_prefix = 1024
source = "OpenAI GPT-5.2 model page"
checked = "2026-12-06"
"""


def test_a_reload_applies_the_model_tables(tmp_path: Path, log_lines: io.BytesIO) -> None:
    """A model added to the file is known after a reload (listed, used by prepare); a file whose
    model table is invalid is refused and the running registry stays."""
    path = _config(tmp_path)
    app = create_app(load_settings(path), config_path=str(path))
    reload = {"X-Admin-Key": ADMIN_KEY}
    body = basic_request(model="gpt-5.2")
    with TestClient(app) as client:
        before = client.post("/v1/prepare", json=body).json()
        assert before["selection"]["model_entry"] is None
        assert "gpt-5.2" not in {m["name"] for m in client.get("/v1/models").json()["models"]}

        _config(tmp_path, GPT_5_2)
        assert client.post("/v1/admin/reload", headers=reload).status_code == 200
        after = client.post("/v1/prepare", json=body).json()
        assert after["selection"]["model_entry"] == "gpt-5.2"
        assert after["budget"]["capacity"] == 400_000
        listed = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
        assert listed["gpt-5.2"]["source"] == "configured"
        assert _events(log_lines, "config_reloaded")[-1]["models"] == 1

        _config(tmp_path, GPT_5_2.replace("400000", "0"))
        refused = client.post("/v1/admin/reload", headers=reload)
        assert refused.status_code == 422
        assert "models.gpt-5.2.context_window" in {e["loc"] for e in refused.json()["errors"]}
        kept = client.post("/v1/prepare", json=body).json()
        assert kept["budget"]["capacity"] == 400_000

        _config(tmp_path)
        assert client.post("/v1/admin/reload", headers=reload).status_code == 200
        gone = client.post("/v1/prepare", json=body).json()
        assert gone["selection"]["model_entry"] is None
