"""A loopback contributor server for end-to-end tests (raw ASGI, run by uvicorn in a subprocess).

Behaviour by path:
  /ok/<ms>/<source>     answer {revision, blocks} after <ms> milliseconds
  /together/<n>/<group>/<source>
                        answer {revision, blocks} once <n> calls of <group> have arrived
  /hang[/<tag>]         never answer; note "closed" when the client goes away
  /drip[/<tag>]         send headers, then one byte every 50 ms until the client goes away
                        (noted "closed")
  /late/<source>        wait until the client goes away (noted "closed"), then send the answer
                        all the same (noted "answered")
  /fail/<status>        answer that status
  /fail-after/<tag>/<status>
                        answer that status once /hang/<tag> has arrived
  /record/<source>      answer at once and append the raw request (headers + body) to RECORD_FILE
  /revision/<value>     answer {revision: <value>, blocks} for both packet types
  /state/<source>       like /revision, the value read from the file STATE_DIR/<source> ("r1" if none)

Every request is noted "seen" when it arrives. Notes are JSON lines {"event", "path"} appended to
RECORD_FILE: the tests wait on them (``e2e_support.Contributor.wait_for``) instead of on the clock.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from typing import Any

RECORD_FILE = os.environ.get("CONTRIBUTOR_RECORD_FILE", "")
STATE_DIR = os.environ.get("CONTRIBUTOR_STATE_DIR", "")


def _blocks(source: str) -> list[dict[str, Any]]:
    return [
        {"id": f"{source}-a", "text": f"fact A from {source}", "priority": 10},
        {
            "id": f"{source}-b",
            "text": f"fact B from {source} " * 5,
            "priority": 0,
            "projection": f"B summary {source}",
        },
    ]


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _record(entry: dict[str, Any]) -> None:
    if RECORD_FILE:
        with open(RECORD_FILE, "a") as handle:
            handle.write(json.dumps(entry) + "\n")


def _note(event: str, path: str) -> None:
    _record({"event": event, "path": path})


async def _until_disconnect(receive: Any) -> None:
    """Return once the client has gone away (the request body is read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


# /together: the calls of each group that have arrived, and the event all of them wait for.
_GROUPS: dict[str, tuple[list[None], asyncio.Event]] = {}
# /hang/<tag> sets its tag's event on arrival; /fail-after/<tag> waits for it.
_HUNG: dict[str, asyncio.Event] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    parts = path.strip("/").split("/")
    body = await _body(receive)
    _note("seen", path)
    packet = json.loads(body) if body else {}
    kind = parts[0]
    status, answer, delay = 200, None, 0.0
    source = parts[-1]
    if kind == "ok":
        delay = int(parts[1]) / 1000
        answer = {"revision": "r1", "blocks": _blocks(source)}
    elif kind == "together":
        arrived, everyone = _GROUPS.setdefault(parts[2], ([], asyncio.Event()))
        arrived.append(None)
        if len(arrived) >= int(parts[1]):
            everyone.set()
        await everyone.wait()
        answer = {"revision": "r1", "blocks": _blocks(source)}
    elif kind == "late":
        await _until_disconnect(receive)
        _note("closed", path)
        answer = {"revision": "r1", "blocks": _blocks(source)}
    elif kind == "hang":
        _HUNG.setdefault(parts[-1], asyncio.Event()).set()
        await _until_disconnect(receive)
        _note("closed", path)
        return
    elif kind == "drip":
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        gone = asyncio.ensure_future(_until_disconnect(receive))
        while not gone.done():
            await send({"type": "http.response.body", "body": b" ", "more_body": True})
            await asyncio.wait({gone}, timeout=0.05)  # the drip's pace: the fault modelled
        _note("closed", path)
        return
    elif kind == "fail":
        status, answer = int(parts[1]), {"error": "boom"}
    elif kind == "fail-after":
        await _HUNG.setdefault(parts[1], asyncio.Event()).wait()
        status, answer = int(parts[2]), {"error": "boom"}
    elif kind == "record":
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        _record({"headers": headers, "body": base64.b64encode(body).decode()})
        answer = {"revision": "r1", "blocks": _blocks(source)}
    elif kind == "state":
        path = os.path.join(STATE_DIR, source)
        value = open(path).read().strip() if os.path.exists(path) else "r1"
        answer = {"revision": value, "blocks": _blocks(source)}
    elif kind == "revision":
        answer = {"revision": parts[1], "blocks": _blocks(packet.get("source", "s"))}
    if delay:
        await asyncio.sleep(delay)
    payload = json.dumps(answer).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
    if kind == "late":
        _note("answered", path)
