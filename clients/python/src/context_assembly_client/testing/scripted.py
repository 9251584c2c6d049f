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
does is measured without the double's work. It writes HTTP/1.1 itself (:mod:`.wire`): a fault
double needs the bytes a server library exists to prevent (a reset, a dripped or endless body, a
lying length).
Requests must carry their body with ``Content-Length`` and are not pipelined; answers keep the
connection alive, as a contributor's would. To run the double as a process of its own (a
benchmark's contributors), see :func:`context_assembly_client.testing.start_contributor`.

This module holds the server: its event loop (:class:`ScriptedContributor`'s thread, or
:func:`serve` on the caller's loop), reading each call and carrying out its step. The steps, the
calls and their record are :mod:`.script`'s (:class:`Step`, :class:`Call` and the other names in
``__all__`` are importable from here too).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType

import httpx

from context_assembly_client.testing.script import (
    DEFAULT_BLOCKS,
    Call,
    Event,
    Fault,
    Handler,
    Record,
    Script,
    Step,
)
from context_assembly_client.testing.wire import drip, encode, oversize, reset, unwatch, watch
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


class _Core:
    """The double's serving of its ``script``, on whichever event loop runs it."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.arrival: asyncio.Event | None = None  # replaced at each arrival (the loop's)

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
        step = self.script.next_step(path)
        if step is None:
            assert request is not None  # made whenever there is a handler
            return await self._by_handler(request, record, writer)
        closed: asyncio.Task[None] | None = None
        try:
            if step.after is not None or step.gather:
                closed = watch(reader)
                if not await self._until(step, path, closed):
                    self.script.note(record, "closed")
                    return False
            return await self._perform(step, record, body, reader, writer, closed)
        finally:
            if closed is not None:
                await unwatch(closed)

    def _arrive(
        self,
        method: str,
        target: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        writer: asyncio.StreamWriter,
    ) -> tuple[httpx.Request | None, Record | None]:
        """Count the call and wake what waits on arrivals; the request (for the record or the
        handler) and the call's record (when the double keeps one)."""
        request = record = None
        if self.script.record or self.script.handler is not None:
            host = next((v for k, v in headers if k.lower() == "host"), None)
            if host is None:
                host = f"127.0.0.1:{writer.get_extra_info('sockname')[1]}"
            request = httpx.Request(method, f"http://{host}{target}", headers=headers, content=body)
            if self.script.record:
                record = Record(request)
        self.script.arrive(path, record)
        assert self.arrival is not None
        arrived, self.arrival = self.arrival, asyncio.Event()
        arrived.set()
        return request, record

    async def _until(self, step: Step, path: str, closed: asyncio.Task[None]) -> bool:
        """Wait for the step's ``after`` and ``gather``; ``False`` if the caller hung up first."""
        while not self.script.ready(step, path):
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
        record: Record | None,
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        closed: asyncio.Task[None] | None,
    ) -> bool:
        fault = step.fault
        if fault == "reset":
            reset(writer)
            return False
        if closed is None and (fault in ("hang", "late", "drip", "oversize") or step.delay):
            closed = watch(reader)
            try:
                return await self._perform(step, record, body, reader, writer, closed)
            finally:
                await unwatch(closed)
        if fault in ("hang", "late"):
            assert closed is not None
            await asyncio.wait({closed})
            self.script.note(record, "closed")
            if fault == "late":
                with contextlib.suppress(ConnectionError):
                    writer.write(self.script.answer(step, body))
                    await writer.drain()
                self.script.note(record, "answered")
            return False
        if fault == "drip":
            assert closed is not None
            await drip(writer, closed)
            self.script.note(record, "closed")
            return False
        if fault == "oversize":
            assert closed is not None
            whole = await oversize(writer, step.size, closed)
            self.script.note(record, "answered" if whole else "closed")
            return False
        if step.delay:
            assert closed is not None
            done, _ = await asyncio.wait({closed}, timeout=step.delay)
            if done:
                self.script.note(record, "closed")
                return False
        writer.write(self.script.answer(step, body))
        await writer.drain()
        self.script.note(record, "answered")
        return True

    async def _by_handler(
        self, request: httpx.Request, record: Record | None, writer: asyncio.StreamWriter
    ) -> bool:
        handler = self.script.handler
        assert handler is not None
        try:
            result = handler(request)
            response = await result if inspect.isawaitable(result) else result
            content = await response.aread()
        except Exception:
            reset(writer)
            return False
        writer.write(encode(response, content))
        await writer.drain()
        self.script.note(record, "answered")
        return False


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
        self._script = Script(
            default=default or Step(),
            script=script or {},
            revision=revision,
            handler=handler,
            record=record,
        )
        self._core = _Core(self._script)
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
        self._script.set_script(path, steps)

    def set_revision(self, source: str, revision: Revision) -> None:
        """Answers for ``source`` whose step names no revision carry ``revision`` from now on."""
        with self._script.lock:
            self._script.revisions[source] = revision

    # ---------------------------------------------------------------- what happened

    def calls(self, path: str | None = None) -> list[Call]:
        """The calls so far (to ``path`` only, when given), in the order they arrived."""
        with self._script.lock:
            return [
                Call(r.request, tuple(r.events))
                for r in self._script.records
                if path is None or r.request.url.path == path
            ]

    def count(self, event: Event, path: str) -> int:
        """How many calls to ``path`` have had ``event``."""
        with self._script.lock:
            return self._count(event, path)

    def _count(self, event: Event, path: str) -> int:  # the lock held
        return sum(
            1 for r in self._script.records if r.request.url.path == path and event in r.events
        )

    def noted(self, event: Event, path: str) -> bool:
        """Whether a call to ``path`` has had ``event``."""
        return self.count(event, path) > 0

    def wait_for(self, event: Event, path: str, count: int = 1, timeout: float = 20.0) -> None:
        """Block until ``count`` calls to ``path`` have had ``event``. ``timeout`` is a hang
        guard, generous on a loaded machine: past it, ``AssertionError`` says what never came.
        (From async code: ``await asyncio.to_thread(double.wait_for, ...)``.)"""
        if not self._script.record:
            raise RuntimeError("this double keeps no record (record=False)")
        deadline = time.monotonic() + timeout
        with self._script.changed:
            while self._count(event, path) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the double never noted {count} x {event!r} for {path}")
                self._script.changed.wait(left)

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
        Script(
            default=default or Step(),
            script=script or {},
            revision=revision,
            handler=None,
            record=False,
        )
    )
    await core.start(port)
    try:
        await stop.wait()
    finally:
        await core.aclose()
