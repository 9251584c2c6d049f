"""Conformance table: each ``cases/NNN-name.json`` is one prepare request and what docs/contract.md requires.

A case file is ``{"description", "via": "cli"|"http", "now", "request", "expect"}``. HTTP cases
may add ``settings`` (``load_settings`` overrides), ``headers``, ``contributors_server`` (canned
answers of one real loopback HTTP server; ``{server}`` in any string becomes its base URL; a
route may give ``revision_json`` to answer ``revision`` packets differently), ``steps``
(follow-up calls: ``{id}`` in a path is the preparation id; in a body ``"$frame"`` is the
prepared neutral frame, ``"$request"`` the prepare request and ``{"$request": {...}}`` that
request with those fields replaced; ``now`` moves the service's pinned wall clock) and
``contributor_calls`` (the packet types the loopback server received, in order). A case with
``"xfail": "<reason>"`` documents contracted behaviour (docs/contract.md) the code lacks (strict: it must fail).

``expect`` keys (only those given are checked):

* ``error`` / ``status`` / ``mentions`` / ``reasons``: the problem code, its HTTP status (the CLI
  must also exit with 2), substrings of the problem body, and the stale ``reasons``;
* ``decisions``: ``{"source/id": "status/reason"}`` for exactly every block of the manifest;
* ``sources``: ``{"source": "kind/status"}`` for exactly every replaced source;
* ``budget`` / ``selection`` / ``response``: subsets of those objects (nested subset match);
* ``roles`` / ``tools_order``: the neutral frame's message roles and tool names, in order;
* ``text_contains`` / ``text_absent``: ``{"<message index>": [substrings]}`` over the frame;
* ``messages_exact``: ``{"<message index>": message}`` compared field by field;
* ``blocks``: ``{"source/id": {subset of that block's manifest entry}}``;
* ``data_order``: the ``source/id`` of every block in the data message, in rendered order;
* ``routing``: ``{"chosen": model | null, "candidates": ["model/reason", ...]}``: the routing
  report of a routed answer (``selection.routing``), or on a ``CONTEXT_OVERFLOW`` the problem's
  ``candidates`` (each ``model/window``, with its shortfall checked);
* ``invariants`` (default true on success): the invariants of docs/contract.md, "Budget" and "Selection invariants", checked on every answer,
  plus the routing arithmetic when the answer was routed and, with a native history, the
  provider-counted history term and a recount of the final neutral frame.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from context_assembly_client.testing import ScriptedContributor, Step
from fastapi.testclient import TestClient

from context_assembly.api.app import create_app
from context_assembly.cli import main
from context_assembly.config import load_settings
from context_assembly.core.blocks import parse_timestamp
from context_assembly.core.counting import count_messages, count_tools
from context_assembly.core.frame import Frame
from context_assembly.core.request import PrepareRequest
from context_assembly.engine import model_context
from context_assembly.preparations import Clock
from context_assembly.tokens.registry import ModelRegistry

CASES_DIR = Path(__file__).parent / "cases"
DEFAULT_NOW = "2026-12-02T12:00:00Z"
CASE_KEYS = {
    "description",
    "via",
    "now",
    "request",
    "expect",
    "xfail",
    "settings",
    "headers",
    "contributors_server",
    "steps",
    "permutation_of",
    "contributor_calls",
}
EXPECT_KEYS = {
    "error",
    "status",
    "mentions",
    "reasons",
    "decisions",
    "sources",
    "budget",
    "selection",
    "response",
    "roles",
    "tools_order",
    "text_contains",
    "text_absent",
    "messages_exact",
    "blocks",
    "data_order",
    "routing",
    "invariants",
}
STEP_KEYS = {"method", "path", "json", "headers", "now", "expect"}
BUDGET_TERMS = ("instructions_tokens", "legacy_data_tokens", "tools_tokens", "history_tokens")
DATA_PREFIX = '{"context_data":'
PACKET_KEYS = {
    "contribute": {
        "type",
        "preparation_id",
        "source",
        "model",
        "input",
        "data_budget_tokens",
        "source_token_limit",
        "scope",
        "deadline_unix_ms",
    },
    "revision": {"type", "source", "scope"},
}


def _load(path: Path) -> dict[str, Any]:
    case: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return case


def _case_params(only: str | None = None) -> list[Any]:
    params = []
    for path in sorted(CASES_DIR.glob("*.json")):
        case = _load(path)
        if only is not None and only not in case:
            continue
        marks = []
        if "xfail" in case:
            marks.append(pytest.mark.xfail(strict=True, reason=case["xfail"]))
        params.append(pytest.param(path, id=path.name, marks=marks))
    return params


# --------------------------------------------------------------------------- checks


def _subset(expected: Any, actual: Any, where: str) -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r}"
        for key, value in expected.items():
            assert key in actual, f"{where}.{key} missing in {sorted(actual)}"
            _subset(value, actual[key], f"{where}.{key}")
    else:
        assert actual == expected, f"{where}: expected {expected!r}, got {actual!r}"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def _decisions(body: dict[str, Any]) -> dict[str, str]:
    return {
        f"{b['source']}/{b['id']}": f"{b['status']}/{b['reason']}"
        for b in body["selection"]["blocks"]
    }


def _data_blocks(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(source/id, "selected"|"projected")`` of every block in the data message, in order."""
    rendered: list[tuple[str, str]] = []
    for message in messages:
        text = _text(message)
        if not text.startswith(DATA_PREFIX):
            continue
        for segment in json.loads(text)["context_data"]:
            for item in segment["blocks"]:
                view = "projected" if item.get("projected") else "selected"
                rendered.append((f"{segment['source']}/{item['id']}", view))
    return rendered


def _check_invariants(body: dict[str, Any]) -> None:
    """docs/contract.md, "Budget" and "Selection invariants": checked on one successful answer."""
    budget = body["budget"]
    selection = body["selection"]
    fixed = sum(budget[t] for t in BUDGET_TERMS) + budget["input_tokens"]
    reserve = budget["response_reserve"] + budget["reasoning_reserve_tokens"]
    assert budget["remaining_tokens"] == budget["capacity"] - reserve - fixed, budget
    assert budget["data_limit_tokens"] == min(
        selection["max_data_tokens"], budget["remaining_tokens"]
    )
    assert budget["data_tokens"] <= budget["data_limit_tokens"], budget
    assert budget["total_input_tokens"] == fixed + budget["data_tokens"], budget
    assert selection["selected_data_tokens"] == budget["data_tokens"], selection
    if selection.get("routing") is not None:
        _check_routing(body)
    if budget.get("provider_counted_tokens") is not None:
        _check_native(body)
    status = {f"{b['source']}/{b['id']}": b["status"] for b in selection["blocks"]}
    entered: dict[str, str] = {}
    for block in selection["blocks"]:
        qid = f"{block['source']}/{block['id']}"
        if block["status"] == "omitted":
            assert block["tokens"] == 0, block
            continue
        paid = block["full_tokens"] if block["status"] == "selected" else block["projection_tokens"]
        assert block["tokens"] == paid, block
        entered[qid] = block["status"]
        if block["protected"]:
            assert block["status"] == "selected", block
        for dep in block["dependencies"]:
            assert status.get(dep) == "selected", f"{qid} entered without {dep} in full"
    if "frame" not in body:
        return  # a stored view (GET) carries no frame
    messages = body["frame"]["messages"]
    data = [m for m in messages if _text(m).startswith(DATA_PREFIX)]
    if not entered:
        assert not data and budget["data_tokens"] == 0
        return
    assert len(data) == 1 and data[0]["role"] == "user", "one user data message"
    rendered = _data_blocks(messages)
    assert dict(rendered) == entered, "the data message holds exactly the entered blocks"
    assert len(rendered) == len(entered), "no block rendered twice"


def _check_routing(body: dict[str, Any]) -> None:
    """A routed answer: each candidate's arithmetic, first fit chosen, its capacity and tokenizer used."""
    routing = body["selection"]["routing"]
    candidates = routing["candidates"]
    assert candidates, routing
    for candidate in candidates:
        shortfall = max(candidate["needed_tokens"] - candidate["capacity"], 0)
        assert candidate["shortfall_tokens"] == shortfall, candidate
        assert candidate["fits"] == (shortfall == 0), candidate
    chosen = [c for c in candidates if c["reason"] != "window"]
    assert len(chosen) == 1 and chosen[0]["model"] == routing["chosen"] == body["model"], routing
    last = chosen[0]
    if last["reason"] == "fits":
        assert candidates[-1] is last, "first_fit stops at the first candidate that fits"
        assert not any(c["fits"] for c in candidates[:-1]), routing
    else:
        assert not any(c["fits"] for c in candidates), "compaction only when nothing fits"
        assert body["budget"]["history_dropped_messages"] > 0, body["budget"]
    assert body["budget"]["capacity"] == last["capacity"], body["budget"]
    assert body["budget"]["capacity_source"] == last["capacity_source"], body["budget"]
    assert body["selection"]["tokenizer"] == last["tokenizer"], body["selection"]


def _check_native(body: dict[str, Any]) -> None:
    """Native history: the provider count is the history term; the final frame recounts exactly."""
    budget = body["budget"]
    selection = body["selection"]
    provider = budget["provider_counted_tokens"]
    assert budget["history_tokens"] == provider, budget
    assert selection["native_history"] is True and selection["exact"] is False, selection
    if "frame" not in body or body["render"] != "neutral":
        return
    probe = PrepareRequest(model=body["model"], assembly={"tokenizer": selection["tokenizer"]})
    ctx = model_context(probe, ModelRegistry.load())
    frame = Frame.model_validate(body["frame"])
    recount = (
        count_messages(frame.messages, ctx.counter, ctx.profile).tokens
        + count_tools(frame.tools, ctx.counter, ctx.profile)
        + ctx.profile.reply_priming
    )
    assert recount + provider == budget["total_input_tokens"], (recount, provider, budget)


def _check_problem_candidates(expect: dict[str, Any], body: dict[str, Any]) -> None:
    assert expect.get("chosen") is None, "a problem chooses no candidate"
    candidates = body["candidates"]
    for candidate in candidates:
        assert candidate["shortfall_tokens"] > 0, candidate
        assert candidate["needed_tokens"] - candidate["capacity"] == candidate["shortfall_tokens"]
    assert [f"{c['model']}/window" for c in candidates] == expect["candidates"], candidates


def _check(expect: dict[str, Any], http_status: int, body: dict[str, Any]) -> None:
    """Compare one answer (prepare, step or CLI output) with the expectations given."""
    assert set(expect) <= EXPECT_KEYS, f"unknown expect keys {set(expect) - EXPECT_KEYS}"
    if "error" in expect:
        assert body.get("code") == expect["error"], body
        assert {"type", "title", "status", "detail", "code"} <= set(body), "RFC 9457 body"
        code = expect["error"].lower().replace("_", "-")
        assert body["type"] == f"urn:context-assembly:problem:{code}", body
        assert http_status == body["status"], body
        if "status" in expect:
            assert http_status == expect["status"], body
        text = json.dumps(body, ensure_ascii=False)
        for needle in expect.get("mentions", []):
            assert needle in text, f"{needle!r} not mentioned in {text}"
        if "reasons" in expect:
            assert body["reasons"] == expect["reasons"], body
        if "routing" in expect:
            _check_problem_candidates(expect["routing"], body)
        return
    assert "code" not in body, f"unexpected problem: {body}"
    assert http_status == expect.get("status", 200), body
    if "decisions" in expect:
        assert _decisions(body) == expect["decisions"]
    if "blocks" in expect:
        reports = {f"{b['source']}/{b['id']}": b for b in body["selection"]["blocks"]}
        for qid, subset in expect["blocks"].items():
            _subset(subset, reports[qid], qid)
    if "sources" in expect:
        got = {s["source"]: f"{s['kind']}/{s['status']}" for s in body["selection"]["sources"]}
        assert got == expect["sources"]
    for key in ("budget", "selection"):
        if key in expect:
            _subset(expect[key], body[key], key)
    if "response" in expect:
        _subset(expect["response"], body, "response")
    messages = body.get("frame", {}).get("messages", [])
    if "roles" in expect:
        assert [m["role"] for m in messages] == expect["roles"]
    if "tools_order" in expect:
        assert [t["name"] for t in body["frame"]["tools"]] == expect["tools_order"]
    for index, needles in expect.get("text_contains", {}).items():
        text = _text(messages[int(index)])
        for needle in needles:
            assert needle in text, f"message {index} lacks {needle!r}: {text!r}"
    for index, needles in expect.get("text_absent", {}).items():
        text = _text(messages[int(index)])
        for needle in needles:
            assert needle not in text, f"message {index} contains {needle!r}"
    for index, message in expect.get("messages_exact", {}).items():
        _subset(message, messages[int(index)], f"messages[{index}]")
    if "data_order" in expect:
        assert [qid for qid, _ in _data_blocks(messages)] == expect["data_order"]
    if "routing" in expect:
        routing = body["selection"].get("routing")
        if expect["routing"] is None:
            assert routing is None, routing
        else:
            assert routing is not None, "the answer was not routed"
            assert routing["chosen"] == expect["routing"]["chosen"], routing
            candidates = [f"{c['model']}/{c['reason']}" for c in routing["candidates"]]
            assert candidates == expect["routing"]["candidates"], routing
    if expect.get("invariants", True) and "selection" in body and "budget" in body:
        _check_invariants(body)


def _check_case_shape(case: dict[str, Any]) -> None:
    assert set(case) <= CASE_KEYS, f"unknown case keys {set(case) - CASE_KEYS}"
    description = case["description"]
    assert isinstance(description, str) and description.endswith("."), "one sentence"
    assert case.get("via", "cli") in {"cli", "http"}
    if "permutation_of" in case:
        assert (CASES_DIR / case["permutation_of"]).is_file()
    for step in case.get("steps", []):
        assert set(step) <= STEP_KEYS, f"unknown step keys {set(step) - STEP_KEYS}"


# --------------------------------------------------------------------------- CLI


def _run_cli(
    request: dict[str, Any], now: str, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> tuple[int, bytes]:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request, ensure_ascii=False), encoding="utf-8")
    code = main(["assemble", str(path), "--now", now])
    return code, capsysbinary.readouterr().out


def _cli_case(
    case: dict[str, Any], tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    code, out = _run_cli(case["request"], case.get("now", DEFAULT_NOW), tmp_path, capsysbinary)
    body = json.loads(out)
    expect = case["expect"]
    if "error" in expect:
        assert code == 2, body
        _check(expect, body["status"], body)
    else:
        assert code == 0, body
        _check(expect, 200, body)


# --------------------------------------------------------------------------- HTTP


NO_ROUTE = Step(status=404, body=b'{"error":"no such canned path"}')


@contextmanager
def _contributors_server(routes: dict[str, Any]) -> Iterator[ScriptedContributor]:
    """The contributors of one case: the scripted double, a path's canned answer (``status``,
    ``json``, after ``delay_ms``) as its step; ``revision_json`` answers the calls after the
    first, the validate's revision check after the prepare's contribution (the case's
    ``contributor_calls`` hold that order)."""
    with ScriptedContributor(default=NO_ROUTE) as double:
        for path, route in routes.items():
            answer = Step(
                status=route.get("status", 200),
                body=json.dumps(route.get("json", {})).encode(),
                delay=route.get("delay_ms", 0) / 1000.0,
            )
            if "revision_json" in route:
                double.script(path, answer, Step(body=json.dumps(route["revision_json"]).encode()))
            else:
                double.script(path, answer)
        yield double


def _substitute(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_substitute(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, old, new) for k, v in value.items()}
    return value


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _step_body(value: Any, frame: Any, request: dict[str, Any]) -> Any:
    if value == "$frame":
        return frame
    if value == "$request":
        return request
    if isinstance(value, dict) and set(value) == {"$request"}:
        return _merge(request, value["$request"])
    if isinstance(value, dict):
        return {k: _step_body(v, frame, request) for k, v in value.items()}
    if isinstance(value, list):
        return [_step_body(v, frame, request) for v in value]
    return value


def _timestamp(value: str) -> float:
    moment = parse_timestamp(value)
    assert moment is not None, f"not an RFC 3339 timestamp with offset: {value!r}"
    return moment.timestamp()


def _json(response: Any) -> dict[str, Any]:
    """The JSON body; an error must be ``application/problem+json``."""
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    return body


def _http_case(case: dict[str, Any], tmp_path: Path) -> None:
    pinned = [_timestamp(case.get("now", DEFAULT_NOW))]
    with _contributors_server(case.get("contributors_server", {})) as server:
        case = _substitute(case, "{server}", server.base_url)
        overrides = _merge(
            {"store": {"path": str(tmp_path / "preparations.db")}}, case.get("settings", {})
        )
        app = create_app(load_settings(**overrides), clock=Clock(wall=lambda: pinned[0]))
        headers = case.get("headers", {})
        with TestClient(app, raise_server_exceptions=False) as client:
            response = client.post("/v1/prepare", json=case["request"], headers=headers)
            body = _json(response)
            _check(case["expect"], response.status_code, body)
            prep_id = body.get("preparation_id", "none")
            for step in case.get("steps", []):
                if "now" in step:
                    pinned[0] = _timestamp(step["now"])
                kwargs: dict[str, Any] = {"headers": step.get("headers", headers)}
                if "json" in step:
                    kwargs["json"] = _step_body(step["json"], body.get("frame"), case["request"])
                path = step["path"].replace("{id}", prep_id)
                answer = client.request(step["method"], path, **kwargs)
                _check(step["expect"], answer.status_code, _json(answer))
        packets = [call.packet or {} for call in server.calls()]
        if "contributor_calls" in case:
            assert [packet.get("type") for packet in packets] == case["contributor_calls"]
        for packet in packets:
            assert set(packet) == PACKET_KEYS[packet["type"]], "docs/contract.md#webhook-protocol"


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("path", _case_params())
def test_case(path: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """Each case file answers as its ``expect`` says, through the CLI or the HTTP API."""
    case = _load(path)
    _check_case_shape(case)
    if case.get("via", "cli") == "http":
        _http_case(case, tmp_path)
    else:
        _cli_case(case, tmp_path, capsysbinary)


@pytest.mark.parametrize("path", _case_params(only="permutation_of"))
def test_permutation_gives_identical_output(
    path: Path, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """Two cases holding the same blocks in different input orders print byte-identical answers."""
    case = _load(path)
    other = _load(CASES_DIR / case["permutation_of"])
    assert case["request"] != other["request"], "a permutation must change the input order"

    def blocks(request: dict[str, Any]) -> list[str]:
        return sorted(
            json.dumps([c["source"], b], sort_keys=True)
            for c in request["contributions"]
            for b in c["blocks"]
        )

    assert blocks(case["request"]) == blocks(other["request"]), "same blocks, other order"
    now = case.get("now", DEFAULT_NOW)
    code_a, out_a = _run_cli(other["request"], now, tmp_path, capsysbinary)
    code_b, out_b = _run_cli(case["request"], now, tmp_path, capsysbinary)
    assert code_a == code_b == 0
    assert out_a == out_b


def test_console_script_entry_point(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """The installed ``context-assembly`` script runs one case exactly like the in-process CLI."""
    script = Path(sys.executable).parent / "context-assembly"
    assert script.exists(), f"console script not installed next to {sys.executable}"
    case = _load(CASES_DIR / "001-fits-all-selected.json")
    code, expected = _run_cli(case["request"], case["now"], tmp_path, capsysbinary)
    assert code == 0
    done = subprocess.run(
        [str(script), "assemble", str(tmp_path / "request.json"), "--now", case["now"]],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == expected
    _check(case["expect"], 200, json.loads(done.stdout))
