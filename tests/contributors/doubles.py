"""Test doubles for contributor tests: a recording resolver, the reference signing secret. (The
contributor double is ``context_assembly_client.testing.ScriptedContributor``.)"""

from __future__ import annotations

from collections.abc import Sequence

# The Standard Webhooks reference secret (libraries/python/tests/test_webhooks.py).
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class RecordingResolver:
    """A fake resolver with fixed answers per host; every call is recorded.

    ``later`` gives a host different answers on later calls (a DNS-rebinding name).
    """

    def __init__(
        self, answers: dict[str, Sequence[str]], later: dict[str, Sequence[str]] | None = None
    ) -> None:
        self.answers = answers
        self.later = later or {}
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        seen_before = any(h == host for h, _ in self.calls)
        self.calls.append((host, port))
        if seen_before and host in self.later:
            return self.later[host]
        if host not in self.answers:
            raise OSError("no such host")
        return self.answers[host]
