"""Fixtures of the in-process HTTP tests (the helpers live in ``api_support``)."""

from api_support import make_client

__all__ = ["make_client"]
