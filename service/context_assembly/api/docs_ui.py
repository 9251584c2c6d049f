"""The interactive API documentation, served offline: ``/docs`` (Swagger UI) and ``/redoc``.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so they stay blank on a machine without
internet access. These pages are built by FastAPI's HTML helpers as usual, but their JavaScript,
CSS and favicon come from the files the ``fastapi-offline`` package ships, served by this app
under ``/docs-assets``. Every asset is same-origin; the pages need no key, like ``/openapi.json``.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
ASSETS_PATH = "/docs-assets"
# The assets directory inside the installed fastapi-offline package: swagger-ui-bundle.js,
# swagger-ui.css, redoc.standalone.js and favicon.png.
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))
# Swagger UI would otherwise send the document to an online validator for its badge.
SWAGGER_UI_PARAMETERS = {"validatorUrl": None}


def install_docs_ui(app: FastAPI) -> None:
    """Add ``/docs``, ``/redoc`` and their assets to ``app`` (created with ``docs_url=None`` and
    ``redoc_url=None``, so that FastAPI adds no CDN pages of its own)."""
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    def _prefix(request: Request) -> str:
        # Behind a proxy that mounts the service under a path, the assets are under it too.
        return str(request.scope.get("root_path", ""))

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = _prefix(request)
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
        )

    @app.get(REDOC_PATH, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = _prefix(request)
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,
        )
