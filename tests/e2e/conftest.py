"""Fixtures of the end-to-end tests (the helpers live in ``e2e_support``)."""

from e2e_support import contributor, service_factory

__all__ = ["contributor", "service_factory"]
