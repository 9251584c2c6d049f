"""The script of a scripted contributor double and its record: what each call does
(:class:`Step`), the calls as the double read them (:class:`Call`), and the state the serving
loop and the test's threads share (:class:`Script`: the steps by path, the sources' revisions,
the calls counted and recorded, the answers a step makes to a packet).

See :mod:`.scripted` for the double itself and what a step does.
"""

from __future__ import annotations

import base64
import dataclasses
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import httpx
import pydantic_core

from context_assembly_client.testing.wire import json_answer
from context_assembly_client.types import Revision

__all__ = [
    "DEFAULT_BLOCKS",
    "Call",
    "Event",
    "Fault",
    "Handler",
    "Record",
    "Script",
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
    """``body`` parsed as JSON; ``None`` when it is empty or not JSON."""
    try:
        return pydantic_core.from_json(body) if body else None
    except ValueError:
        return None


def _with_source(value: Any, source: str) -> Any:
    """``value`` with ``{source}`` in its strings replaced by ``source``."""
    if isinstance(value, str):
        return value.replace("{source}", source)
    if isinstance(value, list | tuple):
        return [_with_source(item, source) for item in value]
    return value


class Record:
    """A call in progress: its request and its events (guarded by the script's lock)."""

    __slots__ = ("events", "request")

    def __init__(self, request: httpx.Request) -> None:
        self.request = request
        self.events: list[Event] = ["seen"]


class Script:
    """The double's script and record, shared by the serving loop and any thread: read and
    written under ``lock``; ``changed`` is notified at each arrival and each event."""

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
        self.records: list[Record] = []
        self.counts: dict[str, int] = {}  # calls arrived, by path
        self.answers: dict[tuple[Any, ...], tuple[Step, bytes]] = {}  # serialised, by step
        for path, steps in script.items():
            self.set_script(path, steps if isinstance(steps, Sequence) else [steps])

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

    def note(self, record: Record | None, event: Event) -> None:
        if record is None:
            return
        with self.changed:
            record.events.append(event)
            self.changed.notify_all()

    def arrive(self, path: str, record: Record | None) -> None:
        """Count a call to ``path`` (and keep its ``record``), waking what waits on arrivals."""
        with self.changed:
            self.counts[path] = self.counts.get(path, 0) + 1
            if record is not None:
                self.records.append(record)
            self.changed.notify_all()

    def ready(self, step: Step, path: str) -> bool:
        """Whether the calls ``step`` waits for (``after``, ``gather``) have arrived."""
        with self.lock:
            after = step.after is None or self.counts.get(step.after, 0) > 0
            return after and self.counts.get(path, 0) >= step.gather

    def answer(self, step: Step, body: bytes) -> bytes:
        """The whole HTTP answer of ``step`` to a request with ``body``."""
        if step.fault == "invalid_json":
            return json_answer(200, b"{not json")
        if step.body is not None:
            return json_answer(step.status, step.body)
        if step.status != 200:
            return json_answer(step.status, b'{"error":"scripted"}')
        packet = _parse(body)
        kind = packet.get("type") if isinstance(packet, dict) else None
        if kind not in ("contribute", "revision", "summarize"):
            return json_answer(400, b'{"error":"not a contributor packet"}')
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
        whole = json_answer(200, pydantic_core.to_json(answer))
        with self.lock:
            if len(self.answers) > 4096:
                self.answers.clear()
            self.answers[key] = (step, whole)
        return whole
