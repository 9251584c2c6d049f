"""The replay itself: each conversation through each policy, the service run in-process.

The service is the real app (``create_app``) on a SQLite file in a temporary directory, called
through ``httpx`` over ASGI, with its wall clock set to each call's recorded time (so the date
line and the cache lifetimes follow the recording). Per call of a service policy: ``POST
/v1/prepare`` (render the log's provider, ``anthropic`` for a trace; the model resolved through
the registry; ``max_context_tokens`` its window; ``response_reserve`` the recorded output), the
frame it answers through the provider's cache rules (``rules``), then the simulated usage to
``POST /v1/preparations/{id}/usage``. A ``CONTEXT_OVERFLOW`` answer is a refused call: counted,
and priced as the plain request sent uncached.

The service's policies (``policies.py``) are tried once per layout it accepts (read from its
OpenAPI document, plus ``transcript``; a layout it refuses is skipped with a note), per way of
splitting history and input, per marker lifetime and per compaction setting (``Compaction``):
``off`` (the history as recorded), ``drop-oldest`` (``history_policy``),
``clear`` (``assembly.compaction.mode: clear_tool_results``) and ``summary`` (the ``report``
mode's decision followed as a caller would: when it says ``compact``, the replay folds the
history before the last reply into a summary of ``summary_tokens`` tokens, which later calls send
in place of what it folded, and counts the summary call: the folded part read from the cache,
the summary as output).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal

import httpx
import orjson

from context_assembly.replay.conversation import Call, Conversation, Format, simulated_usage
from context_assembly.replay.frames import TextCounter, openai_explicit_mode, segments
from context_assembly.replay.policies import (
    ConversationResult,
    ModelInfo,
    Options,
    Outcome,
    Policy,
    PolicyRun,
    ProviderCaches,
    local_run,
    policies,
    prices_for,
    uncached,
)
from context_assembly.replay.rules import TooManyMarkers, Usage

SUMMARY_WORD: Final = "summary "
EXTRA_LAYOUTS: Final = ("transcript",)
"""Layouts tried even when the service's document does not list them (refused: skipped)."""
TENANT_SCOPE: Final = "replay"
DEFAULT_OPTIONS: Final = Options()


class ReplayError(RuntimeError):
    """The service answered something the replay cannot go on from."""


# --------------------------------------------------------------------------- the service


class _Wall:
    """The service's wall clock, set to each call's recorded time."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True, slots=True)
class _Fold:
    """A summary the replayed caller adopted: it replaces the first ``count`` messages."""

    count: int
    message: dict[str, Any]


def _sent(call: Call, policy: Policy, fold: _Fold | None) -> tuple[list[dict[str, Any]], int]:
    """The conversation the replayed caller sends and where its input starts: the recorded one,
    or with an adopted summary in place of what it folded."""
    split = call.call_split if policy.split == "call" else call.turn_split
    messages = list(call.messages)
    if fold is None or fold.count >= split:
        return messages, split
    return [fold.message, *messages[fold.count :]], split - fold.count + 1


def _compaction_options(policy: Policy, options: Options) -> dict[str, Any]:
    if policy.compaction == "drop-oldest":
        return {"history_policy": {"mode": "drop_oldest"}}
    if policy.compaction == "clear":
        mode = {"mode": "clear_tool_results", "trigger_fraction": options.trigger}
        return {"compaction": mode}
    if policy.compaction == "summary":
        report = {"trigger_fraction": options.trigger, "summary_tokens": options.summary_tokens}
        return {"compaction": report}
    return {}


def _prepare_body(
    call: Call,
    policy: Policy,
    model: ModelInfo,
    scope: str,
    options: Options,
    fold: _Fold | None = None,
) -> dict[str, Any]:
    messages, split = _sent(call, policy, fold)
    assembly: dict[str, Any] = {
        "tokenizer": options.tokenizer,
        **_compaction_options(policy, options),
    }
    if policy.layout is not None:
        assembly["layout"] = policy.layout
    body: dict[str, Any] = {
        "model": call.model,
        "render": call.format,
        "input_format": call.format,
        "scope": {"task_id": scope},
        "response_reserve": call.output_tokens,
        "assembly": assembly,
        "history": messages[:split],
        "input": messages[split:],
    }
    if model.context_window is not None:
        body["max_context_tokens"] = model.context_window
    if call.instructions:
        body["instructions"] = call.instructions
    if call.tools:
        body["tools"] = list(call.tools)
    if policy.kind == "service":
        if call.format == "anthropic":
            body["cache"] = {"breakpoints": True, "ttl": policy.ttl}
        elif model.breakpoints:
            body["cache"] = {"key": "auto", "breakpoints": True}
        else:
            body["cache"] = {"key": "auto"}
    return body


def _provider_name(render: Format) -> str:
    return "anthropic" if render == "anthropic" else "openai"


class Service:
    """The app in-process, on a SQLite file of its own."""

    def __init__(self, folder: Path) -> None:
        from context_assembly.api.app import create_app
        from context_assembly.config import load_settings
        from context_assembly.preparations import Clock
        from context_assembly.tokens.registry import ModelRegistry

        self.wall = _Wall()
        # A day's records: a recorded conversation may pause for hours between calls.
        settings = load_settings(store={"path": str(folder / "replay.db"), "ttl_seconds": 86_400})
        self.registry = ModelRegistry.load().with_configured(settings.models)
        self.app = create_app(settings, clock=Clock(wall=self.wall, monotonic=time.monotonic))
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://replay.local"
        )
        self.listing: dict[str, dict[str, Any]] = {}
        self.layouts: list[str] = []

    async def start(self) -> None:
        models = (await self.client.get("/v1/models")).json()
        self.listing = {m["name"]: m for m in models["models"]}
        document = (await self.client.get("/openapi.json")).json()
        schema = document["components"]["schemas"].get("AssemblyOptions", {})
        layout = schema.get("properties", {}).get("layout", {})
        enum = layout.get("enum") or [
            v for option in layout.get("anyOf", []) for v in option.get("enum", [])
        ]
        self.layouts = list(dict.fromkeys([*enum, *EXTRA_LAYOUTS]))

    def model(self, requested: str, render: Format) -> ModelInfo:
        """The registry entry ``requested`` resolves to (a dated snapshot resolves to its
        entry), with its window and minimum cacheable prefix as ``GET /v1/models`` lists them;
        for a model the registry does not know, the largest minimum of the provider."""
        found = self.registry.resolve(requested)
        if found is None:
            provider: Literal["anthropic", "openai"] = (
                "anthropic" if render == "anthropic" else "openai"
            )
            minimum = self.registry.min_cacheable_prefix(requested, provider)
            return ModelInfo(requested, None, None, None, minimum)
        listed = self.listing.get(found.entry.name, {})
        price = self.app.state.prices.lookup(found.entry.name)
        return ModelInfo(
            requested,
            found.entry.name,
            found.entry.provider,
            listed.get("context_window", found.profile.context_window),
            listed.get("min_cacheable_prefix", found.profile.min_cacheable_prefix),
            None if price is None else price.rates.base,
            bool(listed.get("explicit_cache_breakpoints", found.entry.explicit_cache_breakpoints)),
        )

    async def prepare(self, body: dict[str, Any], at: datetime) -> httpx.Response:
        self.wall.now = at.timestamp()
        return await self.client.post(
            "/v1/prepare",
            content=orjson.dumps(body),
            headers={"content-type": "application/json"},
        )

    async def report(self, preparation_id: str, call: Call, usage: Usage) -> None:
        body = {
            "report_id": f"replay-{call.index}",
            "provider": _provider_name(call.format),
            "call": "main",
            "usage": simulated_usage(call.format, usage, call.output_tokens),
        }
        answer = await self.client.post(
            f"/v1/preparations/{preparation_id}/usage",
            content=orjson.dumps(body),
            headers={"content-type": "application/json"},
        )
        if answer.status_code != 200:
            raise ReplayError(
                f"the usage report of call {call.index} was refused: {answer.status_code} "
                f"{answer.text[:300]}"
            )


# --------------------------------------------------------------------------- the replay


async def _service_run(
    service: Service,
    policy: Policy,
    conversation: Conversation,
    models: dict[str, ModelInfo],
    count: TextCounter,
    options: Options,
    run_number: int,
) -> PolicyRun | str:
    """The policy's run, or why the service refused it (a layout it does not accept)."""
    calls = conversation.calls
    provider = ProviderCaches(policy)
    run = PolicyRun(policy, prices_for(calls[0].format, models[calls[0].model]))
    scope = f"{TENANT_SCOPE}:{run_number}:{conversation.name}:{policy.label}"
    fold: _Fold | None = None
    for call in calls:
        model = models[call.model]
        body = _prepare_body(call, policy, model, scope, options, fold)
        answer = await service.prepare(body, call.at)
        if answer.status_code == 422 and answer.json().get("code") == "CONTEXT_OVERFLOW":
            plain = segments(call.format, call.body, count)
            run.outcomes.append(Outcome(call.index, call.at, uncached(plain), refused=True))
            continue
        if answer.status_code != 200:
            problem = (
                answer.json() if answer.headers.get("content-type", "").endswith("json") else {}
            )
            if call.index == 1 and _refuses_layout(problem):
                return f"layout {policy.layout!r} refused by the service: {problem.get('detail')}"
            raise ReplayError(
                f"{conversation.name} call {call.index} ({policy.label}): the service answered "
                f"{answer.status_code}: {answer.text[:500]}"
            )
        prepared = answer.json()
        frame = prepared["frame"]
        prompt = segments(call.format, frame, count)
        try:
            usage = provider.send(
                call.format,
                model,
                prompt,
                call.at.timestamp(),
                explicit=openai_explicit_mode(frame),
            )
        except TooManyMarkers:
            run.outcomes.append(Outcome(call.index, call.at, uncached(prompt), refused=True))
            continue
        await service.report(prepared["preparation_id"], call, usage)
        run.outcomes.append(Outcome(call.index, call.at, usage))
        decided = prepared["selection"].get("compaction") or {}
        if policy.compaction == "summary" and decided.get("decision") == "compact":
            fold, summary = _adopt(call, policy, body, fold, decided, options)
            if summary is not None:
                run.outcomes.append(summary)
    return run


def _adopt(
    call: Call,
    policy: Policy,
    body: dict[str, Any],
    fold: _Fold | None,
    decided: dict[str, Any],
    options: Options,
) -> tuple[_Fold | None, Outcome | None]:
    """What a caller in ``report`` mode does on ``compact``: fold the history before its last
    reply into a summary (later calls send it instead), paying for one summary call that reads
    the folded part from the cache and writes the summary. ``None``: nothing to fold."""
    history = body["history"]
    last = max((i for i, m in enumerate(history) if m.get("role") == "assistant"), default=0)
    if last == 0:
        return fold, None
    # In the recorded conversation's positions: the summary sent (if any) stood for fold.count.
    folded = last if fold is None else fold.count + last - 1
    text = SUMMARY_WORD * options.summary_tokens
    message = {"role": "user", "content": f"[Summary of the earlier conversation]\n\n{text}"}
    span = int(decided.get("reclaimable_tokens", 0))
    usage = Usage(span, cache_read=span)
    return _Fold(folded, message), Outcome(
        call.index, call.at, usage, summary_output=options.summary_tokens
    )


def _refuses_layout(problem: dict[str, Any]) -> bool:
    fields = [problem.get("field"), *(e.get("loc") for e in problem.get("errors") or ())]
    return any(isinstance(f, str) and f.startswith("assembly.layout") for f in fields)


async def replay_async(
    conversations: Sequence[Conversation], options: Options = DEFAULT_OPTIONS
) -> list[ConversationResult]:
    """Every conversation through every policy of ``options``."""
    count = TextCounter()
    results: list[ConversationResult] = []
    with tempfile.TemporaryDirectory(prefix="context-assembly-replay-") as folder:
        service = Service(Path(folder))
        async with service.app.router.lifespan_context(service.app), service.client:
            await service.start()
            layouts = list(options.layouts) if options.layouts is not None else service.layouts
            refused: dict[str, str] = {}
            for number, conversation in enumerate(conversations):
                if not conversation.calls:
                    results.append(
                        ConversationResult(
                            conversation.name, conversation.kind, [], [], conversation.notes, {}
                        )
                    )
                    continue
                models = {c.model: service.model(c.model, c.format) for c in conversation.calls}
                notes = list(conversation.notes)
                for info in models.values():
                    if info.entry is None:
                        notes.append(f"model {info.requested!r} is not in the registry")
                runs: list[PolicyRun] = []
                for policy in policies(
                    options, [x for x in layouts if x not in refused], conversation.kind
                ):
                    if not policy.uses_service:
                        runs.append(local_run(policy, conversation.calls, models, count))
                        continue
                    got = await _service_run(
                        service, policy, conversation, models, count, options, number
                    )
                    if isinstance(got, str):
                        assert policy.layout is not None
                        refused[policy.layout] = got
                        continue
                    runs.append(got)
                results.append(
                    ConversationResult(
                        conversation.name,
                        conversation.kind,
                        conversation.calls,
                        runs,
                        notes,
                        models,
                    )
                )
            for result in results:
                result.notes.extend(f"{reason}; skipped" for reason in refused.values())
    return results


def replay(
    conversations: Sequence[Conversation], options: Options = DEFAULT_OPTIONS
) -> list[ConversationResult]:
    return asyncio.run(replay_async(conversations, options))
