"""structlog configured once: JSON lines via orjson, UTC timestamps, context variables merged.

Logs carry ids, sizes, statuses and timings. Never block text, instructions, history or input:
call sites pass only those, and no request or response body is ever logged.

Lines logged through the standard library's ``logging`` (uvicorn's ``uvicorn.error``: its
start-up and shutdown lines, "Invalid HTTP request received."; asyncio's and the client
libraries' warnings) are handed to structlog too, so the process writes one kind of line: JSON,
with ``logger`` naming where it came from and ``request_id`` when the record has one.
"""

from __future__ import annotations

import logging
import sys
import traceback

import orjson
import structlog
from structlog.tracebacks import ExceptionDictTransformer

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _ToStructlog(logging.Handler):
    """Re-emits a standard-library record through structlog: its level, its message, the name of
    its logger, its ``request_id`` and its exception, and nothing else of the record."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, object] = {"logger": record.name}
            request_id = getattr(record, "request_id", None)
            if request_id is not None:
                fields["request_id"] = request_id
            if record.exc_info:
                fields["exc_info"] = record.exc_info
            structlog.get_logger().log(record.levelno, record.getMessage(), **fields)
        except Exception:
            self.handleError(record)


def frames(exc: BaseException) -> list[str]:
    """Where ``exc`` was raised: module, line and function of each frame of its traceback,
    outermost first (``context_assembly.api.routes.preparations:73 get_preparation``): the ``frames`` of an
    ``unhandled_error`` line (an ``internal_error`` line writes its own the same way). Never the
    exception's message, nor a frame's variables: either can hold what the code was handed (a
    block's text, the input)."""
    return [
        f"{frame.f_globals.get('__name__', '?')}:{line} {frame.f_code.co_qualname}"
        for frame, line in traceback.walk_tb(exc.__traceback__)
    ]


def configure_logging(level: str = "info") -> None:
    """Production recipe: filtering bound logger, contextvars, ISO UTC time, orjson JSON lines;
    the standard library's records go through the same (``_ToStructlog``).

    uvicorn configures its own loggers as it starts (a handler writing plain text); this runs
    after that in every serving process (``server.app_from_env``) and takes them over: their
    records propagate to the root logger's handler, at the service's level. uvicorn's access
    logger stays off (the service logs its own access line)."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # A traceback's frames without their local variables: structlog shows locals by
            # default, and a frame's locals can hold a request's text (a frame, blocks, input).
            structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False)),
            structlog.processors.JSONRenderer(serializer=orjson.dumps),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.BytesLoggerFactory(sys.stderr.buffer),
        # A serving process configures once, before its first log line (the level is not
        # reloadable), so each module's logger is bound on first use instead of on every call.
        cache_logger_on_first_use=True,
    )
    numeric = _LEVELS.get(level, logging.INFO)
    root = logging.getLogger()
    # Idempotent: a second call replaces the handler of the first.
    root.handlers = [h for h in root.handlers if not isinstance(h, _ToStructlog)]
    root.addHandler(_ToStructlog())
    # Other libraries' lines from warning up, whatever the service's level.
    root.setLevel(max(numeric, logging.WARNING))
    for name in ("uvicorn", "uvicorn.error"):
        uvicorn_log = logging.getLogger(name)
        uvicorn_log.handlers = []
        uvicorn_log.propagate = True
        uvicorn_log.setLevel(numeric)
