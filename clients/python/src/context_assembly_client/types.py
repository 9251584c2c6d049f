"""Typed models of the service's requests and responses, named as in ``openapi/openapi.json``.

The classes are generated from the committed OpenAPI document into
:mod:`context_assembly_client._models` by ``make client-types`` (datamodel-code-generator, with
the options of ``[tool.datamodel-codegen]`` in ``clients/python/pyproject.toml``); this module
re-exports them under the same names. A test of the repository fails when the generated module
differs from what the generator writes from the committed document.

Two kinds of model:

- **Request models** (``PrepareRequest`` and what it contains, ``Frame``, ``ValidateRequest``,
  ``RepairRequest``, ``UsageRequest``) refuse unknown fields, so a misspelt option fails here
  instead of on the server, and check the document's bounds (lengths, ranges, patterns) when
  built. The client sends only the fields you set (``exclude_unset``), so the server's defaults
  apply to the rest. An optional field the document gives no default (a nested options object
  such as ``scope`` or ``assembly``) is typed ``X | None`` with ``None`` as its default; leave it
  unset rather than passing ``None``, which is sent as ``null``.
- **Response models** are frozen and accept members they do not know, so a newer server that
  adds a field does not break an older client (the document itself describes this server's
  answers as closed). A value outside a closed set (a new status or reason) is a contract
  change and fails validation (:class:`~context_assembly_client.APIResponseValidationError`).
- **The contributor protocol** (the document's ``webhooks``): the packets the service posts
  (``ContributePacket``, ``RevisionPacket``, ``SummarizePacket``) are frozen and open, as
  answers are; the answers a contributor or summarizer gives (``ContributorAnswer``,
  ``RevisionAnswer``, ``SummaryAnswer``) are read as the service reads them.
  :mod:`context_assembly_client.contributor` serves them.

Every method of the clients also accepts a plain ``dict`` wherever it takes a request model; a
dict is sent as given, and the server checks it.

``Provider``, ``CallKind`` and ``Revision`` name value sets the document writes inline in a
field (``UsageRequest.provider``, ``UsageRequest.call``, ``Contribution.revision``); a test checks
them against the generated fields.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from context_assembly_client._models import (
    AccountingReport,
    AnchorReport,
    AssemblyOptions,
    Block,
    BlockReport,
    BudgetReport,
    BudgetResponse,
    CacheBreakpoint,
    CacheControlDirective,
    CacheOptions,
    CacheReport,
    CompactionOptions,
    CompactionReport,
    ContributePacket,
    Contribution,
    ContributorAnswer,
    ContributorRef,
    CostReport,
    DiagnosticsDirective,
    Economics,
    FirstChange,
    Frame,
    Health,
    HistoryPolicy,
    ManifestWarning,
    Message,
    ModelCalibration,
    ModelInfo,
    ModelList,
    ModelPrice,
    ModelPriceTier,
    NamedChange,
    NativeDirective,
    NativeHistory,
    NativePart,
    Observation,
    OpaquePart,
    OutputLimit,
    Placement,
    Plugin,
    PreparationView,
    PrepareRequest,
    PrepareResponse,
    Problem,
    PromptCacheOptionsDirective,
    RepairRequest,
    RepairResponse,
    RevisionAnswer,
    RevisionPacket,
    Routing,
    RoutingCandidate,
    RoutingReport,
    Scope,
    SelectionReport,
    SkippedBreakpoint,
    SourceFailureReport,
    SourceReport,
    SummarizePacket,
    SummaryAnswer,
    TextPart,
    Timeline,
    TimelineTurn,
    Tool,
    ToolCall,
    TurnCompaction,
    UsageRequest,
    UsageResponse,
    ValidateRequest,
    ValidateResponse,
    Whiteboard,
    WhiteboardEntry,
)

__all__ = [
    "AccountingReport",
    "AnchorReport",
    "AssemblyOptions",
    "Block",
    "BlockReport",
    "BudgetReport",
    "BudgetResponse",
    "CacheBreakpoint",
    "CacheControlDirective",
    "CacheOptions",
    "CacheReport",
    "CallKind",
    "CompactionOptions",
    "CompactionReport",
    "ContributePacket",
    "Contribution",
    "ContributorAnswer",
    "ContributorRef",
    "CostReport",
    "DiagnosticsDirective",
    "Economics",
    "FirstChange",
    "Frame",
    "Health",
    "HistoryPolicy",
    "ManifestWarning",
    "Message",
    "ModelCalibration",
    "ModelInfo",
    "ModelList",
    "ModelPrice",
    "ModelPriceTier",
    "NamedChange",
    "NativeDirective",
    "NativeHistory",
    "NativePart",
    "Observation",
    "OpaquePart",
    "OutputLimit",
    "Placement",
    "Plugin",
    "PreparationView",
    "PrepareRequest",
    "PrepareResponse",
    "Problem",
    "PromptCacheOptionsDirective",
    "Provider",
    "RepairRequest",
    "RepairResponse",
    "Revision",
    "RevisionAnswer",
    "RevisionPacket",
    "Routing",
    "RoutingCandidate",
    "RoutingReport",
    "Scope",
    "SelectionReport",
    "SkippedBreakpoint",
    "SourceFailureReport",
    "SourceReport",
    "SummarizePacket",
    "SummaryAnswer",
    "TextPart",
    "Timeline",
    "TimelineTurn",
    "Tool",
    "ToolCall",
    "TurnCompaction",
    "UsageRequest",
    "UsageResponse",
    "ValidateRequest",
    "ValidateResponse",
    "Whiteboard",
    "WhiteboardEntry",
]

Provider: TypeAlias = Literal["openai", "anthropic", "google", "normalized"]
"""The shape of a usage object (``UsageRequest.provider``)."""

CallKind: TypeAlias = Literal["main", "wrap_up", "repair"]
"""Which call a usage report is for (``UsageRequest.call``)."""

Revision: TypeAlias = str | int | float
"""A contributor's revision: a string or a finite number, compared for equality only."""
