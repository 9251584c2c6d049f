"""Prices on ``GET /v1/models``: shipped, configured with ``[prices."name"]`` tables, ``null``
for a model without one, and applied or refused by a reload."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from api_support import AppFactory
from fastapi.testclient import TestClient
from pydantic import ValidationError

from context_assembly.api.app import create_app
from context_assembly.config import explain, load_settings

ADMIN_KEY = "admin-key-for-price-tests"


def _models(client: TestClient) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in client.get("/v1/models").json()["models"]}


def test_each_model_shows_its_price_or_null(make_client: AppFactory) -> None:
    """A shipped price with all its figures, the page and the date; ``null`` without one."""
    models = _models(make_client())
    sonnet = models["claude-sonnet-4-5"]["price"]
    assert sonnet == {
        "source": "shipped",
        "read_from": sonnet["read_from"],
        "checked": "2026-12-06",
        "input": 3.0,
        "output": 15.0,
        "cache_read": 0.3,
        "cache_write": None,
        "cache_write_5m": 3.75,
        "cache_write_1h": 6.0,
        "cache_storage_per_hour": None,
        "long_context": None,
    }
    assert sonnet["read_from"].startswith("Anthropic pricing page")
    sol = models["gpt-5.6-sol"]["price"]
    assert (sol["input"], sol["cache_read"], sol["cache_write"], sol["output"]) == (4, 0.4, 5, 20)
    assert sol["long_context"] == {
        "above_input_tokens": 272_000,
        "input": 8.0,
        "output": 30.0,
        "cache_read": None,
        "cache_write": None,
        "cache_write_5m": None,
        "cache_write_1h": None,
    }
    assert models["gpt-4"]["price"]["cache_read"] is None
    for unpriced in ("gpt-4o", "gemini-2.5-pro"):
        assert models[unpriced]["price"] is None
    assert all("price" in m for m in models.values())


def test_configured_prices_are_listed_with_their_source(make_client: AppFactory) -> None:
    """A ``[prices."name"]`` table prices a model the release does not, or replaces a shipped
    price; a configured model can be priced too."""
    client = make_client(
        models={
            "gpt-5.2": {
                "provider": "openai",
                "tokenizer": "o200k_base",
                "context_window": 400_000,
                "max_output_tokens": 128_000,
            }
        },
        prices={
            "gpt-4o": {
                "input": 2.5,
                "output": 10,
                "cache_read": 1.25,
                "source": "OpenAI GPT-4o model page",
                "checked": "2026-12-06",
            },
            "claude-opus-4-6": {
                "input": 5,
                "output": 25,
                "cache_read": 0.5,
                "cache_write_5m": 6.25,
                "cache_write_1h": 10,
            },
            "gpt-5.2": {"input": 1.75, "output": 14, "cache_read": 0.175},
            "gemini-2.5-pro": {
                "input": 1.25,
                "output": 10,
                "cache_read": 0.125,
                "cache_storage_per_hour": 4.5,
                "long_context": {"above_input_tokens": 200_000, "input": 2.5, "output": 15},
            },
        },
    )
    models = _models(client)
    gpt_4o = models["gpt-4o"]["price"]
    assert (gpt_4o["source"], gpt_4o["read_from"], gpt_4o["input"]) == (
        "configured",
        "OpenAI GPT-4o model page",
        2.5,
    )
    opus = models["claude-opus-4-6"]["price"]
    assert opus["source"] == "configured" and opus["read_from"] is opus["checked"] is None
    assert models["gpt-5.2"]["price"]["output"] == 14
    gemini = models["gemini-2.5-pro"]["price"]
    assert gemini["cache_storage_per_hour"] == 4.5
    assert gemini["long_context"]["above_input_tokens"] == 200_000
    assert models["claude-sonnet-4-5"]["price"]["source"] == "shipped"


@pytest.mark.parametrize(
    ("prices", "message"),
    [
        ({"gpt-4o": {"input": 1}}, "prices.gpt-4o.output: Field required"),
        (
            {"gpt-4o": {"input": 1, "ouput": 2, "output": 2}},
            "prices.gpt-4o.ouput: unknown key; did you mean prices.gpt-4o.output?",
        ),
        ({"chatgpt-4o-latest": {"input": 1, "output": 1}}, "resolves to 'gpt-4o'"),
        ({"gpt-9": {"input": 1, "output": 1}}, "not the name of a model registry entry"),
        (
            {"claude-opus-4-6": {"input": 5, "output": 25, "cache_write": 6}},
            "per time to live",
        ),
        ({"gpt-4o": {"name": "gpt-4o", "input": 1, "output": 1}}, 'remove "name"'),
    ],
)
def test_an_invalid_price_table_is_refused(prices: dict[str, Any], message: str) -> None:
    """A ``[prices."name"]`` table is validated like the shipped entries, and names a registry
    entry; the error names the key."""
    with pytest.raises(ValidationError) as raised:
        load_settings(prices=prices)
    explained = [explain(e) for e in raised.value.errors()]
    assert any(message in line for line in explained), explained


def _config(tmp_path: Path, tables: str = "") -> Path:
    path = tmp_path / "service.toml"
    path.write_text(
        "[store]\n"
        f'path = "{tmp_path / "reload.db"}"\n'
        "\n[auth]\n"
        f'admin_key_sha256 = "{hashlib.sha256(ADMIN_KEY.encode()).hexdigest()}"\n'
        f"\n{tables}"
    )
    return path


GPT_4O = """[prices."gpt-4o"]
input = 2.5
output = 10
cache_read = 1.25
source = "OpenAI GPT-4o model page"
checked = "2026-12-06"
"""


def test_a_reload_applies_the_price_tables(tmp_path: Path) -> None:
    """A price added to the file is listed after a reload; an invalid table is refused and the
    running prices stay; a removed table leaves the model without a price again."""
    path = _config(tmp_path)
    app = create_app(load_settings(path), config_path=str(path))
    reload = {"X-Admin-Key": ADMIN_KEY}
    with TestClient(app) as client:
        assert _models(client)["gpt-4o"]["price"] is None

        _config(tmp_path, GPT_4O)
        assert client.post("/v1/admin/reload", headers=reload).status_code == 200
        price = _models(client)["gpt-4o"]["price"]
        assert (price["source"], price["cache_read"]) == ("configured", 1.25)

        _config(tmp_path, GPT_4O.replace("input = 2.5", "input = -2.5"))
        refused = client.post("/v1/admin/reload", headers=reload)
        assert refused.status_code == 422
        assert "prices.gpt-4o.input" in {e["loc"] for e in refused.json()["errors"]}
        assert _models(client)["gpt-4o"]["price"]["input"] == 2.5

        _config(tmp_path)
        assert client.post("/v1/admin/reload", headers=reload).status_code == 200
        assert _models(client)["gpt-4o"]["price"] is None
