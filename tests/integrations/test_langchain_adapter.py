"""``ContextAssemblyMiddleware`` in a LangChain ``create_agent`` against a served process, on the
sync paths (``invoke``, ``stream``) that the async conformance kit does not take."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from context_assembly_client import APIConnectionError, InvalidRequestError
from context_assembly_client.integrations.langchain import ContextAssemblyMiddleware
from context_assembly_client.types import PrepareResponse
from integration_support import Service
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_fakes import RecordingChatModel, usage

pytestmark = pytest.mark.e2e

BLOCK_TEXT = "Receipt A42: paid 40 EUR."
QUESTION = "Inspect receipt A42."
USAGE_ROUTE = "/v1/preparations/{preparation_id}/usage"


def memory(state: Any) -> list[dict[str, Any]]:
    assert [m.content for m in state["messages"]] == [QUESTION]  # the agent's state
    return [
        {"source": "memory", "revision": "1", "blocks": [{"id": "receipt", "text": BLOCK_TEXT}]}
    ]


def answering_model(text: str = "A42 was paid.", **usage_details: int) -> RecordingChatModel:
    answer = AIMessage(text, id="resp-1", usage_metadata=usage(180, 6, **usage_details))
    return RecordingChatModel(messages=iter([answer]))


@pytest.fixture
def make_middleware() -> Iterator[Callable[..., ContextAssemblyMiddleware]]:
    """Makes middlewares and closes them (their clients, their report worker) after the test."""
    made: list[ContextAssemblyMiddleware] = []

    def make(*args: Any, **kwargs: Any) -> ContextAssemblyMiddleware:
        made.append(ContextAssemblyMiddleware(*args, **kwargs))
        return made[-1]

    yield make
    for each in made:
        each.close()


def agent_with(model: RecordingChatModel, middleware: ContextAssemblyMiddleware) -> Any:
    return create_agent(model, tools=[], system_prompt="Be exact.", middleware=[middleware])


def test_the_model_sees_the_blocks_and_the_service_counts_one_prepare_and_one_report(
    service: Service, make_middleware: Callable[..., ContextAssemblyMiddleware]
) -> None:
    """The acceptance case: the recording model receives the block text from ``contributions``;
    the service counts one prepare and, after the call, one usage report for it."""
    prepared: list[PrepareResponse] = []
    middleware = make_middleware(
        service.url,
        template={"model": "gpt-4o-mini", "plugins": [{"name": "memory"}]},
        contributions=memory,
        on_prepared=prepared.append,
    )
    model = answering_model()
    prepares = service.requests_total("/v1/prepare")
    reports = service.requests_total(USAGE_ROUTE)

    state = agent_with(model, middleware).invoke({"messages": [HumanMessage(QUESTION)]})

    assert state["messages"][-1].content == "A42 was paid."
    (call,) = model.calls
    assert sum(BLOCK_TEXT in str(m.content) for m in call) == 1
    assert isinstance(call[0], SystemMessage) and str(call[0].content).startswith("Be exact.")
    assert call[-1].content == QUESTION
    assert middleware.flush(timeout=30)
    (preparation,) = prepared
    last = service.preparation(preparation.preparation_id).accounting.last
    assert last is not None and last.report_id == "resp-1"
    assert last.provider_input_tokens == 180 and last.output_tokens == 6
    service.wait_for_requests("/v1/prepare", prepares + 1)
    service.wait_for_requests(USAGE_ROUTE, reports + 1)


def test_a_closed_port_leaves_the_agent_answering_with_its_original_messages(
    closed_url: str,
    caplog: pytest.LogCaptureFixture,
    make_middleware: Callable[..., ContextAssemblyMiddleware],
) -> None:
    """The same agent pointed at a closed port answers, and its model got exactly what it wrote."""
    middleware = make_middleware(
        closed_url,
        template={"model": "gpt-4o-mini", "plugins": [{"name": "memory"}]},
        contributions=memory,
    )
    model = answering_model()
    with caplog.at_level(logging.WARNING, logger="context_assembly_client.integrations"):
        state = agent_with(model, middleware).invoke({"messages": [HumanMessage(QUESTION)]})
    assert state["messages"][-1].content == "A42 was paid."
    assert [(type(m), m.content) for m in model.calls[0]] == [
        (SystemMessage, "Be exact."),
        (HumanMessage, QUESTION),
    ]
    assert middleware.stats.failed_open == 1
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def test_fail_closed_raises_on_a_closed_port(
    closed_url: str, make_middleware: Callable[..., ContextAssemblyMiddleware]
) -> None:
    """``fail_open=False``: the agent's call raises the client's connection error."""
    middleware = make_middleware(
        closed_url, template={"model": "gpt-4o-mini"}, contributions=memory, fail_open=False
    )
    with pytest.raises(APIConnectionError):
        agent_with(answering_model(), middleware).invoke({"messages": [HumanMessage(QUESTION)]})


def test_a_bad_template_raises(
    service: Service, make_middleware: Callable[..., ContextAssemblyMiddleware]
) -> None:
    """A 4xx answer (here a data limit the service refuses) raises, though failing open."""
    middleware = make_middleware(
        service.url, template={"model": "gpt-4o-mini", "assembly": {"max_data_tokens": -1}}
    )
    with pytest.raises(InvalidRequestError) as raised:
        agent_with(answering_model(), middleware).invoke({"messages": [HumanMessage(QUESTION)]})
    assert raised.value.status_code == 422


def test_streaming_sends_the_tokens_and_reports_the_streamed_usage(
    service: Service, make_middleware: Callable[..., ContextAssemblyMiddleware]
) -> None:
    """``stream_mode="messages"`` streams the model's tokens through the middleware, and the usage
    of the streamed answer is reported."""
    prepared: list[PrepareResponse] = []
    middleware = make_middleware(
        service.url,
        template={"model": "gpt-4o-mini", "plugins": [{"name": "memory"}]},
        contributions=memory,
        on_prepared=prepared.append,
    )
    model = answering_model("A42 was paid in full.")
    chunks = [
        chunk.content
        for chunk, _ in agent_with(model, middleware).stream(
            {"messages": [HumanMessage(QUESTION)]}, stream_mode="messages"
        )
        if isinstance(chunk, AIMessageChunk) and isinstance(chunk.content, str) and chunk.content
    ]
    assert len(chunks) > 1 and "".join(chunks) == "A42 was paid in full."
    assert sum(BLOCK_TEXT in str(m.content) for m in model.calls[0]) == 1
    assert middleware.flush(timeout=30)
    last = service.preparation(prepared[0].preparation_id).accounting.last
    assert last is not None and last.provider_input_tokens == 180


def test_a_refused_usage_report_is_counted_and_the_answer_stands(
    service: Service,
    caplog: pytest.LogCaptureFixture,
    make_middleware: Callable[..., ContextAssemblyMiddleware],
) -> None:
    """A report the service refuses (more cached tokens than input) is logged and counted, and the
    agent's answer is unaffected."""
    middleware = make_middleware(service.url, template={"model": "gpt-4o-mini"})
    model = answering_model(cache_read=500)
    with caplog.at_level(logging.WARNING, logger="context_assembly_client.integrations"):
        state = agent_with(model, middleware).invoke({"messages": [HumanMessage(QUESTION)]})
        assert middleware.flush(timeout=30)
    assert state["messages"][-1].content == "A42 was paid."
    assert middleware.stats.usage_report_failures == 1 and middleware.stats.usage_reports == 0
    assert any("usage report" in r.getMessage() for r in caplog.records)


# A tool description long enough that the prefix up to the tools reaches Claude's minimum
# cacheable length (1,024 tokens), so the plan places all three markers.
LONG = " ".join(
    f"Rule {i}: quote order ids exactly and say when a status is uncertain." for i in range(120)
)


@tool(description=LONG)
def lookup_order(order_id: str) -> str:
    """Read an order."""
    return f"order {order_id}"


@tool
def cancel_order(order_id: str) -> str:
    """Cancel an order."""
    return f"cancelled {order_id}"


def test_provider_settings_go_only_to_the_provider_s_own_class(
    service: Service, make_middleware: Callable[..., ContextAssemblyMiddleware]
) -> None:
    """A plan with Anthropic markers and an OpenAI key, for a model of neither class (as
    ``AnthropicPromptCachingMiddleware`` checks the class): no ``cache_control`` on a message or
    a tool, no key or retention among the call's arguments, every marker counted as skipped; the
    tools still come back sorted by name. (``test_provider_classes`` shows both through the real
    classes.)"""
    prepared: list[PrepareResponse] = []
    middleware = make_middleware(
        service.url,
        template={
            "model": "claude-sonnet-4-5",
            "assembly": {"layout": "stable-prefix"},
            "cache": {
                "breakpoints": True,
                "ttl": "1h",
                "key": "orders-A42",
                "retention": "24h",
                "previous_preparation_id": None,
            },
        },
        on_prepared=prepared.append,
    )
    model = answering_model()
    agent = create_agent(
        model,
        tools=[lookup_order, cancel_order],
        system_prompt="Be exact.",
        middleware=[middleware],
    )
    history: list[HumanMessage | AIMessage] = [
        HumanMessage("Where is A42?"),
        AIMessage("It left on Monday."),
    ]
    agent.invoke({"messages": [*history, HumanMessage(QUESTION)]})

    plan = prepared[0].selection.cache
    assert plan is not None and [p.after for p in plan.breakpoints] == [
        "tools",
        "instructions",
        "history",
    ]
    assert middleware.stats.cache_markers_skipped == 3
    assert "cache_control" not in repr(model.calls[0])
    (tools,) = model.bound_tools
    assert [t.name for t in tools] == ["cancel_order", "lookup_order"]
    assert not tools[-1].extras
    assert "prompt_cache_key" not in model.call_kwargs[0]
    assert "prompt_cache_retention" not in model.call_kwargs[0]
    assert model.call_kwargs[0]["max_tokens"] == 4096  # the default reserve, for any class


def test_a_template_cannot_set_what_the_runtime_fills() -> None:
    """The runtime's parts and the neutral render are the adapter's: a template setting them is
    refused when the middleware is made."""
    with pytest.raises(ValueError, match="history"):
        ContextAssemblyMiddleware("http://127.0.0.1:1", template={"model": "m", "history": []})
    with pytest.raises(ValueError, match="render"):
        ContextAssemblyMiddleware(
            "http://127.0.0.1:1", template={"model": "m", "render": "anthropic"}
        )
