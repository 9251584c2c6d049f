"""End-to-end fixtures: real ``context-assembly serve`` processes and a scripted contributor
double on loopback, both from ``context_assembly_client.testing``."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from context_assembly_client.testing import (
    ScriptedContributor,
    ServedProcess,
    free_port,
    start_service,
)

Contributor = ScriptedContributor


@pytest.fixture(scope="module")
def contributor() -> Iterator[ScriptedContributor]:
    """The module's contributor double: each test scripts the paths it registers (a fresh path
    per test, so that its record is the test's own)."""
    with ScriptedContributor() as double:
        yield double


class Service:
    """A served ``context-assembly serve``: its URL, process, config file and log (stderr: JSON
    lines)."""

    def __init__(self, process: ServedProcess, config: Path, log: Path) -> None:
        self.process = process
        self.base = process.url
        self.config = config
        self.log = log

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.process.proc

    def stop(self) -> int:
        """SIGTERM and wait (a kill only past the bound); the exit status."""
        return self.process.stop()


ServiceFactory = Callable[..., Service]


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[ServiceFactory]:
    """Start ``context-assembly serve`` with a TOML config (``{db}``: a fresh SQLite file) and
    extra arguments; every process is stopped afterwards."""
    served: list[ServedProcess] = []

    def start(config_toml: str, *extra: str) -> Service:
        port = free_port()
        config = tmp_path / f"config-{port}.toml"
        config.write_text(config_toml.replace("{db}", str(tmp_path / f"db-{port}.db")))
        log = tmp_path / f"service-{port}.log"
        process = start_service(config, *extra, port=port, log=log, cwd=tmp_path)
        served.append(process)
        return Service(process, config, log)

    try:
        yield start
    finally:
        for process in served:
            process.stop()
