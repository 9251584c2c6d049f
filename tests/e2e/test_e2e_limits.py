"""The request head and body bounds of ``[limits]`` on a real ``context-assembly serve`` process,
over real loopback sockets: an oversized head, a dripped head, a dripped body, a slowloris."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
from context_assembly_client.testing import Step
from e2e_support import Contributor, Service, ServiceFactory

pytestmark = pytest.mark.e2e

HEAD_SECONDS = 1.0
BODY_SECONDS = 2.0
CONFIG = f"""
[store]
backend = "sqlite"
path = "{{db}}"

[limits]
head_timeout_seconds = {HEAD_SECONDS}
body_timeout_seconds = {BODY_SECONDS}
"""
PREPARE = {
    "model": "gpt-4o-mini",
    "instructions": "Be exact.",
    "plugins": [{"name": "memory", "instructions": "Saved entries."}],
    "contributions": [{"source": "memory", "revision": 1, "blocks": [{"id": "a", "text": "hi"}]}],
    "input": [{"role": "user", "content": "hello"}],
}


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid`` (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


async def _open(svc: Service) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", int(svc.base.rsplit(":", 1)[1]))


async def _send(writer: asyncio.StreamWriter, data: bytes) -> bool:
    """Send ``data``; False once the service has closed the connection."""
    try:
        writer.write(data)
        await writer.drain()
    except (ConnectionError, OSError):
        return False
    return True


async def _answer(reader: asyncio.StreamReader, got: bytearray | None = None) -> bytes:
    """All the service sends until it closes the connection (or resets it), kept in ``got`` as
    it arrives."""
    got = bytearray() if got is None else got
    try:
        while chunk := await reader.read(65536):
            got += chunk
    except (ConnectionError, OSError):
        pass
    return bytes(got)


@dataclass(frozen=True)
class Dripped:
    """What a dripping client got: the service's answer (None when the connection was still
    open 5 s after the last piece) and whether the service cut the drip short (it answered or
    closed while pieces were left to send)."""

    answer: bytes | None
    cut_short: bool


async def _drip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pieces: list[bytes], every: float
) -> Dripped:
    """Send ``pieces`` one every ``every`` seconds (the slow client modelled) until the service
    answers or closes."""
    got = bytearray()
    answer = asyncio.ensure_future(_answer(reader, got))
    sent = 0
    for piece in pieces:
        if got or answer.done() or not await _send(writer, piece):
            break
        sent += 1
        await asyncio.sleep(every)
    try:
        return Dripped(await asyncio.wait_for(answer, 5), sent < len(pieces))
    except TimeoutError:
        return Dripped(None, False)


def _bytes(data: bytes) -> list[bytes]:
    return [bytes([byte]) for byte in data]


async def _response(reader: asyncio.StreamReader) -> tuple[int | None, bytes]:
    """One answer with a content-length, read off a kept-alive connection: status and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
    length = next(
        int(line.split(b":")[1])
        for line in head.lower().split(b"\r\n")
        if b"content-length" in line
    )
    return _status(head), await reader.readexactly(length)


def _status(answer: bytes) -> int | None:
    """The status code of the answer's first line; None when nothing was answered."""
    if not answer.startswith(b"HTTP/1.1 "):
        return None
    return int(answer.split(b" ", 2)[1])


def _problem_code(answer: bytes) -> str:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in head.lower()
    code: str = json.loads(body)["code"]
    return code


@pytest.fixture
def svc(service_factory: ServiceFactory) -> Service:
    return service_factory(CONFIG)


async def test_a_huge_head_is_refused_with_431_and_memory_stays_flat(svc: Service) -> None:
    """Ten connections each sending an 8 MiB header field get 431 (or are closed: the client is
    still sending) without the header being held: the process grows by far less than the 80 MiB
    sent."""
    before = rss_bytes(svc.proc.pid)
    field = b"x-big: " + b"a" * (8 * 1024 * 1024) + b"\r\n\r\n"
    head = b"GET /healthz HTTP/1.1\r\nhost: t\r\n"

    async def one() -> bytes:
        reader, writer = await _open(svc)
        await _send(writer, head + field)
        answer = await asyncio.wait_for(_answer(reader), 10)
        writer.close()
        return answer

    answers = await asyncio.gather(*(one() for _ in range(10)))
    grown = rss_bytes(svc.proc.pid) - before
    for answer in answers:
        assert _status(answer) in (431, None), answer[:80]
        if answer:
            assert _problem_code(answer) == "REQUEST_HEAD_TOO_LARGE"
    assert grown < 32 * 1024 * 1024, f"the process grew by {grown} bytes"
    assert httpx.get(svc.base + "/healthz", timeout=5).status_code == 200


async def test_a_whole_head_over_the_limit_gets_431(svc: Service) -> None:
    """A complete head of about 100 KiB (over the 64 KiB default), sent at once, is
    answered 431 REQUEST_HEAD_TOO_LARGE, and one just under the limit is served."""
    reader, writer = await _open(svc)
    fields = b"".join(b"x-%d: %s\r\n" % (i, b"v" * 1000) for i in range(100))
    await _send(writer, b"GET /healthz HTTP/1.1\r\nhost: t\r\n" + fields + b"\r\n")
    answer = await asyncio.wait_for(_answer(reader), 10)
    writer.close()
    assert _status(answer) == 431, answer[:80]
    assert _problem_code(answer) == "REQUEST_HEAD_TOO_LARGE"
    under = {f"x-{i}": "v" * 1000 for i in range(60)}
    assert httpx.get(svc.base + "/healthz", headers=under, timeout=5).status_code == 200


async def test_a_head_dripped_past_the_head_limit_gets_408(svc: Service) -> None:
    """A head sent a byte every 0.1 s is answered 408 REQUEST_TIMEOUT and closed once the head
    time limit has passed, while the client is still sending it."""
    reader, writer = await _open(svc)
    head = b"GET /healthz HTTP/1.1\r\nhost: t\r\nx-slow: " + b"s" * 200  # never finished
    dripped = await _drip(reader, writer, _bytes(head), 0.1)  # 24 s at most
    writer.close()
    assert dripped.answer is not None, "the connection is still open"
    assert _status(dripped.answer) == 408, dripped.answer[:80]
    assert _problem_code(dripped.answer) == "REQUEST_TIMEOUT"
    assert dripped.cut_short, "the whole head was sent before the service answered"


async def test_a_body_dripped_past_the_body_limit_gets_408(svc: Service) -> None:
    """A prepare body sent a byte every 0.5 s is answered 408 REQUEST_TIMEOUT and closed once
    the body time limit has passed, and the service keeps answering others."""
    reader, writer = await _open(svc)
    body = json.dumps(PREPARE).encode()
    await _send(
        writer,
        b"POST /v1/prepare HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body),
    )
    dripped = await _drip(reader, writer, _bytes(body[:40]), 0.5)  # 20 s at most
    writer.close()
    assert dripped.answer is not None, "the connection is still open"
    assert _status(dripped.answer) == 408, dripped.answer[:80]
    assert _problem_code(dripped.answer) == "REQUEST_TIMEOUT"
    assert dripped.cut_short, "the whole body prefix was sent before the service answered"
    async with httpx.AsyncClient(base_url=svc.base, timeout=5) as client:
        assert (await client.post("/v1/prepare", json=PREPARE)).status_code == 200


async def test_a_slowloris_is_closed_and_others_are_answered(svc: Service) -> None:
    """200 connections each dripping 1 KiB header fields (40 KiB in all, under the head size
    limit) are all answered 408 or closed by the head time limit while they are still
    sending, the process does not keep what they sent, and /healthz and a prepare are
    answered during the attack."""
    before = rss_bytes(svc.proc.pid)
    cut: list[None] = []  # the connections the service ended while their client was sending
    opened: list[None] = []
    all_open = asyncio.Event()

    async def loris() -> None:
        reader, writer = await _open(svc)
        await _send(writer, b"GET /healthz HTTP/1.1\r\nhost: t\r\n")
        opened.append(None)
        if len(opened) == 200:
            all_open.set()
        fields = [b"x-%d: %s\r\n" % (i, b"l" * 1024) for i in range(40)]
        dripped = await _drip(reader, writer, fields, 0.2)  # 8 s at most
        answer = dripped.answer
        if answer is not None and _status(answer) in (408, None) and dripped.cut_short:
            cut.append(None)
        writer.close()

    attack = asyncio.gather(*(loris() for _ in range(200)))
    async with httpx.AsyncClient(base_url=svc.base, timeout=5) as client:
        await asyncio.wait_for(all_open.wait(), 10)  # the attack's connections are dripping
        health = await client.get("/healthz")
        prepared = await client.post("/v1/prepare", json=PREPARE)
    peak = rss_bytes(svc.proc.pid)
    await attack
    assert (health.status_code, prepared.status_code) == (200, 200)
    assert len(cut) == 200, f"{200 - len(cut)} connections were not cut by the head time limit"
    assert peak - before < 64 * 1024 * 1024, f"the process grew by {peak - before} bytes"


async def test_a_body_dripped_after_an_early_answer_is_closed_without_a_second_answer(
    svc: Service,
) -> None:
    """A body declared over max_body_bytes gets its 413 at once; dripped on after that, it is
    cut off by the body time limit with a close, and no 408 follows the 413."""
    reader, writer = await _open(svc)
    await _send(
        writer,
        b"POST /v1/prepare HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % (9 * 1024 * 1024),
    )
    status, _ = await _response(reader)
    assert status == 413
    dripped = await _drip(reader, writer, [b"x"] * 40, 0.25)  # 10 s at most
    writer.close()
    assert dripped.answer == b"", repr(dripped.answer)[:80]
    assert dripped.cut_short, "the whole drip was sent before the service closed"


async def test_every_worker_process_holds_the_limits(service_factory: ServiceFactory) -> None:
    """With two worker processes (Redis store), the configured head time limit reaches each
    worker: dripped heads on several connections all get 408."""
    svc = service_factory(
        f"""
[store]
backend = "redis"
redis_url = "redis://127.0.0.1:6379/14"
key_prefix = "limits-{uuid.uuid4().hex}:"

[limits]
head_timeout_seconds = {HEAD_SECONDS}
""",
        "--workers",
        "2",
    )

    async def dripped() -> bytes | None:
        reader, writer = await _open(svc)
        drip = await _drip(reader, writer, _bytes(b"GET /healthz HTTP/1.1\r\nx: " + b"s" * 60), 0.1)
        writer.close()
        return drip.answer

    answers = await asyncio.gather(*(dripped() for _ in range(8)))
    assert [_status(a) if a is not None else None for a in answers] == [408] * 8


async def test_a_pipelined_body_is_timed_from_when_its_request_is_served(
    contributor: Contributor, service_factory: ServiceFactory
) -> None:
    """A prepare pipelined behind one that takes 3 s (a slow contributor) has its body read only
    when the first is answered (uvicorn pauses reading while a request waits): both are
    answered 200, in order, although the wait outlasts the 2 s body time limit."""
    path = f"/slow-{uuid.uuid4().hex}"
    contributor.script(path, Step(delay=3))
    svc = service_factory(CONFIG + f'\n[contributors.slow]\nurl = "{contributor.url(path)}"\n')
    slow = orjson.dumps(
        {
            **PREPARE,
            "assembly": {"timeout_ms": 8000},
            "plugins": [*PREPARE["plugins"], {"name": "slow", "instructions": "slow entries"}],
            "contributors": [{"source": "slow", "endpoint": "slow"}],
        }
    )
    fast = orjson.dumps(PREPARE)

    def head(body: bytes) -> bytes:
        return (
            b"POST /v1/prepare HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body)
        )

    reader, writer = await _open(svc)
    # The second's head goes out with the first request; its body only once the first request
    # has reached the contributor (so the service has read what came with it, the second's
    # head queued behind it).
    await _send(writer, head(slow) + slow + head(fast))
    await asyncio.to_thread(contributor.wait_for, "seen", path)
    await _send(writer, fast)
    first = await _response(reader)
    second = await _response(reader)
    writer.close()
    assert (first[0], second[0]) == (200, 200), (first, second)
    sources = orjson.loads(first[1])["selection"]["sources"]
    assert {s["source"]: s["status"] for s in sources}["slow"] == "ok"
