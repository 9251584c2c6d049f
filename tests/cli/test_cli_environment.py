"""No silent configuration: a ``CONTEXT_ASSEMBLY_*`` variable that names no setting stops the
start, naming itself and the nearest valid variable (a section or a key misspelt, at any depth),
while every variable the project itself uses with that prefix is still accepted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import get_origin

import pytest

from context_assembly import errors
from context_assembly.config import OTHER_ENV, Settings, load_settings, unknown_env_variable
from context_assembly.server import CONFIG_ENV

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "CONTEXT_ASSEMBLY_"
COMMAND = [sys.executable, "-m", "context_assembly.cli", "serve"]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.upper().startswith(PREFIX)}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No ``CONTEXT_ASSEMBLY_*`` variable from the outside in the settings checked."""
    for name in list(os.environ):
        if name.upper().startswith(PREFIX):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("CONTEXT_ASSEMBLY_AUHT__MODE", "CONTEXT_ASSEMBLY_AUTH__MODE"),
        ("CONTEXT_ASSEMBLY_AUTH__MDOE", "CONTEXT_ASSEMBLY_AUTH__MODE"),
    ],
)
def test_serve_refuses_a_misspelt_variable_naming_the_one_meant(
    tmp_path: Path, variable: str, meant: str
) -> None:
    """The real command exits 2 before it serves, its message naming both variables (the value
    is never shown)."""
    env = {**_clean_env(), variable: "api_key"}
    done = subprocess.run(
        [*COMMAND, "--port", "0"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    err = done.stderr.decode()
    assert f"environment variable {variable} names no setting; did you mean {meant}?" in err
    assert "api_key" not in err


@pytest.mark.parametrize(
    ("variable", "said"),
    [
        ("CONTEXT_ASSEMBLY_AUTH__MDOE", "did you mean CONTEXT_ASSEMBLY_AUTH__MODE?"),
        ("CONTEXT_ASSEMBLY_AUHT__MDOE", "did you mean CONTEXT_ASSEMBLY_AUTH__MODE?"),
        ("context_assembly_store__bakend", "did you mean CONTEXT_ASSEMBLY_STORE__BACKEND?"),
        (
            "CONTEXT_ASSEMBLY_LIMITS__MAX_BODY_BYTS",
            "did you mean CONTEXT_ASSEMBLY_LIMITS__MAX_BODY_BYTES?",
        ),
        ("CONTEXT_ASSEMBLY_INLINE_URL__ALLOW", "did you mean CONTEXT_ASSEMBLY_INLINE_URLS__ALLOW?"),
        ("CONTEXT_ASSEMBLY_API_KYE", "did you mean CONTEXT_ASSEMBLY_API_KEY?"),
        ("CONTEXT_ASSEMBLY_STORE__BACKEND__X", "store.backend takes no nested key"),
        ("CONTEXT_ASSEMBLY_AUTH__ZZZZ", "valid keys at auth: mode, keys, admin_key_sha256"),
        ("CONTEXT_ASSEMBLY_ZZZZ", "valid keys at the top: server, auth, store"),
    ],
)
def test_a_nested_key_is_checked_too(variable: str, said: str) -> None:
    problem = unknown_env_variable(variable)
    assert problem is not None and problem.startswith(f"environment variable {variable} ")
    assert said in problem


def test_load_settings_refuses_a_nested_misspelling(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CONTEXT_ASSEMBLY_AUTH__MDOE", "api_key")
    with pytest.raises(ValueError, match="did you mean CONTEXT_ASSEMBLY_AUTH__MODE"):
        load_settings()


@pytest.mark.parametrize(
    "variable",
    [
        "CONTEXT_ASSEMBLY_AUTH__MODE",
        "CONTEXT_ASSEMBLY_STORE",  # a whole section, as JSON
        "context_assembly_server__port",
        "CONTEXT_ASSEMBLY_CONTRIBUTORS__MEMORY__URL",
        "CONTEXT_ASSEMBLY_CONTRIBUTORS__MEMORY__HEADERS__AUTHORIZATION",
        *sorted(OTHER_ENV),
    ],
)
def test_settings_and_the_other_variables_pass(variable: str) -> None:
    assert unknown_env_variable(variable) is None


def test_below_a_table_of_free_names_any_key_passes() -> None:
    """``[contributors.NAME]`` and every other table whose names are the operator's own (a
    ``dict`` setting): what is below it is the table's, and its own validation names a bad key."""
    tables = [
        name for name, info in Settings.model_fields.items() if get_origin(info.annotation) is dict
    ]
    assert "contributors" in tables
    for table in tables:
        variable = f"{PREFIX}{table.upper()}__ANY_NAME__ANY_KEY__DEEPER"
        assert unknown_env_variable(variable) is None, variable


def _named_in_the_repository() -> set[str]:
    """Every ``CONTEXT_ASSEMBLY_*`` name the repository's files write, other than the problem
    codes, the name patterns of the docs (``..._LIMITS__<KEY>``) and the misspellings the docs
    and tests show as refused."""
    codes = {
        cls.code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.ServiceError)
    }
    refused = {
        "CONTEXT_ASSEMBLY_STORE_BACKEND",
        "CONTEXT_ASSEMBLY_AUHT__MODE",
        "CONTEXT_ASSEMBLY_AUTH__MDOE",
    }
    places = [
        ROOT / "docs",
        ROOT / "deploy",
        ROOT / "examples",
        ROOT / "bench",
        ROOT / "clients" / "python" / "src",
        ROOT / "clients" / "python" / "README.md",
        ROOT / "clients" / "typescript" / "README.md",
        ROOT / "clients" / "typescript" / "src",
        ROOT / "clients" / "typescript" / "test",
        ROOT / "service",
        ROOT / "Makefile",
        ROOT / "Dockerfile",
        ROOT / "docker-compose.yml",
        ROOT / "README.md",
    ]
    files = [p for place in places for p in ([place] if place.is_file() else place.rglob("*"))]
    names: set[str] = set()
    for path in files:
        if path.is_file() and ".egg-info" not in str(path):
            text = path.read_text(encoding="utf-8", errors="replace")
            names |= set(re.findall(r"\b" + PREFIX + r"[A-Z0-9_]*[A-Z0-9]\b", text))
    return names - codes - refused


def test_every_variable_the_project_uses_is_accepted(clean_env: pytest.MonkeyPatch) -> None:
    """The settings the docs, the deploy files and the examples set, and the variables the
    examples and clients read beside a service, start the service."""
    named = _named_in_the_repository()
    assert {"CONTEXT_ASSEMBLY_URL", "CONTEXT_ASSEMBLY_STORE__REDIS_URL", CONFIG_ENV} <= named
    assert {name: unknown_env_variable(name) for name in named} == dict.fromkeys(named)
    for name in OTHER_ENV:
        clean_env.setenv(name, "1")
    clean_env.setenv("CONTEXT_ASSEMBLY_AUTH__MODE", "none")
    clean_env.setenv("CONTEXT_ASSEMBLY_CONTRIBUTORS__MEMORY__URL", "http://127.0.0.1:9001/c")
    settings = load_settings()
    assert settings.contributors["memory"].url == "http://127.0.0.1:9001/c"
