"""The core's extra cost of a request's ``cache`` object: plan, digests, comparison, directives.

The inline request of ``bench_service.py`` (128 blocks), with four tools and a 20-message history
as an agent's turn has them, in ``stable-prefix``. Per render target, the p50 of one assembly and
answer (``run_assembly`` with the process's count cache warm, as a repeated turn in the
service, then ``to_response`` and its JSON) without ``cache``, and with it (plus ``core.cache.turn`` against
the previous turn's digests, given the history's digests as the record has them), interleaved in
rounds; and the extra time as a share of the first.

Then the same through the app (in-process ASGI as ``bench_inprocess.py``, a SQLite file): the
p50 of a whole inline prepare without ``cache`` and with it, in interleaved rounds. Every
prepare, with ``cache`` or without, looks up the scope's previous turn and keeps the turn in its
record; what ``cache`` adds is its directives and ``selection.cache`` in the answer.

Run: ``.venv/bin/python bench/bench_cache.py [--n 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_inprocess import p50 as app_p50
from figures import report
from loopback import inline_request

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.core import cache
from context_assembly.core.fingerprint import message_hashes
from context_assembly.core.request import PrepareRequest
from context_assembly.core.sources import materialised_inputs, plan_sources
from context_assembly.engine import cache_minimum, run_assembly, to_response
from context_assembly.logs import configure_logging
from context_assembly.server import tune_gc
from context_assembly.tokens.registry import ModelRegistry

NOW = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
TARGETS = {
    "anthropic": ("claude-sonnet-4", {"breakpoints": True}),
    "openai-chat": ("gpt-4o-mini", {"key": "auto"}),
}


def request_body(model: str, render: str, options: dict[str, object] | None) -> bytes:
    body = orjson.loads(inline_request())
    body["model"] = model
    body["render"] = render
    body["tools"] = [
        {"name": f"tool_{i}", "description": f"Tool {i} reads one kind of record. " * 4}
        for i in range(4)
    ]
    body["history"] = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Message {i}. " * 30}
        for i in range(20)
    ]
    if options is not None:
        body["cache"] = options
    return orjson.dumps(body)


def one_prepare(raw: bytes, registry: ModelRegistry) -> Callable[[], bytes]:
    request = PrepareRequest.model_validate_json(raw)
    setups = plan_sources(request)
    inputs = materialised_inputs(request, setups)
    previous: cache.PrefixDigests | None = None
    # The service keeps these in its record of every preparation (``history_hashes``) and hands
    # them over, so they cost a turn with ``cache`` nothing more.
    history_digests = message_hashes(request.history_messages)
    if request.cache is not None:
        assembly, ctx = run_assembly(
            request, setups, inputs, now=NOW, tenant="bench", registry=registry
        )
        previous = cache.turn(
            request,
            assembly,
            model=ctx.model,
            minimum=cache_minimum(request, ctx, registry),
            tenant="bench",
            previous_preparation_id=None,
            previous=None,
            key_secret=b"bench secret, 16+",
        ).digests

    def call() -> bytes:
        assembly, ctx = run_assembly(
            request, setups, inputs, now=NOW, tenant="bench", registry=registry
        )
        turn = None
        if request.cache is not None:
            turn = cache.turn(
                request,
                assembly,
                model=ctx.model,
                minimum=cache_minimum(request, ctx, registry),
                tenant="bench",
                previous_preparation_id="prep_previous",
                previous=previous,
                key_secret=b"bench secret, 16+",
                history_digests=history_digests,
            )
        response = to_response(
            request, assembly, ctx, preparation_id="prep_x", expires_at=NOW, cache=turn
        )
        return response.model_dump_json()

    return call


def paired_p50(
    first: Callable[[], bytes], second: Callable[[], bytes], n: int
) -> tuple[float, float]:
    """The p50 of each of two calls, alternated call by call: the machine's speed moves within
    a second when it is shared, and both see the same moments."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(n):
        for call, tally in ((first, times[0]), (second, times[1])):
            started = time.perf_counter()
            call()
            tally.append(time.perf_counter() - started)
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6


def main(n: int) -> None:
    registry = ModelRegistry.load()
    print("core assembly + answer, 128 inline blocks, 4 tools, 20 history messages (p50):")
    for render, (model, options) in TARGETS.items():
        plain = one_prepare(request_body(model, render, None), registry)
        cached = one_prepare(request_body(model, render, options), registry)
        paired_p50(plain, cached, n // 10)  # warm up
        without, with_cache = paired_p50(plain, cached, n)
        print(
            f"  {render:<12} without cache {without:7.1f} µs  with cache {with_cache:7.1f} µs"
            f"  extra {with_cache - without:6.1f} µs ({(with_cache / without - 1) * 100:+.1f}%)"
        )


async def app_figures(n: int) -> None:
    """The whole inline prepare through the app, without and with ``cache`` (see the doc)."""
    folder = tempfile.mkdtemp(prefix="ca-bench-")
    app = create_app(load_settings(store={"path": os.path.join(folder, "bench.db")}))
    try:
        async with app.router.lifespan_context(app):
            tune_gc()  # as the server's factory does in a serving process
            print("app prepare, in-process, SQLite file (p50 of interleaved rounds):")
            for render, (model, options) in TARGETS.items():
                bodies = {
                    "without": [request_body(model, render, None)],
                    "with": [request_body(model, render, options)],
                }
                for variant in bodies.values():
                    await app_p50(app, variant, 200)  # warm up
                rounds: dict[str, list[float]] = {"without": [], "with": []}
                for _ in range(6):
                    for name, variant in bodies.items():
                        rounds[name].append(await app_p50(app, variant, n // 6))
                without, with_cache = (statistics.median(rounds[k]) for k in ("without", "with"))
                print(
                    f"  {render:<12} without cache {without:6.3f} ms  with cache {with_cache:6.3f} ms"
                    f"  extra {(with_cache - without) * 1000:6.1f} µs"
                    f" ({(with_cache / without - 1) * 100:+.1f}%)"
                )
                extra = (with_cache / without - 1) * 100
                report(
                    f"extra cost of 'cache' on the inline prepare ({render}, in-process p50)",
                    f"{extra:+.1f}% ({without:.3f} → {with_cache:.3f} ms)",
                    "≤ 5%",
                    extra <= 5,
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="calls per variant")
    n = parser.parse_args().n
    main(n)
    # As `context-assembly serve` logs (JSON lines on stderr), to a sink: the figures stay readable.
    sys.stderr = open(os.devnull, "w")
    configure_logging("info")
    asyncio.run(app_figures(n))
