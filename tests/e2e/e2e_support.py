"""End-to-end fixtures: real uvicorn processes for the service and a loopback contributor."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """Bounded polling: a process needs a moment to bind; give up loudly after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before becoming ready")
        try:
            if httpx.get(url, timeout=0.5).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready within {timeout} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class Contributor:
    def __init__(self, port: int, record_file: Path, state_dir: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.record_file = record_file
        self.state_dir = state_dir

    def set_revision(self, source: str, value: str) -> None:
        (self.state_dir / source).write_text(value)

    def url(self, path: str) -> str:
        return self.base + path

    def noted(self, event: str, path: str) -> bool:
        """Whether the contributor has noted ``event`` ("seen", "closed", "answered") for
        ``path`` (see ``contributor_app``)."""
        if not self.record_file.exists():
            return False
        entry = json.dumps({"event": event, "path": path})
        return entry in self.record_file.read_text().splitlines()

    def wait_for(self, event: str, path: str, timeout: float = 20.0) -> None:
        """Bounded polling: the contributor is another process, which notes what happened to
        each call in its record file; give up loudly after ``timeout`` (a hang guard)."""
        deadline = time.monotonic() + timeout
        while not self.noted(event, path):
            if time.monotonic() > deadline:
                raise AssertionError(f"the contributor never noted {event!r} for {path}")
            time.sleep(0.02)


@pytest.fixture(scope="module")
def contributor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contributor]:
    port = free_port()
    folder = tmp_path_factory.mktemp("contrib")
    record = folder / "record.jsonl"
    env = {
        **os.environ,
        "CONTRIBUTOR_RECORD_FILE": str(record),
        "CONTRIBUTOR_STATE_DIR": str(folder),
        "PYTHONPATH": str(HERE),
    }
    proc = subprocess.Popen(
        [
            str(BIN / "uvicorn"),
            "contributor_app:app",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--log-level",
            "warning",
            "--no-access-log",
            "--loop",
            "uvloop",
            "--http",
            "httptools",
        ],
        cwd=HERE,
        env=env,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/fail/404", proc)
        yield Contributor(port, record, folder)
    finally:
        stop(proc)


class Service:
    def __init__(self, port: int, proc: subprocess.Popen[bytes], config: Path, log: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.proc = proc
        self.config = config
        self.log = log  # the service's stderr: JSON log lines


ServiceFactory = Callable[[str], Service]


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[ServiceFactory]:
    """Start ``context-assembly serve`` with a TOML config; every process is stopped afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    handles: list[BinaryIO] = []

    def start(config_toml: str, *extra: str) -> Service:
        port = free_port()
        config = tmp_path / f"config-{port}.toml"
        config.write_text(config_toml.replace("{db}", str(tmp_path / f"db-{port}.db")))
        log = tmp_path / f"service-{port}.log"
        handle = log.open("wb")
        handles.append(handle)
        proc = subprocess.Popen(
            [
                str(BIN / "context-assembly"),
                "serve",
                "--port",
                str(port),
                "--config",
                str(config),
                *extra,
            ],
            cwd=tmp_path,
            stderr=handle,
        )
        procs.append(proc)
        wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
        return Service(port, proc, config, log)

    try:
        yield start
    finally:
        for proc in procs:
            stop(proc)
        for handle in handles:
            handle.close()
