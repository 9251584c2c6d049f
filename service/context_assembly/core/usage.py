"""Provider usage normalisation and the accounting observation (docs/contract.md, "Accounting").

The host posts the provider's usage object exactly as received; this module turns it into four
numbers with one meaning across providers:

``provider_input_tokens``
    Every input token the provider processed for the call, cached or not. This is the number that
    is comparable with the service's estimate of the frame.
``cached_input_tokens``
    The part of the input read from the provider's prompt cache.
``cache_creation_input_tokens``
    The part of the input written to the provider's prompt cache.
``output_tokens``
    Generated tokens, reasoning/thinking included (that is how all three providers bill them).

Rules shared by every shape:

- A field the provider did not send (absent, or JSON ``null``) becomes ``None``; an actual ``0``
  stays ``0``. Nothing is guessed.
- Counts must be JSON integers ≥ 0. Booleans, floats (even ``3.0``), strings and negative numbers
  are refused with :class:`~context_assembly.errors.InvalidError` whose ``field`` extension names
  the offending path (for example ``usage.prompt_tokens_details.cached_tokens``). A nested object
  of the wrong type (``"prompt_tokens_details": 5``) is refused the same way.
- Every count, and every sum this module forms, is at most ``MAX_COUNT`` (2^53 − 1, the largest
  integer every JSON client reads exactly); a larger one is refused the same way.
- The cached and cache-creation parts of the input cannot exceed the input they are part of
  (together): a report saying so is refused, naming the part, rather than stored as a negative
  uncached input.
- Fields this module does not read (``total_tokens``, modality breakdowns, ...) are ignored, so a
  provider adding fields never breaks a report.

Per-provider rules (each links its source below, next to the code that encodes it):

=========== =============================================== ==========================================
provider    provider_input_tokens                           cached / cache creation / output
=========== =============================================== ==========================================
openai      Chat ``prompt_tokens`` or Responses             ``*_details.cached_tokens`` /
            ``input_tokens``: already include cached tokens ``*_details.cache_write_tokens`` /
                                                            ``completion_tokens`` or ``output_tokens``
anthropic   ``input_tokens + cache_read_input_tokens +      ``cache_read_input_tokens`` /
            cache_creation_input_tokens`` (``input_tokens`` ``cache_creation_input_tokens`` /
            excludes both cache parts)                      ``output_tokens``
google      ``promptTokenCount`` (includes cached content)  ``cachedContentTokenCount`` / always
                                                            ``None`` / ``candidates + thoughts``
normalized  the four field names as given                   the four field names as given
=========== =============================================== ==========================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from context_assembly.core.request import Frozen
from context_assembly.errors import InvalidError

Provider = Literal["openai", "anthropic", "google", "normalized"]
CallKind = Literal["main", "wrap_up", "repair"]

# The largest count accepted (2^53 - 1): every JSON client reads it exactly, and no sum of a few
# of them overflows a 64-bit integer where the record is stored.
MAX_COUNT = 2**53 - 1

NORMALIZED_FIELDS = (
    "provider_input_tokens",
    "cached_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
)


class NormalizedUsage(Frozen):
    """One provider usage report in provider-independent terms; ``None`` means "not reported"."""

    provider_input_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    output_tokens: int | None = None


# --------------------------------------------------------------------------- field readers


def _invalid(path: str, what: str) -> InvalidError:
    return InvalidError(f"{path} {what}", field=path)


def _object(value: object, path: str) -> Mapping[str, Any] | None:
    """A nested usage object, ``None`` when absent or ``null``; anything else is refused."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _invalid(path, "must be an object")
    return value


def _count(obj: Mapping[str, Any], key: str, path: str) -> int | None:
    """A token count: ``None`` when absent or ``null``, else a non-negative JSON integer."""
    value = obj.get(key)
    if value is None:
        return None
    # ``type(...) is int`` on purpose: ``bool`` is a subclass of ``int`` and must be refused.
    if type(value) is not int:
        raise _invalid(f"{path}.{key}", "must be a non-negative integer")
    if value < 0:
        raise _invalid(f"{path}.{key}", "must not be negative")
    if value > MAX_COUNT:
        raise _invalid(f"{path}.{key}", f"must be at most {MAX_COUNT}")
    return value


def _bounded(total: int | None, path: str, what: str) -> int | None:
    """A sum of counts, refused (naming ``path``) above ``MAX_COUNT``."""
    if total is not None and total > MAX_COUNT:
        raise _invalid(path, f"{what} add up to more than {MAX_COUNT}")
    return total


def _sum_present(*values: int | None) -> int | None:
    """The sum of the values that are present; ``None`` only when none is."""
    present = [value for value in values if value is not None]
    return sum(present) if present else None


def _parts_within(total: int | None, total_path: str, *parts: tuple[int | None, str]) -> None:
    """Refuse input parts (cached, cache creation) that exceed the input they are part of."""
    if total is None:
        return
    for value, path in parts:
        if value is not None and value > total:
            raise _invalid(path, f"({value}) exceeds {total_path} ({total}), which includes it")
    present = [(value, path) for value, path in parts if value is not None]
    if len(present) > 1 and sum(value for value, _ in present) > total:
        names = " and ".join(path for _, path in present)
        raise _invalid(present[-1][1], f"together with the others, {names} exceed {total_path}")


# --------------------------------------------------------------------------- providers


_OPENAI_CHAT_KEYS = frozenset({"prompt_tokens", "completion_tokens", "prompt_tokens_details"})
_OPENAI_RESPONSES_KEYS = frozenset({"input_tokens", "output_tokens", "input_tokens_details"})


def _openai(usage: Mapping[str, Any]) -> NormalizedUsage:
    # Chat Completions `usage`: prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens
    #   (OpenAI API reference, the chat completion object)
    # Responses `usage`: input_tokens, output_tokens, input_tokens_details.cached_tokens
    #   (OpenAI API reference, the response object)
    # Cached tokens are a subset of prompt/input tokens ("cached_tokens ... of the prompt tokens"):
    #   (OpenAI's prompt caching guide)
    # `cache_write_tokens` sits next to `cached_tokens` in the same details object on newer model
    # families, also a subset of the input (openai-python `types/responses/response_usage.py`;
    # example bodies in dotnet/extensions#7635).
    # `completion_tokens` / `output_tokens` already include reasoning tokens.
    chat = _OPENAI_CHAT_KEYS.intersection(usage)
    responses = _OPENAI_RESPONSES_KEYS.intersection(usage)
    if chat and responses:
        raise _invalid(
            "usage",
            "mixes Chat Completions fields "
            f"({', '.join(sorted(chat))}) and Responses fields ({', '.join(sorted(responses))})",
        )
    if responses:
        input_key, output_key, details_key = "input_tokens", "output_tokens", "input_tokens_details"
    else:
        input_key, output_key, details_key = (
            "prompt_tokens",
            "completion_tokens",
            "prompt_tokens_details",
        )
    details = _object(usage.get(details_key), f"usage.{details_key}")
    details_path = f"usage.{details_key}"
    total = _count(usage, input_key, "usage")
    cached = None if details is None else _count(details, "cached_tokens", details_path)
    written = None if details is None else _count(details, "cache_write_tokens", details_path)
    _parts_within(
        total,
        f"usage.{input_key}",
        (cached, f"{details_path}.cached_tokens"),
        (written, f"{details_path}.cache_write_tokens"),
    )
    return NormalizedUsage(
        provider_input_tokens=total,
        cached_input_tokens=cached,
        cache_creation_input_tokens=written,
        output_tokens=_count(usage, output_key, "usage"),
    )


def _anthropic(usage: Mapping[str, Any]) -> NormalizedUsage:
    # Anthropic Messages `usage`: `input_tokens` counts only the tokens after the last cache
    # breakpoint; the total input is input_tokens + cache_read_input_tokens +
    # cache_creation_input_tokens.
    #   (Anthropic's prompt caching guide, "Tracking cache performance"; the Messages API
    #   reference, response `usage`)
    # `cache_creation` {ephemeral_5m_input_tokens, ephemeral_1h_input_tokens} breaks the creation
    # count down by TTL; it is used only when the flat `cache_creation_input_tokens` is absent.
    #
    # Decision: `input_tokens` is always sent by the API. When it is present, a missing cache
    # part counts as 0 in the sum (and is still reported as `None` in its own field). When it
    # is absent, the total is unknown and `provider_input_tokens` is `None` even if cache parts
    # are present: a sum of only the cached parts would look like a real total and make the
    # delta against the estimate wildly wrong.
    input_tokens = _count(usage, "input_tokens", "usage")
    cache_read = _count(usage, "cache_read_input_tokens", "usage")
    cache_creation = _count(usage, "cache_creation_input_tokens", "usage")
    if cache_creation is None:
        by_ttl = _object(usage.get("cache_creation"), "usage.cache_creation")
        if by_ttl is not None:
            cache_creation = _bounded(
                _sum_present(
                    _count(by_ttl, "ephemeral_5m_input_tokens", "usage.cache_creation"),
                    _count(by_ttl, "ephemeral_1h_input_tokens", "usage.cache_creation"),
                ),
                "usage.cache_creation",
                "the ephemeral input tokens",
            )
    total = None
    if input_tokens is not None:
        total = _bounded(
            input_tokens + (cache_read or 0) + (cache_creation or 0),
            "usage",
            "input_tokens, cache_read_input_tokens and cache_creation_input_tokens",
        )
    return NormalizedUsage(
        provider_input_tokens=total,
        cached_input_tokens=cache_read,
        cache_creation_input_tokens=cache_creation,
        output_tokens=_count(usage, "output_tokens", "usage"),
    )


def _gemini_count(obj: Mapping[str, Any], camel: str, snake: str, path: str) -> int | None:
    """A Gemini count under its REST (camelCase) or python-genai (snake_case) spelling."""
    camel_value = _count(obj, camel, path)
    snake_value = _count(obj, snake, path)
    if camel_value is not None and snake_value is not None and camel_value != snake_value:
        raise _invalid(f"{path}.{camel}", f"disagrees with {path}.{snake}")
    return camel_value if camel_value is not None else snake_value


def _google(usage: Mapping[str, Any]) -> NormalizedUsage:
    # Gemini `UsageMetadata` (Gemini API reference, generateContent):
    # - `promptTokenCount`: "When cachedContent is set, this is still the total effective prompt
    #   size meaning this includes the number of tokens in the cached content."
    # - `cachedContentTokenCount`: tokens of the prompt served from the (implicit or explicit) cache.
    # - There is no cache-write field: explicit caches are created by a separate CachedContent
    #   call and billed there (Gemini's context caching guide), so
    #   `cache_creation_input_tokens` is always `None`.
    # - `candidatesTokenCount` excludes thinking; `thoughtsTokenCount` is billed as output
    #   ("Output price (including thinking tokens)", Gemini's pricing page).
    #   Decision: output_tokens =
    #   candidates + thoughts, matching OpenAI and Anthropic, whose output counts include
    #   reasoning. A missing half counts as 0 when the other is present, because proto3 JSON
    #   omits zero-valued fields; both missing gives `None`.
    # - Proto3 JSON also omits a zero `cachedContentTokenCount`; following docs/contract.md, "Accounting", a missing
    #   field is reported as `None`, not as a guessed 0.
    # - `toolUsePromptTokenCount` (prompts of built-in tools run by Google) is not part of the
    #   frame the service estimated, so it is not added to the input.
    # - python-genai emits snake_case (`prompt_token_count`, ...; googleapis/python-genai#795);
    #   both spellings and both wrappers (`usageMetadata` / `usage_metadata`) or the bare object
    #   are accepted.
    wrappers = [key for key in ("usageMetadata", "usage_metadata") if key in usage]
    if len(wrappers) > 1:
        raise _invalid("usage", "gives both usageMetadata and usage_metadata")
    path = "usage"
    body = usage
    if wrappers:
        path = f"usage.{wrappers[0]}"
        inner = _object(usage[wrappers[0]], path)
        if inner is None:
            return NormalizedUsage()
        body = inner
    candidates = _gemini_count(body, "candidatesTokenCount", "candidates_token_count", path)
    thoughts = _gemini_count(body, "thoughtsTokenCount", "thoughts_token_count", path)
    prompt = _gemini_count(body, "promptTokenCount", "prompt_token_count", path)
    cached = _gemini_count(body, "cachedContentTokenCount", "cached_content_token_count", path)
    _parts_within(prompt, f"{path}.promptTokenCount", (cached, f"{path}.cachedContentTokenCount"))
    return NormalizedUsage(
        provider_input_tokens=prompt,
        cached_input_tokens=cached,
        cache_creation_input_tokens=None,
        output_tokens=_bounded(
            _sum_present(candidates, thoughts),
            path,
            "candidatesTokenCount and thoughtsTokenCount",
        ),
    )


def _normalized(usage: Mapping[str, Any]) -> NormalizedUsage:
    # Our own shape: the host already normalised, so unknown keys are a mistake, not a new field.
    unknown = sorted(str(key) for key in usage if key not in NORMALIZED_FIELDS)
    if unknown:
        raise _invalid(f"usage.{unknown[0]}", "is not a normalized usage field")
    counts = {name: _count(usage, name, "usage") for name in NORMALIZED_FIELDS}
    _parts_within(
        counts["provider_input_tokens"],
        "usage.provider_input_tokens",
        (counts["cached_input_tokens"], "usage.cached_input_tokens"),
        (counts["cache_creation_input_tokens"], "usage.cache_creation_input_tokens"),
    )
    return NormalizedUsage(**counts)


# --------------------------------------------------------------------------- public API


def normalize_usage(provider: Provider, usage: Mapping[str, Any]) -> NormalizedUsage:
    """Turn a provider's raw usage object into :class:`NormalizedUsage` (rules in the module doc).

    ``provider="openai"`` accepts both the Chat Completions and the Responses shape, told apart by
    their keys; an object mixing the two is refused. Raises ``InvalidError`` naming the field for
    a negative, boolean, non-integer count or a wrongly shaped object.
    """
    if not isinstance(usage, Mapping):
        raise _invalid("usage", "must be an object")
    if provider == "openai":
        return _openai(usage)
    if provider == "anthropic":
        return _anthropic(usage)
    if provider == "google":
        return _google(usage)
    if provider == "normalized":
        return _normalized(usage)
    raise _invalid("provider", f"is not one of openai, anthropic, google, normalized: {provider!r}")


def accounting_observation(
    normalized: NormalizedUsage,
    estimated_input_tokens: int,
    provider: Provider,
    call: CallKind,
    report_id: str,
    observed_at: str,
    *,
    expected_cached_tokens: int | None = None,
    response_id: str | None = None,
    diagnostics: Mapping[str, Any] | None = None,
    cost: Mapping[str, Any] | None = None,
    miss_cause: str | None = None,
    rebilled_tokens: int | None = None,
) -> dict[str, Any]:
    """The accounting record of one usage report (``last`` / ``auxiliary``, docs/contract.md, "Accounting").

    ``input_token_delta`` is provider minus estimate for the same frame (positive: the service
    under-estimated), ``None`` when the provider did not report its input. ``observed_at`` comes
    in from the caller: the core reads no clock. ``expected_cached_tokens`` is the preparation's
    (``core.cache.expected_cached_tokens``), shown beside the provider's ``cached_input_tokens``;
    ``None`` for a repair call and for a preparation made before the figure existed.
    ``response_id`` and ``diagnostics`` are the provider's response id and cache diagnostics
    object as the report named them (``None``: it named none). ``cost`` is what the report cost
    (``preparations/costs.py``; ``None``: it cannot be priced). ``miss_cause`` and
    ``rebilled_tokens`` are a main call's cache miss and the input tokens it billed again
    (``preparations/turns.rebilled``; ``None`` for another call).
    """
    provider_input = normalized.provider_input_tokens
    return {
        "provider": provider,
        "call": call,
        "report_id": report_id,
        "observed_at": observed_at,
        "provider_input_tokens": provider_input,
        "input_token_delta": (
            None if provider_input is None else provider_input - estimated_input_tokens
        ),
        "cached_input_tokens": normalized.cached_input_tokens,
        "expected_cached_tokens": expected_cached_tokens,
        "cache_creation_input_tokens": normalized.cache_creation_input_tokens,
        "output_tokens": normalized.output_tokens,
        "response_id": response_id,
        "diagnostics": None if diagnostics is None else dict(diagnostics),
        "miss_cause": miss_cause,
        "rebilled_tokens": rebilled_tokens,
        "cost": None if cost is None else dict(cost),
    }
