"""Run every example against one freshly started service, then clean up (``make examples``).

Starts ``context-assembly serve`` (``context_assembly_client.testing.start_service``) on a free
loopback port with a temporary TOML config (SQLite in a temporary directory, no auth, the
``notes`` contributor endpoint registered on a second free port with a fresh secret), waits for
``/healthz`` (bounded), runs each example as a subprocess with ``CONTEXT_ASSEMBLY_URL`` set,
stops the service and removes the directory. Exits non-zero if the service did not start or any
example failed.

    .venv/bin/python examples/run_all.py [NAME ...]     # e.g. selection cache_aware
"""

from __future__ import annotations

import base64
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from context_assembly_client.testing import free_port, start_service

HERE = Path(__file__).resolve().parent
EXAMPLES = [
    "selection",
    "dispatch_safety",
    "cache_aware",
    "contributor",
    "breakdown",
    "provider_sdk",
    "mcp_contributor",  # starts its own service: an MCP server is registered in configuration
    "integrations/langchain_agent",
    "integrations/pydantic_ai_agent",
    "integrations/openai_agents_agent",
    "integrations/ai_sdk",  # Node: needs `npm ci` in clients/typescript (make test/examples do it)
]
EXAMPLE_TIMEOUT_S = 60
READY_TIMEOUT_S = 20


def config_toml(folder: Path, contributor_port: int, secret: str) -> str:
    return (
        '[auth]\nmode = "none"\n'
        f'[store]\nbackend = "sqlite"\npath = "{folder / "examples.db"}"\n'
        "[contributors.notes]\n"
        f'url = "http://127.0.0.1:{contributor_port}/contribute"\n'
        f'secret = "{secret}"\nfailure_policy = "fail"\n'
    )


def command(name: str) -> list[str]:
    """How an example runs: a Python file with this interpreter, a Node module with node."""
    if (HERE / f"{name}.mjs").exists():
        return ["node", str(HERE / f"{name}.mjs")]
    return [sys.executable, str(HERE / f"{name}.py")]


def run_examples(names: list[str], base_url: str, contributor_port: int, secret: str) -> int:
    # The examples see the service URL and the contributor's port and secret, nothing else of ours.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_ASSEMBLY_")}
    env.update(
        CONTEXT_ASSEMBLY_URL=base_url,
        CONTEXT_ASSEMBLY_EXAMPLE_CONTRIBUTOR_PORT=str(contributor_port),
        CONTEXT_ASSEMBLY_EXAMPLE_CONTRIBUTOR_SECRET=secret,
        PYTHONUNBUFFERED="1",
    )
    failed: list[str] = []
    for name in names:
        print(f"=== {name}", flush=True)
        started = time.monotonic()
        try:
            result = subprocess.run(
                command(name),
                env=env,
                timeout=EXAMPLE_TIMEOUT_S,
                check=False,
            )
            status = result.returncode
        except subprocess.TimeoutExpired:
            status = -1
        took = time.monotonic() - started
        outcome = "ok" if status == 0 else f"FAILED (exit {status})"
        print(f"=== {name}: {outcome} in {took:.2f} s", flush=True)
        if status != 0:
            failed.append(name)
    if failed:
        print(f"failed examples: {', '.join(failed)}", flush=True)
        return 1
    return 0


def main(argv: list[str]) -> int:
    names = argv or EXAMPLES
    unknown = sorted(set(names) - set(EXAMPLES))
    if unknown:
        print(f"unknown examples: {', '.join(unknown)} (known: {', '.join(EXAMPLES)})")
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ca-examples-") as tmp:
        folder = Path(tmp)
        contributor_port = free_port()
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        config = folder / "config.toml"
        config.write_text(config_toml(folder, contributor_port, secret))
        try:
            # Without this shell's CONTEXT_ASSEMBLY_* variables; its output in service.log.
            service = start_service(config, log=folder / "service.log", timeout=READY_TIMEOUT_S)
        except RuntimeError as err:  # the message ends with the log's last lines
            print(f"service did not start: {err}")
            return 1
        print(
            f"service: {service.url} ready in {time.monotonic() - started:.1f} s "
            f"(pid {service.pid}); contributor port {contributor_port}"
        )
        try:
            status = run_examples(names, service.url, contributor_port, secret)
        finally:
            exit_status = service.stop(timeout=15)
        # uvicorn re-raises the SIGTERM it handled after a graceful shutdown.
        clean = exit_status in (0, -signal.SIGTERM)
        if status != 0 or not clean:
            print("service log (last lines):", *service.log_tail().splitlines(), sep="\n  ")
            status = 1
    how = "cleanly" if clean else f"with exit {exit_status}"
    print(f"service stopped {how}; removed {folder}: {not folder.exists()}")
    print(
        f"all examples: {'ok' if status == 0 else 'FAILED'} in {time.monotonic() - started:.1f} s"
    )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
