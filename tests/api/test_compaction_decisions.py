"""Context pressure and the compaction decision (docs/compaction.md), through the real app on a
real SQLite file: every answer carries the decision and its numbers, a floor over the trigger
never fires, a turn right after a compaction does not fire again, clearing replaces old tool
results in one block and keeps them cleared on later turns, and the native modes put the
provider's own compaction in the frame and read its returned item."""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx
from api_support import AppFactory

from context_assembly.contributors.packets import SummarizePacket

MODEL = "gpt-4o-mini"  # exact counts
WORDS = "the service counts every token of the frame exactly "


def text(repeat: int) -> str:
    return WORDS * repeat


def body(history: list[dict[str, Any]], scope: str, **fields: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": MODEL,
        "max_context_tokens": 8000,
        "response_reserve": 200,
        "instructions": "Answer briefly.",
        "history": history,
        "input": [{"role": "user", "content": "and now?"}],
        "assembly": {"layout": "stable-prefix"},
        "scope": {"task_id": scope},
    }
    for key, value in fields.items():
        if key == "assembly":
            request["assembly"] = {**request["assembly"], **value}
        else:
            request[key] = value
    return request


def exchange(number: int, repeat: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {number}: {text(repeat)}"},
        {"role": "assistant", "content": f"answer {number}: {text(repeat)}"},
    ]


def tool_step(number: int, repeat: int, tool: str = "fetch") -> list[dict[str, Any]]:
    call = f"call_{number}"
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": call, "name": tool, "arguments": "{}"}],
        },
        {"role": "tool", "tool_call_id": call, "content": f"result {number}: {text(repeat)}"},
    ]


def prepare(client: Any, request: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/prepare", json=request)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_every_answer_carries_the_pressure_and_a_decision(make_client: AppFactory) -> None:
    """Without any compaction option the answer has the window, the input, the floor, the
    trigger at 80% of the window and the decision, with the budget's own total."""
    client = make_client()
    answer = prepare(client, body(exchange(1, 5), secrets.token_hex(4)))
    decided = answer["selection"]["compaction"]
    assert decided["mode"] == "report"
    assert decided["window_tokens"] == 8000
    assert decided["trigger_tokens"] == 6400
    assert decided["input_tokens"] == answer["budget"]["total_input_tokens"]
    assert 0 < decided["floor_tokens"] < decided["input_tokens"]
    assert decided["reclaimable_tokens"] == decided["input_tokens"] - decided["floor_tokens"]
    assert (decided["decision"], decided["reason"]) == ("none", "under_trigger")


def test_a_floor_over_the_trigger_never_fires(make_client: AppFactory) -> None:
    """Instructions alone over the trigger: a naive trigger (input over it) would fire a summary
    on every turn; the service says, every turn, that compacting cannot help."""
    client = make_client()
    scope = secrets.token_hex(4)
    history: list[dict[str, Any]] = []
    for number in range(4):
        history += exchange(number, 3)
        answer = prepare(
            client,
            body(
                history,
                scope,
                instructions=text(500),
                assembly={"compaction": {"trigger_fraction": 0.5}},
            ),
        )
        decided = answer["selection"]["compaction"]
        assert decided["input_tokens"] >= decided["trigger_tokens"]  # the naive trigger fires
        assert decided["floor_tokens"] >= decided["trigger_tokens"]
        assert (decided["decision"], decided["reason"]) == ("none", "floor_over_trigger")


def test_a_turn_right_after_a_compaction_does_not_fire_again(make_client: AppFactory) -> None:
    """`report`: the turn over the trigger says `compact`; the next turn of the scope, still over
    (the caller has not compacted yet), says `just_compacted`; the one after fires again."""
    client = make_client()
    scope = secrets.token_hex(4)
    history = [*exchange(1, 300), *exchange(2, 20)]
    options = {"compaction": {"trigger_fraction": 0.5}}
    reasons = []
    for number in range(3):
        history += exchange(10 + number, 2)
        answer = prepare(client, body(history, scope, assembly=options))
        decided = answer["selection"]["compaction"]
        reasons.append((decided["decision"], decided["reason"]))
    assert reasons == [
        ("compact", "over_trigger"),
        ("none", "just_compacted"),
        ("compact", "over_trigger"),
    ]


def test_unscoped_requests_have_no_hysteresis(make_client: AppFactory) -> None:
    """Requests without a scope form no conversation: each decides alone."""
    client = make_client()
    request = body([*exchange(1, 300)], "", assembly={"compaction": {"trigger_fraction": 0.5}})
    del request["scope"]
    for _ in range(2):
        decided = prepare(client, request)["selection"]["compaction"]
        assert decided["decision"] == "compact"


def frame_tool_texts(answer: dict[str, Any]) -> dict[str, str]:
    return {
        m["tool_call_id"]: m["content"] for m in answer["frame"]["messages"] if m["role"] == "tool"
    }


def test_clearing_replaces_old_results_in_one_block_and_keeps_them_cleared(
    make_client: AppFactory,
) -> None:
    """Over the trigger, the results beyond the newest `keep_tool_results` are replaced with a
    placeholder naming the call, the calls and their pairing kept; the next turns clear the
    same results again (the frame's start stays the same) and nothing fires again."""
    client = make_client()
    scope = secrets.token_hex(4)
    history = [{"role": "user", "content": "look these up"}]
    for number in range(6):
        history += tool_step(number, 90)
    history.append({"role": "assistant", "content": "done"})
    options = {
        "compaction": {
            "mode": "clear_tool_results",
            "trigger_fraction": 0.5,
            "keep_tool_results": 2,
            "clear_at_least": 500,
        }
    }
    first = prepare(client, body(history, scope, assembly=options))
    decided = first["selection"]["compaction"]
    assert (decided["decision"], decided["reason"]) == ("clear_tool_results", "over_trigger")
    assert decided["cleared_calls"] == [f"call_{n}" for n in range(4)]
    assert decided["cleared_tokens"] > 500
    assert (
        first["budget"]["total_input_tokens"] == decided["input_tokens"] - decided["cleared_tokens"]
    )
    texts = frame_tool_texts(first)
    for number in range(4):
        assert (
            texts[f"call_{number}"]
            == f"[tool result cleared to save context: fetch call call_{number}]"
        )
    for number in (4, 5):
        assert texts[f"call_{number}"].startswith(f"result {number}: ")
    messages = first["frame"]["messages"]
    for index, message in enumerate(messages):  # every call still answered right after it
        if message.get("tool_calls"):
            assert messages[index + 1]["tool_call_id"] == message["tool_calls"][0]["id"]

    later = []
    for number in range(2):
        history += exchange(20 + number, 2)
        later.append(prepare(client, body(history, scope, assembly=options)))
    for answer in later:
        decided = answer["selection"]["compaction"]
        assert decided["decision"] == "none"
        assert decided["cleared_calls"] == [f"call_{n}" for n in range(4)]
        kept = first["selection"]["placement"]["index"]  # all before the per-turn messages
        assert answer["frame"]["messages"][:kept] == first["frame"]["messages"][:kept]
    reasons = [answer["selection"]["compaction"]["reason"] for answer in later]
    assert reasons == ["under_trigger", "under_trigger"]  # cleared again, so under it


def test_clearing_spares_excluded_tools_and_too_little(make_client: AppFactory) -> None:
    """Results of `exclude_tools` are never cleared; fewer clearable tokens than
    `clear_at_least` clear nothing (`too_little_to_clear`)."""
    client = make_client()
    history = [{"role": "user", "content": "look these up"}]
    for number in range(4):
        history += tool_step(number, 80, tool="memory" if number % 2 else "fetch")
    history.append({"role": "assistant", "content": "done"})
    options = {
        "mode": "clear_tool_results",
        "trigger_fraction": 0.3,
        "keep_tool_results": 0,
        "exclude_tools": ["memory"],
    }
    answer = prepare(
        client,
        body(
            history,
            secrets.token_hex(4),
            assembly={"compaction": {**options, "clear_at_least": 10}},
        ),
    )
    assert answer["selection"]["compaction"]["cleared_calls"] == ["call_0", "call_2"]
    texts = frame_tool_texts(answer)
    assert texts["call_1"].startswith("result 1: ") and texts["call_3"].startswith("result 3: ")
    answer = prepare(
        client,
        body(
            history,
            secrets.token_hex(4),
            assembly={"compaction": {**options, "clear_at_least": 100_000}},
        ),
    )
    decided = answer["selection"]["compaction"]
    assert (decided["decision"], decided["reason"]) == ("none", "too_little_to_clear")
    assert decided["cleared_calls"] == []


def test_native_anthropic_asks_the_provider_to_compact(make_client: AppFactory) -> None:
    """`native` with the Anthropic render: the body carries the compaction edit at the trigger
    (at least Anthropic's 50,000) and the answer names the beta header it needs."""
    client = make_client()
    request = body(
        exchange(1, 5),
        secrets.token_hex(4),
        model="claude-sonnet-4-5",
        render="anthropic",
        max_context_tokens=200_000,
        assembly={"compaction": {"mode": "native", "trigger_tokens": 120_000}},
    )
    answer = prepare(client, request)
    native = answer["selection"]["compaction"]["native"]
    assert native == {
        "parameter": "context_management",
        "threshold_tokens": 120_000,
        "beta": "compact-2026-01-12",
    }
    assert answer["frame"]["context_management"] == {
        "edits": [
            {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 120_000}}
        ]
    }
    request["assembly"]["compaction"]["trigger_tokens"] = 1000
    answer = prepare(client, request)
    edit = answer["frame"]["context_management"]["edits"][0]
    assert edit["trigger"]["value"] == 50_000


def test_native_responses_reads_the_returned_item(make_client: AppFactory) -> None:
    """`native` with the Responses render asks for compaction at the trigger; a compaction item
    in the history replaces what precedes it, as the provider reads it: those messages are
    neither sent nor counted."""
    client = make_client()
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque"}
    history: list[dict[str, Any]] = [*exchange(1, 40), *exchange(2, 40), item]
    history += [{"role": "user", "content": "next"}, {"role": "assistant", "content": "ok"}]
    request = body(
        history,
        secrets.token_hex(4),
        model="gpt-5.5",
        render="openai-responses",
        assembly={"compaction": {"mode": "native", "trigger_tokens": 6000}},
    )
    answer = prepare(client, request)
    frame = answer["frame"]
    assert frame["context_management"] == [{"type": "compaction", "compact_threshold": 6000}]
    decided = answer["selection"]["compaction"]
    assert decided["provider_item_dropped_messages"] == 4
    at = frame["input"].index(item)
    assert [entry["role"] for entry in frame["input"][:at]] == ["system"]  # nothing else before
    without = prepare(
        client, body(history[4:], secrets.token_hex(4), model="gpt-5.5", render="openai-responses")
    )
    assert answer["budget"]["history_tokens"] == without["budget"]["history_tokens"]


def test_native_needs_a_render_with_provider_compaction(make_client: AppFactory) -> None:
    """`native` with a render whose provider does not compact, or `summarize` without a
    summarizer, is a 422 naming the field."""
    client = make_client()
    request = body([], "s", render="openai-chat", assembly={"compaction": {"mode": "native"}})
    response = client.post("/v1/prepare", json=request)
    assert response.status_code == 422
    assert "assembly.compaction.mode" in response.text
    request = body([], "s", assembly={"compaction": {"mode": "summarize"}})
    response = client.post("/v1/prepare", json=request)
    assert response.status_code == 422
    assert "summarizer" in response.text


def test_the_decision_weighs_the_price(make_client: AppFactory) -> None:
    """With the model's prices the decision compares carrying the history at the cache-read rate
    over the next turns with rebuilding the frame and the summary call; one turn ahead it does
    not pay, a hundred turns ahead it does; near the window it fires whatever the price."""
    client = make_client()
    history = [*exchange(1, 200)]

    def decided(horizon: int, window: int) -> dict[str, Any]:
        request = body(
            history,
            secrets.token_hex(4),
            model="claude-sonnet-4-5",
            max_context_tokens=window,
            assembly={"compaction": {"trigger_fraction": 0.3, "horizon_turns": horizon}},
        )
        return dict(prepare(client, request)["selection"]["compaction"])

    short = decided(1, 20_000)
    assert (short["decision"], short["reason"]) == ("none", "does_not_pay")
    assert short["economics"]["pays"] is False
    assert short["economics"]["carry_usd"] < short["economics"]["compact_usd"]
    long = decided(100, 20_000)
    assert (long["decision"], long["reason"]) == ("compact", "over_trigger")
    assert long["economics"]["carry_usd"] > long["economics"]["compact_usd"]
    # Carrying: the reclaimable tokens at Claude Sonnet 4.5's cache-read rate ($0.30 / M).
    expected = long["reclaimable_tokens"] * 0.30 * 100 / 1_000_000
    assert abs(long["economics"]["carry_usd"] - expected) < 1e-6


def test_near_the_window_it_fires_whether_or_not_it_pays(make_client: AppFactory) -> None:
    """Over 95% of the window left for input, compaction fires even when it does not pay."""
    client = make_client()
    history = [*exchange(1, 200)]
    first = prepare(client, body(history, secrets.token_hex(4), model="claude-sonnet-4-5"))
    total = first["budget"]["total_input_tokens"]
    window = int(total / 0.96) + 200
    request = body(
        history,
        secrets.token_hex(4),
        model="claude-sonnet-4-5",
        max_context_tokens=window,
        assembly={"compaction": {"trigger_fraction": 0.3, "horizon_turns": 1}},
    )
    decided = prepare(client, request)["selection"]["compaction"]
    assert (decided["decision"], decided["reason"]) == ("compact", "near_window")
    assert decided["economics"]["pays"] is False


def summarizer_client(make_client: AppFactory, packets: list[dict[str, Any]], answer: Any) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        packet = json.loads(request.content)
        packets.append(packet)
        if isinstance(answer, int):
            return httpx.Response(answer)
        return httpx.Response(200, json=answer)

    return make_client(
        contributor_transport=httpx.MockTransport(handler),
        contributors={"notes": {"url": "http://summarizer.test/fold"}},
    )


SUMMARIZE = {"compaction": {"mode": "summarize", "summarizer": "notes", "trigger_fraction": 0.5}}


def test_summarize_folds_the_history_before_the_latest_user_turn(make_client: AppFactory) -> None:
    """Over the trigger, the summarizer gets the history before the latest reply; its summary
    replaces those messages in the frame as one message, the answer gives it to the caller with
    how many messages it replaced, and the next turn that sends it back is under the trigger,
    with the summary in the floor."""
    packets: list[dict[str, Any]] = []
    client = summarizer_client(make_client, packets, {"summary": "They discussed two questions."})
    scope = secrets.token_hex(4)
    history = [*exchange(1, 300), *exchange(2, 20)]
    answer = prepare(client, body(history, scope, assembly=SUMMARIZE))
    assert len(packets) == 1
    packet = packets[0]
    assert packet["type"] == "summarize" and packet["source"] == "notes"
    SummarizePacket.model_validate(packet)  # the ``summarize`` webhook's packet, every field
    assert [m["content"] for m in packet["messages"]] == [m["content"] for m in history[:3]]
    assert packet["max_summary_tokens"] == 2000
    decided = answer["selection"]["compaction"]
    assert (decided["decision"], decided["folded_messages"]) == ("compact", 3)
    summary = decided["summary"]
    assert summary["role"] == "user"
    assert summary["content"].endswith("They discussed two questions.")
    messages = answer["frame"]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "developer", "user"]
    assert messages[1] == summary
    assert messages[2]["content"] == history[3]["content"]  # the latest reply, kept
    assert answer["budget"]["total_input_tokens"] < decided["trigger_tokens"]

    adopted = [summary, history[3], *exchange(3, 2)]
    later = prepare(client, body(adopted, scope, assembly=SUMMARIZE))
    decided = later["selection"]["compaction"]
    assert decided["decision"] == "none" and len(packets) == 1
    assert later["frame"]["messages"][1] == summary
    # The summary is part of the floor: the same message without the summary heading is not.
    plain = {"role": "user", "content": summary["content"].split("\n\n", 1)[1]}
    other = prepare(client, body([plain, *adopted[1:]], secrets.token_hex(4), assembly=SUMMARIZE))
    other_floor = other["selection"]["compaction"]["floor_tokens"]
    assert decided["floor_tokens"] > other_floor
    assert later["frame"]["messages"][3]["content"].startswith("question 3")


def test_a_summary_never_folds_the_historys_system_message(make_client: AppFactory) -> None:
    """An OpenAI-shaped history opening with its system message: the fold starts after it, the
    frame keeps it first, and the answer says where the folded span starts."""
    packets: list[dict[str, Any]] = []
    client = summarizer_client(make_client, packets, {"summary": "Earlier: two questions."})
    system = {"role": "system", "content": "You are terse."}
    history = [system, *exchange(1, 300), *exchange(2, 20)]
    answer = prepare(client, body(history, secrets.token_hex(4), assembly=SUMMARIZE))
    decided = answer["selection"]["compaction"]
    assert (decided["folded_from"], decided["folded_messages"]) == (1, 3)
    assert all(m["role"] != "system" for m in packets[0]["messages"])
    messages = answer["frame"]["messages"]
    assert [m["role"] for m in messages] == [
        "system",  # the instructions
        "system",  # the history's own, kept
        "user",  # the summary
        "assistant",  # the latest reply
        "developer",
        "user",
    ]
    assert messages[1] == system and messages[2] == decided["summary"]


def test_a_failed_summarizer_leaves_the_frame_whole_and_says_so(make_client: AppFactory) -> None:
    """A summarizer that answers 500 or without a summary: the frame is sent uncompacted with the
    warning `compaction_failed` naming the summarizer and the cause."""
    for answer, cause in ((500, "http_status"), ({"text": "no"}, "invalid_answer")):
        packets: list[dict[str, Any]] = []
        client = summarizer_client(make_client, packets, answer)
        history = [*exchange(1, 300)]
        result = prepare(client, body(history, secrets.token_hex(4), assembly=SUMMARIZE))
        warnings = result["selection"]["warnings"]
        assert [w["code"] for w in warnings] == ["compaction_failed"]
        assert "'notes'" in warnings[0]["detail"] and cause in warnings[0]["detail"]
        assert result["selection"]["compaction"]["folded_messages"] == 0
        assert len(result["frame"]["messages"]) == 5  # system, 2 history, developer, input


def test_an_unknown_summarizer_is_refused_before_any_call(make_client: AppFactory) -> None:
    """A summarizer endpoint that is not registered for the tenant is a 422 naming the field."""
    client = make_client()
    options = {"compaction": {"mode": "summarize", "summarizer": "absent"}}
    response = client.post("/v1/prepare", json=body([], "s", assembly=options))
    assert response.status_code == 422
    assert "assembly.compaction.summarizer" in response.text


def test_clearing_reaches_into_a_long_tool_loop(make_client: AppFactory) -> None:
    """One question and a long tool loop after it (an agent's usual turn): the loop's earlier
    results are what clearing lowers, so it fires; the newest `keep_tool_results` (the input's
    result among them) stay."""
    client = make_client()
    history = [{"role": "user", "content": "look everything up"}]
    for number in range(6):
        history += tool_step(number, 90)
    last = tool_step(6, 90)
    request = body(
        [*history, last[0]],
        secrets.token_hex(4),
        assembly={
            "compaction": {
                "mode": "clear_tool_results",
                "trigger_fraction": 0.5,
                "clear_at_least": 1000,
            }
        },
    )
    request["input"] = [last[1]]
    answer = prepare(client, request)
    decided = answer["selection"]["compaction"]
    assert (decided["decision"], decided["reason"]) == ("clear_tool_results", "over_trigger")
    assert decided["cleared_calls"] == [f"call_{n}" for n in range(4)]
    texts = frame_tool_texts(answer)
    assert all(texts[f"call_{n}"].startswith(f"result {n}: ") for n in (4, 5, 6))


def test_the_breakdown_and_the_timeline_show_every_decision(make_client: AppFactory) -> None:
    """Each turn's decision, fired or not, is on its breakdown (text and HTML, with the numbers)
    and on the timeline (JSON, text and HTML)."""
    client = make_client()
    scope = secrets.token_hex(4)
    history = [*exchange(1, 300)]
    options = {"compaction": {"trigger_fraction": 0.5}}
    ids = []
    for number in range(3):
        history += exchange(10 + number, 2)
        ids.append(prepare(client, body(history, scope, assembly=options))["preparation_id"])
    text = client.get(f"/v1/preparations/{ids[0]}/breakdown", headers={"accept": "text/plain"}).text
    section = " ".join(text.split("compaction:")[1].split())  # the lines wrapped, joined
    assert "decision: compact (over_trigger), mode report" in section
    assert "window; trigger 4000; floor" in section
    page = client.get(f"/v1/preparations/{ids[1]}/breakdown", headers={"accept": "text/html"}).text
    assert "id=compaction-facts" in page and "none (just_compacted)" in page
    path = f"/v1/preparations/{ids[2]}/timeline"
    timeline = client.get(path, headers={"accept": "application/json"}).json()
    assert [t["compaction"] for t in timeline["turns"]] == [
        {"decision": "compact", "reason": "over_trigger"},
        {"decision": "none", "reason": "just_compacted"},
        {"decision": "compact", "reason": "over_trigger"},
    ]
    text = client.get(f"/v1/preparations/{ids[2]}/timeline", headers={"accept": "text/plain"}).text
    assert text.count("compact (over_trigger)") == 2 and "none (just_compacted)" in text
    html = client.get(f"/v1/preparations/{ids[2]}/timeline", headers={"accept": "text/html"}).text
    assert html.count('data-label="compaction"') == 3


def test_clearing_clears_a_transcripts_earlier_data_messages_in_one_block(
    make_client: AppFactory,
) -> None:
    """`transcript`: the data messages of earlier turns stay where they stood; when clearing
    fires, all of them are cleared at once (a placeholder each) and this turn's data follows in
    one message, so a block no longer selected leaves the frame; later turns keep them cleared."""
    client = make_client()
    scope = secrets.token_hex(4)
    blocks = [
        {"id": "a", "text": "alpha " + text(40), "priority": 10},
        {"id": "b", "text": "beta " + text(40), "priority": 5},
    ]

    def turn(history: list[dict[str, Any]], limit: int, **compaction: Any) -> dict[str, Any]:
        request = body(
            history,
            scope,
            plugins=[{"name": "notes", "instructions": "Notes."}],
            contributions=[{"source": "notes", "revision": 1, "blocks": blocks}],
            assembly={"layout": "transcript", "max_data_tokens": limit, "compaction": compaction},
        )
        return prepare(client, request)

    clearing = {"mode": "clear_tool_results", "trigger_tokens": 200, "clear_at_least": 100}
    first = turn([], 2000)
    assert "beta" in str(first["frame"])
    history = [{"role": "user", "content": "and now?"}, {"role": "assistant", "content": "ok"}]
    second = turn(history, 450, **clearing)
    decided = second["selection"]["compaction"]
    assert decided["decision"] == "clear_tool_results"
    assert decided["cleared_calls"] == []
    contents = [m["content"] for m in second["frame"]["messages"]]
    assert any("was cleared here" in c for c in contents)
    assert "beta" not in str(second["frame"]) and "alpha" in str(second["frame"])
    history += [{"role": "user", "content": "and now?"}, {"role": "assistant", "content": "ok"}]
    third = turn(history, 450, **clearing)
    assert third["selection"]["compaction"]["decision"] == "none"
    assert "beta" not in str(third["frame"])
    kept = second["frame"]["messages"][:-1]  # all but the turn's own input
    assert third["frame"]["messages"][: len(kept)] == kept
