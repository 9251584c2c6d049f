"""Whether a tool's parameters schema is strict-compatible (docs/api.md, "Tools").

A provider that enforces a strict tool (OpenAI ``strict: true``, Anthropic ``strict: true``)
accepts only schemas where every object closes its properties and requires them all: the model
then always answers every argument and nothing else. The rules checked here, at every object of
the schema (``properties``, ``items``, ``anyOf``, ``$defs`` and ``definitions`` are followed):

- the root is an object schema (``"type": "object"``);
- an object schema has ``"additionalProperties": false``;
- an object schema lists every key of ``properties`` in ``required``.

An optional argument is written as a required one whose type admits ``null``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def strict_problems(schema: dict[str, Any]) -> Iterator[str]:
    """The rules ``schema`` breaks, each naming where (``parameters`` is the root)."""
    if schema.get("type") != "object":
        yield "parameters: the root must be an object schema ('type': 'object')"
        return
    yield from _walk(schema, "parameters")


def _walk(schema: Any, path: str) -> Iterator[str]:
    if not isinstance(schema, dict):
        return
    types = schema.get("type")
    if types == "object" or (isinstance(types, list) and "object" in types):
        if schema.get("additionalProperties") is not False:
            yield f"{path}: an object must set 'additionalProperties': false"
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            properties = {}
        keys = list(properties)
        required = schema.get("required")
        missing = [key for key in keys if not isinstance(required, list) or key not in required]
        if missing:
            yield f"{path}: every property must be listed in 'required' (missing {missing})"
        for key in keys:
            yield from _walk(properties[key], f"{path}.properties.{key}")
    items = schema.get("items")
    if isinstance(items, dict):
        yield from _walk(items, f"{path}.items")
    for index, option in enumerate(schema.get("anyOf") or ()):
        yield from _walk(option, f"{path}.anyOf[{index}]")
    for group in ("$defs", "definitions"):
        defined = schema.get(group)
        if isinstance(defined, dict):
            for name, sub in defined.items():
                yield from _walk(sub, f"{path}.{group}.{name}")
