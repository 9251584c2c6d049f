"""HTTP surface: problem+json for every kind of bad input, limits, ops endpoints, breakdown, OpenAPI."""

from __future__ import annotations

import gc
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import orjson
import pytest
from api_support import AppFactory, basic_request
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from context_assembly import server
from context_assembly.api import pages
from context_assembly.api.app import create_app
from context_assembly.api.openapi_export import render
from context_assembly.config import load_settings

ROOT = Path(__file__).resolve().parents[2]


def _problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["status"] == status
    assert "Traceback" not in response.text
    return body


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": 5}, "model"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"assembly": {"timeout_ms": 0}}, "assembly.timeout_ms"),
        ({"assembly": {"max_blocks": 4096}}, "assembly.max_blocks"),
        ({"assembly": {"layout": "fancy"}}, "assembly.layout"),
        (
            {"contributions": [{"source": "memory", "revision": 1, "blocks": [{"id": "a"}]}]},
            "contributions.0.blocks.0.text",
        ),
        (
            {
                "contributions": [
                    {
                        "source": "memory",
                        "revision": 1,
                        "blocks": [{"id": "a", "text": "t", "priority": "high"}],
                    }
                ]
            },
            "contributions.0.blocks.0.priority",
        ),
        ({"history": [{"role": "wizard", "content": "x"}]}, "history.0.role"),
        ({"cache": {"ttl": "10m"}}, "cache.ttl"),
        ({"cache": {"previous_preparation_id": "other"}}, "cache.previous_preparation_id"),
    ],
)
def test_malformed_requests_name_the_field(
    make_client: AppFactory, change: dict[str, Any], field: str
) -> None:
    """Wrong types, unknown fields and out-of-range options give 422 naming the offending field."""
    client = make_client()
    body = _problem(
        client.post("/v1/prepare", json=basic_request(**change)), 422, "CONTEXT_ASSEMBLY_INVALID"
    )
    assert any(err["loc"].startswith(field) for err in body["errors"]), body


def test_block_rules_name_the_block(make_client: AppFactory) -> None:
    """A block-level violation (a dependency cycle) names the qualified block ids."""
    blocks = [
        {"id": "a", "text": "x", "dependencies": ["memory/b"]},
        {"id": "b", "text": "y", "dependencies": ["memory/a"]},
    ]
    client = make_client()
    body = _problem(
        client.post(
            "/v1/prepare",
            json=basic_request(
                contributions=[{"source": "memory", "revision": 1, "blocks": blocks}]
            ),
        ),
        422,
        "CONTEXT_ASSEMBLY_INVALID",
    )
    assert body["block_ids"] == ["memory/a", "memory/b"]


def test_invalid_json_body(make_client: AppFactory) -> None:
    """A body that is not JSON is a 422 problem, not a 500."""
    client = make_client()
    response = client.post(
        "/v1/prepare", content=b"{nope", headers={"content-type": "application/json"}
    )
    _problem(response, 422, "CONTEXT_ASSEMBLY_INVALID")


def test_body_over_the_limit_is_413(make_client: AppFactory) -> None:
    """A body over limits.max_body_bytes is refused with 413 PAYLOAD_TOO_LARGE, declared or streamed."""
    client = make_client(limits={"max_body_bytes": 4096})
    big = basic_request(instructions="x" * 10_000)
    _problem(client.post("/v1/prepare", json=big), 413, "PAYLOAD_TOO_LARGE")

    def chunks() -> Any:
        yield orjson.dumps(big)

    _problem(
        client.post("/v1/prepare", content=chunks(), headers={"content-type": "application/json"}),
        413,
        "PAYLOAD_TOO_LARGE",
    )


def test_unknown_path_and_method(make_client: AppFactory) -> None:
    """Unknown paths are 404 NOT_FOUND and wrong methods 405, both problem+json."""
    client = make_client()
    _problem(client.get("/v2/nothing"), 404, "NOT_FOUND")
    _problem(client.get("/v1/prepare"), 405, "METHOD_NOT_ALLOWED")


@pytest.mark.parametrize("coding", ["gzip", "br", "GZIP"])
def test_a_compressed_body_is_refused_naming_the_coding(
    make_client: AppFactory, coding: str
) -> None:
    """A body with a Content-Encoding other than identity is refused by a 422 that names the
    coding, never decoded nor parsed; identity is fine."""
    import gzip

    client = make_client()
    raw = orjson.dumps(basic_request())
    headers = {"content-type": "application/json", "content-encoding": coding}
    refused = client.post("/v1/prepare", content=gzip.compress(raw), headers=headers)
    body = _problem(refused, 422, "CONTEXT_ASSEMBLY_INVALID")
    assert coding.lower() in body["detail"] and body["field"] == "(body)"
    headers["content-encoding"] = "identity"
    assert client.post("/v1/prepare", content=raw, headers=headers).status_code == 200


def test_a_trailing_slash_is_an_unknown_path(make_client: AppFactory) -> None:
    """``/v1/prepare/`` is a 404 problem, not a 307 redirect with an empty body."""
    client = make_client()
    response = client.post("/v1/prepare/", json=basic_request(), follow_redirects=False)
    _problem(response, 404, "NOT_FOUND")
    _problem(client.get("/healthz/", follow_redirects=False), 404, "NOT_FOUND")


def test_an_unexpected_error_answers_500_with_the_request_id(
    make_client: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in a route is a 500 problem whose X-Request-Id is the one in its log line; the
    line says where the bug was raised (module, line and function of each frame, the route's
    and the failing function's among them), never the exception's message."""
    from structlog.testing import capture_logs

    from context_assembly.preparations import Preparations

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug holding ZZ-text-ZZ")

    monkeypatch.setattr(Preparations, "get", broken)
    client = make_client()
    with capture_logs() as logs:
        response = client.get("/v1/preparations/prep_x", headers={"X-Request-Id": "req-500"})
    body = _problem(response, 500, "INTERNAL")
    assert response.headers["x-request-id"] == "req-500"
    assert "a bug" not in response.text and "X-Request-Id" in body["detail"]
    errors = [line for line in logs if line["event"] == "unhandled_error"]
    assert len(errors) == 1
    frames = errors[0].pop("frames")
    assert errors == [
        {
            "event": "unhandled_error",
            "log_level": "error",
            "path": "/v1/preparations/prep_x",
            "error_type": "RuntimeError",
            "request_id": "req-500",
        }
    ]
    assert frames[0].startswith("context_assembly.api.middleware:")  # outermost first
    assert any(f.startswith("context_assembly.api.routes.preparations:") for f in frames)
    assert frames[-1].startswith(f"{__name__}:") and frames[-1].endswith(".broken"), frames
    assert all(re.fullmatch(r"[\w.]+:\d+ [\w.<>]+", f) for f in frames), frames
    assert "ZZ-text-ZZ" not in str(errors) + str(frames)


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("abc-123", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("abc\u00e9", False),  # not ASCII: echoed as sent it would come back re-encoded
        ("a\tb", False),
    ],
)
def test_a_request_id_is_kept_only_as_visible_ascii(
    make_client: AppFactory, sent: str, kept: bool
) -> None:
    """A caller's id of 1-128 visible ASCII characters comes back byte for byte; any other is
    replaced by a new one, which the header names."""
    client = make_client()
    response = client.get("/healthz", headers={b"X-Request-Id": sent.encode("latin-1")})
    echoed = response.headers["x-request-id"]
    if kept:
        assert echoed == sent
    else:
        assert echoed != sent and len(echoed) == 16


def test_an_empty_api_key_header_does_not_hide_a_bearer_key(make_client: AppFactory) -> None:
    """``X-API-Key:`` (empty) beside ``Authorization: Bearer <key>`` authenticates by the Bearer
    key; neither given is still 401."""
    from api_support import KEYS

    client = make_client(auth=True)
    bearer = {"Authorization": f"Bearer {KEYS['acme']}"}
    ok = client.post("/v1/prepare", json=basic_request(), headers={"X-API-Key": "", **bearer})
    assert ok.status_code == 200, ok.text
    _problem(
        client.post("/v1/prepare", json=basic_request(), headers={"X-API-Key": ""}),
        401,
        "UNAUTHENTICATED",
    )


@pytest.mark.parametrize(
    ("accept", "html"),
    [
        ("text/html", True),
        ("TEXT/HTML", True),
        ("application/xhtml+xml", True),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", True),  # a browser
        ("text/plain, text/html;q=0", False),
        ("text/html;q=0.1, text/plain", False),
        ("text/plain", False),
        ("*/*", False),
        ("", False),
    ],
)
def test_breakdown_follows_accept_qualities(
    make_client: AppFactory, accept: str, html: bool
) -> None:
    """HTML when the Accept header prefers it by quality, else plain text; Vary: Accept."""
    client = make_client()
    prep = client.post("/v1/prepare", json=basic_request()).json()
    path = f"/v1/preparations/{prep['preparation_id']}/breakdown"
    response = client.get(path, headers={"Accept": accept})
    kind = "text/html" if html else "text/plain"
    assert response.headers["content-type"].startswith(kind)
    assert response.headers["vary"] == "Accept"


def test_ops_endpoints_and_request_id(make_client: AppFactory) -> None:
    """healthz, readyz, metrics and models answer; the request id is echoed or generated."""
    client = make_client()
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    client.post("/v1/prepare", json=basic_request())
    metrics = client.get("/metrics").text
    assert "context_assembly_prepare_seconds_count" in metrics
    assert 'context_assembly_decisions_total{reason="protected",status="selected"}' in metrics
    models = client.get("/v1/models").json()["models"]
    assert any(m["name"] == "gpt-4o-mini" and m["tokenizer"] == "o200k_base" for m in models)
    echoed = client.get("/healthz", headers={"X-Request-Id": "abc-123"})
    assert echoed.headers["x-request-id"] == "abc-123"
    assert len(client.get("/healthz").headers["x-request-id"]) == 16


def test_the_server_factory_sets_the_collector_thresholds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The uvicorn factory tunes the cyclic collector of the serving process (GC_THRESHOLDS);
    building an app alone leaves an embedding process's collector as it is."""
    before = gc.get_threshold()
    monkeypatch.delenv(server.CONFIG_ENV, raising=False)
    monkeypatch.setenv("CONTEXT_ASSEMBLY_STORE__PATH", str(tmp_path / "gc.db"))
    monkeypatch.setattr(server, "configure_logging", lambda level: None)
    try:
        gc.set_threshold(700, 10, 10)
        create_app(load_settings(store={"path": str(tmp_path / "gc.db")}))
        assert gc.get_threshold() == (700, 10, 10)
        server.app_from_env()
        assert gc.get_threshold() == server.GC_THRESHOLDS != (700, 10, 10)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.ids: dict[str, str] = {}
        self.errors: list[str] = []
        self._current: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in {"meta", "br", "input", "img"}:
            self.stack.append(tag)
        self._current = dict(attrs).get("id")

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unbalanced </{tag}>")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self._current and data.strip():
            self.ids.setdefault(self._current, data.strip())


def test_breakdown_html_and_text(make_client: AppFactory) -> None:
    """The breakdown is well-formed HTML with the budget figures, or plain text for other clients."""
    client = make_client()
    prep = client.post("/v1/prepare", json=basic_request()).json()
    path = f"/v1/preparations/{prep['preparation_id']}/breakdown"
    html = client.get(path, headers={"Accept": "text/html"})
    assert html.headers["content-type"].startswith("text/html")
    parser = _Collector()
    parser.feed(html.text)
    assert parser.errors == [] and parser.stack == [], (parser.errors, parser.stack)
    assert parser.ids["capacity"] == str(prep["budget"]["capacity"])
    assert parser.ids["total"] == str(prep["budget"]["total_input_tokens"])
    assert "memory/receipt" in html.text and "protected" in html.text
    assert "Receipt A42" not in html.text, "no block body is ever shown"
    text = client.get(path, headers={"Accept": "text/plain"})
    assert text.headers["content-type"].startswith("text/plain")
    assert f"total input {prep['budget']['total_input_tokens']}" in text.text


def test_openapi_says_how_to_authenticate_and_that_errors_are_problems() -> None:
    """A client generated from the document can send its key, and finds every error response
    as application/problem+json with the Problem schema (never FastAPI's HTTPValidationError,
    which the service does not send)."""
    doc = orjson.loads(render())
    assert set(doc["components"]["securitySchemes"]) == {"ApiKey", "Bearer", "AdminKey"}
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            keyed = path.startswith("/v1/preparations") or path in {"/v1/prepare", "/v1/budget"}
            if keyed:  # optional (`{}`): the committed document is made with auth off
                assert operation["security"] == [{"ApiKey": []}, {"Bearer": []}, {}], where
            elif path == "/v1/admin/reload":
                assert operation["security"] == [{"AdminKey": []}], where
            else:
                assert "security" not in operation, where
            assert any(p["name"] == "X-Request-Id" for p in operation["parameters"]), where
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    assert response["content"] == {
                        "application/problem+json": {
                            "schema": {"$ref": "#/components/schemas/Problem"}
                        }
                    }, (where, status)
    assert "HTTPValidationError" not in render().decode()


def test_committed_openapi_matches_the_app() -> None:
    """openapi/openapi.json is what `make openapi` would write now (no drift)."""
    committed = (ROOT / "openapi" / "openapi.json").read_bytes()
    assert committed == render(), "run `make openapi` and commit openapi/openapi.json"


def test_a_prepare_record_is_in_the_sqlite_file_when_the_answer_comes(tmp_path: Path) -> None:
    """A ``200`` from prepare means its record is stored: another connection to the file finds
    it before the next request."""
    import sqlite3

    def ids(path: Path) -> set[str]:
        with sqlite3.connect(path) as conn:
            return {row[0] for row in conn.execute("SELECT id FROM preparations")}

    path = tmp_path / "store.db"
    settings = load_settings(store={"path": str(path)})
    with TestClient(create_app(settings)) as client:
        seen: set[str] = set()
        for _ in range(3):
            answer = client.post("/v1/prepare", json=basic_request())
            assert answer.status_code == 200
            seen.add(answer.json()["preparation_id"])
            assert ids(path) == seen


def test_expired_records_are_purged_from_sqlite(
    make_client: AppFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app deletes expired SQLite records in the background, so the file does not grow forever."""
    import sqlite3
    import time

    from api_support import FakeWall

    from context_assembly.api import app as app_module

    monkeypatch.setattr(app_module, "PURGE_INTERVAL_SECONDS", 0.05)
    wall = FakeWall()
    client = make_client(wall=wall)
    assert client.post("/v1/prepare", json=basic_request()).status_code == 200
    database = next(tmp_path.glob("db*.db"))

    def rows() -> int:
        with sqlite3.connect(database) as conn:
            count: int = conn.execute("SELECT COUNT(*) FROM preparations").fetchone()[0]
            return count

    assert rows() == 1  # written before the answer
    wall.now += 3601  # past the default TTL
    deadline = time.monotonic() + 5
    while rows() and time.monotonic() < deadline:  # bounded polling: the purge runs every 50 ms
        time.sleep(0.05)
    assert rows() == 0


def test_a_setting_spelt_with_one_underscore_in_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``CONTEXT_ASSEMBLY_STORE_BACKEND`` (meant: ``..._STORE__BACKEND``) was ignored, and the
    service started on SQLite; it is refused naming the spelling meant. The clients' own
    ``CONTEXT_ASSEMBLY_URL`` and ``..._API_KEY`` beside a service pass."""
    monkeypatch.setenv("CONTEXT_ASSEMBLY_URL", "http://127.0.0.1:8080")
    monkeypatch.setenv("CONTEXT_ASSEMBLY_API_KEY", "k")
    monkeypatch.setenv("CONTEXT_ASSEMBLY_INLINE_URLS__ALLOW_PRIVATE", "false")
    assert load_settings().store.backend == "sqlite"
    monkeypatch.setenv("CONTEXT_ASSEMBLY_STORE_BACKEND", "redis")
    with pytest.raises(ValueError, match="CONTEXT_ASSEMBLY_STORE__BACKEND"):
        load_settings()


HOSTILE_NAMES = [
    "line1\nFAKE   selected  protected  999 / 999  evil/x",
    "\x1b[31mred\x1b[0m",
    "abc\u202edcba",
    "para\u2029graph\rreturn\x00nul",
]


def test_breakdown_shows_hostile_names_escaped_on_their_own_lines(make_client: AppFactory) -> None:
    """Source names and block ids are the caller's: in the text view none starts a line of its
    own or carries a control or format character (ANSI escapes, bidi overrides), and the HTML
    view has none either; each is shown escaped (``\\n``, ``\\x1b``, ``\\u202e``)."""
    client = make_client()
    body = basic_request()
    body["plugins"] = [*body["plugins"], *({"name": n} for n in HOSTILE_NAMES)]
    body["contributions"] = [
        *body["contributions"],
        *(
            {"source": n, "revision": 1, "blocks": [{"id": f"id\u202e{i}", "text": "x"}]}
            for i, n in enumerate(HOSTILE_NAMES)
        ),
    ]
    response = client.post("/v1/prepare", json=body)
    assert response.status_code == 200, response.text
    prep = response.json()
    path = f"/v1/preparations/{prep['preparation_id']}/breakdown"
    text = client.get(path, headers={"Accept": "text/plain"}).text
    lines = text.split("\n")
    assert all(line.isprintable() for line in lines), [ln for ln in lines if not ln.isprintable()]
    blocks = prep["selection"]["blocks"]
    sources = prep["selection"]["sources"]
    start = lines.index(f"blocks ({len(blocks)}):")
    assert lines[start + len(blocks) + 1 : start + len(blocks) + 3] == ["", "sources:"]
    after = lines[start + len(blocks) + 3 :]
    assert after[len(sources)] == "", "one line per source, no more"
    assert not any(ln.startswith("FAKE") for ln in lines)
    assert "line1\\nFAKE" in text and "\\x1b[31mred" in text and "abc\\u202edcba" in text
    html = client.get(path, headers={"Accept": "text/html"}).text
    assert all(line.isprintable() for line in html.split("\n"))
    assert "\\u202e" in html and "\x1b" not in html and "\u202e" not in html


@given(st.text())
def test_a_shown_name_is_printable_and_a_printable_one_is_itself(name: str) -> None:
    """A name as the pages show it is printable, and a printable name is shown unchanged."""
    shown = pages.shown(name)
    assert shown.isprintable()
    assert (shown == name) == name.isprintable()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_head_bytes", 1023),
        ("max_head_bytes", 2 * 1024 * 1024),
        ("head_timeout_seconds", 0),
        ("head_timeout_seconds", 301),
        ("body_timeout_seconds", 0),
        ("body_timeout_seconds", 3601),
    ],
)
def test_request_head_and_body_limits_out_of_range_are_refused(key: str, value: float) -> None:
    """The head size and the head and body time limits are refused at start outside their
    ranges, naming the key; the defaults are 64 KiB, 10 s and 30 s."""
    with pytest.raises(ValueError, match=key):
        load_settings(limits={key: value})
    limits = load_settings().limits
    assert (limits.max_head_bytes, limits.head_timeout_seconds, limits.body_timeout_seconds) == (
        64 * 1024,
        10.0,
        30.0,
    )
