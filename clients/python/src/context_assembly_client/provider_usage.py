"""Turn a provider SDK's response into the ``(provider, usage)`` pair ``report_usage`` takes.

The service wants the provider's usage object **as received** and normalises it itself
(docs/contract.md, "Accounting"), so these helpers only find the object and make it plain JSON data; they never rename or
compute a field. Each accepts the SDK's response object, the response as a dict (the REST JSON),
or the usage object itself::

    provider, usage = usage_from_openai(completion)
    client.report_usage(prep.preparation_id, report_id=completion.id, provider=provider, usage=usage)

Where the usage lives:

- OpenAI (Chat Completions and Responses): ``response.usage``.
- Anthropic Messages: ``message.usage``.
- Gemini: ``response.usage_metadata`` (google-genai SDK, snake_case fields) or
  ``usageMetadata`` (REST JSON, camelCase); the service reads both spellings.

SDK objects are converted with ``model_dump()`` (pydantic, as in the openai, anthropic and
google-genai SDKs) or ``to_dict()`` when they have one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["usage_from_anthropic", "usage_from_gemini", "usage_from_openai"]

_MISSING = object()


def _plain(value: Any) -> Any:
    """JSON-like data of ``value``: mappings and sequences walked, SDK objects dumped."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            dumped = dump(mode="json")  # pydantic v2: enums and dates become JSON values
        except TypeError:  # a pydantic-like object without ``mode``
            dumped = dump()
        return _plain(dumped)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return _plain(to_dict())
    raise TypeError(f"cannot read usage from a {type(value).__name__}")


def _member(container: Any, name: str) -> Any:
    if isinstance(container, Mapping):
        return container.get(name, _MISSING)
    return getattr(container, name, _MISSING)


def _find(
    response: Any, wrappers: tuple[str, ...], own_keys: frozenset[str], provider: str
) -> dict[str, Any]:
    """The usage object of ``response``: under one of ``wrappers``, or ``response`` itself when
    it already is a usage object (it has one of ``own_keys``)."""
    for name in wrappers:
        found = _member(response, name)
        if found is _MISSING:
            continue
        if found is None:
            raise ValueError(f"the {provider} response carries no usage ({name} is None)")
        usage = _plain(found)
        if not isinstance(usage, dict):
            raise TypeError(f"{provider} {name} is not an object")
        return usage
    plain = _plain(response)
    if isinstance(plain, dict) and own_keys.intersection(plain):
        return plain
    raise ValueError(f"no {provider} usage found in a {type(response).__name__}")


def usage_from_openai(response: Any) -> tuple[Literal["openai"], dict[str, Any]]:
    """``("openai", usage)`` from a Chat Completions or Responses response (object or dict).

    Raises:
        ValueError: when the response has no usage (a streaming chunk without ``usage``).
    """
    keys = frozenset({"prompt_tokens", "completion_tokens", "input_tokens", "output_tokens"})
    return "openai", _find(response, ("usage",), keys, "OpenAI")


def usage_from_anthropic(message: Any) -> tuple[Literal["anthropic"], dict[str, Any]]:
    """``("anthropic", usage)`` from a Messages response (object or dict).

    Raises:
        ValueError: when the message has no usage.
    """
    keys = frozenset({"input_tokens", "output_tokens", "cache_read_input_tokens"})
    return "anthropic", _find(message, ("usage",), keys, "Anthropic")


def usage_from_gemini(response: Any) -> tuple[Literal["google"], dict[str, Any]]:
    """``("google", usage_metadata)`` from a Gemini ``generateContent`` response (object or dict).

    Raises:
        ValueError: when the response has no usage metadata.
    """
    keys = frozenset(
        {"promptTokenCount", "prompt_token_count", "candidatesTokenCount", "candidates_token_count"}
    )
    return "google", _find(response, ("usage_metadata", "usageMetadata"), keys, "Gemini")
