"""End to end: real ``context-assembly serve`` processes and a real loopback contributor server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import signal
import socket
import time
import uuid
from typing import Any, Literal

import httpx
import pytest
from context_assembly_client.testing import Step
from e2e_support import Contributor, ServiceFactory
from prometheus_client.parser import text_string_to_metric_families
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

pytestmark = pytest.mark.e2e

SECRET = "whsec_" + base64.b64encode(b"e2e-test-secret-0123456789abcdef").decode()


def config(contributors: dict[str, dict[str, Any]], extra: str = "") -> str:
    lines = ["[store]", 'backend = "sqlite"', 'path = "{db}"', ""]
    for name, conf in contributors.items():
        lines.append(f"[contributors.{name}]")
        for key, value in conf.items():
            lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")
    return "\n".join(lines) + extra


def request(
    sources: list[tuple[str, str]], timeout_ms: int = 1000, **policy: str
) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "assembly": {"timeout_ms": timeout_ms, "max_data_tokens": 4000},
        "instructions": "Be brief.",
        "plugins": [{"name": source, "instructions": f"{source} entries"} for source, _ in sources],
        "contributors": [
            {
                "source": source,
                "endpoint": endpoint,
                **({"failure_policy": policy[source]} if source in policy else {}),
            }
            for source, endpoint in sources
        ],
        "input": [{"role": "user", "content": "hello"}],
    }


def test_eight_contributors_are_called_concurrently(
    contributor: Contributor, service_factory: ServiceFactory
) -> None:
    """Eight contributors that each answer only once all eight have been called all answer:
    they are called at once (one after the other, the first would wait for the others until
    the deadline and the prepare would fail with 504). The latency figures are bench_service's."""
    names = [f"c{i}" for i in range(8)]
    path = f"/together-{uuid.uuid4().hex}"
    contributor.script(path, Step(gather=8))
    svc = service_factory(config({n: {"url": contributor.url(path)} for n in names}))
    body = request([(n, n) for n in names], timeout_ms=30_000)
    with httpx.Client(base_url=svc.base, timeout=60) as client:
        response = client.post("/v1/prepare", json=body)
    assert response.status_code == 200, response.text
    sources = response.json()["selection"]["sources"]
    assert [s["status"] for s in sources] == ["ok"] * 8


def test_deadline_contract_a_hung_contributor_fails_the_prepare_after_its_deadline(
    contributor: Contributor, service_factory: ServiceFactory
) -> None:
    """The suite's one deadline-contract test (tests/README.md): a contributor that never
    answers, under 'fail', makes the prepare answer 504 no sooner than its 300 ms deadline (the
    contributor had all of its time) and long before the client would give up (the call was
    cut). Only a lower bound and a generous upper bound: how fast a loaded machine answers is
    bench_service's to measure, not a test's to assert."""
    path = f"/hang/contract-{uuid.uuid4().hex}"
    contributor.script(path, Step(fault="hang"))
    svc = service_factory(config({"slow": {"url": contributor.url(path)}}))
    with httpx.Client(base_url=svc.base, timeout=60) as client:
        started = time.perf_counter()
        response = client.post("/v1/prepare", json=request([("slow", "slow")], timeout_ms=300))
        elapsed = time.perf_counter() - started
    assert response.status_code == 504
    assert 0.300 <= elapsed < 0.300 + 10.0, f"took {elapsed * 1000:.0f} ms"


@pytest.mark.parametrize(
    ("kind", "phase"),
    [("hang", "waiting for the response headers"), ("drip", "reading the body")],
)
def test_hung_or_dripping_contributor_fails_with_504_at_the_deadline(
    kind: Literal["hang", "drip"],
    phase: str,
    contributor: Contributor,
    service_factory: ServiceFactory,
) -> None:
    """A hung or byte-dripping contributor under 'fail' gives 504 naming it, with the phase the
    deadline cut, and the service closes its connection (the contributor sees it go)."""
    path = f"/{kind}/fail-{uuid.uuid4().hex}"
    contributor.script(path, Step(fault=kind))
    svc = service_factory(config({"slow": {"url": contributor.url(path)}}))
    with httpx.Client(base_url=svc.base, timeout=60) as client:
        response = client.post("/v1/prepare", json=request([("slow", "slow")], timeout_ms=300))
    assert response.status_code == 504
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert (problem["code"], problem["sources"]) == ("CONTEXT_ASSEMBLY_TIMEOUT", ["slow"])
    assert problem["contributors"] == [
        {"source": "slow", "status": "timeout", "cause": f"deadline reached while {phase}"}
    ]
    contributor.wait_for("closed", path)


def test_omit_policy_reports_timeout_and_succeeds(
    contributor: Contributor, service_factory: ServiceFactory
) -> None:
    """With 'omit' a hung contributor shows 'timeout' in the manifest, its connection is closed
    at the deadline, and the prepare succeeds with the other source."""
    path = f"/hang/omit-{uuid.uuid4().hex}"
    contributor.script(path, Step(fault="hang"))
    svc = service_factory(
        config(
            {
                "slow": {"url": contributor.url(path)},
                "fast": {"url": contributor.url("/fast")},  # answers at once
            }
        )
    )
    body = request([("slow", "slow"), ("fast", "fast")], timeout_ms=250, slow="omit")
    response = httpx.post(f"{svc.base}/v1/prepare", json=body, timeout=60)
    assert response.status_code == 200, response.text
    sources = {s["source"]: s for s in response.json()["selection"]["sources"]}
    assert {name: s["status"] for name, s in sources.items()} == {"slow": "timeout", "fast": "ok"}
    ids = {b["id"] for b in response.json()["selection"]["blocks"]}
    assert ids == {"fast-a", "fast-b"}
    contributor.wait_for("closed", path)


def _contributor_calls(base: str) -> set[tuple[str, str]]:
    """The (source label, status) of every contributor call the service's /metrics counts."""
    text = httpx.get(f"{base}/metrics", timeout=5).text
    return {
        (sample.labels["source"], sample.labels["status"])
        for family in text_string_to_metric_families(text)
        if family.name == "context_assembly_contributor_seconds"
        for sample in family.samples
        if sample.name.endswith("_count")
    }


def test_a_failing_fail_policy_contributor_fails_the_prepare_at_once(
    contributor: Contributor, service_factory: ServiceFactory
) -> None:
    """A 'fail' source answering 500 fails the prepare as soon as it answers (502 naming it),
    not when a hung 'omit' source reaches the 30 s deadline: the hung call is cancelled (its
    connection closed) without ever settling, so /metrics counts the failed call only."""
    tag = f"fail-fast-{uuid.uuid4().hex}"
    path = f"/hang/{tag}"
    contributor.script(path, Step(fault="hang"))
    # Fails once the hung call has arrived, so the cancellation reaches a connection.
    contributor.script(f"/broken/{tag}", Step(status=500, after=path))
    svc = service_factory(
        config(
            {
                "broken": {"url": contributor.url(f"/broken/{tag}")},
                "slow": {"url": contributor.url(path), "failure_policy": "omit"},
            }
        )
    )
    body = request([("broken", "broken"), ("slow", "slow")], timeout_ms=30_000)
    response = httpx.post(f"{svc.base}/v1/prepare", json=body, timeout=60)
    assert response.status_code == 502, response.text
    problem = response.json()
    assert problem["code"] == "CONTRIBUTOR_FAILED" and problem["source"] == "broken"
    contributor.wait_for("closed", path)
    assert _contributor_calls(svc.base) == {("broken", "error")}


def test_head_answers_every_get_route_without_a_body(service_factory: ServiceFactory) -> None:
    """HEAD /healthz (a load balancer's probe) and HEAD on any GET route answer like GET with no
    body; HEAD on a POST route is 405 naming POST."""
    svc = service_factory(config({}))
    with httpx.Client(base_url=svc.base, timeout=5) as client:
        for path in ("/healthz", "/readyz", "/v1/models", "/metrics"):
            got, head = client.get(path), client.head(path)
            assert head.status_code == got.status_code == 200, path
            assert head.content == b"", path
            assert head.headers["content-type"] == got.headers["content-type"], path
        refused = client.head("/v1/prepare")
        assert refused.status_code == 405 and refused.headers["allow"] == "POST"


def test_a_late_answer_changes_nothing_stored(
    contributor: Contributor, service_factory: ServiceFactory
) -> None:
    """A contributor that answers after the deadline leaves the stored preparation as it was
    answered: the contributor sends its answer once the service has closed the call."""
    path = f"/late/late-{uuid.uuid4().hex}"
    contributor.script(path, Step(fault="late"))
    svc = service_factory(
        config({"late": {"url": contributor.url(path), "failure_policy": "omit"}})
    )
    with httpx.Client(base_url=svc.base, timeout=60) as client:
        response = client.post("/v1/prepare", json=request([("late", "late")], timeout_ms=150))
        assert response.status_code == 200
        prep = response.json()
        contributor.wait_for("answered", path)  # after the close: nothing can read it any more
        stored = client.get(f"/v1/preparations/{prep['preparation_id']}").json()
    assert stored["selection"] == prep["selection"]
    assert stored["selection"]["sources"][0]["status"] == "timeout"
    assert stored["selection"]["blocks"] == []


def test_signature_verifies_with_an_independent_implementation(
    contributor: Contributor, service_factory: ServiceFactory
) -> None:
    """The contributor verifies the Standard Webhooks signature; the deadline header is ≤ timeout_ms."""
    path = f"/signed-{uuid.uuid4().hex}"
    svc = service_factory(config({"signed": {"url": contributor.url(path), "secret": SECRET}}))
    response = httpx.post(
        f"{svc.base}/v1/prepare", json=request([("signed", "signed")], timeout_ms=800), timeout=5
    )
    assert response.status_code == 200, response.text
    [call] = contributor.calls(path)
    headers, body = dict(call.request.headers), call.request.content
    Webhook(SECRET).verify(body, headers)  # raises on a bad signature
    # And by hand, from the Standard Webhooks spec, not the library the service signs with:
    # v1 = base64(HMAC-SHA256(base64-decoded secret, "{id}.{timestamp}.{body}")).
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert f"v1,{expected}" in headers["webhook-signature"].split(" ")
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    # The remaining budget at send time: within the request's timeout_ms.
    assert 1 <= int(headers["x-contributor-timeout-ms"]) <= 800
    packet = json.loads(body)
    assert packet["type"] == "contribute" and packet["source"] == "signed"
    assert packet["preparation_id"] == response.json()["preparation_id"]
    tampered = body.replace(b"signed", b"forged")
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(tampered, headers)


def test_validate_sees_a_changed_or_unavailable_revision(
    contributor: Contributor, service_factory: ServiceFactory
) -> None:
    """validate re-queries each webhook: same revision 200, a new one 409 revision_changed."""
    contributor.set_revision("rev", "one")  # the source's revision, in both packets' answers
    svc = service_factory(config({"rev": {"url": contributor.url("/rev")}}))
    with httpx.Client(base_url=svc.base, timeout=5) as client:
        prep = client.post("/v1/prepare", json=request([("rev", "rev")])).json()
        frame = {"messages": prep["frame"]["messages"], "tools": prep["frame"]["tools"]}
        path = f"/v1/preparations/{prep['preparation_id']}/validate"
        ok = client.post(path, json={"model": "gpt-4o-mini", "frame": frame})
        assert ok.status_code == 200, ok.text
        contributor.set_revision("rev", "two")
        stale = client.post(path, json={"model": "gpt-4o-mini", "frame": frame})
    assert stale.status_code == 409
    assert stale.json()["reasons"] == ["revision_changed:rev"]


def test_serve_refuses_sqlite_with_two_workers(service_factory: ServiceFactory) -> None:
    """``serve --workers 2`` on SQLite exits with a clear message instead of starting."""
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "context-assembly"
    done = subprocess.run(
        [str(exe), "serve", "--workers", "2", "--port", "0"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert b"SQLite" in done.stderr


def test_logs_carry_ids_and_timings_never_text(service_factory: ServiceFactory) -> None:
    """The service log has a JSON line per request, with the preparation's id and the sizes
    read and sent, and none of the block, instruction or input text."""
    svc = service_factory(config({}))
    body = {
        "model": "gpt-4o-mini",
        "instructions": "HOST-PROMPT-7f3a",
        "plugins": [
            {"name": "memory", "instructions": "PLUGIN-INSTR-91c2", "content": "LEGACY-VIEW-55d0"}
        ],
        "contributions": [
            {"source": "memory", "revision": 1, "blocks": [{"id": "a", "text": "BLOCK-TEXT-3b8e"}]}
        ],
        "history": [{"role": "user", "content": "HISTORY-TEXT-0a1b"}],
        "input": [{"role": "user", "content": "INPUT-TEXT-c4d5"}],
    }
    sent = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    prepared = httpx.post(f"{svc.base}/v1/prepare", content=sent, headers=headers, timeout=5)
    assert prepared.status_code == 200
    prep_id = prepared.json()["preparation_id"]
    assert httpx.get(f"{svc.base}/v1/preparations/{prep_id}", timeout=5).status_code == 200
    assert (
        httpx.post(f"{svc.base}/v1/prepare", json={**body, "model": 7}, timeout=5).status_code
        == 422
    )
    svc.proc.terminate()
    svc.proc.wait(10)
    lines = [json.loads(line) for line in svc.log.read_text().splitlines() if line.startswith("{")]
    requests = [line for line in lines if line.get("event") == "request"]
    assert [r["status"] for r in requests if r["route"] == "/v1/prepare"] == [200, 422]
    assert all("duration_ms" in r and "request_id" in r for r in requests)
    first = next(r for r in requests if r["route"] == "/v1/prepare")
    assert (first["preparation_id"], first["bytes_in"]) == (prep_id, len(sent))
    assert first["bytes_out"] == len(prepared.content)
    read = next(r for r in requests if r["route"] == "/v1/preparations/{preparation_id}")
    assert read["preparation_id"] == prep_id and read["bytes_in"] == 0
    text = svc.log.read_text()
    for secret in (
        "HOST-PROMPT",
        "PLUGIN-INSTR",
        "LEGACY-VIEW",
        "BLOCK-TEXT",
        "HISTORY-TEXT",
        "INPUT-TEXT",
    ):
        assert secret not in text


@pytest.mark.parametrize("drain", [0, 0.5])
def test_a_drain_under_a_second_is_still_bounded(
    contributor: Contributor, service_factory: ServiceFactory, drain: float
) -> None:
    """With ``drain_seconds`` under 1 (0 is no drain) a request still in flight does not hold
    SIGTERM up until it ends: a prepare waiting on a hung contributor, its deadline 30 s away,
    is cancelled once the drain is over (its contributor call closed), the process exits, and
    the request never gets the 504 its deadline would have given."""
    path = f"/hang/drain-{uuid.uuid4().hex}"
    contributor.script(path, Step(fault="hang"))
    svc = service_factory(
        config({"slow": {"url": contributor.url(path)}}, f"\n[server]\ndrain_seconds = {drain}\n")
    )
    body = json.dumps(request([("slow", "slow")], timeout_ms=30_000)).encode()
    port = int(svc.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as held:
        held.sendall(
            b"POST /v1/prepare HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        contributor.wait_for("seen", path)  # the prepare is under way, waiting on the call
        svc.proc.send_signal(signal.SIGTERM)
        # Bounded: the drain is under a second, the prepare's deadline 30 s away.
        svc.proc.wait(20)
        contributor.wait_for("closed", path)
        answer = _read_until_closed(held)
    assert b"CONTEXT_ASSEMBLY_TIMEOUT" not in answer, answer[:200]
    assert not answer.startswith(b"HTTP/1.1 504"), answer[:200]


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes the connection (or resets it)."""
    got = bytearray()
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return bytes(got)


def test_records_answered_before_sigterm_survive_a_restart(
    service_factory: ServiceFactory,
) -> None:
    """The preparations answered just before SIGTERM are in the SQLite file when their answers
    come, and a new process on the same file finds them (``GET`` and ``validate``)."""
    import sqlite3
    from pathlib import Path

    svc = service_factory(config({}))
    body = {
        "model": "gpt-4o-mini",
        "instructions": "Be brief.",
        "plugins": [{"name": "memory", "instructions": "entries"}],
        "contributions": [
            {"source": "memory", "revision": 1, "blocks": [{"id": "a", "text": "one fact"}]}
        ],
        "input": [{"role": "user", "content": "hello"}],
    }
    frames: dict[str, dict[str, Any]] = {}
    for _ in range(3):
        answer = httpx.post(f"{svc.base}/v1/prepare", json=body, timeout=5)
        assert answer.status_code == 200
        prep = answer.json()
        frames[prep["preparation_id"]] = {
            "messages": prep["frame"]["messages"],
            "tools": prep["frame"]["tools"],
        }
    ids = list(frames)
    database = Path(svc.config.read_text().split('path = "')[1].split('"')[0])
    with sqlite3.connect(database) as conn:
        assert conn.execute("SELECT COUNT(*) FROM preparations").fetchone()[0] == len(ids)
    svc.proc.terminate()
    svc.proc.wait(10)  # uvicorn shuts down, then ends by its signal (-15), as it does
    with sqlite3.connect(database) as conn:
        stored = {row[0] for row in conn.execute("SELECT id FROM preparations")}
    assert stored == set(ids)

    again = service_factory(svc.config.read_text())  # the same file, a new process
    for prep_id in ids:
        assert httpx.get(f"{again.base}/v1/preparations/{prep_id}", timeout=5).status_code == 200
        check = httpx.post(
            f"{again.base}/v1/preparations/{prep_id}/validate",
            json={"model": "gpt-4o-mini", "frame": frames[prep_id]},
            timeout=5,
        )
        assert check.status_code == 200, check.text
