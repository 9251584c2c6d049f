"""API-key authentication: a key's sha256 maps to a tenant (keys are never stored in clear)."""

from __future__ import annotations

import hashlib
import hmac

from starlette.requests import Request

from context_assembly.config import AuthSettings
from context_assembly.errors import UnauthenticatedError

ANONYMOUS_TENANT = "default"


class Authenticator:
    """Resolves the tenant of a request from ``Authorization: Bearer <key>`` or ``X-API-Key``."""

    def __init__(self, settings: AuthSettings) -> None:
        self.mode = settings.mode
        self._keys = [(k.key_sha256, k.tenant) for k in settings.keys]

    def tenant(self, request: Request) -> str:
        if self.mode == "none":
            return ANONYMOUS_TENANT
        key = request.headers.get("x-api-key", "").strip()
        if not key:  # an empty X-API-Key does not hide a Bearer key
            scheme, _, value = request.headers.get("authorization", "").partition(" ")
            key = value.strip() if scheme.lower() == "bearer" else ""
        if not key:
            raise UnauthenticatedError("an API key is required (Authorization: Bearer <key>)")
        digest = hashlib.sha256(key.encode()).hexdigest()
        found = None
        for known, tenant in self._keys:
            # Compare every entry in constant time so timing does not reveal which prefix matched.
            if hmac.compare_digest(digest, known):
                found = tenant
        if found is None:
            raise UnauthenticatedError("the API key is not valid")
        return found
