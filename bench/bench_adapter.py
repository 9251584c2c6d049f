"""What the LangChain adapter adds to an agent turn, beside the prepare it waits for.

One ``context-assembly serve`` process (a temporary SQLite file, default configuration) on a
free loopback port. The turn: a ``create_agent`` agent with LangChain's fake chat model (it
answers at once), four tools, a 20-message history and a new question; the middleware's template
asks for ``stable-prefix`` and its ``contributions`` send 16 inline blocks. Measured in
interleaved rounds, p50 of each:

- the turn without the middleware (the agent's own cost);
- the turn with it (the mapping, one prepare over HTTP, the frame back in LangChain's types;
  the usage report goes to a background thread and is not waited for; it lands before the next
  measurement starts);
- one ``Client.prepare`` of the same body, alone (the service and the network);
- the mapping alone, no HTTP: LangChain's request to the neutral body, and a recorded answer back
  to a LangChain request (alignment, tools, cache plan).

The adapter's overhead is the turn with it, less the turn without it, less the prepare.

Run: ``.venv/bin/python bench/bench_adapter.py [--rounds 300]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from context_assembly_client import Client
from context_assembly_client.integrations import langchain as adapter
from context_assembly_client.integrations.langchain import ContextAssemblyMiddleware
from context_assembly_client.integrations.preparer import split_turn
from context_assembly_client.testing import start_service
from figures import report
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, tool

INSTRUCTIONS = "You are a careful operations assistant. Quote order ids exactly."
ANSWER = AIMessage(
    "Order A42 has shipped.",
    usage_metadata={"input_tokens": 900, "output_tokens": 7, "total_tokens": 907},
)


class InstantChatModel(GenericFakeChatModel):
    """LangChain's fake chat model answering the same message at once, whatever it is given."""

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Any:
        self.messages = iter([ANSWER])
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, AIMessage]:
        return self


def make_tools() -> list[BaseTool]:
    made = []
    for name in ("lookup_order", "cancel_order", "store_get", "notify_customer"):

        def run(order_id: str) -> str:
            return order_id

        made.append(tool(name, description=f"{name.replace('_', ' ')} by order id.")(run))
    return made


def history() -> list[BaseMessage]:
    messages: list[BaseMessage] = []
    for turn in range(10):
        messages.append(HumanMessage(f"Question {turn} about order A{40 + turn}: where is it now?"))
        messages.append(
            AIMessage(f"Order A{40 + turn} is at the depot; it leaves tomorrow (turn {turn}).")
        )
    return [*messages, HumanMessage("Summarise every order we discussed.")]


def contributions(state: Any) -> list[dict[str, Any]]:
    blocks = [
        {
            "id": f"note-{i}",
            "text": f"Note {i}: order A{40 + i} status and customer remarks. " * 3,
            "priority": i % 5,
        }
        for i in range(16)
    ]
    return [{"source": "notes", "revision": "1", "blocks": blocks}]


TEMPLATE: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "assembly": {"layout": "stable-prefix", "max_data_tokens": 2048},
    "plugins": [{"name": "notes", "instructions": "Saved notes about orders."}],
}


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """``context-assembly serve`` on a SQLite file in ``folder``; its URL while it runs."""
    config = folder / "service.toml"
    config.write_text(f'[store]\nbackend = "sqlite"\npath = "{folder / "bench.db"}"\n')
    with start_service(config) as service:
        yield service.url


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def measure(url: str, rounds: int) -> dict[str, list[float]]:
    """Seconds per round of the four measurements, interleaved."""
    tools = make_tools()
    messages = history()
    middleware = ContextAssemblyMiddleware(url, template=TEMPLATE, contributions=contributions)
    plain = create_agent(
        InstantChatModel(messages=iter([])), tools=tools, system_prompt=INSTRUCTIONS
    )
    wrapped = create_agent(
        InstantChatModel(messages=iter([])),
        tools=tools,
        system_prompt=INSTRUCTIONS,
        middleware=[middleware],
    )
    request = ModelRequest(
        model=InstantChatModel(messages=iter([])),
        messages=list(messages),
        system_message=SystemMessage(INSTRUCTIONS),
        tools=list(tools),
        state={"messages": list(messages)},
    )
    preparer = middleware.preparer
    call = adapter._call_of(request)
    history_part, input_part = split_turn(call.messages)
    body = preparer._body(call, history_part, input_part, contributions(None))
    client = Client(url)
    response = client.prepare(body)

    def mapping() -> None:
        mapped = adapter._call_of(request)
        h, i = split_turn(mapped.messages)
        preparer._body(mapped, h, i, contributions(None))
        preparer._finish(
            mapped, h, i, response, lambda p: adapter._apply(request, p, preparer.stats)
        )

    state = {"messages": messages}
    samples: dict[str, list[float]] = {"without": [], "with": [], "prepare": [], "mapping": []}
    runs: dict[str, Callable[[], object]] = {
        "without": lambda: plain.invoke(state),
        "with": lambda: wrapped.invoke(state),
        "prepare": lambda: client.prepare(body),
        "mapping": mapping,
    }
    for _ in range(20):  # warm up: imports, connection pools, the service's caches
        for run in runs.values():
            run()
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(timed(run))
            # The usage report goes out after the turn, in the background; let it land before the
            # next measurement so that it does not share the service with it.
            middleware.flush()
    middleware.close()
    client.close()
    return samples


def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="ca-bench-adapter-") as tmp, serve(Path(tmp)) as url:
        samples = measure(url, rounds)
    turn, turn_with, prep, mapped = (
        p50_ms(samples[k]) for k in ("without", "with", "prepare", "mapping")
    )
    # Per round, the turn with the adapter less the turn without it and less the prepare.
    paired = [
        w - o - p
        for w, o, p in zip(samples["with"], samples["without"], samples["prepare"], strict=True)
    ]
    overhead = p50_ms(paired)
    print(
        f"LangChain agent turn: 20 history messages, 4 tools, 16 inline blocks; {rounds} interleaved rounds"
    )
    print(f"{'':44}{'p50 ms':>10}")
    print(f"{'turn without the middleware':44}{turn:>10.3f}")
    print(f"{'turn with the middleware':44}{turn_with:>10.3f}")
    print(f"{'prepare alone (Client.prepare)':44}{prep:>10.3f}")
    print(f"{'mapping alone (no HTTP)':44}{mapped:>10.3f}")
    print(f"{'with - without - prepare (per round)':44}{overhead:>10.3f}")
    report("LangChain adapter mapping, p50", f"{mapped:.3f} ms", "< 1 ms", mapped < 1.0)
    report(
        "LangChain turn with the adapter, less the turn and the prepare, p50",
        f"{overhead:.3f} ms",
        "reference",
        None,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    main(parser.parse_args().rounds)
