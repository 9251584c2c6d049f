"""The HTTP layer: ``create_app(settings)``, routes, problem+json mapping, authentication."""

from context_assembly.api.app import create_app

__all__ = ["create_app"]
