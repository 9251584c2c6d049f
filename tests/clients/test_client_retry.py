"""The retry policy (pure functions as tables, and what the clients repeat, counted on a mock
transport) and how requests are built."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import httpx
import orjson
import pytest
from context_assembly_client import (
    APIConnectionError,
    APITimeoutError,
    AsyncClient,
    Client,
    InternalServerError,
    StoreUnavailableError,
)
from context_assembly_client._retry import parse_retry_after, retry_delay, should_retry
from context_assembly_client.types import PrepareRequest, Scope

NOW = 1_800_000_000.0
STORE_DOWN = {
    "type": "urn:context-assembly:problem:store-unavailable",
    "title": "Store unavailable",
    "status": 503,
    "detail": "store down",
    "code": "STORE_UNAVAILABLE",
}
HEALTH = {"status": "ok"}
USAGE_ARGS = {"report_id": "r1", "provider": "normalized", "usage": {"output_tokens": 1}}


class TestShouldRetry:
    @pytest.mark.parametrize(
        ("retry_safe", "done", "status", "expected"),
        [
            (True, 0, None, True),
            (True, 0, 502, True),
            (True, 0, 503, True),
            (True, 1, 504, True),
            (True, 2, 503, False),
            (True, 0, 500, False),
            (True, 0, 409, False),
            (True, 0, 429, False),
            (True, 0, 200, False),
            (False, 0, None, False),
            (False, 0, 503, False),
        ],
    )
    def test_table(self, retry_safe: bool, done: int, status: int | None, expected: bool) -> None:
        """Only retry-safe calls with retries left that got no answer or a 502/503/504 are retried."""
        assert (
            should_retry(
                retry_safe=retry_safe, retries_done=done, max_retries=2, status_code=status
            )
            is expected
        )


class TestRetryDelay:
    @pytest.mark.parametrize(
        ("done", "expected"), [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]
    )
    def test_backoff_doubles_and_is_capped(self, done: int, expected: float) -> None:
        """Without jitter the delay is 0.5·2ⁿ seconds, capped at 8."""
        assert retry_delay(done, rand=lambda: 0.0) == expected

    def test_jitter_takes_off_at_most_a_quarter(self) -> None:
        """Full jitter shortens the delay by 25 %, never more."""
        assert retry_delay(2, rand=lambda: 1.0) == pytest.approx(1.5)

    @pytest.mark.parametrize(
        ("headers", "expected"),
        [
            ({"retry-after": "3"}, 3.0),
            ({"Retry-After": "1.5"}, 1.5),
            ({"retry-after-ms": "250"}, 0.25),
            ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
            (
                {"retry-after": format_datetime(datetime.fromtimestamp(NOW + 4, UTC), usegmt=True)},
                4.0,
            ),
            ({"retry-after": "0"}, 1.0),
            ({"retry-after": "-2"}, 1.0),
            ({"retry-after": "61"}, 1.0),
            ({"retry-after": "soon"}, 1.0),
            ({}, 1.0),
        ],
    )
    def test_retry_after_is_obeyed_only_when_sensible(
        self, headers: dict[str, str], expected: float
    ) -> None:
        """A Retry-After in (0, 60] s wins over backoff; anything else falls back to backoff (1 s here)."""
        delay = retry_delay(1, headers, rand=lambda: 0.0, now=lambda: NOW)
        assert delay == pytest.approx(expected)

    def test_unparseable_retry_after_is_absent(self) -> None:
        """Garbage in Retry-After or retry-after-ms reads as no header."""
        assert parse_retry_after({"retry-after": "later", "retry-after-ms": "x"}) is None


class Counter:
    """A mock transport handler that counts requests and answers from a script."""

    def __init__(self, *answers: httpx.Response | type[Exception]) -> None:
        self.answers = list(answers)
        self.calls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(f"{request.method} {request.url.path}")
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, type):
            raise answer("scripted failure", request=request)  # type: ignore[call-arg]
        return answer


def store_down() -> httpx.Response:
    return httpx.Response(
        503, json=STORE_DOWN, headers={"content-type": "application/problem+json"}
    )


def instant(client: Client | AsyncClient) -> None:
    """No waiting between retries in these tests (the delay itself is tested above)."""
    client._retry_delay = lambda *_: 0.0  # type: ignore[method-assign]


def sync_client(counter: Counter) -> Client:
    client = Client(
        "http://ca.test", http_client=httpx.Client(transport=httpx.MockTransport(counter))
    )
    instant(client)
    return client


def async_client(counter: Counter) -> AsyncClient:
    transport = httpx.MockTransport(counter)
    client = AsyncClient("http://ca.test", http_client=httpx.AsyncClient(transport=transport))
    instant(client)
    return client


class TestWhatIsRetried:
    def test_post_prepare_is_never_retried(self) -> None:
        """A 503 on prepare is raised after one request: a POST that runs contributors is not repeated."""
        counter = Counter(store_down())
        with pytest.raises(StoreUnavailableError):
            sync_client(counter).prepare({"model": "gpt-4o-mini"})
        assert counter.calls == ["POST /v1/prepare"]

    def test_post_prepare_connection_error_is_not_retried(self) -> None:
        """A connection error on prepare is raised as APIConnectionError after one attempt."""
        counter = Counter(httpx.ConnectError)
        with pytest.raises(APIConnectionError) as caught:
            sync_client(counter).prepare({"model": "gpt-4o-mini"})
        assert not isinstance(caught.value, APITimeoutError)
        assert len(counter.calls) == 1

    def test_get_is_retried_up_to_max_retries(self) -> None:
        """A GET answered 503 every time is sent 1 + max_retries times, then raised."""
        counter = Counter(store_down())
        with pytest.raises(StoreUnavailableError):
            sync_client(counter).get_preparation("prep_1")
        assert counter.calls == ["GET /v1/preparations/prep_1"] * 3

    def test_get_succeeds_after_transient_failures(self) -> None:
        """A GET that fails with a timeout, then a 502, then answers, returns the answer."""
        counter = Counter(httpx.ReadTimeout, httpx.Response(502), httpx.Response(200, json=HEALTH))
        assert sync_client(counter).health().status == "ok"
        assert len(counter.calls) == 3

    def test_timeouts_end_in_api_timeout_error(self) -> None:
        """A GET that keeps timing out raises APITimeoutError after its retries."""
        counter = Counter(httpx.ReadTimeout)
        with pytest.raises(APITimeoutError):
            sync_client(counter).models()
        assert len(counter.calls) == 3

    def test_500_is_not_retried(self) -> None:
        """A 500 is a bug, not a blip: even a GET is not repeated, and it raises InternalServerError."""
        counter = Counter(httpx.Response(500, text="boom"))
        with pytest.raises(InternalServerError):
            sync_client(counter).models()
        assert len(counter.calls) == 1

    def test_max_retries_zero_disables_retries(self) -> None:
        """max_retries=0 sends every call once."""
        counter = Counter(store_down())
        client = Client(
            "http://ca.test",
            max_retries=0,
            http_client=httpx.Client(transport=httpx.MockTransport(counter)),
        )
        with pytest.raises(StoreUnavailableError):
            client.get_preparation("prep_1")
        assert len(counter.calls) == 1

    async def test_async_post_is_not_retried_but_get_and_usage_are(self) -> None:
        """The async twin: prepare, validate and refresh once each; get and report_usage three times each."""
        counter = Counter(store_down())
        client = async_client(counter)
        for call in (
            client.prepare({"model": "m"}),
            client.validate("prep_1", model="m", frame={}),
            client.refresh("prep_1", {"model": "m"}),
            client.repair("prep_1", model="m", instructions="", frame={}, answer="a"),
        ):
            with pytest.raises(StoreUnavailableError):
                await call
        assert len(counter.calls) == 4
        counter.calls.clear()
        with pytest.raises(StoreUnavailableError):
            await client.get_preparation("prep_1")
        with pytest.raises(StoreUnavailableError):
            await client.report_usage("prep_1", **USAGE_ARGS)  # type: ignore[arg-type]
        assert (
            counter.calls
            == ["GET /v1/preparations/prep_1"] * 3 + ["POST /v1/preparations/prep_1/usage"] * 3
        )
        await client.aclose()


class TestRequestBuilding:
    def test_per_call_timeout_reaches_the_request(self) -> None:
        """A per-call timeout overrides the client's on that request only."""
        seen: list[dict[str, float | None]] = []

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(request.extensions["timeout"])
            return httpx.Response(200, json=HEALTH)

        client = Client(
            "http://ca.test",
            timeout=7.0,
            http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        )
        client.health(timeout=0.25)
        client.health()
        assert seen[0]["read"] == 0.25
        assert seen[1]["read"] == 7.0

    def test_headers_and_path_escaping(self) -> None:
        """The key goes out as a bearer token and a preparation id is escaped into one path segment."""
        seen: list[httpx.Request] = []

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(200, text="view")

        client = Client(
            "http://ca.test/base/",
            api_key="k1",
            http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        )
        assert client.breakdown("a/b c", html=True) == "view"
        request = seen[0]
        assert request.headers["authorization"] == "Bearer k1"
        assert request.headers["accept"] == "text/html"
        assert request.url.raw_path == b"/base/v1/preparations/a%2Fb%20c/breakdown"

    def test_models_send_only_the_fields_that_were_set(self) -> None:
        """A typed request sends only what the caller set, so the server's defaults apply to the rest."""
        bodies: list[bytes] = []

        def handler(request: httpx.Request) -> httpx.Response:
            bodies.append(request.content)
            return httpx.Response(503)

        client = Client(
            "http://ca.test",
            max_retries=0,
            http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        )
        request = PrepareRequest(model="m", scope=Scope(account_id="a"), input=[{"role": "user"}])
        with pytest.raises(InternalServerError):
            client.prepare(request)
        assert orjson.loads(bodies[0]) == {
            "model": "m",
            "scope": {"account_id": "a"},
            "input": [{"role": "user"}],
        }
