"""The interactive API documentation, served offline: ``/docs`` (Swagger UI) and ``/redoc``.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so they stay blank on a machine without
internet access. These pages are built by FastAPI's HTML helpers as usual, but their JavaScript,
CSS and favicon come from the files the ``fastapi-offline`` package ships, served by this app
under ``/docs-assets``. Every asset is same-origin; the pages need no key, like ``/openapi.json``.

Each page is sent with a Content-Security-Policy that allows what it needs and nothing else:
scripts from the service only (Swagger UI's inline start-up script by its hash), styles from the
service and inline (both bundles set styles from script), images from the service and ``data:``
(their icons), connections to the service only (the document, and Swagger UI's "Try it out"),
and ReDoc's search worker, which it starts from a ``blob:`` URL. ReDoc's bundle also compiles
JSON schemas into functions at run time (Ajv), so its page allows ``'unsafe-eval'``; Swagger UI's
does not. No frame may embed either page, and no form is sent from them.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib.resources import files
from pathlib import Path
from typing import Final

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

# What both pages allow beside their scripts (see the module doc).
_POLICY: Final = (
    "default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
REDOC_POLICY: Final = f"{_POLICY}; script-src 'self' 'unsafe-eval'; worker-src blob:"
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def swagger_policy(page: str) -> str:
    """The policy of the Swagger UI ``page``: scripts from the service, and its inline scripts
    by their SHA-256 (CSP Level 2 hash sources)."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"
        for script in _INLINE_SCRIPT.findall(page)
    )
    return f"{_POLICY}; script-src 'self' {hashes}".rstrip()


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
        page = get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
        )
        page.headers["content-security-policy"] = swagger_policy(bytes(page.body).decode())
        return page

    @app.get(REDOC_PATH, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = _prefix(request)
        page = get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,
        )
        page.headers["content-security-policy"] = REDOC_POLICY
        return page
