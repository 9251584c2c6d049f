"""``POST /v1/admin/reload``: the configuration file reloaded, behind the admin key."""

from __future__ import annotations

import hashlib
import hmac

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from context_assembly.api.reload import reload_settings
from context_assembly.api.routes.problem_answers import problems
from context_assembly.config import Settings
from context_assembly.core.request import wire_schema
from context_assembly.errors import InvalidError, NotFoundError, UnauthenticatedError

router = APIRouter(prefix="/v1")


class ReloadAnswer(BaseModel):
    """The configuration file was reloaded."""

    model_config = ConfigDict(json_schema_extra=wire_schema)
    reloaded: bool = Field(description="Always `true` (a refused reload is `422`).")
    errors: list[dict[str, str]] = Field(description="Always empty.")


@router.post(
    "/admin/reload",
    response_model=ReloadAnswer,
    responses=problems(
        401,
        404,
        422,
        s401="`UNAUTHENTICATED`: a valid `X-Admin-Key` is required.",
        s404="`NOT_FOUND`: no admin key is configured, or the service runs without a "
        "configuration file.",
        s422="`CONTEXT_ASSEMBLY_INVALID`: the new configuration was refused and the running one "
        "is unchanged; `errors` names the fields.",
    ),
    name="reload_config",
    tags=["Operations"],
    summary="Reload the configuration file",
    response_description="The new configuration is in force.",
)
async def reload_config(request: Request) -> ReloadAnswer:
    """Reload the configuration file (keys, contributors, allowlist, limits); admin key required.

    Answers 404 when no admin key is configured or the service runs without a config file; a
    refused reload is 422 CONTEXT_ASSEMBLY_INVALID naming the fields, and changes nothing.
    """
    settings: Settings = request.app.state.settings
    expected = settings.auth.admin_key_sha256
    path = request.app.state.config_path
    if expected is None or path is None:
        raise NotFoundError("no such resource")
    given = request.headers.get("x-admin-key", "")
    if not hmac.compare_digest(hashlib.sha256(given.encode()).hexdigest(), expected.lower()):
        raise UnauthenticatedError("a valid X-Admin-Key is required")
    result = reload_settings(request.app, path)
    if not result.reloaded:
        raise InvalidError(
            "the new configuration was refused; the running one is unchanged", errors=result.errors
        )
    return ReloadAnswer(reloaded=True, errors=[])
