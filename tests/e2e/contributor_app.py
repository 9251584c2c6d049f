"""A loopback contributor server for end-to-end tests (raw ASGI, run by uvicorn in a subprocess).

Behaviour by path:
  /ok/<ms>/<source>     answer {revision, blocks} after <ms> milliseconds
  /hang                 never answer (until the client goes away)
  /drip                 send headers, then one byte every 50 ms, forever
  /fail/<status>        answer that status
  /record/<source>      answer at once and append the raw request (headers + body) to RECORD_FILE
  /late/<ms>/<source>   like /ok, and append "answered" to RECORD_FILE once the answer is sent
  /revision/<value>     answer {revision: <value>, blocks} for both packet types
  /state/<source>       like /revision, the value read from the file STATE_DIR/<source> ("r1" if none)
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


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    parts = scope["path"].strip("/").split("/")
    body = await _body(receive)
    packet = json.loads(body) if body else {}
    kind = parts[0]
    status, answer, delay = 200, None, 0.0
    source = parts[-1]
    if kind == "ok" or kind == "late":
        delay = int(parts[1]) / 1000
        answer = {"revision": "r1", "blocks": _blocks(source)}
    elif kind == "hang":
        await asyncio.sleep(3600)
    elif kind == "drip":
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        while True:
            await send({"type": "http.response.body", "body": b" ", "more_body": True})
            await asyncio.sleep(0.05)
    elif kind == "fail":
        status, answer = int(parts[1]), {"error": "boom"}
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
        _record({"answered": scope["path"]})
