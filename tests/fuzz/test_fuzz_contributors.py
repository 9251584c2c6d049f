"""Fuzzing contributor answers: random JSON, random bytes, random statuses, headers and failures.

Two layers: ``contribute_all`` on its own (it must never raise and must settle every call with a
known status), then the whole app in-process, where a registered contributor answers the same
random responses under failure policy ``omit`` and ``fail`` (``POST /v1/prepare`` must answer
200 or a problem+json with a known code, never a 500).

Every contributor reply is written as drawn (status line, headers, body) by a loopback server
(``context_assembly_client.testing.ScriptedContributor`` with a handler) and read by the
production client. Runs are
derandomized, so CI sees the same examples every time; ``make test-deep`` draws many more at
random (``hypothesis_budget``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, get_args

import httpx
import pytest
from context_assembly_client.testing import ScriptedContributor
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from context_assembly.contributors import (
    ContributorTarget,
    PacketFields,
    Status,
    contribute_all,
)
from context_assembly.core.request import Block, Message, Scope
from hypothesis_budget import DEEP, examples
from loopback_client import LoopbackClient

KNOWN_STATUSES = frozenset(get_args(Status))
CAP = 2048
"""Response cap in bytes (the smallest the settings allow is 1024): bodies over it are drawn."""
MARKER = "ZQ-body-marker-7"
"""A string the random bodies carry; a ``cause`` must describe the answer without quoting it."""
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
API_KEY = "ca_fuzz_contributors_key"


def fuzz_settings(max_examples: int) -> settings:
    """Bounded, reproducible Hypothesis settings (no example database, fixed derivation)."""
    return settings(
        max_examples=examples(max_examples),
        deadline=None,
        derandomize=not DEEP,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --------------------------------------------------------------------------- strategies

texts = st.one_of(st.text(max_size=12), st.just(MARKER))
# Block ids and dependency references never hold the marker: a block rule names the offending
# block and dependency by id (ids may go into answers and logs, docs/contract.md, "Privacy"), as it does for inline
# blocks; every other place of the body may hold it, and no cause may quote it.
ids = st.text(max_size=12)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),  # beyond 64 bits: orjson refuses these
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(texts, children, max_size=4)
    ),
    max_leaves=12,
)
block_like = st.fixed_dictionaries(
    {"id": st.one_of(ids, json_values), "text": st.one_of(texts, json_values)},
    optional={
        "priority": st.one_of(st.integers(-2000, 2000), json_values),
        "protected": st.one_of(st.booleans(), json_values),
        "dependencies": st.one_of(st.lists(ids, max_size=3), json_values),
        "expires_at": st.sampled_from([None, "2099-01-01T00:00:00Z", "yesterday", "2000-01-01"]),
        "projection": st.one_of(st.none(), texts),
        MARKER: json_values,  # an unknown member whose name is body text
    },
)
near_valid = st.fixed_dictionaries(
    {
        "revision": st.one_of(st.text(max_size=8), st.integers(), json_values),
        "blocks": st.one_of(st.lists(block_like, max_size=4), json_values),
    },
    optional={"extra": json_values},
)
valid_answers = st.fixed_dictionaries(
    {
        "revision": st.one_of(
            st.text(max_size=8),
            st.integers(-(2**63), 2**63 - 1),
            st.floats(allow_nan=False, allow_infinity=False),
        ),
        "blocks": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.text("abcdefgh", min_size=1, max_size=6),
                    "text": st.text(max_size=40),
                },
                optional={"priority": st.integers(-1000, 1000), "projection": st.text(max_size=8)},
            ),
            max_size=4,
            unique_by=lambda b: b["id"],
        ),
    }
)
odd_bytes = st.sampled_from(
    [
        b"",
        b"null",
        b"[]",
        b"{}",
        b"NaN",
        b'{"revision": NaN, "blocks": []}',
        b'{"revision": Infinity, "blocks": []}',
        b'{"revision": 1e999, "blocks": []}',
        b'{"revision": 1, "blocks": []',
        b'{"revision": 1, "blocks": [], "revision": 2}',
        b"\xef\xbb\xbf{}",  # a byte-order mark
        b"\xff\xfe\x00",
        b"[" * 5000 + b"]" * 5000,  # nesting deeper than any parser's limit
        b'{"revision": "' + MARKER.encode() + b'", "blocks": "' + MARKER.encode() + b'"}',
        b" " * (CAP + 1),
    ]
)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


bodies = st.one_of(
    valid_answers.map(_dumps),
    near_valid.map(_dumps),
    json_values.map(_dumps),
    st.binary(max_size=64),
    odd_bytes,
    st.binary(min_size=CAP - 16, max_size=CAP + 16),
)


@dataclass(frozen=True)
class Reply:
    """One drawn contributor behaviour: an HTTP answer, or an exception from the transport."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    raises: type[BaseException] | None = None
    chunk: int = 4096
    valid: bool = False
    """Drawn from ``valid_answers`` and served cleanly: the app must select from it (200, ok)."""

    def respond(self, request: httpx.Request) -> httpx.Response:
        if self.raises is not None:
            if issubclass(self.raises, httpx.RequestError):
                raise self.raises("drawn failure", request=request)
            raise self.raises("drawn failure")
        # A streamed body, as from a socket: httpx neither reads nor decodes it in advance.
        return httpx.Response(self.status, content=self._stream(), headers=self.headers)

    async def _stream(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self.body), self.chunk):
            yield self.body[start : start + self.chunk]


RAISES: list[type[BaseException]] = [
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadTimeout,
    httpx.ReadError,
    httpx.RemoteProtocolError,
    ConnectionResetError,
    OSError,
    RuntimeError,  # a transport bug: must settle as an error, never escape
    ValueError,
]


@st.composite
def replies(draw: st.DrawFn) -> Reply:
    """A clean 200 JSON answer of any shape, a random status/body/headers, or a transport error."""
    kind = draw(st.sampled_from(["clean", "random", "random", "raises"]))
    chunk = draw(st.sampled_from([4096, 1, 7, 512]))
    if kind == "raises":
        return Reply(0, b"", raises=draw(st.sampled_from(RAISES)))
    if kind == "clean":
        json_type = {"content-type": "application/json"}
        shape = draw(st.sampled_from(["valid", "near", "oversize"]))
        if shape == "valid":
            return Reply(200, draw(valid_answers.map(_dumps)), json_type, chunk=chunk, valid=True)
        if shape == "oversize":
            answer = draw(valid_answers)
            blocks = answer["blocks"]
            assert isinstance(blocks, list)
            blocks.append({"id": "pad", "text": "x" * CAP})
            return Reply(200, _dumps(answer), json_type, chunk=chunk)
        return Reply(200, draw(near_valid.map(_dumps)), json_type, chunk=chunk)
    status = draw(st.one_of(st.just(200), st.integers(100, 599)))
    headers: dict[str, str] = {}
    content_type = draw(
        st.sampled_from(
            [
                "application/json",
                "application/json; charset=utf-8",
                "application/problem+json",
                "APPLICATION/JSON",
                "text/plain",
                "text/html",
                "",
                ";;",
                None,
            ]
        )
    )
    if content_type is not None:
        headers["content-type"] = content_type
    encoding = draw(st.sampled_from([None, None, "identity", "gzip", "br", "x-weird"]))
    if encoding is not None:
        headers["content-encoding"] = encoding
    length = draw(st.sampled_from([None, None, "1", "99999999", "abc", "-5", " 12 "]))
    if length is not None:
        headers["content-length"] = length
    return Reply(status, draw(bodies), headers, chunk=chunk)


def _is_plain_valid(reply: Reply) -> bool:
    """Whether a reply is a clean 200 JSON ``{revision, blocks}`` that must come back ``ok``."""
    if reply.raises is not None or reply.status != 200 or len(reply.body) > CAP:
        return False
    if set(reply.headers) - {"content-type"}:  # no encoding, no (possibly lying) length
        return False
    if reply.headers.get("content-type", "application/json").split(";")[0] != "application/json":
        return False
    try:
        value = json.loads(reply.body)
    except ValueError:
        return False
    return (
        isinstance(value, dict)
        and set(value) == {"revision", "blocks"}
        and isinstance(value["revision"], str | int | float)
        and not isinstance(value["revision"], bool)
        and (not isinstance(value["revision"], int) or -(2**63) <= value["revision"] < 2**64)
        and (not isinstance(value["revision"], float) or math.isfinite(value["revision"]))
        and isinstance(value["blocks"], list)
        and all(
            isinstance(b, dict)
            and set(b) <= {"id", "text", "priority", "projection"}
            and isinstance(b.get("id"), str)
            and isinstance(b.get("text"), str)
            and isinstance(b.get("priority", 0), int)
            and not isinstance(b.get("priority", 0), bool)
            and -(2**63) <= b.get("priority", 0) < 2**64
            and isinstance(b.get("projection", ""), str)
            for b in value["blocks"]
        )
    )


# --------------------------------------------------------------------------- contribute_all

FIELDS = PacketFields(
    preparation_id="prep_fuzz",
    model="gpt-4o-mini",
    input=[Message(role="user", content="what is due today?")],
    data_budget_tokens=2048,
    scope=Scope(account_id="acct_1"),
    deadline_unix_ms=int(time.time() * 1000) + 5000,
    source_token_limits={"s0": 512},
)


async def _fan_out(answers: dict[str, Reply], secrets: list[bool], expired: bool) -> list[Any]:
    def handler(request: httpx.Request) -> httpx.Response:
        return answers[request.url.path.strip("/")].respond(request)

    targets = [
        ContributorTarget(
            source=source,
            url=f"http://contributor.test/{source}",
            secret=SECRET if with_secret else None,
            failure_policy="omit",
        )
        for source, with_secret in zip(answers, secrets, strict=True)
    ]
    deadline = time.monotonic() + (-1.0 if expired else 5.0)
    with ScriptedContributor(handler=handler) as server:
        async with LoopbackClient(server.port) as client:
            return await contribute_all(client, targets, FIELDS, deadline, CAP)


# Cases CI's short runs seldom draw, kept as examples: a 504 (the contributor reporting its
# deadline) and integers beyond 64 bits, which must not fail the prepare with a 500
# (``request.INT64_MIN``).
JSON_TYPE = {"content-type": "application/json"}
BIG_REVISION = Reply(200, b'{"revision": -9223372036854775809, "blocks": []}', JSON_TYPE)
BIG_PRIORITY = Reply(
    200,
    b'{"revision": 1, "blocks": [{"id": "a", "text": "t", "priority": 18446744073709551616}]}',
    JSON_TYPE,
)


@fuzz_settings(400)
@example(answers={"s0": Reply(504, b"{}", JSON_TYPE)}, secrets=[False] * 3, expired=False)
@example(answers={"s0": BIG_REVISION, "s1": BIG_PRIORITY}, secrets=[False] * 3, expired=False)
@given(
    answers=st.lists(replies(), min_size=1, max_size=3).map(
        lambda rs: {f"s{i}": r for i, r in enumerate(rs)}
    ),
    secrets=st.lists(st.booleans(), min_size=3, max_size=3),
    expired=st.integers(0, 19).map(lambda n: n == 13),  # 1 in 20, not the shrink target
)
def test_fuzz_contribute_all_settles_every_answer(
    answers: dict[str, Reply], secrets: list[bool], expired: bool
) -> None:
    """Any status, body, header or transport error: one outcome per target, a known status, never
    an exception; ``ok`` carries a revision and blocks, a failure carries a cause that does not
    quote the body; a clean valid answer is always ``ok``."""
    outcomes = asyncio.run(_fan_out(answers, secrets[: len(answers)], expired))
    assert [o.source for o in outcomes] == list(answers)
    for outcome in outcomes:
        reply = answers[outcome.source]
        assert outcome.status in KNOWN_STATUSES
        assert math.isfinite(outcome.duration_ms) and outcome.duration_ms >= 0
        if outcome.ok:
            assert outcome.cause is None and outcome.revision is not None
            assert all(isinstance(b, Block) for b in outcome.blocks)
            assert reply.raises is None and 200 <= reply.status < 300
        else:
            assert outcome.blocks == () and outcome.revision is None
            assert isinstance(outcome.cause, str) and outcome.cause
            assert MARKER not in outcome.cause
        if expired:
            assert outcome.status == "skipped_deadline"
        elif reply.raises is not None:
            assert outcome.status in {"error", "timeout"}
        elif not 200 <= reply.status < 300:
            # 504: the contributor (or a gateway) ran out of its deadline, a timeout as our own
            # timer's would be (``calls._check_status_headers``).
            assert outcome.status == ("timeout" if reply.status == 504 else "error")
        elif _is_plain_valid(reply):
            assert outcome.status == "ok", outcome.cause
            assert len(outcome.blocks) == len(json.loads(reply.body)["blocks"])


# --------------------------------------------------------------------------- through the app

PROBLEM_CODES = {
    "CONTEXT_ASSEMBLY_INVALID": 422,
    "CONTEXT_ASSEMBLY_OVERFLOW": 422,
    "CONTEXT_OVERFLOW": 422,
    "CONTEXT_ASSEMBLY_TIMEOUT": 504,
    "CONTRIBUTOR_FAILED": 502,
}


class Switchboard:
    """The mock contributor: answers whatever reply the current example put on it."""

    def __init__(self) -> None:
        self.reply = Reply(200, b'{"revision": 1, "blocks": []}')

    def __call__(self, request: httpx.Request) -> httpx.Response:
        return self.reply.respond(request)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Switchboard]]:
    """The real app (SQLite store, API-key auth) with two registered contributors on one mock."""
    board = Switchboard()
    app_settings = load_settings(
        auth={
            "mode": "api_key",
            "keys": [
                {"tenant": "acme", "key_sha256": hashlib.sha256(API_KEY.encode()).hexdigest()}
            ],
        },
        store={"path": str(tmp_path_factory.mktemp("fuzz-contributors") / "store.db")},
        contributors={
            "omit_hook": {"url": "http://contributor.test/omit", "failure_policy": "omit"},
            "fail_hook": {"url": "http://contributor.test/fail", "failure_policy": "fail"},
        },
        limits={"max_contributor_response_bytes": CAP},
    )
    server = ScriptedContributor(handler=board)
    app = create_app(app_settings, client=LoopbackClient(server.port))
    with server, TestClient(app, raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {API_KEY}"
        yield client, board


def _prepare_body(endpoint: str) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "instructions": "Be exact.",
        "plugins": [{"name": "docs", "instructions": "Documents."}],
        "contributors": [{"source": "docs", "endpoint": endpoint}],
        "input": [{"role": "user", "content": "What is due today?"}],
        "assembly": {"max_data_tokens": 256},
    }


@fuzz_settings(150)
@example(  # a block rule names the duplicated id, never the text
    reply=Reply(
        200,
        b'{"revision": "", "blocks": [{"id": "d", "text": "%s"}, {"id": "d", "text": ""}]}'
        % MARKER.encode(),
        JSON_TYPE,
    ),
    policy="fail",
)
@example(reply=BIG_REVISION, policy="omit")
@example(reply=BIG_PRIORITY, policy="fail")
@given(reply=replies(), policy=st.sampled_from(["omit", "fail"]))
def test_fuzz_prepare_survives_any_contributor_answer(
    service: tuple[TestClient, Switchboard], reply: Reply, policy: str
) -> None:
    """Through the app: 200 with the source's status in the manifest, or a problem+json with a
    known code and its status; never a 500. Under ``omit`` a contributor failure never fails the
    prepare; under ``fail`` a failed contributor gives 502/504 naming the source."""
    client, board = service
    board.reply = reply
    response = client.post("/v1/prepare", json=_prepare_body(f"{policy}_hook"))
    assert response.status_code != 500, response.text
    if response.status_code == 200:
        assert response.headers["content-type"].startswith("application/json")
        sources = {s["source"]: s for s in response.json()["selection"]["sources"]}
        status = sources["docs"]["status"]
        assert status in KNOWN_STATUSES
        if policy == "fail" or reply.valid:
            assert status == "ok"
        if status != "ok":
            assert sources["docs"]["block_count"] == 0
        return
    assert response.headers["content-type"] == "application/problem+json", response.text
    problem = response.json()
    assert PROBLEM_CODES.get(problem["code"]) == response.status_code, problem
    assert problem["status"] == response.status_code
    if problem["code"] in {"CONTRIBUTOR_FAILED", "CONTEXT_ASSEMBLY_TIMEOUT"}:
        assert policy == "fail"
        assert MARKER not in response.text  # the cause describes the answer, never quotes it
        assert [c["source"] for c in problem["contributors"]] == ["docs"]
        assert problem["contributors"][0]["status"] in KNOWN_STATUSES - {"ok"}
    assert not reply.valid, f"a clean valid answer must prepare: {problem}"


VALID_ANSWER = Reply(200, b'{"revision": "r1", "blocks": [{"id": "a", "text": "fact"}]}', JSON_TYPE)


@fuzz_settings(100)
@example(reply=BIG_REVISION, policy="fail", edit=True)
@given(reply=replies(), policy=st.sampled_from(["omit", "fail"]), edit=st.booleans())
def test_fuzz_validate_and_refresh_survive_any_contributor_answer(
    service: tuple[TestClient, Switchboard], reply: Reply, policy: str, edit: bool
) -> None:
    """After a clean prepare, the contributor answers anything to validate's revision query and
    to the refresh's call: validate answers 200 or 409 with known reasons (an answer it cannot
    read is ``revision_unavailable``), refresh 200 or a problem with a known code; never a 500,
    and no cause quotes the answer."""
    client, board = service
    board.reply = VALID_ANSWER
    body = _prepare_body(f"{policy}_hook")
    prepared = client.post("/v1/prepare", json=body)
    assert prepared.status_code == 200, prepared.text
    prep = prepared.json()
    base = f"/v1/preparations/{prep['preparation_id']}"
    board.reply = reply
    frame = {"messages": prep["frame"]["messages"], "tools": prep["frame"]["tools"]}
    validate = client.post(f"{base}/validate", json={"model": "gpt-4o-mini", "frame": frame})
    assert validate.status_code in (200, 409), validate.text
    if validate.status_code == 409:
        assert validate.headers["content-type"] == "application/problem+json"
        reasons = validate.json()["reasons"]
        assert set(reasons) <= {"revision_changed:docs", "revision_unavailable:docs"}, reasons
    assert MARKER not in validate.text
    if edit:
        body = {**body, "input": [{"role": "user", "content": "And tomorrow?"}]}
    refresh = client.post(f"{base}/refresh", json=body)
    assert refresh.status_code != 500, refresh.text
    if refresh.status_code == 200:
        sources = {s["source"]: s for s in refresh.json()["selection"]["sources"]}
        assert sources["docs"]["status"] in KNOWN_STATUSES
        if policy == "fail":
            assert sources["docs"]["status"] == "ok"
        return
    assert refresh.headers["content-type"] == "application/problem+json", refresh.text
    problem = refresh.json()
    assert PROBLEM_CODES.get(problem["code"]) == refresh.status_code, problem
    assert MARKER not in refresh.text
