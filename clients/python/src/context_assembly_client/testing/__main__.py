"""``python -m context_assembly_client.testing``: a scripted contributor double as a process of
its own, serving on 127.0.0.1 until SIGTERM or SIGINT (:func:`.start_contributor` runs it)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable, Sequence

import pydantic_core

from context_assembly_client.testing.scripted import Step, serve


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m context_assembly_client.testing",
        description="Serve a scripted contributor double on 127.0.0.1.",
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--default", default="{}", help="the default step, as Step.to_data JSON")
    parser.add_argument("--script", default="{}", help='JSON: {"/path": [step, ...], ...}')
    parser.add_argument("--revision", default='"r1"', help="the initial revision, as JSON")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop (when installed)")
    args = parser.parse_args(argv)
    default = Step.from_data(pydantic_core.from_json(args.default))
    script = {
        path: [Step.from_data(step) for step in steps]
        for path, steps in pydantic_core.from_json(args.script).items()
    }
    revision = pydantic_core.from_json(args.revision)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(args.port, default=default, script=script, revision=revision, stop=stop)

    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if args.uvloop:
        import uvloop  # only when asked for: not a dependency of the client

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
