"""Which sources a request replaces, and the blocks of its inline and whiteboard sources.

A source is a plugin of the host. A contributor (webhook), an inline contribution or the built-in
whiteboard adapter replaces that plugin's legacy *content view* for this request; the plugin's
instructions stay unless the registration gives new ones (``null`` drops them). Checked before any
contributor is called, so a bad request never starts a webhook and nothing is half-applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import orjson

from context_assembly.core.request import Block, PrepareRequest, Revision, Whiteboard
from context_assembly.errors import InvalidError

PROTECTED_SOURCES = frozenset({"task_state", "evidence", "persistent_instructions"})

# ``webhook``: a contributor the service calls. Planned so for every contributor of the request;
# the caller that calls it reports an MCP server as ``mcp`` (``SourceInput.setup``): a registered
# endpoint's kind is in the configuration, which the core does not see.
SourceKind = Literal["webhook", "mcp", "inline", "whiteboard"]
SourceStatus = Literal[
    "ok", "inline", "timeout", "error", "invalid", "too_large", "skipped_deadline", "rejected"
]
SkipReason = Literal["binary_content"]
FAILED_STATUSES = frozenset(
    {"timeout", "error", "invalid", "too_large", "skipped_deadline", "rejected"}
)
# What made a contributor call fail, as the contributor calls classify it (contributors/failures.py,
# calls.py, mcp*.py; preparations/targets.py for the block rules and inline URLs). A name
# for programs, beside the status; the words of ``SourceFailure.detail`` say the same for people.
FailureCause = Literal[
    "connect_refused",  # nothing listens on the port
    "connect_failed",  # the connection could not be made for another reason
    "name_resolution",  # the host name did not resolve
    "tls",  # a TLS failure other than the certificate's
    "tls_certificate",  # the certificate did not verify
    "connection_reset",  # the contributor reset the connection
    "connection_closed",  # the contributor closed it before the answer was complete
    "protocol_error",  # an answer that is not valid HTTP
    "transport_refused",  # the client refused the request (an inline URL off its pinned address)
    "transport_error",  # another failure of the connection
    "timeout",  # the deadline passed first
    "no_time_left",  # the call was not sent: no time was left before the deadline
    "http_status",  # a status other than 2xx (a redirect, which is never followed, included)
    "content_type",  # an answer that is not JSON (for MCP: nor an event stream)
    "content_encoding",  # a compressed answer
    "too_large",  # an answer over the byte cap
    "invalid_json",  # a body that is not JSON
    "invalid_answer",  # JSON that is not the protocol's shape
    "block_rules",  # blocks that break the block rules
    "jsonrpc_error",  # an MCP server's JSON-RPC error
    "tool_error",  # an MCP tool result with ``isError``
    "protocol_version",  # an MCP server that chose a protocol version this client lacks
    "session_lost",  # an MCP server that forgot the session twice in a row
    "no_answer",  # an MCP event stream that ended without the answer
    "url_rejected",  # an inline URL refused by the allowlist or the SSRF guard
    "internal_error",  # a bug of the service's own code (logged as ``internal_error``)
]

# Whiteboard priorities (docs/contract.md, "Whiteboard"): critical entries are protected.
_WHITEBOARD_PRIORITY = {"low": -500, "normal": 0, "high": 500, "critical": 0}


@dataclass(frozen=True, slots=True)
class SourceSetup:
    """One replaced source as registered in the request (before any contributor ran)."""

    source: str
    kind: SourceKind
    replaces_instructions: bool
    instructions: str | None
    recovery_tool: str | None


@dataclass(frozen=True, slots=True)
class SourceFailure:
    """Why a source failed: the cause's name, the same in words, and the HTTP status (for
    ``http_status``, and a JSON-RPC error that came with a status other than 2xx) or the path of
    the offending field in the answer (``invalid_answer``, ``block_rules``) when there is one.
    Never a part of the answer's body: the words name what happened, the path where."""

    cause: FailureCause
    detail: str
    status: int | None = None
    field: str | None = None


@dataclass(frozen=True, slots=True)
class SourceInput:
    """One replaced source with what it contributed to this preparation."""

    setup: SourceSetup
    status: SourceStatus
    duration_ms: float
    revision: Revision | None
    blocks: tuple[Block, ...]
    # Items the source offered that are no blocks, as (id, reason): an MCP server's binary
    # contents (``binary_content``). Each is reported omitted with 0 tokens, never sent.
    skipped: tuple[tuple[str, SkipReason], ...] = ()
    # Why a failed source failed (``None`` for a source that did not fail).
    failure: SourceFailure | None = None

    @property
    def failed(self) -> bool:
        return self.status in FAILED_STATUSES


def plan_sources(request: PrepareRequest) -> list[SourceSetup]:
    """Every replaced source in request order (webhooks, inline contributions, whiteboard).

    Raises:
        InvalidError: a source that is not a plugin, a protected name, or a source named twice.
    """
    plugins = {plugin.name for plugin in request.plugins}
    if len(plugins) != len(request.plugins):
        names = [p.name for p in request.plugins]
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise InvalidError(
            f"plugin named more than once: {', '.join(dupes)}", field="plugins", sources=dupes
        )
    setups: list[SourceSetup] = []
    for index, ref in enumerate(request.contributors):
        setups.append(
            SourceSetup(
                ref.source,
                "webhook",
                "instructions" in ref.model_fields_set,
                ref.instructions,
                ref.recovery_tool,
            )
        )
        _check_source(ref.source, plugins, f"contributors.{index}.source")
    for index, item in enumerate(request.contributions):
        setups.append(
            SourceSetup(
                item.source,
                "inline",
                "instructions" in item.model_fields_set,
                item.instructions,
                item.recovery_tool,
            )
        )
        _check_source(item.source, plugins, f"contributions.{index}.source")
    if request.whiteboard is not None:
        setups.append(
            SourceSetup(
                request.whiteboard.source,
                "whiteboard",
                False,
                None,
                request.whiteboard.recovery_tool,
            )
        )
        _check_source(request.whiteboard.source, plugins, "whiteboard.source")
    seen: set[str] = set()
    for setup in setups:
        if setup.source in seen:
            raise InvalidError(
                f"source {setup.source!r} is replaced more than once in this request",
                field="contributors",
                sources=[setup.source],
            )
        seen.add(setup.source)
    for name in request.options.source_token_limits:
        if name not in plugins:
            raise InvalidError(
                f"source_token_limits names {name!r}, which is not a plugin of this request",
                field="assembly.source_token_limits",
                sources=[name],
            )
    return setups


def _check_source(source: str, plugins: set[str], field_name: str) -> None:
    if source in PROTECTED_SOURCES:
        raise InvalidError(
            f"source {source!r} cannot be replaced: its legacy view is protected",
            field=field_name,
            sources=[source],
        )
    if source not in plugins:
        raise InvalidError(
            f"source {source!r} is not a plugin of this request (contributors attach to existing plugins)",
            field=field_name,
            sources=[source],
        )


def whiteboard_blocks(whiteboard: Whiteboard) -> tuple[Block, ...]:
    """The built-in whiteboard adapter: one block per entry (docs/contract.md, "Whiteboard").

    id = key; text = the description and the value (strings as-is, other JSON compact) on two
    lines; projection = the description alone; ``critical`` = protected, ``high`` = 500,
    ``normal`` = 0, ``low`` = -500.
    """
    blocks: list[Block] = []
    for entry in whiteboard.entries:
        value = entry.value if isinstance(entry.value, str) else orjson.dumps(entry.value).decode()
        text = f"{entry.description}\n{value}" if entry.description else value
        blocks.append(
            Block(
                id=entry.key,
                text=text,
                priority=_WHITEBOARD_PRIORITY[entry.priority],
                protected=entry.priority == "critical",
                projection=entry.description or None,
            )
        )
    return tuple(blocks)


def materialised_inputs(
    request: PrepareRequest, setups: Sequence[SourceSetup]
) -> list[SourceInput]:
    """Inputs for the sources that need no call: inline contributions and the whiteboard."""
    inline = {item.source: item for item in request.contributions}
    inputs: list[SourceInput] = []
    for setup in setups:
        if setup.kind == "inline":
            item = inline[setup.source]
            inputs.append(SourceInput(setup, "inline", 0.0, item.revision, tuple(item.blocks)))
        elif setup.kind == "whiteboard" and request.whiteboard is not None:
            inputs.append(
                SourceInput(setup, "inline", 0.0, None, whiteboard_blocks(request.whiteboard))
            )
    return inputs
