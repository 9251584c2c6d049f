"""``python -m context_assembly.api.openapi_export FILE``: write the OpenAPI document (``make openapi``)."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

from context_assembly.api.app import openapi_document


def render() -> bytes:
    """The committed form: sorted keys, two-space indent, trailing newline."""
    return (
        orjson.dumps(openapi_document(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    )


def main() -> int:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "openapi/openapi.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
