"""Wire models of the prepare response (SPEC §3.2): budget, manifest and hashes.

The manifest is detached metadata: ids, statuses, reasons and token counts; never block bodies
and never raw revision values.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from context_assembly.core.request import Frozen, Render
from context_assembly.core.select import Reason, Status
from context_assembly.core.sources import SourceKind, SourceStatus


class BudgetReport(Frozen):
    capacity: int
    capacity_source: Literal["host", "provider", "registry", "fallback"]
    response_reserve: int
    reasoning_reserve_tokens: int
    instructions_tokens: int
    legacy_data_tokens: int
    tools_tokens: int
    history_tokens: int
    input_tokens: int
    remaining_tokens: int
    data_limit_tokens: int
    data_tokens: int
    total_input_tokens: int
    history_dropped_messages: int


class BlockReport(Frozen):
    source: str
    id: str
    status: Status
    reason: Reason
    tokens: int
    full_tokens: int
    projection_tokens: int | None
    priority: int
    protected: bool
    dependencies: list[str]


class SourceReport(Frozen):
    source: str
    kind: SourceKind
    status: SourceStatus
    duration_ms: float
    block_count: int


class SelectionReport(Frozen):
    blocks: list[BlockReport]
    sources: list[SourceReport]
    max_data_tokens: int
    selected_data_tokens: int
    layout: Literal["legacy", "stable-prefix"]
    reasoning_reserve_tokens: int
    tokenizer: Literal["o200k_base", "cl100k_base", "estimate"]
    exact: bool
    opaque_or_multimodal: bool


class PrepareResponse(Frozen):
    preparation_id: str
    model: str
    layout: Literal["legacy", "stable-prefix"]
    render: Render
    frame: dict[str, Any]
    budget: BudgetReport
    selection: SelectionReport
    fingerprint: str
    prefix_hash: str
    prefix_tokens: int
    input_hash: str
    expires_at: str
    attempt: int = Field(default=1, ge=1, le=2)
