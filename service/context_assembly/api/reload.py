"""Configuration reload without a restart: ``SIGHUP`` or ``POST /v1/admin/reload``.

What reloads: API keys, registered contributors, the inline-URL allowlist, limits, the model
entries of ``[models."name"]`` (the registry is rebuilt from the shipped one) and the prices of
``[prices."name"]`` (rebuilt from the shipped ones). What does not: ``[server]``, ``[store]``
and ``[cache]`` (a new bind, store or cache-key secret needs a restart); a file that changes
them is refused like an invalid one. A refused reload changes nothing: the running configuration
stays, and one log line says why (field locations and messages only, never values, which could be
secrets). Requests in flight finish with the configuration they started with; a later validate
asks each contributor for its revision as registered then (the record keeps source and endpoint
name or inline URL, never the registered URL), so a removed registration is
``revision_unavailable``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from fastapi import FastAPI
from pydantic import ValidationError

from context_assembly.api.auth import Authenticator
from context_assembly.config import Settings, explain, load_settings
from context_assembly.tokens.prices import ModelPrices
from context_assembly.tokens.registry import ModelRegistry

log = structlog.get_logger("context_assembly.reload")


@dataclass(frozen=True, slots=True)
class ReloadResult:
    reloaded: bool
    errors: list[dict[str, str]]


def _errors(err: Exception) -> list[dict[str, str]]:
    if isinstance(err, ValidationError):
        return [
            {
                "loc": ".".join(str(p) for p in e["loc"]) or "(file)",
                "msg": explain(e).partition(": ")[2],
            }
            for e in err.errors(include_input=False, include_url=False)
        ]
    if isinstance(err, FileNotFoundError):
        return [{"loc": "(file)", "msg": "configuration file not found"}]
    # TOML syntax errors carry line/column in their message, never values of other keys.
    return [{"loc": "(file)", "msg": f"{type(err).__name__}: {err}"[:300]}]


RESTART_SECTIONS = ("server", "store", "cache")
"""The sections a reload cannot apply: a new bind, store or cache-key secret needs a restart."""


def file_tables(path: str | Path | None) -> dict[str, Any]:
    """The file's own tables of ``RESTART_SECTIONS``, as written (before the environment and
    ``serve``'s options, which carry the running bind and win over the file): a reload compares
    them too, so that a changed ``[server] port`` is refused rather than silently kept."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError):
        return {}  # load_settings reports it
    return {name: document.get(name, {}) for name in RESTART_SECTIONS}


def _changed_keys(current: Settings, new: Settings) -> list[str]:
    return [
        f"{name}.{key}"
        for name in RESTART_SECTIONS
        for key, value in getattr(new, name)
        if getattr(getattr(current, name), key) != value
    ]


def _changed_in_file(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    changed: list[str] = []
    for name in RESTART_SECTIONS:
        old, new = before.get(name, {}), after.get(name, {})
        if not isinstance(old, dict) or not isinstance(new, dict):
            changed.append(name)
            continue
        changed.extend(
            f"{name}.{key}"
            for key in sorted(old.keys() | new.keys())
            if old.get(key) != new.get(key)
        )
    return changed


def reload_settings(app: FastAPI, path: str | Path | None) -> ReloadResult:
    """Load ``path`` and, if valid and reloadable, swap it in; otherwise change nothing."""
    current: Settings = app.state.settings
    try:
        new = load_settings(path)
    except Exception as err:  # any failure to read or validate is a refusal, never a crash
        result = ReloadResult(False, _errors(err))
        log.warning("config_reload_refused", errors=result.errors)
        return result
    changed = [
        *_changed_keys(current, new),
        *_changed_in_file(app.state.config_tables, file_tables(path)),
    ]
    if changed:
        result = ReloadResult(
            False,
            [{"loc": loc, "msg": "changes here need a restart"} for loc in dict.fromkeys(changed)],
        )
        log.warning("config_reload_refused", errors=result.errors)
        return result
    registry = ModelRegistry.load().with_configured(new.models)
    prices = ModelPrices.load(registry).with_configured(new.prices)
    app.state.auth = Authenticator(new.auth)
    app.state.preparations.reconfigure(new, registry, prices)
    app.state.registry = registry
    app.state.prices = prices
    app.state.settings = new
    log.info(
        "config_reloaded",
        contributors=len(new.contributors),
        keys=len(new.auth.keys),
        inline_prefixes=len(new.inline_urls.allow),
        models=len(new.models),
        prices=len(new.prices),
    )
    return ReloadResult(True, [])
