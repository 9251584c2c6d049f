"""Fixtures of the client tests (the helpers live in ``client_support``)."""

from client_support import aclient, app, client

__all__ = ["aclient", "app", "client"]
