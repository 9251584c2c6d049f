"""Cache directives of the newer provider rules (core/cache.py, core/render.py): OpenAI's explicit
breakpoints on GPT-5.6 and later, Anthropic's automatic caching and mixed lifetimes, and the
diagnostics objects that name the previous turn's response; on whole assemblies through the
engine and the renderers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembly.core import cache
from context_assembly.core.request import PrepareRequest
from context_assembly.core.sources import materialised_inputs, plan_sources
from context_assembly.engine import cache_model, run_assembly, to_response
from context_assembly.errors import InvalidError
from context_assembly.tokens.registry import ModelEntry, ModelRegistry, RegistryDataError
from context_assembly.validation import parse_model
from hypothesis_budget import examples

NOW = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)
OPENAI = "gpt-5.6-sol"  # explicit breakpoints, minimum 1,024
OLDER = "gpt-5.5"  # no explicit breakpoints
CLAUDE = "claude-sonnet-4-5"  # minimum 1,024
REGISTRY = ModelRegistry.load()
INSTRUCTIONS = "You are a careful assistant who checks every figure twice. " * 120


def tool(name: str, words: int = 20) -> dict[str, Any]:
    return {
        "name": name,
        "description": " ".join(f"{name}-word{i}" for i in range(words)),
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }


def exchange(turn: int, *, loop: bool = False) -> list[dict[str, Any]]:
    """One turn of history: a question and its answer, with a tool call and its result before
    the answer when ``loop``."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"question {turn}: " + "detail " * 60}
    ]
    if loop:
        call = {"id": f"call_{turn}", "name": "search", "arguments": {"q": str(turn)}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": "found " * 40})
    messages.append({"role": "assistant", "content": f"answer {turn}: " + "reply " * 60})
    return messages


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": OPENAI,
        "instructions": INSTRUCTIONS,
        "tools": [tool("search"), tool("fetch")],
        "history": [m for turn in range(3) for m in exchange(turn)],
        "input": [{"role": "user", "content": "What now?"}],
        "assembly": {"layout": "stable-prefix"},
        "render": "openai-chat",
        "cache": {"breakpoints": True},
    }
    base.update(fields)
    return base


def prepare(
    fields: dict[str, Any],
    *,
    registry: ModelRegistry = REGISTRY,
    previous: cache.PrefixDigests | None = None,
    response_id: str | None = None,
) -> tuple[dict[str, Any], cache.CacheTurn]:
    """One turn as the service makes it: the answer as JSON data, and its cache turn."""
    request = parse_model(PrepareRequest, orjson.dumps(fields))
    setups = plan_sources(request)
    inputs = materialised_inputs(request, setups)
    assembly, ctx = run_assembly(request, setups, inputs, now=NOW, tenant="t", registry=registry)
    facts = cache_model(request, ctx, registry)
    turn = cache.turn(
        request,
        assembly,
        model=ctx.model,
        minimum=facts.minimum,
        tenant="t",
        previous_preparation_id=None if previous is None else "prep_before",
        previous=previous,
        key_secret=b"test secret, 16+",
        provider=facts.provider,
        explicit=facts.explicit,
        previous_response_id=response_id,
    )
    response = to_response(
        request, assembly, ctx, preparation_id="prep_t", expires_at=NOW, cache=turn
    )
    return orjson.loads(response.model_dump_json()), turn


def chat_breakpoints(frame: dict[str, Any]) -> list[tuple[int, str]]:
    """(message index, role) of every ``prompt_cache_breakpoint`` of a Chat body."""
    found = []
    for index, message in enumerate(frame["messages"]):
        content = message.get("content")
        if isinstance(content, list):
            found += [(index, message["role"]) for p in content if "prompt_cache_breakpoint" in p]
    return found


def responses_breakpoints(frame: dict[str, Any]) -> list[dict[str, Any]]:
    """Every input item of a Responses body that carries a ``prompt_cache_breakpoint``."""
    found = []
    for item in frame["input"]:
        for key in ("content", "output"):
            value = item.get(key)
            if isinstance(value, list):
                found += [item for p in value if "prompt_cache_breakpoint" in p]
    return found


# --------------------------------------------------------------------------- the registry flag


def test_only_the_gpt_5_6_models_take_explicit_breakpoints() -> None:
    flagged = {e.entry.name for e in REGISTRY.entries() if e.entry.explicit_cache_breakpoints}
    assert flagged == {"gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.6-luna"}
    assert REGISTRY.explicit_cache_breakpoints("gpt-5.6-luna-2026-10-01")
    assert not REGISTRY.explicit_cache_breakpoints("gpt-5.6-unreleased")  # unknown: refused
    assert not REGISTRY.explicit_cache_breakpoints(OLDER)


def test_the_flag_is_refused_on_another_provider() -> None:
    raw = resources.files("context_assembly.tokens").joinpath("data", "models.json").read_bytes()
    data = orjson.loads(raw)
    claude = next(m for m in data["models"] if m["provider"] == "anthropic")
    claude["explicit_cache_breakpoints"] = True
    with pytest.raises(RegistryDataError, match="OpenAI models only"):
        ModelRegistry.from_json(orjson.dumps(data))
    with pytest.raises(ValueError, match="OpenAI models only"):
        ModelEntry.model_validate({**claude, "name": "claude-x"})


# --------------------------------------------------------------------------- OpenAI breakpoints


@pytest.mark.parametrize("render", ["openai-chat", "openai-responses"])
def test_stable_prefix_marks_the_instructions_and_the_last_user_message_of_the_prefix(
    render: str,
) -> None:
    """The prefix ends on the assistant's last answer, which OpenAI takes no breakpoint on: the
    history marker goes on the user message before it, with the tokens up to it; the tools are
    skipped as not markable; implicit mode sends no ``prompt_cache_options``."""
    answer, _ = prepare(body(render=render))
    report = answer["selection"]["cache"]
    frame = answer["frame"]
    assert [(b["after"], b["ttl"]) for b in report["breakpoints"]] == [
        ("instructions", "30m"),
        ("history", "30m"),
    ]
    assert report["skipped"] == [{"after": "tools", "reason": "not_markable"}]
    instructions, history = report["breakpoints"]
    assert history["message"] == answer["selection"]["cache"]["breakpoints"][1]["message"]
    assert instructions["tokens"] < history["tokens"] < answer["prefix_tokens"]
    assert report["cacheable_tokens"] == history["tokens"]
    assert "prompt_cache_options" not in frame and "prompt_cache_options" not in report
    if render == "openai-chat":
        assert chat_breakpoints(frame) == [(0, "system"), (history["message"], "user")]
        marked = frame["messages"][history["message"]]["content"]
        assert marked[-1]["text"].startswith("question 2")
    else:
        items = responses_breakpoints(frame)
        assert [item["role"] for item in items] == ["system", "user"]
        assert items[1]["content"][-1] == {
            "type": "input_text",
            "text": "question 2: " + "detail " * 60,
            "prompt_cache_breakpoint": {"mode": "explicit"},
        }


def test_a_tool_loop_marks_the_tool_result_before_the_answer() -> None:
    """The last message of the prefix that takes a breakpoint is a tool result: its output is
    marked (Responses: a list of one input_text)."""
    history = [m for turn in range(2) for m in exchange(turn, loop=True)]
    answer, _ = prepare(body(render="openai-responses", history=history))
    items = responses_breakpoints(answer["frame"])
    assert items[-1]["type"] == "function_call_output" and items[-1]["call_id"] == "call_1"
    assert items[-1]["output"][-1]["prompt_cache_breakpoint"] == {"mode": "explicit"}


def test_explicit_mode_marks_the_frame_end_in_transcript_and_says_so() -> None:
    """``mode: explicit`` sends ``prompt_cache_options.mode`` and places the end marker the
    implicit mode leaves to OpenAI (skipped there as ``automatic``, and counted)."""
    implicit, _ = prepare(body(assembly={"layout": "transcript"}))
    explicit, _ = prepare(
        body(assembly={"layout": "transcript"}, cache={"breakpoints": True, "mode": "explicit"})
    )
    end = {"after": "end", "reason": "automatic"}
    assert end in implicit["selection"]["cache"]["skipped"]
    total = implicit["budget"]["total_input_tokens"]
    assert implicit["selection"]["cache"]["cacheable_tokens"] == total
    assert [b["after"] for b in explicit["selection"]["cache"]["breakpoints"]][-1] == "end"
    assert explicit["frame"]["prompt_cache_options"] == {"mode": "explicit"}
    assert explicit["selection"]["cache"]["prompt_cache_options"] == {"mode": "explicit"}
    last = len(explicit["frame"]["messages"]) - 1
    assert (last, "user") in chat_breakpoints(explicit["frame"])
    assert (last, "user") not in chat_breakpoints(implicit["frame"])


def test_a_model_without_explicit_breakpoints_gets_none() -> None:
    """On gpt-5.5 the plan is OpenAI's older rule: no marker, no options, cacheable tokens from
    the minimum up in steps of 128 over the stable prefix."""
    answer, _ = prepare(body(model=OLDER, cache={"breakpoints": True, "diagnostics": True}))
    report = answer["selection"]["cache"]
    assert report["breakpoints"] == [] and report["skipped"] == []
    text = orjson.dumps(answer["frame"]).decode()
    assert "prompt_cache_breakpoint" not in text and "prompt_cache_options" not in text
    assert report["cacheable_tokens"] == cache.openai_cacheable(answer["prefix_tokens"], 1024)


def test_retention_leaves_the_breakpoints_out() -> None:
    """With ``prompt_cache_retention`` the plan sends no breakpoint (each candidate skipped as
    ``retention``), and still counts OpenAI's own marker on a transcript's end."""
    answer, _ = prepare(
        body(assembly={"layout": "transcript"}, cache={"breakpoints": True, "retention": "24h"})
    )
    report = answer["selection"]["cache"]
    assert report["breakpoints"] == []
    assert {"after": "instructions", "reason": "retention"} in report["skipped"]
    assert {"after": "end", "reason": "automatic"} in report["skipped"]
    assert answer["frame"]["prompt_cache_retention"] == "24h"
    assert "prompt_cache_breakpoint" not in orjson.dumps(answer["frame"]).decode()


def test_without_breakpoints_only_openais_own_marker_counts() -> None:
    """Without ``breakpoints`` no marker is sent; OpenAI's implicit one ends the frame, which a
    transcript's next turn repeats (cacheable) and a stable-prefix's does not (0)."""
    stable, _ = prepare(body(cache={"key": "auto"}))
    assert stable["selection"]["cache"]["cacheable_tokens"] == 0
    transcript, _ = prepare(body(assembly={"layout": "transcript"}, cache={"key": "auto"}))
    report = transcript["selection"]["cache"]
    assert report["breakpoints"] == [] and report["skipped"] == [
        {"after": "end", "reason": "automatic"}
    ]
    assert report["cacheable_tokens"] == transcript["budget"]["total_input_tokens"]


@st.composite
def openai_requests(draw: st.DrawFn) -> dict[str, Any]:
    turns = draw(st.integers(0, 4))
    loops = draw(st.lists(st.booleans(), min_size=turns, max_size=turns))
    history = [m for turn, loop in enumerate(loops) for m in exchange(turn, loop=loop)]
    mode = draw(st.sampled_from(["implicit", "explicit"]))
    return body(
        render=draw(st.sampled_from(["openai-chat", "openai-responses"])),
        instructions=draw(st.sampled_from(["", "Be brief.", INSTRUCTIONS])),
        tools=[tool(f"t{i}", draw(st.integers(0, 60))) for i in range(draw(st.integers(0, 3)))],
        history=history,
        assembly={"layout": draw(st.sampled_from(["legacy", "stable-prefix", "transcript"]))},
        cache={"breakpoints": True, "mode": mode},
    )


@settings(max_examples=examples(40), deadline=None)
@given(fields=openai_requests())
def test_openai_breakpoints_follow_the_provider_rules(fields: dict[str, Any]) -> None:
    """At most 3 markers beside OpenAI's own (4 in explicit mode), none below the minimum nor
    on an assistant message, one in the body per planned breakpoint and on the message it
    names, growing figures, every candidate placed or skipped, and the cacheable tokens up to
    the last marker, OpenAI's own included."""
    answer, _ = prepare(fields)
    report = answer["selection"]["cache"]
    placed = report["breakpoints"]
    explicit = fields["cache"]["mode"] == "explicit"
    assert len(placed) <= (4 if explicit else 3)
    assert all(b["tokens"] >= 1024 and b["ttl"] == "30m" for b in placed)
    tokens = [b["tokens"] for b in placed]
    assert tokens == sorted(tokens)
    frame = answer["frame"]
    if fields["render"] == "openai-chat":
        found = chat_breakpoints(frame)
        assert [index for index, _ in found] == [b["message"] for b in placed]
        assert all(role != "assistant" for _, role in found)
    else:
        found_items = responses_breakpoints(frame)
        assert len(found_items) == len(placed)
        assert all(item.get("role") != "assistant" for item in found_items)
    skipped = report["skipped"]
    assert ({"after": "tools", "reason": "not_markable"} in skipped) == bool(fields["tools"])
    assert all(s["reason"] != "automatic" or s["after"] == "end" for s in skipped)
    assert not (explicit and any(s["reason"] == "automatic" for s in skipped))
    if fields["assembly"]["layout"] == "legacy":
        assert placed == []
    own = [answer["budget"]["total_input_tokens"] for s in skipped if s["reason"] == "automatic"]
    assert report["cacheable_tokens"] == max(tokens + own, default=0)
    assert ("prompt_cache_options" in frame) == explicit


def test_the_markable_messages() -> None:
    """OpenAI takes a breakpoint on a system, developer, user or tool message ending with a
    non-empty text (or, in its own render, a part of a type it marks), never an assistant's."""
    from context_assembly.core.render import openai_markable
    from context_assembly.core.request import Message

    def message(role: str, content: Any) -> Message:
        return Message.model_validate({"role": role, "content": content})

    image = {"type": "native", "format": "openai-chat", "item": {"type": "image_url"}}
    assert openai_markable(message("user", "hi"), "openai-chat")
    assert openai_markable(message("tool", [{"type": "text", "text": "x"}]), "openai-responses")
    assert not openai_markable(message("assistant", "hi"), "openai-chat")
    assert not openai_markable(message("user", ""), "openai-chat")
    assert openai_markable(message("user", [image]), "openai-chat")
    assert not openai_markable(message("user", [image]), "neutral")
    assert not openai_markable(message("user", [{"type": "image", "url": "u"}]), "openai-chat")


# --------------------------------------------------------------------------- expected tokens


def _conversation(
    fields: dict[str, Any], gaps: list[timedelta]
) -> list[tuple[dict[str, Any], cache.CacheTurn]]:
    """The turns of a conversation whose turn ``n + 1`` comes ``gaps[n]`` after turn ``n``,
    each adding an exchange to the history."""
    answers = []
    previous: cache.PrefixDigests | None = None
    history = list(fields["history"])
    for number in range(len(gaps) + 1):
        answer, turn = prepare({**fields, "history": history}, previous=previous)
        answers.append((answer, turn))
        previous = turn.digests
        history = [*history, *exchange(10 + number)]
    return answers


@pytest.mark.parametrize("layout", ["stable-prefix", "transcript"])
def test_expected_cached_tokens_follow_openais_rules(layout: str) -> None:
    """On an explicit-breakpoint model the next turn reads what the previous turn's last marker
    wrote (its own or OpenAI's), within 30 minutes and not after; without breakpoints a
    stable-prefix turn reads nothing, since OpenAI's own marker ends on this turn's data."""
    options = {"render": "openai-chat", "assembly": {"layout": layout}}
    turns = _conversation(body(**options), [timedelta(minutes=1)])
    (first, _), (second, _) = turns
    lifetime = cache.cache_lifetime("openai-chat", parse_cache({}), explicit=True)
    assert lifetime == timedelta(minutes=30)

    def expected(since: timedelta, a: dict[str, Any], b: dict[str, Any]) -> int:
        return cache.expected_cached_tokens(
            prefix_kept=b["selection"]["cache"]["prefix_kept"],
            cacheable_tokens=b["selection"]["cache"]["cacheable_tokens"],
            previous_cacheable_tokens=a["selection"]["cache"]["cacheable_tokens"],
            since_previous=since,
            lifetime=lifetime,
        )

    read = expected(timedelta(minutes=29), first, second)
    assert read == first["selection"]["cache"]["cacheable_tokens"] > 0
    assert expected(timedelta(minutes=31), first, second) == 0
    plain = _conversation(body(cache={"key": "auto"}, **options), [timedelta(minutes=1)])
    (a, _), (b, _) = plain
    assert (expected(timedelta(minutes=1), a, b) > 0) == (layout == "transcript")


def parse_cache(raw: dict[str, Any]) -> Any:
    options = parse_model(PrepareRequest, orjson.dumps(body(cache=raw))).cache
    assert options is not None
    return options


# --------------------------------------------------------------------------- Anthropic


def anthropic_markers(frame: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``cache_control`` of an Anthropic body in prompt order, the top-level one last."""
    found = [t["cache_control"] for t in frame.get("tools", []) if "cache_control" in t]
    system = frame.get("system")
    if isinstance(system, list):
        found += [b["cache_control"] for b in system if "cache_control" in b]
    for message in frame["messages"]:
        if isinstance(message["content"], list):
            found += [b["cache_control"] for b in message["content"] if "cache_control" in b]
    if "cache_control" in frame:
        found.append(frame["cache_control"])
    return found


def claude(**fields: Any) -> dict[str, Any]:
    return body(
        **{"model": CLAUDE, "render": "anthropic", "tools": [tool("search", 200)], **fields}
    )


def test_automatic_caching_takes_a_slot_and_the_frame_end() -> None:
    """``automatic`` adds a top-level ``cache_control``; in a transcript it stands in for the
    end marker (skipped as ``automatic``, counted as cacheable)."""
    answer, _ = prepare(
        claude(assembly={"layout": "transcript"}, cache={"breakpoints": True, "automatic": True})
    )
    frame = answer["frame"]
    report = answer["selection"]["cache"]
    assert frame["cache_control"] == {"type": "ephemeral"}
    assert report["cache_control"] == {"type": "ephemeral"}
    assert {"after": "end", "reason": "automatic"} in report["skipped"]
    assert report["cacheable_tokens"] == answer["budget"]["total_input_tokens"]
    assert len(anthropic_markers(frame)) == len(report["breakpoints"]) + 1


@settings(max_examples=examples(60), deadline=None)
@given(
    figures=st.lists(st.integers(0, 5000), min_size=0, max_size=8),
    minimum=st.none() | st.integers(1, 5000),
    automatic=st.booleans(),
)
def test_automatic_caching_leaves_three_slots(
    figures: list[int], minimum: int | None, automatic: bool
) -> None:
    """Over any candidates: the plan's markers and the provider's own never exceed four, and
    the end candidate is the provider's whenever it reaches the minimum."""
    afters = ("tools", "instructions", "history", "end")
    found = [
        cache.Candidate(afters[min(i, 3)], tokens, i)  # type: ignore[arg-type]
        for i, tokens in enumerate(sorted(figures))
    ]
    limit = cache.MAX_BREAKPOINTS - automatic
    placed, skipped = cache.plan_breakpoints(
        found, legacy=False, minimum=minimum, limit=limit, automatic=automatic
    )
    assert len(placed) + automatic <= cache.MAX_BREAKPOINTS
    assert len(placed) + len(skipped) == len(found)
    for candidate, reason in skipped:
        if reason == "automatic":
            assert automatic and candidate.after == "end"
            assert minimum is not None and candidate.tokens >= minimum
    if automatic:
        assert all(c.after != "end" for c in placed)


@pytest.mark.parametrize("ttl", ["5m", "1h"])
@pytest.mark.parametrize("instructions_ttl", [None, "5m", "1h"])
@pytest.mark.parametrize("automatic", [False, True])
def test_one_hour_markers_come_before_five_minute_ones(
    ttl: str, instructions_ttl: str | None, automatic: bool
) -> None:
    """Every lifetime combination the request accepts gives a body whose markers never put a
    1-hour entry after a 5-minute one (tools, system, messages, then the automatic one); the
    one combination that would is a 422 naming ``cache.instructions_ttl``."""
    options: dict[str, Any] = {"breakpoints": True, "ttl": ttl, "automatic": automatic}
    if instructions_ttl is not None:
        options["instructions_ttl"] = instructions_ttl
    fields = claude(cache=options)
    if instructions_ttl == "5m" and ttl == "1h":
        with pytest.raises(InvalidError) as caught:
            parse_model(PrepareRequest, orjson.dumps(fields))
        assert [e["loc"] for e in caught.value.extensions["errors"]] == ["cache.instructions_ttl"]
        return
    answer, _ = prepare(fields)
    lifetimes = [m.get("ttl", "5m") for m in anthropic_markers(answer["frame"])]
    assert lifetimes == sorted(lifetimes, key=lambda t: t != "1h")
    planned = {b["after"]: b["ttl"] for b in answer["selection"]["cache"]["breakpoints"]}
    assert planned["instructions"] == (instructions_ttl or ttl)
    assert planned["history"] == ttl


def test_mixed_lifetimes_keep_the_instructions_for_an_hour() -> None:
    """With 1-hour instructions and 5-minute history markers, a turn 30 minutes on still reads
    what the previous turn wrote up to its last 1-hour marker; past the hour, nothing."""
    options = parse_cache({"breakpoints": True, "instructions_ttl": "1h"})
    long = cache.long_lifetime("anthropic", options)
    assert long == timedelta(hours=1)
    assert cache.long_lifetime("anthropic", parse_cache({"breakpoints": True})) is None
    answer, _ = prepare(claude(cache={"breakpoints": True, "instructions_ttl": "1h"}))
    breakpoints = answer["selection"]["cache"]["breakpoints"]
    instructions = cache.long_lived_tokens(breakpoints)
    assert instructions == next(b["tokens"] for b in breakpoints if b["after"] == "instructions")

    def expected(since: timedelta) -> int:
        return cache.expected_cached_tokens(
            prefix_kept=True,
            cacheable_tokens=answer["selection"]["cache"]["cacheable_tokens"],
            previous_cacheable_tokens=answer["selection"]["cache"]["cacheable_tokens"],
            since_previous=since,
            lifetime=cache.cache_lifetime("anthropic", options),
            long_lived=(instructions, instructions),
            long_lifetime=long,
        )

    assert expected(timedelta(minutes=4)) == answer["selection"]["cache"]["cacheable_tokens"]
    assert expected(timedelta(minutes=30)) == instructions
    assert expected(timedelta(minutes=61)) == 0


@pytest.mark.parametrize(
    ("model", "minimum"), [("claude-sonnet-4-5", 1024), ("claude-sonnet-4-6", 2048)]
)
def test_each_claude_model_takes_its_own_minimum(model: str, minimum: int) -> None:
    """The same ~1,500-token prefix is marked for a model whose minimum is 1,024 and not for one
    whose minimum is 2,048 (the registry's figure per model)."""
    fields = body(
        model=model,
        render="anthropic",
        tools=[],
        history=[],
        instructions="You are a careful assistant. " * 140,
    )
    answer, _ = prepare(fields)
    report = answer["selection"]["cache"]
    assert 1024 <= answer["prefix_tokens"] < 2048
    assert bool(report["breakpoints"]) == (minimum == 1024)
    if minimum == 2048:
        assert report["skipped"] == [{"after": "instructions", "reason": "below_minimum"}]


# --------------------------------------------------------------------------- diagnostics


def test_anthropic_diagnostics_name_the_previous_response() -> None:
    """``diagnostics: true`` sends ``diagnostics.previous_message_id``: the id given, or ``null``
    (a first turn, or no id reported), which still opts the request in."""
    fields = claude(cache={"breakpoints": True, "diagnostics": True})
    first, _ = prepare(fields)
    assert first["frame"]["diagnostics"] == {"previous_message_id": None}
    assert first["selection"]["cache"]["diagnostics"] == {"previous_message_id": None}
    later, _ = prepare(fields, response_id="msg_01ABC")
    assert later["frame"]["diagnostics"] == {"previous_message_id": "msg_01ABC"}
    without, _ = prepare(claude(), response_id="msg_01ABC")
    assert "diagnostics" not in without["frame"]


@pytest.mark.parametrize(
    ("model", "render", "compared"),
    [
        (OPENAI, "openai-responses", True),
        (OPENAI, "openai-chat", False),  # Chat has no comparison_response_id
        (OLDER, "openai-responses", False),  # options are refused before GPT-5.6
    ],
)
def test_openai_diagnostics_name_the_comparison_response(
    model: str, render: str, compared: bool
) -> None:
    fields = body(model=model, render=render, cache={"breakpoints": True, "diagnostics": True})
    answer, _ = prepare(fields, response_id="resp_042")
    frame = answer["frame"]
    if compared:
        assert frame["prompt_cache_options"] == {"comparison_response_id": "resp_042"}
    else:
        assert "prompt_cache_options" not in frame
    first, _ = prepare(fields)
    assert "prompt_cache_options" not in first["frame"]


def test_neutral_reports_what_an_adapter_passes_on() -> None:
    """``neutral`` carries no directive in its frame; the plan reports each one for the model's
    provider."""
    openai, _ = prepare(
        body(
            render="neutral", cache={"breakpoints": True, "diagnostics": True, "mode": "explicit"}
        ),
        response_id="resp_1",
    )
    report = openai["selection"]["cache"]
    assert report["prompt_cache_options"] == {
        "mode": "explicit",
        "comparison_response_id": "resp_1",
    }
    assert (
        report["breakpoints"]
        and "prompt_cache_breakpoint" not in orjson.dumps(openai["frame"]).decode()
    )
    anthropic, _ = prepare(
        claude(render="neutral", cache={"automatic": True, "diagnostics": True}),
        response_id="msg_1",
    )
    report = anthropic["selection"]["cache"]
    assert report["diagnostics"] == {"previous_message_id": "msg_1"}
    assert report["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in anthropic["frame"]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"mode": "explicit"}, "cache.mode"),
        ({"breakpoints": True, "mode": "explicit", "retention": "24h"}, "cache.mode"),
        ({"mode": "auto"}, "cache.mode"),
        ({"automatic": "yes"}, "cache.automatic"),
        ({"diagnostics": 1}, "cache.diagnostics"),
        ({"instructions_ttl": "30m"}, "cache.instructions_ttl"),
        ({"ttl": "1h", "instructions_ttl": "5m"}, "cache.instructions_ttl"),
    ],
)
def test_invalid_combinations_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidError) as caught:
        parse_model(PrepareRequest, orjson.dumps(body(cache=raw)))
    assert [e["loc"] for e in caught.value.extensions["errors"]] == [field]
