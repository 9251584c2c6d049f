"""Turning pydantic validation errors into one clear ``CONTEXT_ASSEMBLY_INVALID`` problem."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from context_assembly.errors import InvalidError

M = TypeVar("M", bound=BaseModel)


# Location parts pydantic adds for the branch of a union it tried ("str", "list[...]",
# "function-after[...]"): they name types, not fields, so the path a client sees leaves them out.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _loc(loc: Sequence[Any]) -> str:
    parts = [
        str(part)
        for part in loc
        if not (isinstance(part, str) and (part in _TYPE_TAGS or "[" in part))
    ]
    return ".".join(parts) or "(body)"


def invalid_from_errors(errors: Sequence[Any], what: str = "request") -> InvalidError:
    """One InvalidError naming every offending field (never echoing the offending values)."""
    items = [
        {
            "loc": _loc(err.get("loc", ())),
            "msg": str(err.get("msg", "invalid")),
            "type": err.get("type"),
        }
        for err in errors
    ]
    # A value of the right shape that cannot be encoded again says more than the type errors
    # of the other branches of the same union (``str``, say), which pydantic lists first.
    named = [item for item in items if item["type"] == "json_encodable"]
    first = (named or items or [{"loc": "(body)", "msg": "invalid"}])[0]
    more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
    return InvalidError(f"invalid {what}: {first['loc']}: {first['msg']}{more}", errors=items)


def parse_model(model: type[M], raw: bytes, what: str = "request") -> M:
    """Parse JSON bytes into ``model``; any problem becomes an InvalidError naming the field.

    The bytes go to ``model_validate_json``, as the HTTP routes' do (``api/bodies.py``), so the
    CLI and the service read one body the same way: the same numbers (an integer beyond 64 bits
    stays an integer and is refused where it must encode again, not read as a float), the same
    refusals, the same field names."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as err:
        raise invalid_from_errors(err.errors(include_url=False, include_input=False), what) from err
