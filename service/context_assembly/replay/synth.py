"""kv-cache-tester traces rebuilt as conversations whose text is synthesised per block hash.

A trace (``read_trace``) lists a conversation's model calls with, for each, one hash per
``block_size`` (64) tokens of its input: equal hashes, equal content. The text is not recorded,
so ``rebuild`` makes it up, with counts exact by construction:

- each block id becomes 64 words of ``VOCABULARY``, each one ``o200k_base`` token with its leading
  space, chosen by a digest of the id (``block_text``): equal ids give equal text, and the text
  of n blocks counts 64 × n tokens;
- only full blocks are used: a request of ``in`` tokens has ``in // 64`` of them (a trace that
  also lists the hash of the last, partial block has it ignored);
- the first ``round(tool_tokens / 64)`` blocks are the tools (``TOOL_BLOCKS`` blocks per tool,
  each tool's description holding their text), the next ``round(system_tokens / 64)`` the system
  prompt, the rest the conversation;
- a request keeps the previous request's messages while their blocks are a prefix of its own
  conversation blocks (cut back to a user or tool message, so that every tool call keeps its
  result); its new blocks become an assistant message (``round(out / 64)`` blocks of the
  previous request's output, at least one, with a tool call when the previous request stopped on
  ``tool_use`` and this one sends a tool result) followed by the new input: a tool result
  answering that call, else a user message;
- a request that keeps none of them (the conversation was rewritten, as a compaction does) starts
  over with all its conversation blocks as one user message.

``subagent`` entries are skipped (the reader counts them).
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

import orjson

from context_assembly.replay.conversation import Call, Conversation

BLOCK_TOKENS: Final = 64
TOOL_BLOCKS: Final = 16
"""Blocks per synthesised tool: a trace's ~12,000 tool tokens become about a dozen tools."""

# 256 common English words, each one o200k_base token with a leading space (tests check it),
# so that one digest byte picks one word.
VOCABULARY: Final = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if so "
    "no will can more about up out them some could what into than time only other new these "
    "two may first then do any like my now over such our man me even most made after also did "
    "many before must through back years where much your way well down should because each "
    "just those people how too little state good very make world still own see men work long "
    "here get both between life being under never day same another know while last might us "
    "great old year off come since against go came right used take three states himself few "
    "house use during without again place around however home small found thought went say "
    "part once general high upon school every does got united left number course war until "
    "always away something fact though water less public put think almost hand enough far "
    "took head yet government system better set told nothing night end why called find going "
    "look asked later knew point next program city business give group toward young days let "
    "room president side social present given several order national possible rather second "
    "face per among form important often things looked early white case large big need four "
    "within felt along children saw best church ever least power development"
).split()
assert len(VOCABULARY) == 256 and len(set(VOCABULARY)) == 256

_SALT: Final = b"context-assembly replay block "
TOOL_PARAMETERS: Final = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "What to act on."}},
}
DEFAULT_START: Final = datetime.fromisoformat("2026-01-05T09:00:00+00:00")
"""When a trace starts (its times are seconds since its start): a Monday morning."""


@lru_cache(maxsize=1 << 16)
def block_text(block_id: int, words: int = BLOCK_TOKENS) -> str:
    """The text of one block: ``words`` words of ``VOCABULARY``, each with a leading space,
    picked by a digest of the id."""
    seed = _SALT + str(block_id).encode()
    picks = b""
    counter = 0
    while len(picks) < words:
        picks += hashlib.sha256(seed + b":" + str(counter).encode()).digest()
        counter += 1
    return "".join(" " + VOCABULARY[b] for b in picks[:words])


def blocks_text(block_ids: Sequence[int], words: int = BLOCK_TOKENS) -> str:
    return "".join(block_text(b, words) for b in block_ids)


# --------------------------------------------------------------------------- the trace


@dataclass(frozen=True, slots=True)
class TraceRequest:
    t: float
    model: str
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]  # the full blocks' hashes
    input_types: tuple[str, ...]
    stop: str


@dataclass(frozen=True, slots=True)
class Trace:
    id: str
    block_size: int
    tool_tokens: int
    system_tokens: int
    requests: tuple[TraceRequest, ...]
    skipped_subagents: int


class TraceError(ValueError):
    """A trace file that cannot be read as a kv-cache-tester trace."""


def load_json(path: Path) -> Any:
    """A ``.json`` or ``.json.gz`` file's value."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return orjson.loads(raw)


def parse_trace(data: Any, name: str = "trace") -> Trace:
    """A trace from its JSON value; raises ``TraceError`` naming what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("requests"), list):
        raise TraceError(f"{name}: not a trace (an object with 'requests')")
    block_size = data.get("block_size", BLOCK_TOKENS)
    if not isinstance(block_size, int) or block_size < 1:
        raise TraceError(f"{name}: block_size must be a positive integer")
    requests: list[TraceRequest] = []
    skipped = 0
    for index, entry in enumerate(data["requests"]):
        if not isinstance(entry, dict):
            raise TraceError(f"{name}: requests[{index}] is not an object")
        if entry.get("type") == "subagent":
            skipped += 1
            continue
        try:
            full = int(entry["in"]) // block_size
            hashes = tuple(int(h) for h in entry["hash_ids"])
            requests.append(
                TraceRequest(
                    t=float(entry["t"]),
                    model=str(entry.get("model") or (data.get("models") or ["unknown"])[0]),
                    input_tokens=int(entry["in"]),
                    output_tokens=int(entry.get("out", 0)),
                    blocks=hashes[:full],
                    input_types=tuple(str(t) for t in entry.get("input_types") or ()),
                    stop=str(entry.get("stop") or ""),
                )
            )
        except (KeyError, TypeError, ValueError) as err:
            raise TraceError(f"{name}: requests[{index}]: {err!r}") from None
    return Trace(
        id=str(data.get("id") or name),
        block_size=block_size,
        tool_tokens=int(data.get("tool_tokens", 0)),
        system_tokens=int(data.get("system_tokens", 0)),
        requests=tuple(requests),
        skipped_subagents=skipped,
    )


def read_trace(path: Path) -> Trace:
    """A trace file (``.json`` or ``.json.gz``)."""
    name = path.name.removesuffix(".gz").removesuffix(".json")
    try:
        data = load_json(path)
    except (OSError, orjson.JSONDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise TraceError(f"{path.name}: cannot read: {err}") from None
    return parse_trace(data, name)


# --------------------------------------------------------------------------- the rebuild


@dataclass(frozen=True, slots=True)
class _Message:
    blocks: tuple[int, ...]
    message: dict[str, Any]
    role: str  # "user", "assistant" or "tool"
    call_id: str | None = None  # an assistant's tool call


def tools_of(block_ids: Sequence[int], words: int) -> tuple[dict[str, Any], ...]:
    """The tools of a request's tool blocks, ``TOOL_BLOCKS`` per tool, in the prepare request's
    shape."""
    return tuple(
        {
            "name": f"tool_{i // TOOL_BLOCKS:02d}",
            "description": blocks_text(block_ids[i : i + TOOL_BLOCKS], words),
            "parameters": TOOL_PARAMETERS,
        }
        for i in range(0, len(block_ids), TOOL_BLOCKS)
    )


def anthropic_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": tool["name"],
        "description": tool["description"],
        "input_schema": tool["parameters"],
    }


def plain_anthropic_body(
    model: str,
    instructions: str | None,
    tools: Sequence[dict[str, Any]],
    messages: Sequence[dict[str, Any]],
    max_tokens: int,
) -> dict[str, Any]:
    """The Anthropic body a plain client sends: tools, system, the conversation as it is."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    if instructions:
        body["system"] = instructions
    body["messages"] = list(messages)
    if tools:
        body["tools"] = [anthropic_tool(t) for t in tools]
    return body


def _split_points(messages: Sequence[_Message]) -> tuple[int, int]:
    """(call split, turn split): after the last assistant message; at the last user text."""
    call = next(
        (i + 1 for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), 0
    )
    turn = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "user"), 0)
    return call, turn


def rebuild(trace: Trace, start: datetime = DEFAULT_START) -> Conversation:
    """The trace's requests as calls of one conversation (rules in the module doc)."""
    words = trace.block_size
    n_tools = round(trace.tool_tokens / trace.block_size)
    n_system = round(trace.system_tokens / trace.block_size)
    notes: list[str] = []
    if trace.skipped_subagents:
        notes.append(f"{trace.skipped_subagents} subagent requests skipped")
    calls: list[Call] = []
    messages: list[_Message] = []
    previous: TraceRequest | None = None
    rewrites = 0
    short = 0
    for request in trace.requests:
        blocks = request.blocks
        tools_n = min(n_tools, max(len(blocks) - 1, 0))
        system_n = min(n_system, max(len(blocks) - tools_n - 1, 0))
        conversation = blocks[tools_n + system_n :]
        if not conversation:
            short += 1
            continue
        tools = tools_of(blocks[:tools_n], words)
        instructions = blocks_text(blocks[tools_n : tools_n + system_n], words) or None
        kept, position = _kept(messages, conversation)
        # At least two new blocks (the answer and the input), stepping back one exchange at a time.
        while kept >= 3 and len(conversation) - position < 2:
            kept -= 2
            position -= len(messages[kept].blocks) + len(messages[kept + 1].blocks)
        rest = conversation[position:]
        tool_call = (
            previous is not None
            and previous.stop == "tool_use"
            and "tool_result" in request.input_types
            and bool(tools)
        )
        rewritten = False
        if kept == 0 or len(rest) < (1 if tool_call else 2):
            rewritten = bool(messages)
            rewrites += rewritten
            messages = [
                _Message(
                    conversation,
                    {"role": "user", "content": blocks_text(conversation, words)},
                    "user",
                )
            ]
        else:
            assert previous is not None
            messages = messages[:kept]
            answer_n = min(max(round(previous.output_tokens / words), 1), len(rest) - 1)
            if tool_call and len(rest) == 1:
                answer_n = 0
            messages += _exchange(rest, answer_n, tool_call, tools, len(calls), words)
        call_split, turn_split = _split_points(messages)
        plain = [m.message for m in messages]
        calls.append(
            Call(
                index=len(calls) + 1,
                at=start + timedelta(seconds=request.t),
                model=request.model,
                format="anthropic",
                instructions=instructions,
                tools=tools,
                messages=tuple(plain),
                call_split=call_split,
                turn_split=turn_split,
                output_tokens=max(request.output_tokens, 1),
                body=plain_anthropic_body(
                    request.model, instructions, tools, plain, max(request.output_tokens, 1)
                ),
                reference_input_tokens=request.input_tokens,
                rewritten=rewritten,
            )
        )
        previous = request
    if rewrites:
        notes.append(f"{rewrites} rewritten conversations (started over from the system prompt)")
    if short:
        notes.append(f"{short} requests without conversation blocks skipped")
    return Conversation(trace.id, calls, notes, "trace")


def _kept(messages: Sequence[_Message], conversation: Sequence[int]) -> tuple[int, int]:
    """How many of ``messages`` to keep (their blocks a prefix of ``conversation``, ending on a
    user or tool message) and the blocks they cover."""
    kept = position = 0
    for message in messages:
        end = position + len(message.blocks)
        if tuple(conversation[position:end]) != message.blocks:
            break
        kept, position = kept + 1, end
    while kept and messages[kept - 1].role == "assistant":
        kept -= 1
        position -= len(messages[kept].blocks)
    return kept, position


def _exchange(
    rest: Sequence[int],
    answer_n: int,
    tool_call: bool,
    tools: Sequence[dict[str, Any]],
    index: int,
    words: int,
) -> list[_Message]:
    """The model's answer (``answer_n`` blocks, and a tool call) and the new input."""
    answer_blocks = tuple(rest[:answer_n])
    input_blocks = tuple(rest[answer_n:])
    content: list[dict[str, Any]] = []
    if answer_blocks:
        content.append({"type": "text", "text": blocks_text(answer_blocks, words)})
    call_id = None
    if tool_call:
        call_id = f"toolu_{index:05d}"
        name = tools[(rest[0] if rest else 0) % len(tools)]["name"]
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": {}})
    answer = _Message(
        answer_blocks, {"role": "assistant", "content": content}, "assistant", call_id
    )
    text = blocks_text(input_blocks, words)
    if call_id is not None:
        result = {"type": "tool_result", "tool_use_id": call_id, "content": text}
        new_input = _Message(input_blocks, {"role": "user", "content": [result]}, "tool")
    else:
        new_input = _Message(input_blocks, {"role": "user", "content": text}, "user")
    return [answer, new_input]
