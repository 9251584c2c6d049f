"""Hashes of a preparation (docs/contract.md, "Hashes"): fingerprint, stable-prefix hash and input hash.

All three are ``sha256:`` of canonical JSON (sorted keys, compact, UTF-8). The fingerprint is a
local diagnostic over model, tenant, scope, render target and the rendered request (messages and
tools); it is *not* a provider cache key. ``prefix_hash`` covers the model, the tools in frame
order and the messages of the stable prefix; ``input_hash`` covers the current input messages.
Clients never have to reproduce a hash: the service recomputes them from a frame on validate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import orjson

from context_assembly.core.request import Message, Scope, Tool


def digest(value: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``value``."""
    raw = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return [m.model_dump(mode="json", exclude_none=True) for m in messages]


def _tools(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    return [t.model_dump(mode="json") for t in tools]


def fingerprint(
    model: str,
    tenant: str,
    scope: Scope,
    render: str,
    messages: Sequence[Message],
    tools: Sequence[Tool],
) -> str:
    """The scoped request fingerprint."""
    return digest(
        {
            "model": model,
            "tenant": tenant,
            "scope": scope.model_dump(mode="json"),
            "render": render,
            "messages": _messages(messages),
            "tools": _tools(tools),
        }
    )


def prefix_hash(model: str, prefix: Sequence[Message], tools: Sequence[Tool]) -> str:
    """Hash of the stable prefix: model, tools in frame order, leading messages and history."""
    return digest({"model": model, "tools": _tools(tools), "messages": _messages(prefix)})


_SORTED = orjson.OPT_SORT_KEYS


def frame_hashes(
    model: str,
    tenant: str,
    scope: Scope,
    render: str,
    messages: Sequence[Message],
    tools: Sequence[Tool],
    prefix_len: int,
) -> tuple[str, str, bytes]:
    """``(fingerprint(...), prefix_hash(model, messages[:prefix_len], tools), neutral frame JSON)``
    in one pass.

    Both hash canonical JSON that starts with the same messages (``"messages"`` sorts first), so
    each message is serialised once and the prefix is hashed once: the SHA-256 state after the
    prefix's messages is copied and finished both ways. The data message is usually most of a
    frame, and both hashes cover it. The third value is the frame as the ``neutral`` render
    gives it (``{"messages": [...], "tools": [...]}``, object keys sorted), from the same bytes.
    """
    dumped = [orjson.dumps(item, option=_SORTED) for item in _messages(messages)]
    tools_json = orjson.dumps(_tools(tools), option=_SORTED)
    model_json = orjson.dumps(model)
    # The messages joined once; both hashes read it in place (the prefix is its first bytes).
    joined = b",".join(dumped)
    view = memoryview(joined)
    prefix_end = sum(map(len, dumped[:prefix_len])) + max(prefix_len - 1, 0)
    hasher = hashlib.sha256(b'{"messages":[')
    hasher.update(view[:prefix_end])
    prefix = hasher.copy()
    prefix.update(b'],"model":' + model_json + b',"tools":' + tools_json + b"}")
    hasher.update(view[prefix_end:])
    hasher.update(
        b"".join(
            (
                b'],"model":',
                model_json,
                b',"render":',
                orjson.dumps(render),
                b',"scope":',
                orjson.dumps(scope.model_dump(mode="json"), option=_SORTED),
                b',"tenant":',
                orjson.dumps(tenant),
                b',"tools":',
                tools_json,
                b"}",
            )
        )
    )
    frame_json = b"".join((b'{"messages":[', joined, b'],"tools":', tools_json, b"}"))
    return "sha256:" + hasher.hexdigest(), "sha256:" + prefix.hexdigest(), frame_json


def message_hashes(messages: Sequence[Message]) -> list[str]:
    """One hash per message (:func:`digest` of its JSON): a record keeps its history's as
    ``history_hashes``, which refresh compares with an edited history and a cache plan with the
    next turn's."""
    return [digest(message) for message in _messages(messages)]


def input_hash(inputs: Sequence[Message]) -> str:
    """Hash of the current input messages."""
    return digest(_messages(inputs))


def text_hash(text: str) -> str:
    """Hash of one text (stored instead of the text itself, e.g. the host instructions)."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
