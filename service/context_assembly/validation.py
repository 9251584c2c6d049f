"""Turning pydantic validation errors into one clear ``CONTEXT_ASSEMBLY_INVALID`` problem.

A member the model does not have (``extra_forbidden``) is named with the nearest member the
model has at that place, when one is near enough: ``instuctions: Extra inputs are not
permitted; did you mean 'instructions'?``. The configuration's unknown keys are named the same
way (:func:`nearest`).
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from context_assembly.errors import InvalidError

M = TypeVar("M", bound=BaseModel)


def nearest(word: str, valid: Iterable[str]) -> str | None:
    """The name of ``valid`` nearest to ``word`` (a misspelling of it), or ``None`` when none is
    near enough (``difflib``'s ratio of at least 0.6)."""
    found = difflib.get_close_matches(word, list(valid), n=1)
    return found[0] if found else None


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


def _members(tp: Any) -> list[Any]:
    """The types a value of annotation ``tp`` may have: a union's members, ``Annotated``
    unwrapped."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _members(get_args(tp)[0])
    if origin is Union or origin is types.UnionType:
        return [member for arg in get_args(tp) for member in _members(arg)]
    return [tp]


def _models(candidates: Iterable[Any]) -> list[type[BaseModel]]:
    return [tp for tp in candidates if isinstance(tp, type) and issubclass(tp, BaseModel)]


def _wire_names(model: type[BaseModel]) -> dict[str, Any]:
    """A model's members as a body names them (the alias, when a field has one), with each
    one's annotation."""
    names: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
        names[alias or name] = info.annotation
    return names


def _tags(model: type[BaseModel]) -> set[str]:
    """The values of a model's ``Literal`` members: the tags a discriminated union knows it by."""
    return {
        str(value)
        for info in model.model_fields.values()
        if get_origin(info.annotation) is Literal
        for value in get_args(info.annotation)
    }


def _step(candidates: list[Any], part: Any) -> list[Any]:
    """The types at ``part`` below a value of one of ``candidates`` (pydantic's location parts:
    a member, a list index, a mapping key, or the tag of the union member it tried)."""
    if isinstance(part, int):
        inner: list[Any] = []
        for tp in candidates:
            args = get_args(tp)
            if get_origin(tp) in (list, tuple, set, frozenset) and args:
                inner += _members(args[0])
            elif get_origin(tp) is dict and len(args) == 2:
                inner += _members(args[1])
        return inner
    if part in _TYPE_TAGS or "[" in str(part):
        return candidates  # a union member's type tag: the same value, tried as one member
    models = _models(candidates)
    if len(models) > 1:  # the tag of the member tried: its class name or its literal tag
        tagged = [m for m in models if m.__name__ == part or part in _tags(m)]
        if tagged:
            return tagged
    found: list[Any] = []
    for model in models:
        annotation = _wire_names(model).get(part)
        if annotation is not None:
            found += _members(annotation)
    for tp in candidates:
        args = get_args(tp)
        if get_origin(tp) is dict and len(args) == 2:
            found += _members(args[1])
    return found


def _did_you_mean(model: type[BaseModel], loc: Sequence[Any]) -> str | None:
    """For an unknown member at ``loc`` in a body of ``model``: the nearest member that the
    model has at that place, when the place is known and one is near enough."""
    if not loc or not isinstance(loc[-1], str):
        return None
    candidates: list[Any] = [model]
    for part in loc[:-1]:
        candidates = _step(candidates, part)
        if not candidates:
            return None
    valid = [name for found in _models(candidates) for name in _wire_names(found)]
    return nearest(loc[-1], valid)


def _meant(err: Any, model: type[BaseModel] | None) -> str | None:
    """The member an unknown one of ``err`` was meant to be, when ``model`` tells."""
    if model is None or err.get("type") != "extra_forbidden":
        return None
    return _did_you_mean(model, tuple(err.get("loc", ())))


def invalid_from_errors(
    errors: Sequence[Any], what: str = "request", model: type[BaseModel] | None = None
) -> InvalidError:
    """One InvalidError naming every offending field (never echoing the offending values).

    With ``model`` (the body's), an unknown member is named with the nearest member the model
    has at that place, and such an error is the one the detail names first.
    """
    items: list[dict[str, Any]] = []
    hinted: list[dict[str, Any]] = []
    for err in errors:
        msg = str(err.get("msg", "invalid"))
        meant = _meant(err, model)
        if meant is not None:
            msg += f"; did you mean {meant!r}?"
        items.append({"loc": _loc(err.get("loc", ())), "msg": msg, "type": err.get("type")})
        if meant is not None:
            hinted.append(items[-1])
    # A value of the right shape that cannot be encoded again says more than the type errors
    # of the other branches of the same union (``str``, say), which pydantic lists first; a
    # misspelt member says more than what its absence made missing.
    named = [item for item in items if item["type"] == "json_encodable"] or hinted
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
        errors = err.errors(include_url=False, include_input=False)
        raise invalid_from_errors(errors, what, model) from err
