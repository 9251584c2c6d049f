"""How a route answers: a response model serialised once (:func:`json_response`), and the form
of a page negotiated by the ``Accept`` header (JSON, HTML or plain text)."""

from __future__ import annotations

from fastapi.responses import Response
from pydantic import BaseModel

from context_assembly.api.pages import POLICY


def json_response(model: BaseModel) -> Response:
    """The answer of a response model, serialised once, in pydantic-core.

    Returning the model would make FastAPI dump it to Python objects, validate those against the
    response model again and serialise them. The route keeps ``response_model`` for the OpenAPI
    document; the values are built by the core and the models are already validated.
    """
    return Response(model.model_dump_json(), media_type="application/json")


HTML_TYPES = ("text/html", "application/xhtml+xml")
# The headers of the HTML pages (``pages.POLICY``).
PAGE_HEADERS = {"content-security-policy": POLICY}


def wants_json(accept: str) -> bool:
    """Whether an ``Accept`` header prefers JSON to HTML and plain text (a tie answers text)."""
    html, text, json = _qualities(accept)
    return json > 0 and json > max(html, text)


def wants_html(accept: str) -> bool:
    """Whether an ``Accept`` header prefers HTML to plain text (RFC 9110 §12.5.1): the highest
    quality wins, ``q=0`` refuses, media types are case-insensitive, and a tie (``*/*`` or
    none) answers plain text, the form a terminal or script reads."""
    html, text, _ = _qualities(accept)
    return html > 0 and html > text


def _qualities(accept: str) -> tuple[float, float, float]:
    """The highest quality an ``Accept`` header gives HTML, plain text and JSON."""
    html = text = json = 0.0
    for item in accept.split(","):
        media, *params = (part.strip() for part in item.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        media = media.lower()
        if media in HTML_TYPES:
            html = max(html, quality)
        elif media in {"text/plain", "text/*"}:
            text = max(text, quality)
        elif media == "application/json":
            json = max(json, quality)
    return html, text, json
