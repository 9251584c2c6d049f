"""Configuration reload on a running service: SIGHUP and the authenticated admin call."""

from __future__ import annotations

import hashlib
import signal
import time
from typing import Any

import httpx
import pytest
from e2e_support import Contributor, ServiceFactory

pytestmark = pytest.mark.e2e
ADMIN_KEY = "admin-key-for-tests"


def config(contributor: Contributor, endpoints: list[str], db: str = "{db}") -> str:
    lines = [
        "[store]",
        f'path = "{db}"',
        "",
        "[auth]",
        'mode = "none"',
        f'admin_key_sha256 = "{hashlib.sha256(ADMIN_KEY.encode()).hexdigest()}"',
        "",
    ]
    for name in endpoints:
        lines += [f"[contributors.{name}]", f'url = "{contributor.url(f"/{name}")}"', ""]
    return "\n".join(lines)


def body(endpoint: str) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "plugins": [{"name": "memory"}],
        "contributors": [{"source": "memory", "endpoint": endpoint}],
        "input": [{"role": "user", "content": "hi"}],
    }


def _until(check: Any, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded: a signal is handled asynchronously
        if check():
            return True
        time.sleep(0.05)
    return False


def test_sighup_reloads_a_valid_file_and_refuses_an_invalid_one(
    contributor: Contributor, service_factory: ServiceFactory
) -> None:
    """A valid change takes effect for the next prepare; an invalid file changes nothing."""
    svc = service_factory(config(contributor, ["c0"]))
    db = next(
        line.split('"')[1]
        for line in svc.config.read_text().splitlines()
        if line.startswith("path")
    )
    with httpx.Client(base_url=svc.base, timeout=5) as client:
        old = client.post("/v1/prepare", json=body("c0"))
        assert old.status_code == 200
        assert client.post("/v1/prepare", json=body("c1")).status_code == 422
        svc.config.write_text(config(contributor, ["c0", "c1"], db))
        svc.proc.send_signal(signal.SIGHUP)
        assert _until(lambda: client.post("/v1/prepare", json=body("c1")).status_code == 200)
        for number, broken in enumerate(
            [
                "[contributors.c2\nurl = broken toml",
                config(contributor, ["c0"], db).replace("[store]", "[store]\nttl_seconds = -5"),
            ],
            start=1,
        ):
            svc.config.write_text(broken)
            svc.proc.send_signal(signal.SIGHUP)
            assert _until(lambda n=number: svc.log.read_text().count("config_reload_refused") == n)
        # The refused files named only c0: c1 still working shows the running config is intact.
        assert client.post("/v1/prepare", json=body("c1")).status_code == 200
        assert svc.proc.poll() is None
        # A preparation made before the reload still validates against the contributor it used.
        prep = old.json()
        frame = {"messages": prep["frame"]["messages"], "tools": prep["frame"]["tools"]}
        check = client.post(
            f"/v1/preparations/{prep['preparation_id']}/validate",
            json={"model": "gpt-4o-mini", "frame": frame},
        )
        assert check.status_code == 200, check.text


def test_admin_reload_call(contributor: Contributor, service_factory: ServiceFactory) -> None:
    """POST /v1/admin/reload needs the admin key, applies a valid file and names a refused one."""
    svc = service_factory(config(contributor, ["c0"]))
    db = next(
        line.split('"')[1]
        for line in svc.config.read_text().splitlines()
        if line.startswith("path")
    )
    with httpx.Client(base_url=svc.base, timeout=5) as client:
        assert client.post("/v1/admin/reload").status_code == 401
        svc.config.write_text(config(contributor, ["c0", "c9"], db))
        ok = client.post("/v1/admin/reload", headers={"X-Admin-Key": ADMIN_KEY})
        assert ok.status_code == 200 and ok.json()["reloaded"] is True
        assert client.post("/v1/prepare", json=body("c9")).status_code == 200
        svc.config.write_text(
            config(contributor, ["c0"], db).replace("[store]", '[store]\nbackend = "redis"')
        )
        refused = client.post("/v1/admin/reload", headers={"X-Admin-Key": ADMIN_KEY})
        assert refused.status_code == 422
        assert refused.json()["errors"] == [
            {"loc": "store.backend", "msg": "changes here need a restart"}
        ]
        assert client.post("/v1/prepare", json=body("c9")).status_code == 200, (
            "running config unchanged"
        )
        # The bind comes from serve's options, which win over the file: a changed port in the
        # file would not apply, so it is refused, named, rather than answered as reloaded.
        svc.config.write_text(config(contributor, ["c0", "c9"], db) + "\n[server]\nport = 1\n")
        moved = client.post("/v1/admin/reload", headers={"X-Admin-Key": ADMIN_KEY})
        assert moved.status_code == 422
        assert moved.json()["errors"] == [
            {"loc": "server.port", "msg": "changes here need a restart"}
        ]
