"""Managed routing (``models`` + ``routing: {"policy": "first_fit"}``): what each candidate needs.

Routing runs after the sources are materialised (the protected closure is part of the fit) and
before selection. For each candidate, in the request's preference order, the need is measured
exactly as :func:`~context_assembly.core.assemble.assemble_frame` measures it before selecting::

    needed = fixed (instructions, legacy data, date, tools, history, input; framing included)
           + response_reserve + reasoning_reserve_tokens
           + protected closure (the data-message tokens protected blocks and their dependencies need)

counted with the candidate's tokenizer and framing profile. A candidate fits when
``needed <= capacity``; ``first_fit`` assembles with the first that fits. Pure; the engine
resolves profiles, counters and capacities.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from context_assembly.core.blocks import SourceBlocks, build_graph
from context_assembly.core.budget import count_history, fixed_costs
from context_assembly.core.counting import ModelProfile, TokenCounter
from context_assembly.core.layout import build_texts
from context_assembly.core.request import PrepareRequest
from context_assembly.core.select import protected_demand
from context_assembly.core.sources import SourceInput, SourceSetup


class RoutingProbe:
    """The model-independent parts of one request (texts, block graph), built once for all
    candidates; :meth:`needed_tokens` counts them for one candidate."""

    def __init__(
        self,
        request: PrepareRequest,
        setups: Sequence[SourceSetup],
        inputs: Sequence[SourceInput],
        *,
        now: datetime,
        local_now: datetime,
    ) -> None:
        options = request.options
        replaced = {setup.source: setup for setup in setups}
        self.request = request
        self.now = now
        self.texts = build_texts(request, replaced, local_now)
        self.failed = frozenset(item.setup.source for item in inputs if item.failed)
        self.graph = build_graph(
            (SourceBlocks(i.setup.source, i.blocks) for i in inputs if not i.failed), options
        )
        self.source_order = [p.name for p in request.plugins if p.name in replaced]
        self.reserve = request.response_reserve + options.reasoning_reserve_tokens

    def needed_tokens(self, counter: TokenCounter, profile: ModelProfile) -> int:
        """Fixed content + reserves + protected closure, counted for one candidate."""
        request = self.request
        fixed = fixed_costs(
            request.options.layout,
            self.texts,
            request.tools,
            count_history(request, counter, profile),
            request.input,
            counter,
            profile,
        )
        demand = (
            protected_demand(self.graph, self.source_order, counter, profile, self.now, self.failed)
            if self.graph
            else 0
        )
        return fixed.total + self.reserve + demand


__all__ = ["RoutingProbe"]
