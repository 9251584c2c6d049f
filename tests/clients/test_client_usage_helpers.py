"""Provider usage helpers: find the usage in SDK objects or dicts, and the service accepts the pair."""

from __future__ import annotations

import enum
from typing import Any

import pytest
from client_support import prepare_body
from context_assembly_client import (
    AsyncClient,
    usage_from_anthropic,
    usage_from_gemini,
    usage_from_openai,
)
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

# --------------------------------------------------------------------------- SDK look-alikes
# Shaped like the openai, anthropic and google-genai SDK response types (pydantic models).


class PromptDetails(BaseModel):
    cached_tokens: int | None = None
    audio_tokens: int | None = None


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptDetails | None = None


class ChatCompletion(BaseModel):
    id: str
    usage: CompletionUsage | None = None


class AnthropicUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    service_tier: str | None = None


class AnthropicMessage(BaseModel):
    id: str
    usage: AnthropicUsage


class TrafficType(enum.Enum):
    ON_DEMAND = "ON_DEMAND"


class GeminiUsageMetadata(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)
    prompt_token_count: int | None = None
    cached_content_token_count: int | None = None
    candidates_token_count: int | None = None
    thoughts_token_count: int | None = None
    traffic_type: TrafficType | None = None


class GeminiResponse(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)
    usage_metadata: GeminiUsageMetadata | None = None


class LegacyObject:
    """An SDK object that converts with ``to_dict()`` instead of ``model_dump()``."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def to_dict(self) -> dict[str, Any]:
        return dict(self._data)


class HasUsage:
    """An object exposing ``usage`` as an attribute holding a ``to_dict`` object."""

    def __init__(self, usage: Any) -> None:
        self.usage = usage


CHAT = ChatCompletion(
    id="c1",
    usage=CompletionUsage(
        prompt_tokens=100,
        completion_tokens=5,
        total_tokens=105,
        prompt_tokens_details=PromptDetails(cached_tokens=40),
    ),
)
MESSAGE = AnthropicMessage(
    id="m1",
    usage=AnthropicUsage(input_tokens=30, output_tokens=9, cache_read_input_tokens=70),
)
GEMINI = GeminiResponse(
    usage_metadata=GeminiUsageMetadata(
        prompt_token_count=100,
        cached_content_token_count=60,
        candidates_token_count=4,
        thoughts_token_count=6,
        traffic_type=TrafficType.ON_DEMAND,
    )
)


class TestFindUsage:
    def test_openai_sdk_object(self) -> None:
        """An openai-style response object gives ("openai", its usage dumped as JSON data)."""
        provider, usage = usage_from_openai(CHAT)
        assert provider == "openai"
        assert usage["prompt_tokens"] == 100
        assert usage["prompt_tokens_details"]["cached_tokens"] == 40

    def test_openai_responses_dict_and_bare_usage(self) -> None:
        """A Responses API dict and a bare usage dict are both accepted as they are."""
        usage = {
            "input_tokens": 10,
            "output_tokens": 2,
            "input_tokens_details": {"cached_tokens": 0},
        }
        assert usage_from_openai({"id": "r", "usage": usage}) == ("openai", usage)
        assert usage_from_openai(usage) == ("openai", usage)

    def test_anthropic_sdk_object_and_dict(self) -> None:
        """An anthropic-style message object and its JSON dict give the same usage."""
        provider, usage = usage_from_anthropic(MESSAGE)
        assert provider == "anthropic"
        assert usage_from_anthropic(MESSAGE.model_dump()) == (provider, usage)
        assert usage["cache_read_input_tokens"] == 70

    def test_gemini_sdk_object_and_rest_dict(self) -> None:
        """python-genai's ``usage_metadata`` (snake_case, enums as strings) and REST ``usageMetadata`` are found."""
        provider, usage = usage_from_gemini(GEMINI)
        assert provider == "google"
        assert usage["prompt_token_count"] == 100
        assert usage["traffic_type"] == "ON_DEMAND"
        rest = GEMINI.model_dump(by_alias=True, exclude_none=True, mode="json")
        assert usage_from_gemini(rest)[1]["promptTokenCount"] == 100

    def test_to_dict_objects(self) -> None:
        """Objects without ``model_dump`` are converted with ``to_dict()``."""
        usage = {"prompt_tokens": 3, "completion_tokens": 1}
        assert usage_from_openai(HasUsage(LegacyObject(usage))) == ("openai", usage)

    @pytest.mark.parametrize(
        "response",
        [ChatCompletion(id="chunk"), {"id": "x"}, {"usage": None}],
        ids=["sdk-without-usage", "dict-without-usage", "null-usage"],
    )
    def test_missing_usage_is_an_error(self, response: Any) -> None:
        """A response without usage (a streaming chunk) raises ValueError instead of reporting nothing."""
        with pytest.raises(ValueError, match="usage"):
            usage_from_openai(response)


class TestServiceAcceptsThePair:
    @pytest.mark.parametrize(
        ("pair", "input_tokens", "cached", "output"),
        [
            (usage_from_openai(CHAT), 100, 40, 5),
            (usage_from_anthropic(MESSAGE), 100, 70, 9),
            (usage_from_gemini(GEMINI), 100, 60, 10),
            (usage_from_gemini(GEMINI.model_dump(by_alias=True, mode="json")), 100, 60, 10),
        ],
        ids=["openai", "anthropic", "gemini-sdk", "gemini-rest"],
    )
    async def test_report_usage_normalises_it(
        self,
        aclient: AsyncClient,
        pair: tuple[Any, dict[str, Any]],
        input_tokens: int,
        cached: int,
        output: int,
    ) -> None:
        """Each helper's (provider, usage) is accepted by the real service and normalised as expected."""
        prep = await aclient.prepare(prepare_body())
        provider, usage = pair
        answer = await aclient.report_usage(
            prep.preparation_id, report_id="r", provider=provider, usage=usage
        )
        last = answer.accounting.last
        assert last is not None
        assert (last.provider_input_tokens, last.cached_input_tokens, last.output_tokens) == (
            input_tokens,
            cached,
            output,
        )
