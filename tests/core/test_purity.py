"""The core stays pure: no I/O library, no clock, no environment (CONVENTIONS.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "service" / "context_assembly" / "core"
BANNED_MODULES = {
    "fastapi",
    "starlette",
    "httpx",
    "redis",
    "sqlite3",
    "structlog",
    "tiktoken",
    "aiohttp",
    "socket",
    "requests",
    "uvicorn",
    "os",
    "subprocess",
    "time",
    "asyncio",
    "zoneinfo",
}
BANNED_CALLS = {("datetime", "now"), ("datetime", "utcnow"), ("date", "today"), ("os", "environ")}


def _core_files() -> list[Path]:
    files = sorted(CORE.glob("*.py"))
    assert files, "the core package has modules"
    return files


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: p.name)
def test_core_module_imports_no_io_library(path: Path) -> None:
    """A core module imports none of the I/O, clock or environment libraries."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in BANNED_MODULES, f"{path.name} imports {name}"
            assert not name.startswith("context_assembly.") or name.startswith(
                ("context_assembly.core", "context_assembly.errors")
            ), f"{path.name} imports {name} (core may only use core and errors)"


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: p.name)
def test_core_module_reads_no_clock_or_environment(path: Path) -> None:
    """No ``datetime.now``, ``utcnow``, ``date.today`` or ``os.environ`` appears in the core."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert (node.value.id, node.attr) not in BANNED_CALLS, (
                f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}"
            )


def test_checker_catches_a_banned_import(tmp_path: Path) -> None:
    """The checker itself fails on a module that imports tiktoken (so it can fail at all)."""
    bad = ast.parse("import tiktoken\nfrom datetime import datetime\nx = datetime.now()\n")
    imports = [n for n in ast.walk(bad) if isinstance(n, ast.Import)]
    calls = [
        n
        for n in ast.walk(bad)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and (n.value.id, n.attr) in BANNED_CALLS
    ]
    assert imports[0].names[0].name in BANNED_MODULES
    assert calls, "datetime.now is detected"
