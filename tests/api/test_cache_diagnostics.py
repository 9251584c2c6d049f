"""Vendor cache diagnostics through the HTTP API (in-process app, real SQLite file): the frame
names the previous turn's provider response id from its usage report, a refresh names the same,
and the breakdown shows the provider's diagnosis beside the service's comparison, marking a
disagreement; ``GET /v1/models`` says which models take OpenAI's explicit breakpoints."""

from __future__ import annotations

from typing import Any

from api_support import AppFactory, FakeWall
from page_support import INSTRUCTIONS, Page, new_scope, next_history, ok, prepare, turn_body


def usage(
    client: Any,
    prep_id: str,
    provider: str,
    response_id: str | None,
    diagnostics: dict[str, Any] | None = None,
    report_id: str = "r1",
) -> dict[str, Any]:
    """A main call's usage report, with the provider's response id and diagnostics."""
    body: dict[str, Any] = {"report_id": report_id, "provider": provider, "call": "main"}
    if provider == "anthropic":
        body["usage"] = {"input_tokens": 100, "cache_read_input_tokens": 0, "output_tokens": 5}
    else:
        body["usage"] = {
            "input_tokens": 2000,
            "output_tokens": 5,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 1500},
        }
    if response_id is not None:
        body["response_id"] = response_id
    if diagnostics is not None:
        body["diagnostics"] = diagnostics
    return ok(client.post(f"/v1/preparations/{prep_id}/usage", json=body))


def test_anthropic_frames_name_the_previous_response(make_client: AppFactory) -> None:
    """Turn 1 sends ``previous_message_id: null``; turn 2 the id turn 1's report named; a turn
    whose previous report named none sends ``null`` again; a refresh names the same id."""
    wall = FakeWall()
    client = make_client(wall=wall)
    body = turn_body(new_scope(), cache={"breakpoints": True, "diagnostics": True})
    first = prepare(client, body)
    assert first["frame"]["diagnostics"] == {"previous_message_id": None}
    usage(client, first["preparation_id"], "anthropic", "msg_01first")
    wall.now += 60
    body = next_history(body, 0)
    second = prepare(client, body)
    assert second["frame"]["diagnostics"] == {"previous_message_id": "msg_01first"}
    assert second["selection"]["cache"]["diagnostics"] == {"previous_message_id": "msg_01first"}
    refreshed = ok(client.post(f"/v1/preparations/{second['preparation_id']}/refresh", json=body))
    assert refreshed["frame"]["diagnostics"] == {"previous_message_id": "msg_01first"}
    usage(client, second["preparation_id"], "anthropic", None)
    wall.now += 60
    third = prepare(client, next_history(body, 1))
    assert third["frame"]["diagnostics"] == {"previous_message_id": None}


def test_openai_responses_compares_with_the_previous_response(make_client: AppFactory) -> None:
    """On a GPT-5.6 model and the Responses render the second turn's ``prompt_cache_options``
    name the first turn's response; after a turn sent to Chat no id is named (it is another
    API's)."""
    wall = FakeWall()
    client = make_client(wall=wall)
    body = turn_body(
        new_scope(),
        model="gpt-5.6-terra",
        render="openai-responses",
        cache={"breakpoints": True, "diagnostics": True},
    )
    first = prepare(client, body)
    assert "prompt_cache_options" not in first["frame"]
    accounting = usage(client, first["preparation_id"], "openai", "resp_first")["accounting"]
    assert accounting["last"]["cache_creation_input_tokens"] == 1500  # cache_write_tokens
    wall.now += 60
    body = next_history(body, 0)
    second = prepare(client, body)
    assert second["frame"]["prompt_cache_options"] == {"comparison_response_id": "resp_first"}
    chat = prepare(client, {**next_history(body, 1), "render": "openai-chat"})
    usage(client, chat["preparation_id"], "openai", "chatcmpl-1")
    wall.now += 60
    after = prepare(client, next_history(next_history(body, 1), 2))
    assert "prompt_cache_options" not in after["frame"]


def _breakdown(client: Any, prep_id: str) -> tuple[dict[str, str], str, Page]:
    path = f"/v1/preparations/{prep_id}/breakdown"
    page = Page(client.get(path, headers={"Accept": "text/html"}).text)
    text = client.get(path, headers={"Accept": "text/plain"}).text
    return page.facts("cache-facts"), text, page


def test_the_breakdown_shows_the_providers_reason_beside_ours(make_client: AppFactory) -> None:
    """A report whose diagnostics name the same change as the service agrees; one that names a
    change where the service kept the prefix is marked as a disagreement (red in HTML, in
    capitals in text); the plan says which response the provider compared with."""
    wall = FakeWall()
    client = make_client(wall=wall)
    body = turn_body(new_scope(), cache={"breakpoints": True, "diagnostics": True})
    first = prepare(client, body)
    usage(client, first["preparation_id"], "anthropic", "msg_a")
    wall.now += 60
    body = next_history(body, 0)
    kept = prepare(client, body)
    assert kept["selection"]["cache"]["prefix_kept"] is True
    said = {"cache_miss_reason": {"type": "tools_changed", "cache_missed_input_tokens": 1234}}
    usage(client, kept["preparation_id"], "anthropic", "msg_b", said)
    facts, text, page = _breakdown(client, kept["preparation_id"])
    assert facts["diagnostics"] == "asked, previous_message_id msg_a"
    assert facts["provider diagnosis"] == (
        "anthropic: tools_changed (1234 input tokens missed); the service kept the prefix: "
        "DISAGREES with the service's comparison"
    )
    (value,) = [e for e in page.elements if e.tag == "dd" and "tools_changed" in page.text(e)]
    assert "miss" in value.cls()
    assert "DISAGREES with the service's comparison" in " ".join(text.split())
    wall.now += 60
    changed = prepare(client, {**next_history(body, 1), "instructions": "Other. " + INSTRUCTIONS})
    assert changed["selection"]["cache"]["first_change"]["part"] == "instructions"
    said = {"cache_miss_reason": {"type": "system_changed", "cache_missed_input_tokens": 900}}
    usage(client, changed["preparation_id"], "anthropic", "msg_c", said)
    facts, _, page = _breakdown(client, changed["preparation_id"])
    assert facts["provider diagnosis"] == (
        "anthropic: system_changed (900 input tokens missed); the service: instructions "
        "changed: agrees with the service's comparison"
    )
    (value,) = [e for e in page.elements if e.tag == "dd" and "system_changed" in page.text(e)]
    assert "miss" not in value.cls()


def test_models_say_which_take_explicit_breakpoints(make_client: AppFactory) -> None:
    models = ok(make_client().get("/v1/models"))["models"]
    flagged = {m["name"] for m in models if m["explicit_cache_breakpoints"]}
    assert flagged == {"gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.6-luna"}


def test_the_breakdown_says_why_openais_own_breakpoint_caches_nothing(
    make_client: AppFactory,
) -> None:
    """On GPT-5.6 in stable-prefix without breakpoints the next turn reads nothing: OpenAI's own
    breakpoint ends on the turn's own messages. The breakdown says so, not that the prefix is
    below the minimum."""
    wall = FakeWall()
    client = make_client(wall=wall)
    body = turn_body(new_scope(), model="gpt-5.6-sol", render="openai-chat", cache={"key": "auto"})
    prepare(client, body)
    wall.now += 60
    second = prepare(client, next_history(body, 0))
    assert second["selection"]["cache"]["cacheable_tokens"] == 0
    facts, _, _ = _breakdown(client, second["preparation_id"])
    assert "OpenAI's own breakpoint ends on this turn's messages" in facts["expected cached"]
