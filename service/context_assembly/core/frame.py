"""The neutral frame: the provider-independent request the service lays out."""

from __future__ import annotations

from pydantic import Field

from context_assembly.core.request import Frozen, Message, Tool


class Frame(Frozen):
    """Messages in dispatch order and the tool definitions, as the host will send them."""

    messages: list[Message] = Field(
        default_factory=list, description="The messages, in dispatch order."
    )
    tools: list[Tool] = Field(default_factory=list, description="The tool definitions.")
