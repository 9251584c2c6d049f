"""A tiny example contributor: a pure ASGI app that answers the service's webhook packets.

Run it with uvicorn (docker-compose.yml does this from the service image)::

    uvicorn app:app --app-dir examples/contributor --host 127.0.0.1 --port 9001

and register it in the service configuration::

    [contributors.memory]
    url = "http://127.0.0.1:9001/contribute"
    secret = "whsec_..."          # the same value as CONTRIBUTOR_SECRET below (optional)

Protocol (docs/contract.md, "Webhook protocol"): ``POST /contribute`` receives ``{type: "contribute", source, scope, input,
data_budget_tokens, deadline_unix_ms, ...}`` and answers ``200 {revision, blocks}``; a packet of
``type: "revision"`` is answered ``200 {revision}``. ``GET /healthz`` answers ``{"status": "ok"}``
(the compose healthcheck).

With ``CONTRIBUTOR_SECRET`` set (a Standard Webhooks ``whsec_`` secret), a request whose
``webhook-signature`` does not verify gets 401. The packet grants no authority: a real contributor
authorises every read against ``scope`` itself. This one serves a few fixed notes per account.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

MAX_BODY = 1 << 20
REVISION = os.environ.get("CONTRIBUTOR_REVISION", "notes-v1")

NOTES: list[dict[str, Any]] = [
    {
        "id": "deploy-window",
        "text": "Deploys are allowed Monday to Thursday, 09:00-16:00 UTC.",
        "priority": 50,
        "protected": True,
    },
    {
        "id": "on-call",
        "text": "The on-call engineer this week is listed in the #ops channel topic.",
        "priority": 10,
    },
    {
        "id": "runbook",
        "text": "Runbook: restart the worker, check the queue depth, then page if it stays high. "
        * 4,
        "priority": 0,
        "projection": "Runbook: restart, check queue depth, page if still high.",
    },
]


def _verifier() -> Webhook | None:
    secret = os.environ.get("CONTRIBUTOR_SECRET")
    return Webhook(secret) if secret else None


def _blocks_for(packet: dict[str, Any]) -> list[dict[str, Any]]:
    # A real contributor filters by packet["scope"] (account, roles) and by its own permissions,
    # and sizes its answer to packet["source_token_limit"] / ["data_budget_tokens"].
    return NOTES


async def _read_body(receive: Receive) -> bytes | None:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > MAX_BODY:
            return None
        if not message.get("more_body"):
            return bytes(body)


async def _answer(send: Send, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI entry point."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    method, path = scope["method"], scope["path"]
    if path == "/healthz" and method in ("GET", "HEAD"):
        await _answer(send, 200, {"status": "ok"})
        return
    if path != "/contribute":
        await _answer(send, 404, {"error": "not found"})
        return
    if method != "POST":
        await _answer(send, 405, {"error": "method not allowed"})
        return
    body = await _read_body(receive)
    if body is None:
        await _answer(send, 413, {"error": "body too large"})
        return
    verifier = _verifier()
    if verifier is not None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            verifier.verify(body, headers, json_parse=False)
        except (WebhookVerificationError, ValueError):  # ValueError: malformed header or body
            await _answer(send, 401, {"error": "bad signature"})
            return
    try:
        packet = json.loads(body)
    except ValueError:
        await _answer(send, 400, {"error": "not JSON"})
        return
    if not isinstance(packet, dict):
        await _answer(send, 400, {"error": "not a packet"})
        return
    if packet.get("type") == "revision":
        await _answer(send, 200, {"revision": REVISION})
        return
    await _answer(send, 200, {"revision": REVISION, "blocks": _blocks_for(packet)})
