"""The ``context-assembly`` command: ``assemble`` (no server) and ``serve``.

``assemble [FILE]`` reads a prepare request (stdin without FILE), calls no contributor (inline
contributions and the whiteboard only), and prints the prepare response JSON. On error it prints
the problem+json body and exits with status 2. ``--now`` pins the clock for reproducible runs.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta

import orjson

from context_assembly.core import cache
from context_assembly.core.blocks import parse_timestamp
from context_assembly.core.fingerprint import digest
from context_assembly.core.request import PrepareRequest
from context_assembly.core.sources import materialised_inputs, plan_sources
from context_assembly.engine import cache_minimum, run_assembly, to_response
from context_assembly.errors import InvalidError, ServiceError
from context_assembly.tokens.registry import ModelRegistry
from context_assembly.validation import parse_model

CLI_TENANT = "local"
CLI_TTL = timedelta(hours=1)


def assemble_bytes(raw: bytes, now: datetime) -> bytes:
    """One CLI assembly: request JSON in, response JSON out (raises ServiceError)."""
    request = parse_model(PrepareRequest, raw)
    if request.contributors:
        raise InvalidError(
            "the assemble command calls no contributor: this request names webhook contributors "
            f"({', '.join(c.source for c in request.contributors)}); use the service's POST /v1/prepare",
            field="contributors",
        )
    setups = plan_sources(request)
    inputs = materialised_inputs(request, setups)
    registry = ModelRegistry.load()
    assembly, ctx = run_assembly(
        request, setups, inputs, now=now, tenant=CLI_TENANT, registry=registry
    )
    # A local run has no store: its id is derived from the fingerprint, so the output is
    # reproducible, and there is no previous turn to compare with.
    prep_id = "prep_local_" + digest(assembly.fingerprint)[7:31]
    turn = None
    if request.cache is not None:
        turn = cache.turn(
            request,
            assembly,
            model=ctx.model,
            minimum=cache_minimum(request, ctx, registry),
            tenant=CLI_TENANT,
            previous_preparation_id=None,
            previous=None,
        )
    response = to_response(
        request, assembly, ctx, preparation_id=prep_id, expires_at=now + CLI_TTL, cache=turn
    )
    return response.model_dump_json().encode()


def _now(value: str | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    parsed = parse_timestamp(value)
    if parsed is None:
        raise SystemExit(f"--now must be an RFC 3339 timestamp with an offset, got {value!r}")
    return parsed


def _cmd_assemble(args: argparse.Namespace) -> int:
    now = _now(args.now)
    try:
        if args.file is None or args.file == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as handle:
                raw = handle.read()
    except OSError as err:
        problem = InvalidError(f"cannot read the request file: {err.strerror}", field="FILE")
        sys.stdout.buffer.write(orjson.dumps(problem.to_problem()) + b"\n")
        return 2
    try:
        out = assemble_bytes(raw, now)
    except ServiceError as err:
        sys.stdout.buffer.write(orjson.dumps(err.to_problem()) + b"\n")
        return 2
    sys.stdout.buffer.write(out + b"\n")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from context_assembly.server import serve  # the HTTP stack loads only when serving

    return serve(host=args.host, port=args.port, config=args.config, workers=args.workers)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``context-assembly`` console script."""
    parser = argparse.ArgumentParser(prog="context-assembly", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_assemble = sub.add_parser("assemble", help="assemble one prepare request without a server")
    p_assemble.add_argument("file", nargs="?", help="request JSON file (default: stdin)")
    p_assemble.add_argument("--now", help="pin the clock (RFC 3339), for reproducible output")
    p_assemble.set_defaults(func=_cmd_assemble)
    p_serve = sub.add_parser("serve", help="run the HTTP service")
    p_serve.add_argument("--host", default=None)
    p_serve.add_argument("--port", type=int, default=None)
    p_serve.add_argument("--config", default=None, help="TOML configuration file")
    p_serve.add_argument("--workers", type=int, default=None)
    p_serve.set_defaults(func=_cmd_serve)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
