"""Servers in processes of their own: start one on a free loopback port, wait until it answers,
stop it cleanly.

::

    from context_assembly_client.testing import start_contributor, start_service

    with start_service(config_path, log=folder / "service.log") as service:   # context-assembly serve
        httpx.post(service.url + "/v1/prepare", json=...)
    # stopped: SIGTERM, its drain, and a kill only past ``stop``'s timeout

A :class:`ServedProcess` runs a command whose ``{port}`` is replaced by a port that was free a
moment before (the process binds it itself: a race with another process is possible, and shows
as a process that exits before it is ready). It is ready when ``ready`` answers a ``GET`` with
any status below 500 (a service still starting answers ``503`` on ``/readyz``), or, with
``ready=None``, when the port takes a connection. Waiting polls, bounded by ``timeout``: a
process that exits first, or is not ready in time, is stopped and raises ``RuntimeError`` with
the end of its log.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx
import pydantic_core

from context_assembly_client.testing.scripted import Step
from context_assembly_client.types import Revision

__all__ = [
    "ServedProcess",
    "executable",
    "free_port",
    "service_command",
    "start_app",
    "start_contributor",
    "start_service",
]

POLL_SECONDS = 0.05  # between readiness checks: a process needs a moment to import and bind


def free_port() -> int:
    """A loopback port that was free a moment ago (for a process that binds it itself)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def executable(name: str) -> str:
    """The path of the installed command ``name``: beside this interpreter (a virtualenv's
    ``bin``), else on ``PATH``."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    return shutil.which(name) or name


class ServedProcess:
    """A server process on a loopback port, ready when constructed (see the module docstring).

    Args:
        command: the program and its arguments; ``{port}`` in any of them becomes the port.
        port: the port to serve on (default: a free one).
        ready: the path whose ``GET`` answers below 500 once the server is ready; ``None``:
            the port takes a connection.
        env: the process's whole environment (default: this process's).
        cwd: its working directory.
        log: a file that takes its stdout and stderr (appended); default: both discarded.
        timeout: the bound on the wait until ready, in seconds (a hang guard).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        port: int | None = None,
        ready: str | None = "/healthz",
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log: Path | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.port = port if port is not None else free_port()
        self.command = [part.replace("{port}", str(self.port)) for part in command]
        self.ready = ready
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.log = log
        self.timeout = timeout
        self.killed = False
        self.proc = self._start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once it has ended (``-15``: ended by SIGTERM), else ``None``."""
        return self.proc.poll()

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then wait up to ``timeout`` seconds for the process to end; past that, kill
        it (``killed`` says so). Returns the exit status; stopping an ended process does
        nothing."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def restart(self) -> None:
        """Stop the process and start the same command again, on the same port."""
        self.stop()
        self.killed = False
        self.proc = self._start()

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the log (empty without one)."""
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(
            self.log.read_bytes()[-16000:].decode(errors="replace").splitlines()[-lines:]
        )

    def _start(self) -> subprocess.Popen[bytes]:
        output: IO[bytes] | int = subprocess.DEVNULL
        if self.log is not None:
            output = self.log.open("ab")
        try:
            proc = subprocess.Popen(
                self.command, cwd=self.cwd, env=self.env, stdout=output, stderr=output
            )
        finally:
            if not isinstance(output, int):
                output.close()  # the child holds its own descriptor
        self.proc = proc
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return proc

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.command[0]} exited with {self.proc.returncode} before it was ready"
                    + (f"; its log ends:\n{self.log_tail()}" if self.log is not None else "")
                )
            if self._answers():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.command[0]} not ready on port {self.port} within {self.timeout} s"
                    + (f"; its log ends:\n{self.log_tail()}" if self.log is not None else "")
                )
            time.sleep(POLL_SECONDS)

    def _answers(self) -> bool:
        if self.ready is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False
        try:
            return httpx.get(self.url + self.ready, timeout=0.5).status_code < 500
        except httpx.HTTPError:
            return False

    def __enter__(self) -> ServedProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def service_command(config: str | Path | None = None, *args: str) -> list[str]:
    """``context-assembly serve --port {port} [--config CONFIG] ARGS...``."""
    command = [executable("context-assembly"), "serve", "--port", "{port}"]
    if config is not None:
        command += ["--config", str(config)]
    return [*command, *args]


def start_service(
    config: str | Path | None = None,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    log: Path | None = None,
    port: int | None = None,
    ready: str = "/healthz",
    timeout: float = 30.0,
) -> ServedProcess:
    """``context-assembly serve`` with the TOML file ``config`` (and ``args``, such as
    ``--workers 2``), ready when ``ready`` answers.

    The process gets this process's environment without its ``CONTEXT_ASSEMBLY_*`` variables (so
    that it serves ``config`` and nothing a shell left set), then ``env``. It runs in ``cwd``
    (default: the config's folder).
    """
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_ASSEMBLY_")}
    environment.update(env or {})
    if cwd is None and config is not None:
        cwd = Path(config).parent
    return ServedProcess(
        service_command(config, *args),
        port=port,
        ready=ready,
        env=environment,
        cwd=cwd,
        log=log,
        timeout=timeout,
    )


def start_app(
    app: str,
    *uvicorn_args: str,
    app_dir: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    log: Path | None = None,
    port: int | None = None,
    ready: str | None = None,
    timeout: float = 30.0,
) -> ServedProcess:
    """An ASGI app (``"module:attribute"``, such as a contributor built with
    ``make_contributor_app``) under uvicorn, which must be installed where this runs.

    ``uvicorn_args`` go to uvicorn as they are (``--loop uvloop``); ``app_dir`` is where the
    module is found; ``env`` is added to this process's environment.
    """
    command = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", "{port}",
               "--log-level", "warning", "--no-access-log"]  # fmt: skip
    if app_dir is not None:
        command += ["--app-dir", str(app_dir)]
    return ServedProcess(
        [*command, *uvicorn_args],
        port=port,
        ready=ready,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        log=log,
        timeout=timeout,
    )


def start_contributor(
    *,
    default: Step | None = None,
    script: Mapping[str, Step | Sequence[Step]] | None = None,
    revision: Revision = "r1",
    uvloop: bool = False,
    port: int | None = None,
    log: Path | None = None,
    timeout: float = 30.0,
) -> ServedProcess:
    """A :class:`~context_assembly_client.testing.ScriptedContributor` as a process of its own
    (``python -m context_assembly_client.testing``), with the same ``default``, ``script`` and
    ``revision``; it keeps no record (a benchmark's contributor). ``uvloop`` runs it on uvloop,
    which must then be installed."""
    steps = {
        path: [s.to_data() for s in (value if isinstance(value, Sequence) else [value])]
        for path, value in (script or {}).items()
    }
    command = [
        sys.executable, "-m", "context_assembly_client.testing", "--port", "{port}",
        "--default", pydantic_core.to_json((default or Step()).to_data()).decode(),
        "--script", pydantic_core.to_json(steps).decode(),
        "--revision", pydantic_core.to_json(revision).decode(),
    ]  # fmt: skip
    if uvloop:
        command.append("--uvloop")
    return ServedProcess(command, port=port, ready=None, log=log, timeout=timeout)
