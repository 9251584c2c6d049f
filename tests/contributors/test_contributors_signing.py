"""Standard Webhooks signing of outbound calls, checked with the reference library's verifier."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from doubles import SECRET
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from context_assembly.contributors import sign_headers, validate_secret, webhook_id
from hypothesis_budget import examples


def test_known_vector_matches_the_reference_library() -> None:
    """The published Standard Webhooks test vector signs to the published signature."""
    headers = sign_headers(
        SECRET,
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        b'{"test": 2432232314}',
        now=datetime.fromtimestamp(1614265330, UTC),
    )
    assert headers == {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }


def test_non_utc_timestamps_sign_the_same_instant() -> None:
    """An aware timestamp in another zone gives the same header as its UTC equivalent."""
    instant = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    other_zone = instant.astimezone(timezone(timedelta(hours=5, minutes=30)))
    a = sign_headers(SECRET, "msg_1", b"{}", now=instant)
    b = sign_headers(SECRET, "msg_1", b"{}", now=other_zone)
    assert a == b
    assert a["webhook-timestamp"] == str(int(instant.timestamp()))


def test_headers_verify_with_an_independent_verifier() -> None:
    """What we send verifies with standardwebhooks.Webhook(secret).verify over the same bytes."""
    body = '{"type":"contribute","text":"naïve ✓"}'.encode()
    headers = sign_headers(SECRET, webhook_id("prep_1", "memory", "contribute", 1), body)
    assert Webhook(SECRET).verify(body, headers) == {"type": "contribute", "text": "naïve ✓"}


def test_without_a_secret_only_the_id_is_sent() -> None:
    """A contributor without a secret still gets a webhook-id, but no signature headers."""
    assert sign_headers(None, "msg_x", b"{}") == {"webhook-id": "msg_x"}
    assert sign_headers([], "msg_x", b"{}") == {"webhook-id": "msg_x"}


def test_two_secrets_give_two_signatures_each_verifying_alone() -> None:
    """During rotation both secrets sign, and either secret alone verifies the delivery."""
    other = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3"
    headers = sign_headers([SECRET, other], "msg_rot", b"{}")
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(SECRET).verify(b"{}", headers)
    Webhook(other).verify(b"{}", headers)


def test_stale_timestamps_do_not_verify() -> None:
    """A signature more than five minutes old is refused by the receiver's tolerance."""
    headers = sign_headers(SECRET, "msg_old", b"{}", now=datetime.now(UTC) - timedelta(seconds=301))
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(SECRET).verify(b"{}", headers)


def test_webhook_id_is_stable_per_delivery_and_distinct_across_deliveries() -> None:
    """Same (preparation, source, call, attempt) gives the same id; changing any part changes it."""
    base = webhook_id("prep_1", "memory", "contribute", 1)
    assert base == webhook_id("prep_1", "memory", "contribute", 1)
    others = {
        webhook_id("prep_2", "memory", "contribute", 1),
        webhook_id("prep_1", "tasks", "contribute", 1),
        webhook_id("prep_1", "memory", "revision", 1),
        webhook_id("prep_1", "memory", "contribute", 2),
    }
    assert base not in others and len(others) == 4
    assert base.startswith("msg_") and "." not in base


@pytest.mark.parametrize("secret", ["", "whsec_", "not base64 !!!", "whsec_@@@@"])
def test_unusable_secrets_fail_fast(secret: str) -> None:
    """A secret that the library cannot decode is a configuration error."""
    with pytest.raises(ValueError, match="whsec_"):
        validate_secret(secret)


@settings(max_examples=examples(300), deadline=None)
@given(
    body=st.binary(min_size=1, max_size=64).filter(lambda b: b.isascii()), flip=st.integers(0, 63)
)
def test_any_flipped_body_byte_fails_verification(body: bytes, flip: int) -> None:
    """Changing one byte of the signed body makes the signature fail to verify."""
    headers = sign_headers(SECRET, "msg_h", body)
    index = flip % len(body)
    tampered = body[:index] + bytes([(body[index] + 1) % 128]) + body[index + 1 :]
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(tampered, headers, json_parse=False)
