"""A contributor webhook written with ``make_contributor_app``, served next to the service.

The contributor (endpoint ``notes``) serves two sources from one function: ``notes`` answers at
once, ``slow_notes`` would take 30 s. It runs under uvicorn on a loopback port in a background
thread of this process, with a Standard Webhooks secret shared with the service. The example:

1. prepares with ``notes`` and prints the source's status, the contributed blocks' decisions and
   the deadline the contributor saw (``X-Contributor-Timeout-Ms`` on arrival, and the packet's
   ``deadline_unix_ms`` minus the arrival time);
2. validates the frame (the service re-queries the revision), then bumps the revision: stale;
3. prepares again with ``slow_notes`` too (``failure_policy: "omit"``,
   ``assembly.timeout_ms = 400``): the app cancels the slow function at the header's deadline
   and the service omits the source with status ``timeout``;
4. sends forged calls straight to the contributor (wrong signature, no signature): 401.

The service must register the endpoint (``run_all.py`` writes this for you)::

    [contributors.notes]
    url = "http://127.0.0.1:<port>/contribute"
    secret = "<the same secret>"

and the port and secret are given by ``--port`` / ``CONTEXT_ASSEMBLY_EXAMPLE_CONTRIBUTOR_PORT``
(default 9001) and ``CONTEXT_ASSEMBLY_EXAMPLE_CONTRIBUTOR_SECRET`` (default: the example secret
below, for local runs only)::

    CONTEXT_ASSEMBLY_URL=http://127.0.0.1:8080 .venv/bin/python examples/contributor.py --port 9001
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import anyio
import httpx
import uvicorn
from context_assembly_client import Client, InvalidRequestError, StaleError
from context_assembly_client.contributor import (
    TIMEOUT_HEADER,
    ContributePacket,
    ContributorApp,
    make_contributor_app,
)
from context_assembly_client.types import PrepareResponse

BASE_URL = os.environ.get("CONTEXT_ASSEMBLY_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("CONTEXT_ASSEMBLY_API_KEY") or None
EXAMPLE_SECRET = "whsec_" + base64.b64encode(b"context-assembly example secret!").decode()
SECRET = os.environ.get("CONTEXT_ASSEMBLY_EXAMPLE_CONTRIBUTOR_SECRET", EXAMPLE_SECRET)
DEFAULT_PORT = int(os.environ.get("CONTEXT_ASSEMBLY_EXAMPLE_CONTRIBUTOR_PORT", "9001"))


class Seen:
    """What the contributor observed, shared with the main thread (ids and numbers only)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.revision = "notes-r1"
        self.revision_calls = 0
        self.header: dict[str, str | None] = {}  # source -> X-Contributor-Timeout-Ms at arrival
        self.arrived_ms: dict[str, int] = {}  # source -> wall clock at arrival (ms)
        self.deadline_ms: dict[str, int] = {}  # source -> the packet's deadline_unix_ms
        self.slow_cancelled = threading.Event()
        self.slow_ran_ms = 0

    def saw(self, source: str) -> str:
        with self.lock:
            header = self.header.get(source)
            left = self.deadline_ms.get(source, 0) - self.arrived_ms.get(source, 0)
        return f"{TIMEOUT_HEADER}={header} deadline_unix_ms-arrival={left} ms"


SEEN = Seen()

# What the deadline header said when the call arrived; the ASGI wrapper below sets it and the
# contribute function (awaited in the same task) reads it.
ARRIVAL: ContextVar[tuple[str | None, int]] = ContextVar("arrival", default=(None, 0))


async def contribute(packet: ContributePacket) -> dict[str, Any]:
    """The user function: authorise against ``packet.scope`` (here: one account) and answer."""
    if packet.type == "revision":  # the dispatch-time check (no revision function given)
        with SEEN.lock:
            SEEN.revision_calls += 1
        return {"revision": SEEN.revision, "blocks": []}
    header, arrived_ms = ARRIVAL.get()
    with SEEN.lock:
        SEEN.header[packet.source] = header
        SEEN.arrived_ms[packet.source] = arrived_ms
        SEEN.deadline_ms[packet.source] = packet.deadline_unix_ms or 0
    if packet.scope.account_id != "acct-1":
        return {"revision": SEEN.revision, "blocks": []}  # nothing this scope may read
    if packet.source == "slow_notes":
        started = time.monotonic()
        try:
            await anyio.sleep(30)  # a slow backend; the app cancels this at the deadline
        except anyio.get_cancelled_exc_class():
            SEEN.slow_ran_ms = round((time.monotonic() - started) * 1000)
            SEEN.slow_cancelled.set()
            raise
        return {"revision": "slow-r1", "blocks": [{"id": "late", "text": "never used"}]}
    return {
        "revision": SEEN.revision,
        "blocks": [
            {"id": "sla", "text": "Enterprise SLA: first answer within 4 hours.", "priority": 50},
            {
                "id": "escalation",
                "text": "Escalation path: on-call lead, then vendor support. " * 30,
                "projection": "Escalation: on-call lead, then vendor.",
                "dependencies": ["notes/sla"],
            },
        ],
    }


def with_header_probe(app: ContributorApp) -> Any:
    """Wrap the ASGI app to note the deadline header and the arrival time (for printing only)."""

    async def probe(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode() for k, v in scope["headers"]}
            ARRIVAL.set((headers.get(TIMEOUT_HEADER), int(time.time() * 1000)))
        await app(scope, receive, send)

    return probe


@contextmanager
def serve(port: int) -> Iterator[str]:
    """Run the contributor under uvicorn in a background thread; stop it on exit."""
    app = make_contributor_app(contribute, secret=SECRET)
    config = uvicorn.Config(
        with_header_probe(app), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="contributor", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:  # bounded polling for the bind
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the contributor did not start on 127.0.0.1:{port}")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}/contribute"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


SCOPE = {"account_id": "acct-1"}
REQUEST: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "max_context_tokens": 8000,
    "response_reserve": 512,
    "assembly": {"max_data_tokens": 200, "layout": "stable-prefix"},
    "instructions": "You are a support assistant.",
    "plugins": [{"name": "notes", "instructions": "Account notes."}],
    "contributors": [{"source": "notes", "endpoint": "notes", "recovery_tool": "notes_get"}],
    "scope": SCOPE,
    "input": [{"role": "user", "content": "What is our SLA for acct-1?"}],
}
# The same, plus a slow source that may be left out, under a 400 ms contributor deadline.
SLOW_REQUEST: dict[str, Any] = {
    **REQUEST,
    "assembly": {**REQUEST["assembly"], "timeout_ms": 400},
    "plugins": [*REQUEST["plugins"], {"name": "slow_notes", "instructions": "Archive notes."}],
    "contributors": [
        *REQUEST["contributors"],
        {"source": "slow_notes", "endpoint": "notes", "failure_policy": "omit"},
    ],
}


def print_manifest(prep: PrepareResponse) -> None:
    for source in prep.selection.sources:
        print(
            f"  source {source.source}: kind={source.kind} status={source.status} "
            f"blocks={source.block_count}"
        )
    for block in prep.selection.blocks:
        print(
            f"  block {block.source}/{block.id}: {block.status} ({block.reason}) "
            f"tokens={block.tokens}"
        )


def forged_calls(url: str) -> None:
    """Calls that did not come from the service: the app refuses them before any work."""
    body = b'{"type":"revision","source":"notes","scope":{"account_id":"acct-1"}}'
    wrong = base64.b64encode(b"x" * 32).decode()
    headers = {
        "content-type": "application/json",
        "webhook-id": "msg_forged",
        "webhook-timestamp": str(int(time.time())),
        "webhook-signature": f"v1,{wrong}",
    }
    with httpx.Client(timeout=5.0) as http:
        forged = http.post(url, content=body, headers=headers)
        unsigned = http.post(url, content=body, headers={"content-type": "application/json"})
    print(f"forged call (wrong signature): HTTP {forged.status_code}")
    print(f"unsigned call: HTTP {unsigned.status_code}")


def main() -> int:
    parser = argparse.ArgumentParser(description="A signed contributor next to the service.")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="the contributor's port")
    args = parser.parse_args()
    with serve(args.port) as url, Client(BASE_URL, api_key=API_KEY, timeout=10.0) as client:
        print(f"contributor: {url} (endpoint 'notes', signed)")
        try:
            prep = client.prepare(REQUEST)
        except InvalidRequestError as err:
            print(f"prepare: {err.status_code} {err.code}: {err.problem.get('detail')}")
            print(f'register it: [contributors.notes] url = "{url}" with the same secret')
            return 2
        print(f"prepare: {prep.preparation_id}")
        print_manifest(prep)
        print(f"contributor saw for notes: {SEEN.saw('notes')} (timeout_ms=1000)")

        valid = client.validate(
            prep.preparation_id, model=prep.model, scope=SCOPE, frame=prep.frame
        )
        print(f"validate: valid={valid.valid} revision checks answered={SEEN.revision_calls}")
        with SEEN.lock:
            SEEN.revision = "notes-r2"  # the source changed after preparation
        try:
            client.validate(prep.preparation_id, model=prep.model, scope=SCOPE, frame=prep.frame)
        except StaleError as err:
            print(f"validate after a revision bump: {err.status_code} {err.code} {err.reasons}")
        else:
            print("validate after a revision bump: unexpectedly valid")
            return 1

        slow = client.prepare(SLOW_REQUEST)
        print(f"prepare with slow_notes (omit, timeout_ms=400): {slow.preparation_id}")
        print_manifest(slow)
        if not SEEN.slow_cancelled.wait(timeout=5):  # bounded: the cancel lands at the deadline
            print("slow_notes: the contributor function was not cancelled")
            return 1
        print(f"contributor saw for slow_notes: {SEEN.saw('slow_notes')}")
        print(f"slow_notes: function cancelled at the deadline after {SEEN.slow_ran_ms} ms")
        forged_calls(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
