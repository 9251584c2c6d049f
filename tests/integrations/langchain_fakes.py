"""A recording LangChain chat model: LangChain's own ``GenericFakeChatModel``, which also keeps
what each call received (messages, bound tools, call arguments) and streams usage and tool calls."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from pydantic import Field


def usage(input_tokens: int, output_tokens: int, cache_read: int = 0) -> UsageMetadata:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "input_token_details": {"cache_read": cache_read},
    }


class RecordingChatModel(GenericFakeChatModel):
    """Answers with the scripted ``messages`` in turn and records every call."""

    calls: list[list[BaseMessage]] = Field(default_factory=list)
    call_kwargs: list[dict[str, Any]] = Field(default_factory=list)
    bound_tools: list[list[Any]] = Field(default_factory=list)

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Any | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        self.bound_tools.append(list(tools))
        return self.bind(tool_names=[getattr(t, "name", None) for t in tools], **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls.append(list(messages))
        self.call_kwargs.append(dict(kwargs))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        message = self._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
        answer = message.generations[0].message
        assert isinstance(answer, AIMessage) and isinstance(answer.content, str)
        for token in re.split(r"(\s)", answer.content) if answer.content else []:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=token, id=answer.id))
            if run_manager:
                run_manager.on_llm_new_token(token, chunk=chunk)
            yield chunk
        last = AIMessageChunk(
            content="",
            id=answer.id,
            usage_metadata=answer.usage_metadata,
            tool_call_chunks=[
                {"id": c["id"], "name": c["name"], "args": json.dumps(c["args"]), "index": i}
                for i, c in enumerate(answer.tool_calls)
            ],
            chunk_position="last",
        )
        yield ChatGenerationChunk(message=last)
