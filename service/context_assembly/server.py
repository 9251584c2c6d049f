"""``context-assembly serve``: settings built once, then uvicorn runs ``create_app(settings)``.

With several workers uvicorn imports the app in each worker process, so the settings travel as
environment variables (the TOML path and the command-line overrides) and each worker rebuilds
them through the same validated path.
"""

from __future__ import annotations

import functools
import gc
import os
import sys

import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError

from context_assembly.api.app import create_app
from context_assembly.config import Settings, explain, load_settings
from context_assembly.http_limits import LimitedHttpToolsProtocol
from context_assembly.logs import configure_logging

CONFIG_ENV = "CONTEXT_ASSEMBLY_CONFIG_FILE"
# The cyclic collector's thresholds in a serving process (Python's default is (700, 10, 10)).
# Almost nothing a request allocates is cyclic garbage (refcounting frees it), yet at the default
# a young collection runs every few prepares and scans the objects of the requests in flight.
GC_THRESHOLDS = (5_000, 10, 10)


def tune_gc() -> None:
    """Move what the process has built so far (modules, registry, schemas, routes) out of the
    cyclic collector's reach, so that full collections during requests do not traverse it, and
    collect young objects less often (``GC_THRESHOLDS``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def app_from_env() -> FastAPI:
    """The uvicorn factory used by every worker."""
    config = os.environ.get(CONFIG_ENV) or None
    settings = load_settings(config)
    configure_logging(settings.server.log_level)
    app = create_app(settings, config_path=config)
    tune_gc()
    return app


def _settings(config: str | None, overrides: dict[str, object]) -> Settings:
    server = {k: v for k, v in overrides.items() if v is not None}
    try:
        base = load_settings(config)
        merged = {**base.server.model_dump(), **server}
        return load_settings(config, server=merged)
    except ValidationError as err:
        # Field locations and messages only: an input value could be a secret.
        for item in err.errors(include_input=False, include_url=False):
            print(f"context-assembly: invalid configuration: {explain(item)}", file=sys.stderr)
        raise SystemExit(2) from err
    except (FileNotFoundError, ValueError) as err:
        print(f"context-assembly: invalid configuration: {err}", file=sys.stderr)
        raise SystemExit(2) from err


def serve(*, host: str | None, port: int | None, config: str | None, workers: int | None) -> int:
    """Validate the settings, then run uvicorn (uvloop + httptools bounded by ``[limits]``, no
    access log)."""
    settings = _settings(config, {"host": host, "port": port, "workers": workers})
    if config is not None:
        os.environ[CONFIG_ENV] = os.path.abspath(config)
    # Carry the command-line overrides to the workers through the same environment mechanism.
    os.environ["CONTEXT_ASSEMBLY_SERVER__HOST"] = settings.server.host
    os.environ["CONTEXT_ASSEMBLY_SERVER__PORT"] = str(settings.server.port)
    os.environ["CONTEXT_ASSEMBLY_SERVER__WORKERS"] = str(settings.server.workers)
    configure_logging(settings.server.log_level)
    uvicorn.run(
        "context_assembly.server:app_from_env",
        factory=True,
        host=settings.server.host,
        port=settings.server.port,
        workers=settings.server.workers,
        loop="uvloop",
        # uvicorn builds the protocol of each connection by calling this as it would the class
        # (a partial pickles, for the worker processes).
        http=functools.partial(LimitedHttpToolsProtocol, limits=settings.limits),  # type: ignore[arg-type]
        access_log=False,
        log_level="warning",
        # uvicorn hands it to asyncio.timeout, which takes seconds as a float: 0.5 is half a
        # second and 0 no drain. It goes through as given: rounded to an int, 0.5 would become
        # 0, which uvicorn reads as no bound at all.
        timeout_graceful_shutdown=settings.server.drain_seconds,  # type: ignore[arg-type]
    )
    return 0
