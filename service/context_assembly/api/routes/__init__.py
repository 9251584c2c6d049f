"""The HTTP routes, one module per resource; thin and typed: parse → call ``Preparations`` →
return a response model.

* ``prepare``: ``POST /v1/prepare`` and ``POST /v1/budget``;
* ``preparations``: ``/v1/preparations/{preparation_id}`` (read, validate, refresh, repair,
  usage, breakdown, timeline);
* ``models``: ``GET /v1/models``;
* ``admin``: ``POST /v1/admin/reload``;
* ``health``: ``/healthz``, ``/readyz``, ``/metrics``;
* ``dependencies``: the tenant, the service, the metrics and the bodies a route takes;
* ``problem_answers``, ``examples``, ``responses``: the error answers each route documents, the
  request examples, and the forms of an answer.
"""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter

from context_assembly.api.routes import admin, health, models, preparations, prepare

ROUTERS: Final[tuple[APIRouter, ...]] = (
    prepare.router,
    preparations.router,
    models.router,
    admin.router,
    health.router,
)
"""The routers in the order the app includes them (the order of the paths in the document)."""

__all__ = ["ROUTERS"]
