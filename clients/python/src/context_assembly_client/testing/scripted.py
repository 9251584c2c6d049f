"""A scripted contributor double: a loopback webhook contributor that does, call by call, what a
test or a benchmark scripts.

::

    from context_assembly_client.testing import ScriptedContributor, Step

    with ScriptedContributor() as double:                # serving on 127.0.0.1 from a thread
        double.script("/slow", Step(fault="hang"))       # never answers
        double.script("/notes", Step(delay=0.02), Step(status=500))  # then fails, and again
        ...  # register double.url("/slow") and double.url("/notes"), prepare
        double.wait_for("closed", "/slow")               # the service gave up and hung up
        double.set_revision("notes", "r2")               # what the next answers say

It speaks the service's packet protocol (docs/contract.md, "Webhook protocol"): a ``contribute``
packet is answered ``{revision, blocks}``, a ``revision`` packet ``{revision}``, a ``summarize``
packet ``{summary}``. Each call follows the next :class:`Step` scripted for its path (the last
one repeats; an unscripted path takes ``default``):

- **answer**: ``revision`` (else the packet's source's current one, :meth:`set_revision`,
  ``"r1"`` at first) and ``blocks`` (else two blocks named after the source, ``<source>-a`` and
  ``<source>-b``); a block's strings may hold ``{source}``, replaced by the packet's source.
  ``status`` other than 200 answers ``{"error": "scripted"}``; ``body`` answers those bytes.
- **timing**: ``after`` waits until a call to that path has arrived, ``gather`` until that
  many calls to this path have arrived (calls made at once); then ``delay`` seconds.
- **faults**: ``hang`` (never answer), ``drip`` (headers, then a byte every 50 ms), ``late``
  (answer once the caller has hung up), ``reset`` (TCP reset), ``oversize`` (``size`` bytes,
  chunked), ``invalid_json`` (a 200 whose body is not JSON).

Every call is recorded (:meth:`ScriptedContributor.calls`: the request as an ``httpx.Request``
whose URL names the host the caller meant, the parsed packet) with what happened to it: ``seen``
(it arrived), ``answered`` (the answer was written), ``closed`` (the caller hung up before the
answer was written). Tests wait on those events (:meth:`~ScriptedContributor.wait_for`), never
on the clock.

``handler`` answers the unscripted calls instead, for HTTP a script cannot say: it takes the
``httpx.Request`` and returns an ``httpx.Response``, written as given (status, headers as they
are, a lying ``Content-Length`` included; chunked when the response says so), then the
connection is closed; a handler that raises resets the connection.

The server is asyncio on its own event loop in a thread of its own, so it serves beside
Starlette's ``TestClient``, async tests and a served process alike, and what the caller's loop
does is measured without the double's work. It writes HTTP/1.1 itself: a fault double needs the
bytes a server library exists to prevent (a reset, a dripped or endless body, a lying length).
Requests must carry their body with ``Content-Length`` and are not pipelined; answers keep the
connection alive, as a contributor's would. To run the double as a process of its own (a
benchmark's contributors), see :func:`context_assembly_client.testing.start_contributor`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import http
import inspect
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeAlias

import httpx
import pydantic_core

from context_assembly_client.types import Revision

__all__ = [
    "DEFAULT_BLOCKS",
    "Call",
    "Event",
    "Fault",
    "Handler",
    "ScriptedContributor",
    "Step",
]

Fault: TypeAlias = Literal["hang", "drip", "late", "reset", "oversize", "invalid_json"]
Event: TypeAlias = Literal["seen", "answered", "closed"]
Handler: TypeAlias = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]

DEFAULT_BLOCKS: tuple[Mapping[str, Any], ...] = (
    {"id": "{source}-a", "text": "fact A from {source}", "priority": 10},
    {
        "id": "{source}-b",
        "text": "fact B from {source} " * 5,
        "priority": 0,
        "projection": "B summary {source}",
    },
)
"""The blocks of an answer whose step names none (``{source}``: the packet's source)."""

DRIP_INTERVAL = 0.05  # seconds between the bytes of a dripped body: the fault modelled
_CHUNK = 65536


@dataclass(frozen=True)
class Step:
    """What the double does with one call. Every field is optional; ``Step()`` answers at once
    with the source's current revision and the default blocks."""

    revision: Revision | None = None
    """The answer's revision; ``None``: the source's current one (``set_revision``)."""
    blocks: Sequence[Mapping[str, Any]] | None = None
    """The answer's blocks; ``None``: :data:`DEFAULT_BLOCKS`. Strings may hold ``{source}``."""
    summary: str = "A summary of the folded messages."
    """The answer to a ``summarize`` packet."""
    status: int = 200
    """The answer's status; other than 200 the body is ``{"error": "scripted"}``."""
    body: bytes | None = None
    """The answer's body as given (``content-type: application/json``), whatever the packet."""
    delay: float = 0.0
    """Seconds to wait before answering (after ``after`` and ``gather``)."""
    after: str | None = None
    """Answer only once a call to this path has arrived."""
    gather: int = 0
    """Answer only once this many calls to this call's path have arrived."""
    fault: Fault | None = None
    """Not an answer (``invalid_json`` and ``late`` do answer, after their fashion)."""
    size: int = 10 * 1024 * 1024
    """The bytes an ``oversize`` fault streams."""

    def to_data(self) -> dict[str, Any]:
        """The step as JSON-ready data (``body`` in base64), for a double in another process."""
        data = {k: v for k, v in dataclasses.asdict(self).items() if v != _DEFAULTS[k]}
        if self.body is not None:
            data["body"] = base64.b64encode(self.body).decode()
        if self.blocks is not None:
            data["blocks"] = [dict(block) for block in self.blocks]
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Step:
        """The step of :meth:`to_data`'s output."""
        values = dict(data)
        if values.get("body") is not None:
            values["body"] = base64.b64decode(values["body"])
        return cls(**values)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Step)}


@dataclass(frozen=True)
class Call:
    """One call as the double read it, with what has happened to it so far."""

    request: httpx.Request
    """The request; its URL's host is the ``Host`` header's (the name the caller meant)."""
    events: tuple[Event, ...]

    @property
    def path(self) -> str:
        return self.request.url.path

    @property
    def packet(self) -> Any:
        """The body parsed as JSON (``None`` when it is not JSON)."""
        return _parse(self.request.content)


def _parse(body: bytes) -> Any:
    try:
        return pydantic_core.from_json(body) if body else None
    except ValueError:
        return None


def _with_source(value: Any, source: str) -> Any:
    if isinstance(value, str):
        return value.replace("{source}", source)
    if isinstance(value, list | tuple):
        return [_with_source(item, source) for item in value]
    return value


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Scripted"


def _head(status: int, fields: Iterable[str]) -> bytes:
    return (
        f"HTTP/1.1 {status} {_reason(status)}\r\n" + "".join(f"{f}\r\n" for f in fields)
    ).encode("latin-1") + b"\r\n"


def _json_answer(status: int, body: bytes) -> bytes:
    fields = ("content-type: application/json", f"content-length: {len(body)}")
    return _head(status, fields) + body


class _Record:
    """A call in progress: its request and its events (guarded by the double's lock)."""

    __slots__ = ("events", "request")

    def __init__(self, request: httpx.Request) -> None:
        self.request = request
        self.events: list[Event] = ["seen"]


class _Core:
    """The double's state and its serving, on whichever event loop runs it."""

    def __init__(
        self,
        *,
        default: Step,
        script: Mapping[str, Step | Sequence[Step]],
        revision: Revision,
        handler: Handler | None,
        record: bool,
    ) -> None:
        self.default = default
        self.handler = handler
        self.record = record
        self.initial_revision = revision
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.scripts: dict[str, list[Step]] = {}
        self.revisions: dict[str, Revision] = {}
        self.records: list[_Record] = []
        self.counts: dict[str, int] = {}  # calls arrived, by path
        self.answers: dict[tuple[Any, ...], tuple[Step, bytes]] = {}  # serialised, by step
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.arrival: asyncio.Event | None = None  # replaced at each arrival (the loop's)
        for path, steps in script.items():
            self.set_script(path, steps if isinstance(steps, Sequence) else [steps])

    # ---------------------------------------------------------------- script (any thread)

    def set_script(self, path: str, steps: Sequence[Step]) -> None:
        if not steps:
            raise ValueError("script at least one step")
        with self.lock:
            self.scripts[path] = list(steps)

    def next_step(self, path: str) -> Step | None:
        with self.lock:
            steps = self.scripts.get(path)
            if steps is None:
                return None if self.handler is not None else self.default
            return steps.pop(0) if len(steps) > 1 else steps[0]

    def revision(self, source: str) -> Revision:
        with self.lock:
            return self.revisions.get(source, self.initial_revision)

    def note(self, record: _Record | None, event: Event) -> None:
        if record is None:
            return
        with self.changed:
            record.events.append(event)
            self.changed.notify_all()

    # ---------------------------------------------------------------- serving (the loop's)

    async def start(self, port: int) -> int:
        self.arrival = asyncio.Event()
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", port)
        bound: int = self.server.sockets[0].getsockname()[1]
        return bound

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while await self._exchange(reader, writer):
                pass
        except (
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ):
            pass  # the caller went away, or sent what is not HTTP/1.1 with a length
        except asyncio.CancelledError:
            # The double is closing. The connection's task ends here, not cancelled: asyncio's
            # stream callback asks a finished task for its exception, which a cancelled one
            # raises instead of returning.
            writer.transport.abort()
        finally:
            self.tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it; whether the connection stays open for another."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False  # closed between requests
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = [
            (name.strip(), value.strip())
            for name, _, value in (line.partition(":") for line in lines[1:] if line)
        ]
        length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
        body = await reader.readexactly(length) if length else b""
        path = target.split("?", 1)[0]
        request, record = self._arrive(method, target, path, headers, body, writer)
        step = self.next_step(path)
        if step is None:
            assert request is not None  # made whenever there is a handler
            return await self._by_handler(request, record, writer)
        closed: asyncio.Task[None] | None = None
        try:
            if step.after is not None or step.gather:
                closed = _watch(reader)
                if not await self._until(step, path, closed):
                    self.note(record, "closed")
                    return False
            return await self._perform(step, record, body, reader, writer, closed)
        finally:
            if closed is not None:
                await _unwatch(closed)

    def _arrive(
        self,
        method: str,
        target: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        writer: asyncio.StreamWriter,
    ) -> tuple[httpx.Request | None, _Record | None]:
        """Count the call and wake what waits on arrivals; the request (for the record or the
        handler) and the call's record (when the double keeps one)."""
        request = record = None
        if self.record or self.handler is not None:
            host = next((v for k, v in headers if k.lower() == "host"), None)
            if host is None:
                host = f"127.0.0.1:{writer.get_extra_info('sockname')[1]}"
            request = httpx.Request(method, f"http://{host}{target}", headers=headers, content=body)
            if self.record:
                record = _Record(request)
        with self.changed:
            self.counts[path] = self.counts.get(path, 0) + 1
            if record is not None:
                self.records.append(record)
            self.changed.notify_all()
        assert self.arrival is not None
        arrived, self.arrival = self.arrival, asyncio.Event()
        arrived.set()
        return request, record

    async def _until(self, step: Step, path: str, closed: asyncio.Task[None]) -> bool:
        """Wait for the step's ``after`` and ``gather``; ``False`` if the caller hung up first."""

        def ready() -> bool:
            with self.lock:
                after = step.after is None or self.counts.get(step.after, 0) > 0
                return after and self.counts.get(path, 0) >= step.gather

        while not ready():
            assert self.arrival is not None
            arrival = asyncio.ensure_future(self.arrival.wait())
            try:
                await asyncio.wait({arrival, closed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                arrival.cancel()
            if closed.done():
                return False
        return True

    async def _perform(
        self,
        step: Step,
        record: _Record | None,
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        closed: asyncio.Task[None] | None,
    ) -> bool:
        fault = step.fault
        if fault == "reset":
            _reset(writer)
            return False
        if closed is None and (fault in ("hang", "late", "drip", "oversize") or step.delay):
            closed = _watch(reader)
            try:
                return await self._perform(step, record, body, reader, writer, closed)
            finally:
                await _unwatch(closed)
        if fault in ("hang", "late"):
            assert closed is not None
            await asyncio.wait({closed})
            self.note(record, "closed")
            if fault == "late":
                with contextlib.suppress(ConnectionError):
                    writer.write(self._answer(step, body))
                    await writer.drain()
                self.note(record, "answered")
            return False
        if fault == "drip":
            assert closed is not None
            writer.write(_head(200, ("content-type: application/json", "content-length: 100000")))
            with contextlib.suppress(ConnectionError):  # a reset is a hang-up too
                while not closed.done():
                    writer.write(b" ")
                    await writer.drain()
                    await asyncio.wait({closed}, timeout=DRIP_INTERVAL)
            self.note(record, "closed")
            return False
        if fault == "oversize":
            assert closed is not None
            writer.write(
                _head(200, ("content-type: application/json", "transfer-encoding: chunked"))
            )
            sent = 0
            with contextlib.suppress(ConnectionError):  # the caller cut it short
                while sent < step.size and not closed.done():
                    piece = b"[" * min(_CHUNK, step.size - sent)
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    await writer.drain()
                    sent += len(piece)
            if sent < step.size or closed.done():
                self.note(record, "closed")
                return False
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            self.note(record, "answered")
            return False
        if step.delay:
            assert closed is not None
            done, _ = await asyncio.wait({closed}, timeout=step.delay)
            if done:
                self.note(record, "closed")
                return False
        writer.write(self._answer(step, body))
        await writer.drain()
        self.note(record, "answered")
        return True

    def _answer(self, step: Step, body: bytes) -> bytes:
        """The whole HTTP answer of ``step`` to a request with ``body``."""
        if step.fault == "invalid_json":
            return _json_answer(200, b"{not json")
        if step.body is not None:
            return _json_answer(step.status, step.body)
        if step.status != 200:
            return _json_answer(step.status, b'{"error":"scripted"}')
        packet = _parse(body)
        kind = packet.get("type") if isinstance(packet, dict) else None
        if kind not in ("contribute", "revision", "summarize"):
            return _json_answer(400, b'{"error":"not a contributor packet"}')
        assert isinstance(packet, dict)
        source = str(packet.get("source", ""))
        revision = step.revision if step.revision is not None else self.revision(source)
        key = (id(step), kind, source, type(revision).__name__, revision)
        with self.lock:
            cached = self.answers.get(key)
            if cached is not None and cached[0] is step:
                return cached[1]
        if kind == "summarize":
            answer: dict[str, Any] = {"summary": step.summary}
        elif kind == "revision":
            answer = {"revision": revision}
        else:
            blocks = DEFAULT_BLOCKS if step.blocks is None else step.blocks
            answer = {
                "revision": revision,
                "blocks": [{k: _with_source(v, source) for k, v in b.items()} for b in blocks],
            }
        whole = _json_answer(200, pydantic_core.to_json(answer))
        with self.lock:
            if len(self.answers) > 4096:
                self.answers.clear()
            self.answers[key] = (step, whole)
        return whole

    async def _by_handler(
        self, request: httpx.Request, record: _Record | None, writer: asyncio.StreamWriter
    ) -> bool:
        assert self.handler is not None
        try:
            result = self.handler(request)
            response = await result if inspect.isawaitable(result) else result
            content = await response.aread()
        except Exception:
            _reset(writer)
            return False
        writer.write(_encode(response, content))
        await writer.drain()
        self.note(record, "answered")
        return False


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort the connection with a TCP reset (``SO_LINGER`` 0), not a close."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _watch(reader: asyncio.StreamReader) -> asyncio.Task[None]:
    """A task that ends when the caller closes the connection (or resets it)."""

    async def until_closed() -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(_CHUNK):
                pass

    return asyncio.ensure_future(until_closed())


async def _unwatch(watch: asyncio.Task[None]) -> None:
    """Cancel a watch and wait until it has let go of the reader (the next request's read)."""
    watch.cancel()
    await asyncio.wait({watch})


def _encode(response: httpx.Response, content: bytes) -> bytes:
    chunked = response.headers.get("transfer-encoding", "").lower() == "chunked"
    lines = [f"HTTP/1.1 {response.status_code} {_reason(response.status_code)}".encode()]
    lines += [name + b": " + value for name, value in response.headers.raw]
    lines.append(b"connection: close")
    if chunked:
        content = (b"%x\r\n%s\r\n" % (len(content), content) if content else b"") + b"0\r\n\r\n"
    return b"\r\n".join(lines) + b"\r\n\r\n" + content


class ScriptedContributor:
    """A loopback contributor double serving from a thread of its own until :meth:`close` (or
    the end of its ``with`` block); see the module docstring.

    Args:
        default: the step of every call to a path with no script.
        script: steps by path, as :meth:`script` takes them.
        revision: every source's revision until :meth:`set_revision` changes it.
        handler: answers the calls to paths with no script instead of ``default``.
        port: the loopback port to bind (0: any free one).
        record: keep every call for :meth:`calls` and the events (a benchmark's long run
            turns it off: nothing is kept, nothing can be waited for).
    """

    def __init__(
        self,
        *,
        default: Step | None = None,
        script: Mapping[str, Step | Sequence[Step]] | None = None,
        revision: Revision = "r1",
        handler: Handler | None = None,
        port: int = 0,
        record: bool = True,
    ) -> None:
        self._core = _Core(
            default=default or Step(),
            script=script or {},
            revision=revision,
            handler=handler,
            record=record,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="scripted-contributor", daemon=True
        )
        self._thread.start()
        try:
            self.port: int = asyncio.run_coroutine_threadsafe(
                self._core.start(port), self._loop
            ).result(timeout=10)
        except BaseException:
            self._stop_loop()
            raise

    # ---------------------------------------------------------------- where it is

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "/contribute") -> str:
        """The URL of ``path`` on this double."""
        return self.base_url + path

    # ---------------------------------------------------------------- the script

    def script(self, path: str, *steps: Step) -> None:
        """The calls to ``path`` from now on take ``steps`` in order; the last one repeats."""
        self._core.set_script(path, steps)

    def set_revision(self, source: str, revision: Revision) -> None:
        """Answers for ``source`` whose step names no revision carry ``revision`` from now on."""
        with self._core.lock:
            self._core.revisions[source] = revision

    # ---------------------------------------------------------------- what happened

    def calls(self, path: str | None = None) -> list[Call]:
        """The calls so far (to ``path`` only, when given), in the order they arrived."""
        with self._core.lock:
            return [
                Call(r.request, tuple(r.events))
                for r in self._core.records
                if path is None or r.request.url.path == path
            ]

    def count(self, event: Event, path: str) -> int:
        """How many calls to ``path`` have had ``event``."""
        with self._core.lock:
            return self._count(event, path)

    def _count(self, event: Event, path: str) -> int:  # the lock held
        return sum(
            1 for r in self._core.records if r.request.url.path == path and event in r.events
        )

    def noted(self, event: Event, path: str) -> bool:
        """Whether a call to ``path`` has had ``event``."""
        return self.count(event, path) > 0

    def wait_for(self, event: Event, path: str, count: int = 1, timeout: float = 20.0) -> None:
        """Block until ``count`` calls to ``path`` have had ``event``. ``timeout`` is a hang
        guard, generous on a loaded machine: past it, ``AssertionError`` says what never came.
        (From async code: ``await asyncio.to_thread(double.wait_for, ...)``.)"""
        if not self._core.record:
            raise RuntimeError("this double keeps no record (record=False)")
        deadline = time.monotonic() + timeout
        with self._core.changed:
            while self._count(event, path) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the double never noted {count} x {event!r} for {path}")
                self._core.changed.wait(left)

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Stop serving: every connection still open is closed, pending answers abandoned."""
        if self._loop.is_closed():
            return
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._core.aclose(), self._loop).result(timeout=10)
        self._stop_loop()

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> ScriptedContributor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def serve(
    port: int,
    *,
    default: Step | None = None,
    script: Mapping[str, Step | Sequence[Step]] | None = None,
    revision: Revision = "r1",
    stop: asyncio.Event,
) -> None:
    """Serve a double that keeps no record on this event loop until ``stop`` is set (the
    process form, ``python -m context_assembly_client.testing``)."""
    core = _Core(
        default=default or Step(),
        script=script or {},
        revision=revision,
        handler=None,
        record=False,
    )
    await core.start(port)
    try:
        await stop.wait()
    finally:
        await core.aclose()
