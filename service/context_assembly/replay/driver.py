"""The replay itself: each conversation through each policy, the service run in-process.

The service is the real app (``create_app``) on a SQLite file in a temporary directory, called
through ``httpx`` over ASGI, with its wall clock set to each call's recorded time (so the date
line and the cache lifetimes follow the recording). Per call of a service policy: ``POST
/v1/prepare`` (render the log's provider, ``anthropic`` for a trace; the model resolved through
the registry; ``max_context_tokens`` its window; ``response_reserve`` the recorded output), the
frame it answers through the provider's cache rules (``rules``), then the simulated usage to
``POST /v1/preparations/{id}/usage``. A ``CONTEXT_OVERFLOW`` answer is a refused call: counted,
and priced as the plain request sent uncached.

The policies (``Policy``): ``theory`` (the upper bound), ``last-message`` (a plain client with one
marker on its last message), ``recorded`` (a log's request as it was sent, markers included),
``none`` (the service's frame without a cache plan) and ``service`` (its frame and cache plan),
the service's once per layout it accepts (read from its OpenAPI document, plus ``transcript``; a
layout it refuses is skipped with a note) and per way of splitting history and input (``call``:
the input is what came since the model last answered; ``turn``: the whole tool loop since the
last user text); each with 5-minute and 1-hour markers.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal

import httpx
import orjson

from context_assembly.core.pricing import Rates
from context_assembly.replay.conversation import Call, Conversation, Format, simulated_usage
from context_assembly.replay.frames import TextCounter, segments
from context_assembly.replay.rules import (
    ANTHROPIC_PRICES,
    AnthropicCache,
    OpenAICache,
    Prices,
    Segment,
    TheoryCache,
    TooManyMarkers,
    Ttl,
    Usage,
    openai_prices,
)

Kind = Literal["theory", "last-message", "recorded", "none", "service"]
Split = Literal["call", "turn"]
TTLS: Final[tuple[Ttl, ...]] = ("5m", "1h")
SPLITS: Final[tuple[Split, ...]] = ("call", "turn")
EXTRA_LAYOUTS: Final = ("transcript",)
"""Layouts tried even when the service's document does not list them (refused: skipped)."""
TENANT_SCOPE: Final = "replay"


@dataclass(frozen=True, slots=True)
class Policy:
    kind: Kind
    ttl: Ttl = "5m"
    layout: str | None = None
    split: Split = "call"

    @property
    def name(self) -> str:
        if self.kind == "service":
            return f"service:{self.layout}"
        return self.kind

    @property
    def label(self) -> str:
        """The row's name: ``service:stable-prefix split:call 5m``."""
        if self.kind == "service":
            return f"{self.name} split:{self.split} {self.ttl}"
        if self.kind in ("none", "recorded"):
            return self.kind
        return f"{self.kind} {self.ttl}"

    @property
    def uses_service(self) -> bool:
        return self.kind in ("none", "service")


@dataclass(frozen=True, slots=True)
class Outcome:
    """One call under one policy: the usage the provider rules gave, or a refusal."""

    index: int
    at: datetime
    usage: Usage
    refused: bool = False


@dataclass(slots=True)
class PolicyRun:
    policy: Policy
    prices: Prices
    outcomes: list[Outcome] = field(default_factory=list)


@dataclass(slots=True)
class ModelInfo:
    requested: str
    entry: str | None
    provider: str | None
    context_window: int | None
    minimum: int | None
    rates: Rates | None = None  # the service's price of the entry (``None``: no price)


@dataclass(slots=True)
class ConversationResult:
    name: str
    kind: str
    calls: list[Call]
    runs: list[PolicyRun]
    notes: list[str]
    models: dict[str, ModelInfo]


@dataclass(frozen=True, slots=True)
class Options:
    """What to replay: the policies' kinds and TTLs, the layouts and splits of the service's
    policies (``None``: every one the service accepts), and the service's tokenizer."""

    kinds: tuple[Kind, ...] = ("theory", "last-message", "recorded", "none", "service")
    ttls: tuple[Ttl, ...] = TTLS
    layouts: tuple[str, ...] | None = None
    splits: tuple[Split, ...] = SPLITS
    tokenizer: str = "auto"


class ReplayError(RuntimeError):
    """The service answered something the replay cannot go on from."""


# --------------------------------------------------------------------------- local policies


def _mark_last_message(body: dict[str, Any], render: Format, ttl: Ttl) -> dict[str, Any]:
    """``body`` with one cache marker on the last content block of its last message
    (Anthropic; OpenAI bodies take no marker)."""
    if render != "anthropic" or not body.get("messages"):
        return body
    marked = dict(body)
    messages = list(marked["messages"])
    last = dict(messages[-1])
    content = last.get("content")
    blocks = (
        [{"type": "text", "text": content}] if isinstance(content, str) else list(content or ())
    )
    if blocks:
        control = {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": "1h"}
        blocks[-1] = {**blocks[-1], "cache_control": control}
        last["content"] = blocks
    messages[-1] = last
    marked["messages"] = messages
    return marked


class _Provider:
    """The provider caches of one policy, one per model (a provider keeps them apart)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._caches: dict[tuple[str, str], AnthropicCache | OpenAICache | TheoryCache] = {}

    def send(
        self, render: Format, model: ModelInfo, prompt: Sequence[Segment], now: float
    ) -> Usage:
        key = (render, model.entry or model.requested)
        cache = self._caches.get(key)
        if cache is None:
            anthropic = render == "anthropic"
            if self.policy.kind == "theory":
                cache = TheoryCache(model.minimum, self.policy.ttl, writes=anthropic)
            elif anthropic:
                cache = AnthropicCache(model.minimum)
            else:
                cache = OpenAICache(model.minimum)
            self._caches[key] = cache
        return cache.send(prompt, now)


def prices_for(render: Format, model: ModelInfo) -> Prices:
    """The relative prices of the render's provider, with the model's USD rates where the
    service's price data has them."""
    relative = (
        ANTHROPIC_PRICES if render == "anthropic" else openai_prices(model.entry or model.requested)
    )
    rates = model.rates
    if rates is None:
        return relative
    # OpenAI bills no write but GPT-5.6 and later; a write there costs its write rate, else input.
    writes = rates.cache_write if rates.cache_write is not None else rates.input
    chosen = (
        (rates.input, rates.cache_read, rates.cache_write_5m, rates.cache_write_1h)
        if render == "anthropic"
        else (rates.input, rates.cache_read, writes, writes)
    )
    a, b, c, d = (None if r is None else float(r) for r in chosen)
    return replace(relative, usd=(a, b, c, d))


# --------------------------------------------------------------------------- the service


class _Wall:
    """The service's wall clock, set to each call's recorded time."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _prepare_body(
    call: Call,
    policy: Policy,
    model: ModelInfo,
    scope: str,
    tokenizer: str,
) -> dict[str, Any]:
    split = call.call_split if policy.split == "call" else call.turn_split
    assembly: dict[str, Any] = {"tokenizer": tokenizer}
    if policy.layout is not None:
        assembly["layout"] = policy.layout
    body: dict[str, Any] = {
        "model": call.model,
        "render": call.format,
        "input_format": call.format,
        "scope": {"task_id": scope},
        "response_reserve": call.output_tokens,
        "assembly": assembly,
        "history": list(call.messages[:split]),
        "input": list(call.messages[split:]),
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


def policies(options: Options, layouts: Iterable[str], kind: str) -> list[Policy]:
    """The policies to run for a conversation of ``kind`` (``trace`` or ``log``), in table
    order."""
    chosen: list[Policy] = []
    for wanted in options.kinds:
        if wanted == "recorded" and kind != "log":
            continue
        if wanted == "none":
            chosen.append(Policy("none"))
        elif wanted == "service":
            for layout in layouts:
                for split in options.splits:
                    chosen.extend(Policy("service", ttl, layout, split) for ttl in options.ttls)
        elif wanted == "recorded":
            chosen.append(Policy("recorded"))
        else:
            chosen.extend(Policy(wanted, ttl) for ttl in options.ttls)
    return chosen


def _local_run(
    policy: Policy, calls: Sequence[Call], models: dict[str, ModelInfo], count: TextCounter
) -> PolicyRun:
    provider = _Provider(policy)
    run = PolicyRun(policy, prices_for(calls[0].format, models[calls[0].model]))
    for call in calls:
        model = models[call.model]
        if policy.kind == "recorded" and call.recorded is not None:
            body = call.recorded
        elif policy.kind == "last-message":
            body = _mark_last_message(call.body, call.format, policy.ttl)
        else:
            body = call.body
        prompt = segments(call.format, body, count)
        try:
            usage = provider.send(call.format, model, prompt, call.at.timestamp())
        except TooManyMarkers:
            run.outcomes.append(Outcome(call.index, call.at, _uncached(prompt), refused=True))
            continue
        run.outcomes.append(Outcome(call.index, call.at, usage))
    return run


def _uncached(prompt: Sequence[Segment]) -> Usage:
    return Usage(sum(s.tokens for s in prompt))


async def _service_run(
    service: Service,
    policy: Policy,
    conversation: Conversation,
    models: dict[str, ModelInfo],
    count: TextCounter,
    tokenizer: str,
    run_number: int,
) -> PolicyRun | str:
    """The policy's run, or why the service refused it (a layout it does not accept)."""
    calls = conversation.calls
    provider = _Provider(policy)
    run = PolicyRun(policy, prices_for(calls[0].format, models[calls[0].model]))
    scope = f"{TENANT_SCOPE}:{run_number}:{conversation.name}:{policy.label}"
    for call in calls:
        model = models[call.model]
        body = _prepare_body(call, policy, model, scope, tokenizer)
        answer = await service.prepare(body, call.at)
        if answer.status_code == 422 and answer.json().get("code") == "CONTEXT_OVERFLOW":
            plain = segments(call.format, call.body, count)
            run.outcomes.append(Outcome(call.index, call.at, _uncached(plain), refused=True))
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
        prompt = segments(call.format, prepared["frame"], count)
        try:
            usage = provider.send(call.format, model, prompt, call.at.timestamp())
        except TooManyMarkers:
            run.outcomes.append(Outcome(call.index, call.at, _uncached(prompt), refused=True))
            continue
        await service.report(prepared["preparation_id"], call, usage)
        run.outcomes.append(Outcome(call.index, call.at, usage))
    return run


def _refuses_layout(problem: dict[str, Any]) -> bool:
    fields = [problem.get("field"), *(e.get("loc") for e in problem.get("errors") or ())]
    return any(isinstance(f, str) and f.startswith("assembly.layout") for f in fields)


async def replay_async(
    conversations: Sequence[Conversation], options: Options = Options()
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
                        runs.append(_local_run(policy, conversation.calls, models, count))
                        continue
                    got = await _service_run(
                        service, policy, conversation, models, count, options.tokenizer, number
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
    conversations: Sequence[Conversation], options: Options = Options()
) -> list[ConversationResult]:
    return asyncio.run(replay_async(conversations, options))
