"""OpenTelemetry traces (``tracing.py``): the spans of prepare, refresh and usage with their
attributes, ``traceparent`` at a real loopback contributor, no text in any span, and the switch
(in-process app, real SQLite file; the spans land in the SDK's in-memory exporter).

Tracing is process-wide (one tracer provider, aiohttp sessions instrumented from the start on),
so the ``spans`` fixture starts it before the app is built and stops it afterwards; the tests of
tracing off run in a fresh interpreter each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import structlog
from api_support import AppFactory, basic_request, neutral_frame
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from context_assembly import tracing

MARKER = "MARKER-7f3a9c"  # in every text a request carries; never in a span
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_PARENT = "00f067aa0ba902b7"
TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on for this test, its spans kept in memory (``OTEL_*`` of the shell cleared)."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    exporter = InMemorySpanExporter()
    assert tracing.start(SimpleSpanProcessor(exporter)) is not None
    yield exporter
    tracing.stop()


class Contributor:
    """A registered contributor ``hook`` that answers blocks carrying the marker and keeps the
    ``traceparent`` of every call."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.traceparents: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.traceparents.append(request.headers.get("traceparent"))
        if self.status != 200:
            return httpx.Response(self.status, text=f"down {MARKER}")
        blocks = [{"id": "fact", "text": f"contributed fact {MARKER}", "priority": 3}]
        return httpx.Response(200, json={"revision": "r1", "blocks": blocks})


def _client(make_client: AppFactory, contributor: Contributor, policy: str = "fail") -> Any:
    # A token in the registered URL's query: spans record the URL without it.
    hook = {"url": f"http://contributor.test/hook?token={MARKER}", "failure_policy": policy}
    return make_client(
        contributor_transport=httpx.MockTransport(contributor), contributors={"hook": hook}
    )


def _request(**overrides: Any) -> dict[str, Any]:
    """``basic_request`` with the marker in every text and the contributor ``hook`` as ``docs``."""
    body = basic_request(
        instructions=f"Be exact. {MARKER}",
        plugins=[
            {"name": "memory", "instructions": f"Saved entries. {MARKER}"},
            {"name": "docs", "instructions": f"Documents. {MARKER}"},
        ],
        contributors=[{"source": "docs", "endpoint": "hook", "instructions": f"Use. {MARKER}"}],
        history=[
            {"role": "user", "content": f"earlier {MARKER}"},
            {"role": "assistant", "content": f"ok {MARKER}"},
        ],
        input=[{"role": "user", "content": f"Inspect receipt A42. {MARKER}"}],
    )
    for block in body["contributions"][0]["blocks"]:
        block["text"] += f" {MARKER}"
    body.update(overrides)
    return body


def _one(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [span for span in spans.get_finished_spans() if span.name == name]
    assert len(found) == 1, [span.name for span in spans.get_finished_spans()]
    return found[0]


def _statuses(prep: dict[str, Any]) -> dict[str, int]:
    counts = dict.fromkeys(("selected", "projected", "omitted"), 0)
    for block in prep["selection"]["blocks"]:
        counts[block["status"]] += 1
    return counts


def test_a_prepare_span_sits_between_the_server_span_and_the_contributor_call(
    spans: InMemorySpanExporter, make_client: AppFactory
) -> None:
    """The caller's trace goes on: the server span continues its ``traceparent``, the prepare
    span is its child, and the contributor call is the prepare span's child, whose id the
    contributor receives in its own ``traceparent``."""
    contributor = Contributor()
    client = _client(make_client, contributor)
    response = client.post(
        "/v1/prepare",
        json=_request(),
        headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_PARENT}-01"},
    )
    assert response.status_code == 200, response.text

    server = _one(spans, "POST /v1/prepare")
    prepare = _one(spans, "context_assembly.prepare")
    calls = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert len(calls) == 1 and len(contributor.traceparents) == 1
    assert server.kind is SpanKind.SERVER
    assert f"{server.context.trace_id:032x}" == CALLER_TRACE
    assert server.parent is not None and f"{server.parent.span_id:016x}" == CALLER_PARENT
    assert prepare.parent is not None and prepare.parent.span_id == server.context.span_id
    assert calls[0].parent is not None and calls[0].parent.span_id == prepare.context.span_id
    _, trace_id, parent_id, _ = (contributor.traceparents[0] or "").split("-")
    assert trace_id == f"{server.context.trace_id:032x}"
    assert parent_id == f"{calls[0].context.span_id:016x}"


def test_the_prepare_span_holds_what_the_answer_says(
    spans: InMemorySpanExporter, make_client: AppFactory
) -> None:
    """The prepare span carries the GenAI model and provider, and the answer's window, budget,
    block counts, tokenizer and exactness under ``context_assembly.*``."""
    client = _client(make_client, Contributor())
    prep = client.post("/v1/prepare", json=_request()).json()
    attributes = dict(_one(spans, "context_assembly.prepare").attributes or {})
    budget, selection = prep["budget"], prep["selection"]
    counts = _statuses(prep)
    assert counts["selected"] >= 2 and counts["omitted"] >= 1  # the expired note is omitted
    assert attributes == {
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.provider.name": "openai",
        "context_assembly.preparation_id": prep["preparation_id"],
        "context_assembly.attempt": 1,
        "context_assembly.render": prep["render"],
        "context_assembly.layout": "stable-prefix",
        "context_assembly.prefix_tokens": prep["prefix_tokens"],
        "context_assembly.budget.capacity": 128_000,
        "context_assembly.budget.capacity_source": "registry",
        "context_assembly.budget.response_reserve": budget["response_reserve"],
        "context_assembly.budget.data_limit_tokens": budget["data_limit_tokens"],
        "context_assembly.budget.data_tokens": budget["data_tokens"],
        "context_assembly.budget.remaining_tokens": budget["remaining_tokens"],
        "context_assembly.budget.total_input_tokens": budget["total_input_tokens"],
        "context_assembly.selection.tokenizer": "o200k_base",
        "context_assembly.selection.exact": True,
        "context_assembly.selection.selected_data_tokens": selection["selected_data_tokens"],
        "context_assembly.selection.blocks.selected": counts["selected"],
        "context_assembly.selection.blocks.projected": counts["projected"],
        "context_assembly.selection.blocks.omitted": counts["omitted"],
        "context_assembly.selection.sources.failed": 0,
    }


def test_a_cached_turn_says_whether_its_prefix_was_kept(
    spans: InMemorySpanExporter, make_client: AppFactory
) -> None:
    """With a ``cache`` object the span says whether the previous turn's prefix was kept, how
    many tokens a provider can cache and how many markers were placed; the provider is the
    registry's (Anthropic as the conventions name it); an unknown model gets no provider and
    the manifest's warning code."""
    client = make_client()
    body = basic_request(
        model="claude-sonnet-4-5",
        render="anthropic",
        instructions="You are a careful assistant. " * 300,
        cache={"breakpoints": True},
        scope={"task_id": "traced-turns"},
    )
    first = client.post("/v1/prepare", json=body).json()
    second = client.post("/v1/prepare", json=body).json()
    unknown = client.post("/v1/prepare", json=basic_request(model="house-model-1")).json()
    prepares = {
        dict(s.attributes or {})["context_assembly.preparation_id"]: dict(s.attributes or {})
        for s in spans.get_finished_spans()
        if s.name == "context_assembly.prepare"
    }
    one, two = prepares[first["preparation_id"]], prepares[second["preparation_id"]]
    report = second["selection"]["cache"]
    assert one["gen_ai.provider.name"] == two["gen_ai.provider.name"] == "anthropic"
    assert "context_assembly.selection.cache.prefix_kept" not in one  # no previous turn
    assert two["context_assembly.selection.cache.prefix_kept"] is True
    assert two["context_assembly.selection.cache.cacheable_tokens"] == report["cacheable_tokens"]
    assert report["cacheable_tokens"] > 0
    assert two["context_assembly.selection.cache.breakpoints"] == len(report["breakpoints"]) > 0
    other = prepares[unknown["preparation_id"]]
    assert "gen_ai.provider.name" not in other
    assert other["context_assembly.selection.warnings"] == ("unknown_model",)
    assert other["context_assembly.selection.exact"] is False


def test_a_refresh_is_a_span_of_the_second_attempt(
    spans: InMemorySpanExporter, make_client: AppFactory
) -> None:
    """The refresh span names the same preparation, attempt 2, and its contributor call is its
    child."""
    client = _client(make_client, Contributor())
    body = _request()
    prep = client.post("/v1/prepare", json=body).json()
    body["input"] = [{"role": "user", "content": "Edited by a hook."}]
    refreshed = client.post(f"/v1/preparations/{prep['preparation_id']}/refresh", json=body)
    assert refreshed.status_code == 200, refreshed.text
    refresh = _one(spans, "context_assembly.refresh")
    attributes = dict(refresh.attributes or {})
    assert attributes["context_assembly.preparation_id"] == prep["preparation_id"]
    assert attributes["context_assembly.attempt"] == 2
    calls = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert any(c.parent is not None and c.parent.span_id == refresh.context.span_id for c in calls)


def test_a_usage_report_is_a_span_with_the_gen_ai_usage(
    spans: InMemorySpanExporter, make_client: AppFactory
) -> None:
    """An Anthropic usage report becomes ``gen_ai.usage.*``: input tokens counting both cache
    parts (as the conventions count them), cache reads and writes, output; a repeat says it
    changed nothing."""
    client = make_client()
    prep = client.post("/v1/prepare", json=basic_request()).json()
    report = {
        "report_id": "msg_01",
        "provider": "anthropic",
        "call": "main",
        "usage": {
            "input_tokens": 12,
            "cache_read_input_tokens": 90,
            "cache_creation_input_tokens": 20,
            "output_tokens": 7,
        },
    }
    path = f"/v1/preparations/{prep['preparation_id']}/usage"
    answered = client.post(path, json=report).json()
    assert client.post(path, json=report).status_code == 200
    first, repeat = [
        dict(s.attributes or {})
        for s in spans.get_finished_spans()
        if s.name == "context_assembly.usage"
    ]
    estimate = answered["accounting"]["estimated_input_tokens"]
    assert first == {
        "gen_ai.provider.name": "anthropic",
        "gen_ai.usage.input_tokens": 122,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.usage.cache_read.input_tokens": 90,
        "gen_ai.usage.cache_creation.input_tokens": 20,
        "context_assembly.preparation_id": prep["preparation_id"],
        "context_assembly.usage.report_id": "msg_01",
        "context_assembly.usage.call": "main",
        "context_assembly.usage.applied": True,
        "context_assembly.usage.input_token_delta": 122 - estimate,
        "context_assembly.usage.expected_cached_tokens": 0,
    }
    assert repeat == {**first, "context_assembly.usage.applied": False}


def test_a_failed_operation_records_its_code_not_its_message(
    spans: InMemorySpanExporter, make_client: AppFactory
) -> None:
    """A prepare whose contributor fails ends its span in error with the problem code as
    ``error.type`` and no exception event (a message may quote what it refused)."""
    client = _client(make_client, Contributor(status=500))
    assert client.post("/v1/prepare", json=_request()).status_code == 502
    prepare = _one(spans, "context_assembly.prepare")
    assert prepare.status.status_code is StatusCode.ERROR
    assert dict(prepare.attributes or {}) == {"error.type": "CONTRIBUTOR_FAILED"}
    assert prepare.events == ()


def _texts(span: ReadableSpan) -> Iterator[str]:
    """Every string a span exports: name, attributes, events, links, status, resource."""
    yield span.name
    yield str(span.status.description)
    groups = [span.attributes, span.resource.attributes]
    groups += [event.attributes for event in span.events]
    groups += [link.attributes for link in span.links]
    yield from (event.name for event in span.events)
    for group in groups:
        for key, value in (group or {}).items():
            yield key
            yield str(value)


def test_no_span_holds_a_text_of_any_call(
    spans: InMemorySpanExporter, make_client: AppFactory
) -> None:
    """Instructions, plugin and contributor instructions, block texts (inline and contributed),
    history, input, the frame, a repair's answer, a refused body, a failing contributor's answer
    and the query of the contributor's URL all carry the marker; no exported span does."""
    contributor = Contributor()
    client = _client(make_client, contributor, policy="omit")
    body = _request()
    prep = client.post("/v1/prepare", json=body).json()
    prep_id = prep["preparation_id"]
    frame = neutral_frame(prep)
    assert MARKER in orjson.dumps(frame).decode()  # the frame holds the texts
    base = f"/v1/preparations/{prep_id}"
    calls = [
        ("validate", {"model": prep["model"], "scope": {}, "frame": frame}),
        (
            "repair",
            {
                "model": prep["model"],
                "scope": {},
                "instructions": body["instructions"],
                "frame": frame,
                "answer": f"An answer {MARKER}",
            },
        ),
        ("refresh", {**body, "input": [{"role": "user", "content": f"again {MARKER}"}]}),
        (
            "usage",
            {"report_id": "r1", "provider": "openai", "usage": {"prompt_tokens": 9}},
        ),
    ]
    for name, payload in calls:
        response = client.post(f"{base}/{name}", json=payload)
        assert response.status_code == 200, (name, response.text)
    contributor.status = 500  # the next prepare omits the failing source
    assert client.post("/v1/prepare", json=body).status_code == 200
    refused = client.post("/v1/prepare", json={**body, "model": 7, "note": MARKER})
    assert refused.status_code == 422
    for page in ("", "/breakdown", "/timeline"):
        assert client.get(f"{base}{page}").status_code == 200

    finished = spans.get_finished_spans()
    names = {span.name for span in finished}
    assert {"context_assembly.prepare", "context_assembly.refresh"} <= names
    assert {"context_assembly.usage", "POST /v1/preparations/{preparation_id}/repair"} <= names
    leaks = [(span.name, text) for span in finished for text in _texts(span) if MARKER in text]
    assert leaks == []


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "ca"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_TRACES_EXPORTER": " none , console "}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
    ],
)
def test_tracing_is_on_only_when_the_environment_asks(
    environ: dict[str, str], expected: bool
) -> None:
    """An exporter named (not ``none``) or an OTLP endpoint turns tracing on, unless the SDK is
    disabled; nothing set, or only other ``OTEL_*`` variables, leaves it off."""
    assert tracing.enabled(environ) is expected


# A fresh interpreter builds the app with the environment it is given, prepares once with a
# caller's traceparent through a registered loopback contributor, and prints what that
# contributor received and which OpenTelemetry implementation modules were imported. (FastAPI
# imports the OpenTelemetry *API* itself, traced or not: the SDK, exporters and instrumentations
# are what tracing adds.) ``argv[1]``: modules to make unimportable; ``argv[2]``: the request.
_RUN_APP = """
import sys
for name in sys.argv[1].split(","):
    if name:
        sys.modules[name] = None
import httpx, orjson
from fastapi.testclient import TestClient
from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly_client.testing import ScriptedContributor

from loopback_client import LoopbackClient

seen = []
def contribute(request):
    seen.append(request.headers.get("traceparent"))
    return httpx.Response(200, json={"revision": "r1", "blocks": [{"id": "x", "text": "fact"}]})

with ScriptedContributor(handler=contribute) as server:
    settings = load_settings(
        store={"path": "traced.db"}, contributors={"hook": {"url": "http://contributor.test/hook"}}
    )
    app = create_app(settings, client=LoopbackClient(server.port))
    with TestClient(app) as client:
        status = client.post(
            "/v1/prepare",
            content=sys.argv[2],
            headers={"content-type": "application/json", "traceparent": sys.argv[3]},
        ).status_code
loaded = sorted(
    name for name, module in sys.modules.items()
    if module is not None
    and name.startswith(("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.instrumentation"))
)
print("RESULT " + orjson.dumps({"status": status, "seen": seen, "loaded": loaded}).decode())
"""
IMPLEMENTATION = "opentelemetry.sdk,opentelemetry.exporter,opentelemetry.instrumentation"


def _run_app(tmp_path: Path, env: dict[str, str], blocked: str = "") -> tuple[dict[str, Any], str]:
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CONTEXT_ASSEMBLY_"))
    }
    clean["PYTHONPATH"] = str(TESTS)
    body = basic_request(contributors=[{"source": "docs", "endpoint": "hook"}])
    body["plugins"] = [*body["plugins"], {"name": "docs"}]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _RUN_APP,
            blocked,
            orjson.dumps(body).decode(),
            f"00-{CALLER_TRACE}-{CALLER_PARENT}-01",
        ],
        cwd=tmp_path,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    result: dict[str, Any] = orjson.loads(line.removeprefix("RESULT "))
    return result, done.stdout + done.stderr


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    ],
)
def test_off_nothing_is_instrumented_and_no_sdk_is_loaded(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Tracing off (the default): the contributor gets no ``traceparent`` even when the caller
    sent one, and no OpenTelemetry SDK, exporter or instrumentation module is ever imported."""
    result, _ = _run_app(tmp_path, env)
    assert result == {"status": 200, "seen": [None], "loaded": []}


def test_on_without_the_extra_warns_once_and_serves(tmp_path: Path) -> None:
    """Asked for traces without the ``[otel]`` extra installed, the service logs a warning that
    names the extra and serves untraced."""
    result, output = _run_app(
        tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, blocked=IMPLEMENTATION
    )
    assert result == {"status": 200, "seen": [None], "loaded": []}
    warnings = [line for line in output.splitlines() if "tracing_unavailable" in line]
    assert len(warnings) == 1 and tracing.EXTRA in warnings[0]


class _HungProcessor(SimpleSpanProcessor):
    """A processor whose flush never ends until released: an exporter stuck in its own timeout
    and retries."""

    def __init__(self) -> None:
        super().__init__(InMemorySpanExporter())
        self.release = threading.Event()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.release.wait(30)  # ignores its timeout, as the SDK's batch processor does
        return True


async def test_the_flush_is_bounded_by_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the exporter does, the flush waits its bound and no longer, logs the spans left
    as ``tracing_flush_incomplete``, and leaves no thread that the loop or the interpreter would
    wait for at exit (a daemon thread, not the loop's executor)."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    hung = _HungProcessor()
    assert tracing.start(hung) is not None
    try:
        with structlog.testing.capture_logs() as logs:
            started = time.monotonic()
            assert await tracing.flush(timeout_millis=200) is False
            took = time.monotonic() - started
        assert 0.15 < took < 1.0, took
        assert [(line["event"], line["waited_ms"]) for line in logs] == [
            ("tracing_flush_incomplete", 200)
        ]
        flushing = [t for t in threading.enumerate() if t.name == "context-assembly-trace-flush"]
        assert flushing and all(t.daemon for t in flushing)
    finally:
        hung.release.set()
        tracing.stop()
    assert await tracing.flush() is True  # off: nothing to wait for
