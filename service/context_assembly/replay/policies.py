"""The replay's policies: what each one is, what a run of one gives, the provider caches and prices
its calls meet, and the policies that run without the service.

The policies (``Policy``): ``theory`` (the upper bound), ``last-message`` (a plain client with one
marker on its last message), ``recorded`` (a log's request as it was sent, markers included),
``none`` (the service's frame without a cache plan) and ``service`` (its frame and cache plan),
the service's once per layout it accepts and per way of splitting history and input (``call``:
the input is what came since the model last answered; ``turn``: the whole tool loop since the
last user text); each with 5-minute and 1-hour markers; and per compaction setting
(``Compaction``). ``theory``, ``last-message`` and ``recorded`` send the client's own body
through the provider's cache rules (:func:`local_run`); ``none`` and ``service`` go through the
service (``driver.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final, Literal

from context_assembly.core.pricing import Rates
from context_assembly.replay.conversation import Call, Format
from context_assembly.replay.frames import TextCounter, openai_explicit_mode, segments
from context_assembly.replay.rules import (
    ANTHROPIC_PRICES,
    AnthropicCache,
    OpenAIBreakpointCache,
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
Compaction = Literal["off", "drop-oldest", "clear", "summary"]
COMPACTIONS: Final[tuple[Compaction, ...]] = ("off", "drop-oldest", "clear", "summary")
TTLS: Final[tuple[Ttl, ...]] = ("5m", "1h")
SPLITS: Final[tuple[Split, ...]] = ("call", "turn")


@dataclass(frozen=True, slots=True)
class Policy:
    kind: Kind
    ttl: Ttl = "5m"
    layout: str | None = None
    split: Split = "call"
    compaction: Compaction = "off"

    @property
    def name(self) -> str:
        if self.kind == "service":
            return f"service:{self.layout}"
        return self.kind

    @property
    def label(self) -> str:
        """The row's name: ``service:stable-prefix split:call 5m``."""
        if self.kind == "service":
            label = f"{self.name} split:{self.split} {self.ttl}"
            return label if self.compaction == "off" else f"{label} compaction:{self.compaction}"
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
    summary_output: int = 0  # a summary call (``compaction:summary``): its output tokens

    @property
    def summary(self) -> bool:
        return self.summary_output > 0


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
    breakpoints: bool = False  # OpenAI's explicit breakpoints (GPT-5.6 and later)


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
    """What to replay: the policies' kinds and TTLs, the layouts, splits and compaction
    settings of the service's policies (layouts ``None``: every one the service accepts), the
    compaction trigger and summary size, and the service's tokenizer."""

    kinds: tuple[Kind, ...] = ("theory", "last-message", "recorded", "none", "service")
    ttls: tuple[Ttl, ...] = TTLS
    layouts: tuple[str, ...] | None = None
    splits: tuple[Split, ...] = SPLITS
    tokenizer: str = "auto"
    compactions: tuple[Compaction, ...] = ("off",)
    trigger: float = 0.8  # ``trigger_fraction`` of the compaction settings
    summary_tokens: int = 2000


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
                    for compaction in options.compactions:
                        chosen.extend(
                            Policy("service", ttl, layout, split, compaction)
                            for ttl in options.ttls
                        )
        elif wanted == "recorded":
            chosen.append(Policy("recorded"))
        else:
            chosen.extend(Policy(wanted, ttl) for ttl in options.ttls)
    return chosen


# --------------------------------------------------------------------------- local policies


def mark_last_message(body: dict[str, Any], render: Format, ttl: Ttl) -> dict[str, Any]:
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


class ProviderCaches:
    """The provider caches of one policy, one per model (a provider keeps them apart)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._caches: dict[
            tuple[str, str], AnthropicCache | OpenAICache | OpenAIBreakpointCache | TheoryCache
        ] = {}

    def send(
        self,
        render: Format,
        model: ModelInfo,
        prompt: Sequence[Segment],
        now: float,
        *,
        explicit: bool = False,
    ) -> Usage:
        """``prompt``'s usage; ``explicit``: an OpenAI body in explicit mode."""
        key = (render, model.entry or model.requested)
        cache = self._caches.get(key)
        if cache is None:
            anthropic = render == "anthropic"
            if self.policy.kind == "theory":
                # Writes cost something on Anthropic and on OpenAI's GPT-5.6 and later.
                writes = anthropic or model.breakpoints
                cache = TheoryCache(model.minimum, self.policy.ttl, writes=writes)
            elif anthropic:
                cache = AnthropicCache(model.minimum)
            elif model.breakpoints:
                cache = OpenAIBreakpointCache(model.minimum)
            else:
                cache = OpenAICache(model.minimum)
            self._caches[key] = cache
        if isinstance(cache, OpenAIBreakpointCache):
            return cache.send(prompt, now, explicit=explicit)
        return cache.send(prompt, now)


def prices_for(render: Format, model: ModelInfo) -> Prices:
    """The relative prices of the render's provider, with the model's USD rates where the
    service's price data has them."""
    relative = (
        ANTHROPIC_PRICES
        if render == "anthropic"
        else openai_prices(model.entry or model.requested, breakpoints=model.breakpoints)
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
    return replace(relative, usd=(a, b, c, d), output=float(rates.output / rates.input))


def local_run(
    policy: Policy, calls: Sequence[Call], models: dict[str, ModelInfo], count: TextCounter
) -> PolicyRun:
    provider = ProviderCaches(policy)
    run = PolicyRun(policy, prices_for(calls[0].format, models[calls[0].model]))
    for call in calls:
        model = models[call.model]
        if policy.kind == "recorded" and call.recorded is not None:
            body = call.recorded
        elif policy.kind == "last-message":
            body = mark_last_message(call.body, call.format, policy.ttl)
        else:
            body = call.body
        prompt = segments(call.format, body, count)
        try:
            usage = provider.send(
                call.format, model, prompt, call.at.timestamp(), explicit=openai_explicit_mode(body)
            )
        except TooManyMarkers:
            run.outcomes.append(Outcome(call.index, call.at, uncached(prompt), refused=True))
            continue
        run.outcomes.append(Outcome(call.index, call.at, usage))
    return run


def uncached(prompt: Sequence[Segment]) -> Usage:
    return Usage(sum(s.tokens for s in prompt))
