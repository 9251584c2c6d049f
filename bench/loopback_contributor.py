"""A minimal loopback contributor for benchmarks: ``POST /ok/<ms>/<source>`` answers after <ms>."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    _, _kind, delay, source = scope["path"].split("/")[:4]
    await asyncio.sleep(int(delay) / 1000)
    blocks = [
        {"id": f"{source}-{i}", "text": f"fact {i} from {source} " * 8, "priority": i}
        for i in range(4)
    ]
    payload = orjson.dumps({"revision": "r1", "blocks": blocks})
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
