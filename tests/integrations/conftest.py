"""Fixtures of the runtime adapter tests: one real ``context-assembly serve`` process for the
whole directory (default configuration, a temporary SQLite file), and addresses that fail."""

from integration_support import closed_url, failing_url, service, silent_url, summarizer

__all__ = ["closed_url", "failing_url", "service", "silent_url", "summarizer"]
