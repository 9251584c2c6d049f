"""The ``context-assembly`` command: ``assemble`` (no server), ``serve`` (the service) and
``replay`` (recorded conversations through the service, ``replay/command.py``).

``assemble [FILE]`` reads a prepare request (stdin without FILE), calls no contributor (inline
contributions and the whiteboard only), and prints the prepare response JSON. On error it prints
the problem+json body and exits with status 2. ``--now`` pins the clock for reproducible runs.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta

import orjson

from context_assembly import __version__
from context_assembly.core import cache
from context_assembly.core.blocks import parse_timestamp
from context_assembly.core.fingerprint import digest
from context_assembly.core.request import PrepareRequest
from context_assembly.core.sources import materialised_inputs, plan_sources
from context_assembly.engine import cache_model, run_assembly, to_response
from context_assembly.errors import InvalidError, ServiceError
from context_assembly.tokens.registry import ModelRegistry
from context_assembly.validation import parse_model

CLI_TENANT = "local"
CLI_TTL = timedelta(hours=1)
# A local run keys automatic ``prompt_cache_key``s with this fixed secret, so its output is
# reproducible; only the service's keys are secret (``[cache] key_secret`` or the stored one).
CLI_CACHE_KEY_SECRET = b"context-assembly assemble"


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
        facts = cache_model(request, ctx, registry)
        turn = cache.turn(
            request,
            assembly,
            model=ctx.model,
            minimum=facts.minimum,
            tenant=CLI_TENANT,
            previous_preparation_id=None,
            previous=None,
            key_secret=CLI_CACHE_KEY_SECRET,
            provider=facts.provider,
            explicit=facts.explicit,
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
        _print_json(orjson.dumps(problem.to_problem()), args.pretty)
        return 2
    try:
        out = assemble_bytes(raw, now)
    except ServiceError as err:
        _print_json(orjson.dumps(err.to_problem()), args.pretty)
        return 2
    _print_json(out, args.pretty)
    return 0


def _print_json(data: bytes, pretty: bool | None) -> None:
    """JSON on stdout: indented when asked, or by default when stdout is a terminal."""
    if pretty is None:
        pretty = sys.stdout.isatty()
    if pretty:
        data = orjson.dumps(orjson.loads(data), option=orjson.OPT_INDENT_2)
    sys.stdout.buffer.write(data + b"\n")


def _cmd_serve(args: argparse.Namespace) -> int:
    from context_assembly.server import serve  # the HTTP stack loads only when serving

    return serve(host=args.host, port=args.port, config=args.config, workers=args.workers)


DESCRIPTION = """\
Decide which pieces of source data enter an AI model's prompt under a token budget, lay the
prompt out, and explain every decision.

Run "context-assembly COMMAND --help" for the options of each command.
"""

ASSEMBLE_DESCRIPTION = """\
Assemble one prepare request without a server: read the request JSON (the body of
POST /v1/prepare), run the same selection, budget and layout as the service, and print the
prepare answer as JSON on stdout.

No contributor is called: only inline contributions and the whiteboard are used, and a request
that names webhook contributors is refused. Nothing is stored; the preparation id is derived
from the request, so the same request and --now give the same output.

exit status:
  0  the answer was printed
  2  the request was refused: the problem+json body (type, title, status, code, detail) is
     printed on stdout instead
"""

ASSEMBLE_EPILOG = """\
example:
  context-assembly assemble examples/requests/seed-whiteboard.json --now 2026-12-02T12:00:00Z
  cat request.json | context-assembly assemble
"""

SERVE_DESCRIPTION = """\
Run the HTTP service with uvicorn. Settings come from, strongest first: these options, the
CONTEXT_ASSEMBLY_* environment variables (nested keys with a double underscore, for example
CONTEXT_ASSEMBLY_STORE__BACKEND=redis), the TOML file given with --config, and the defaults.
With no file and no variables it listens on 127.0.0.1:8080 without authentication and keeps
its records in the SQLite file context-assembly.db in the working directory.

An invalid configuration is refused at start with one line per problem on stderr and exit
status 2. SIGTERM drains requests in flight (server.drain_seconds) before stopping; SIGHUP
reloads the --config file. docs/configuration.md lists every key.
"""

SERVE_EPILOG = """\
examples:
  context-assembly serve
  context-assembly serve --config service.toml
  context-assembly serve --host 0.0.0.0 --port 9000 --config service.toml
"""


def _parser() -> argparse.ArgumentParser:
    text = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="context-assembly", description=DESCRIPTION, formatter_class=text
    )
    parser.add_argument("--version", action="version", version=f"context-assembly {__version__}")
    sub = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")
    p_assemble = sub.add_parser(
        "assemble",
        help="assemble one prepare request without a server and print the answer",
        description=ASSEMBLE_DESCRIPTION,
        epilog=ASSEMBLE_EPILOG,
        formatter_class=text,
    )
    p_assemble.add_argument(
        "file",
        nargs="?",
        metavar="FILE",
        help="the prepare request as a JSON file; without FILE, or with -, it is read from stdin",
    )
    p_assemble.add_argument(
        "--now",
        metavar="TIMESTAMP",
        help="the time to assemble at, as RFC 3339 with an offset (2026-12-02T12:00:00Z); it "
        "sets the date line, block expiry and expires_at. Default: the current time",
    )
    p_assemble.add_argument(
        "--pretty",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="indent the JSON (--no-pretty: one line). Default: indented on a terminal, one line "
        "when piped",
    )
    p_assemble.set_defaults(func=_cmd_assemble)
    p_serve = sub.add_parser(
        "serve",
        help="run the HTTP service (POST /v1/prepare and the rest of the API)",
        description=SERVE_DESCRIPTION,
        epilog=SERVE_EPILOG,
        formatter_class=text,
    )
    p_serve.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="TOML configuration file (sections [server], [auth], [store], [contributors.NAME], "
        "[inline_urls], [limits]). Default: none, only the environment and the defaults",
    )
    p_serve.add_argument(
        "--host",
        metavar="ADDRESS",
        default=None,
        help="address to listen on; overrides server.host (default 127.0.0.1). An address "
        'other than loopback needs [auth] mode = "api_key"',
    )
    p_serve.add_argument(
        "--port",
        metavar="PORT",
        type=int,
        default=None,
        help="TCP port to listen on; overrides server.port (default 8080)",
    )
    p_serve.add_argument(
        "--workers",
        metavar="N",
        type=int,
        default=None,
        help="number of worker processes; overrides server.workers (default 1). More than one "
        'needs the Redis store ([store] backend = "redis")',
    )
    p_serve.set_defaults(func=_cmd_serve)
    from context_assembly.replay.command import add_parser as add_replay_parser

    add_replay_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``context-assembly`` console script."""
    args = _parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
