"""``context_assembly_client.testing``: the scripted contributor double (answers, revisions,
waits, faults, the handler, its record) over real loopback sockets, and the process helper with
real processes (the double's own, the service's, ones that fail to start)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from context_assembly_client.testing import (
    ScriptedContributor,
    ServedProcess,
    Step,
    start_contributor,
    start_service,
)

PACKET: dict[str, Any] = {
    "type": "contribute",
    "preparation_id": "prep_1",
    "source": "notes",
    "model": "gpt-4o-mini",
    "input": [{"role": "user", "content": "what is due?"}],
    "data_budget_tokens": 2048,
    "source_token_limit": None,
    "scope": {"account_id": "acct"},
    "deadline_unix_ms": 0,
}
HANG_UP = 0.3  # seconds: when a caller of these tests gives up on a call that is held


@pytest.fixture
def double() -> Iterator[ScriptedContributor]:
    with ScriptedContributor() as serving:
        yield serving


def post(url: str, packet: dict[str, Any] = PACKET, timeout: float = 10.0) -> httpx.Response:
    return httpx.post(url, json=packet, timeout=timeout)


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` in a thread; its result (or exception) lands in the list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as err:
            out.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


class TestAnswers:
    def test_a_contribute_packet_gets_the_sources_blocks_and_revision(
        self, double: ScriptedContributor
    ) -> None:
        """Unscripted, a ``contribute`` packet is answered 200 with the default blocks named after
        its source and the revision ``r1``."""
        answer = post(double.url("/notes"))
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "application/json"
        body = answer.json()
        assert body["revision"] == "r1"
        assert [b["id"] for b in body["blocks"]] == ["notes-a", "notes-b"]
        assert body["blocks"][1]["projection"] == "B summary notes"

    def test_revision_and_summarize_packets_get_their_own_answers(
        self, double: ScriptedContributor
    ) -> None:
        """A ``revision`` packet is answered ``{revision}`` alone, a ``summarize`` packet
        ``{summary}``, and a body that is no packet 400."""
        revision = post(double.url(), {"type": "revision", "source": "notes", "scope": {}})
        assert revision.json() == {"revision": "r1"}
        summary = post(double.url(), {"type": "summarize", "source": "s", "messages": []})
        assert summary.json() == {"summary": Step().summary}
        assert httpx.post(double.url(), content=b"[1]").status_code == 400

    def test_set_revision_changes_the_next_answers_of_that_source_only(
        self, double: ScriptedContributor
    ) -> None:
        """After ``set_revision``, answers for that source (both packet kinds) carry the new
        revision; another source keeps ``r1``."""
        assert post(double.url()).json()["revision"] == "r1"
        double.set_revision("notes", 7)
        assert post(double.url()).json()["revision"] == 7
        check = post(double.url(), {"type": "revision", "source": "notes", "scope": {}})
        assert check.json() == {"revision": 7}
        assert post(double.url(), {**PACKET, "source": "other"}).json()["revision"] == "r1"

    def test_steps_are_taken_in_order_and_the_last_repeats(
        self, double: ScriptedContributor
    ) -> None:
        """A path's steps answer its calls in order (status, own blocks with ``{source}``, own
        body), the last one for every later call; other paths keep the default."""
        double.script(
            "/s",
            Step(status=503),
            Step(revision="x", blocks=[{"id": "{source}-only", "text": "t"}]),
            Step(body=b'{"revision":"raw","blocks":[]}'),
        )
        first, second = post(double.url("/s")), post(double.url("/s"))
        assert (first.status_code, first.json()) == (503, {"error": "scripted"})
        assert second.json() == {"revision": "x", "blocks": [{"id": "notes-only", "text": "t"}]}
        assert [post(double.url("/s")).json()["revision"] for _ in range(2)] == ["raw", "raw"]
        assert post(double.url("/other")).json()["revision"] == "r1"

    def test_answers_keep_the_connection_alive(self, double: ScriptedContributor) -> None:
        """Three calls over one client reuse one connection, as a contributor's pool would."""
        peers = set()
        with httpx.Client() as client:
            for _ in range(3):
                with client.stream("POST", double.url(), json=PACKET) as answer:
                    assert answer.read() and answer.status_code == 200
                    peers.add(answer.extensions["network_stream"].get_extra_info("client_addr"))
        assert len(peers) == 1

    def test_the_record_has_each_request_with_the_host_meant_and_its_events(
        self, double: ScriptedContributor
    ) -> None:
        """``calls`` keeps each request (its URL's host from the ``Host`` header), its parsed
        packet and its events."""
        httpx.post(double.url("/r"), json=PACKET, headers={"host": "memory.internal:9"})
        [call] = double.calls("/r")
        assert call.request.url.host == "memory.internal"
        assert call.packet == PACKET
        assert call.events == ("seen", "answered")
        assert double.count("answered", "/r") == 1 and not double.noted("closed", "/r")


class TestWaits:
    def test_a_delayed_call_whose_caller_hangs_up_is_closed_not_answered(
        self, double: ScriptedContributor
    ) -> None:
        """A call held by ``delay`` notes ``closed`` when its caller gives up, and is never
        answered; a short delay answers."""
        double.script("/slow", Step(delay=60))
        with pytest.raises(httpx.TimeoutException):
            post(double.url("/slow"), timeout=HANG_UP)
        double.wait_for("closed", "/slow")
        assert double.calls("/slow")[0].events == ("seen", "closed")
        double.script("/quick", Step(delay=0.01))
        assert post(double.url("/quick")).status_code == 200

    def test_gather_answers_only_once_that_many_calls_arrived(
        self, double: ScriptedContributor
    ) -> None:
        """With ``gather=2`` a lone call is held (its caller hangs up: closed, not answered);
        two calls at once are both answered."""
        double.script("/lone", Step(gather=2))
        with pytest.raises(httpx.TimeoutException):
            post(double.url("/lone"), timeout=HANG_UP)
        double.wait_for("closed", "/lone")
        assert double.count("answered", "/lone") == 0
        double.script("/pair", Step(gather=2))
        calls = [in_thread(lambda: post(double.url("/pair")).status_code) for _ in range(2)]
        for thread, _ in calls:
            thread.join(timeout=30)
        assert [out for _, out in calls] == [[200], [200]]

    def test_after_holds_a_call_until_another_path_is_called(
        self, double: ScriptedContributor
    ) -> None:
        """A step with ``after`` holds its call while that path has had none (its caller hangs
        up: closed, not answered); a call held when that path is called is answered then."""
        double.script("/broken", Step(status=500, after="/first"))
        with pytest.raises(httpx.TimeoutException):
            post(double.url("/broken"), timeout=HANG_UP)
        double.wait_for("closed", "/broken")
        assert double.count("answered", "/broken") == 0
        thread, out = in_thread(lambda: post(double.url("/broken")).status_code)
        double.wait_for("seen", "/broken", count=2)
        post(double.url("/first"))
        thread.join(timeout=30)
        assert out == [500]


class TestFaults:
    def test_hang_never_answers_and_notes_the_hang_up(self, double: ScriptedContributor) -> None:
        """``hang`` holds the call until the caller closes it, noted ``closed``."""
        double.script("/hang", Step(fault="hang"))
        with pytest.raises(httpx.ReadTimeout):
            post(double.url("/hang"), timeout=HANG_UP)
        double.wait_for("closed", "/hang")
        assert double.calls("/hang")[0].events == ("seen", "closed")

    def test_late_answers_once_the_caller_has_hung_up(self, double: ScriptedContributor) -> None:
        """``late`` writes its answer after the caller closed: seen, closed, answered."""
        double.script("/late", Step(fault="late"))
        with pytest.raises(httpx.ReadTimeout):
            post(double.url("/late"), timeout=HANG_UP)
        double.wait_for("answered", "/late")
        assert double.calls("/late")[0].events == ("seen", "closed", "answered")

    def test_drip_sends_headers_then_a_byte_at_a_time_until_the_hang_up(
        self, double: ScriptedContributor
    ) -> None:
        """``drip`` answers 200 with a long declared body and sends it byte by byte until the
        caller closes (a per-read timeout never fires)."""
        double.script("/drip", Step(fault="drip"))
        with socket.create_connection(("127.0.0.1", double.port), timeout=10) as sock:
            sock.sendall(b"POST /drip HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
            got = b""
            while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < 2:
                got += sock.recv(1024)
        head, body = got.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: 100000" in head
        assert set(body) == {ord(" ")}
        double.wait_for("closed", "/drip")

    def test_reset_aborts_the_connection(self, double: ScriptedContributor) -> None:
        """``reset`` answers nothing and resets the connection."""
        double.script("/reset", Step(fault="reset"))
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            post(double.url("/reset"))

    def test_oversize_streams_the_bytes_it_was_given_chunked(
        self, double: ScriptedContributor
    ) -> None:
        """``oversize`` streams ``size`` bytes as a chunked body."""
        double.script("/big", Step(fault="oversize", size=300_000))
        answer = post(double.url("/big"))
        assert answer.headers["transfer-encoding"] == "chunked"
        assert answer.content == b"[" * 300_000

    def test_invalid_json_is_a_200_that_does_not_parse(self, double: ScriptedContributor) -> None:
        """``invalid_json`` answers 200 ``application/json`` with a body that is not JSON."""
        double.script("/bad", Step(fault="invalid_json"))
        answer = post(double.url("/bad"))
        assert answer.status_code == 200
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(answer.content)


class TestHandler:
    def test_the_handler_answers_unscripted_calls_as_written(self) -> None:
        """With a handler, unscripted calls get its response as written (a lying length
        included, then the close) and scripted ones their steps; a raising handler resets."""

        def handler(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/raise":
                raise RuntimeError("a handler that fails")
            response = httpx.Response(200, content=b"short")
            response.headers["content-length"] = "100"
            return response

        with ScriptedContributor(handler=handler) as double:
            double.script("/scripted", Step(status=418))
            with pytest.raises(httpx.RemoteProtocolError):
                post(double.url("/lying"))
            with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
                post(double.url("/raise"))
            assert post(double.url("/scripted")).status_code == 418
            assert [c.path for c in double.calls()] == ["/lying", "/raise", "/scripted"]


def test_steps_round_trip_through_their_data() -> None:
    """``to_data`` keeps what a step sets (bytes in base64) and ``from_data`` restores it."""
    step = Step(delay=0.02, blocks=[{"id": "a", "text": "t"}], body=b"\x00{", fault="late")
    data = step.to_data()
    assert data == {
        "delay": 0.02,
        "blocks": [{"id": "a", "text": "t"}],
        "body": "AHs=",
        "fault": "late",
    }
    assert Step.from_data(orjson.loads(orjson.dumps(data))) == step


def test_the_module_imports_nothing_beyond_the_clients_dependencies() -> None:
    """Importing ``context_assembly_client.testing`` loads no server, test or service package."""
    script = (
        "import sys, context_assembly_client.testing\n"
        "banned = {'uvicorn', 'uvloop', 'starlette', 'fastapi', 'pytest', 'aiohttp', 'orjson',"
        " 'context_assembly', 'respx'}\n"
        "print(sorted(banned & {name.split('.')[0] for name in sys.modules}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


class TestProcesses:
    def test_a_contributor_process_follows_its_script_and_stops_on_sigterm(self) -> None:
        """``start_contributor`` serves the script in a process of its own, ready when
        constructed; ``stop`` ends it by SIGTERM, cleanly (exit status 0), without a kill."""
        process = start_contributor(
            default=Step(blocks=[{"id": "{source}-0", "text": "t"}]),
            script={"/fail": Step(status=500)},
            revision=3,
        )
        try:
            assert post(process.url + "/any").json() == {
                "revision": 3,
                "blocks": [{"id": "notes-0", "text": "t"}],
            }
            assert post(process.url + "/fail").status_code == 500
        finally:
            assert process.stop() == 0
        assert not process.killed

    def test_the_service_serves_until_stopped(self, tmp_path: Path) -> None:
        """``start_service`` returns once ``/healthz`` answers; ``stop`` ends it by its SIGTERM
        (uvicorn re-raises it once shut down), and its log has its lines."""
        config = tmp_path / "service.toml"
        config.write_text(f'[store]\npath = "{tmp_path / "s.db"}"\n')
        service = start_service(config, log=tmp_path / "service.log")
        try:
            assert httpx.get(service.url + "/healthz", timeout=5).status_code == 200
        finally:
            status = service.stop()
        assert status in (0, -15) and not service.killed
        assert "Application startup complete" in service.log_tail(100)

    def test_a_process_that_exits_before_it_is_ready_raises_with_its_log(
        self, tmp_path: Path
    ) -> None:
        """A command that ends at once raises ``RuntimeError`` naming its exit status and the
        end of its log."""
        script = "import sys; print('no port for me', file=sys.stderr); sys.exit(3)"
        with pytest.raises(RuntimeError, match=r"exited with 3(.|\n)*no port for me"):
            ServedProcess([sys.executable, "-c", script], log=tmp_path / "x.log")

    def test_a_process_not_ready_in_time_is_stopped_and_raises(self, tmp_path: Path) -> None:
        """A process that never listens is stopped once the wait's bound has passed, and the
        wait raises ``RuntimeError``."""
        pid_file = tmp_path / "pid"
        script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
        with pytest.raises(RuntimeError, match="not ready"):
            ServedProcess([sys.executable, "-c", script], ready=None, timeout=3.0)
        pid = int(pid_file.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone: stopped and reaped
