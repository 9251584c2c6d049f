"""structlog configured once: JSON lines via orjson, UTC timestamps, context variables merged.

Logs carry ids, sizes, statuses and timings. Never block text, instructions, history or input:
call sites pass only those, and no request or response body is ever logged.
"""

from __future__ import annotations

import logging
import sys

import orjson
import structlog
from structlog.tracebacks import ExceptionDictTransformer

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure_logging(level: str = "info") -> None:
    """Production recipe: filtering bound logger, contextvars, ISO UTC time, orjson JSON lines."""
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
