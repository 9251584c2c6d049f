"""Traces read and rebuilt as conversations (``replay/synth.py``): the synthesised text counts
exactly, the conversation keeps its prefix, and a small trace's figures under the plain client's
policy match a hand computation."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest

from context_assembly.replay.frames import TextCounter, anthropic_segments
from context_assembly.replay.policies import mark_last_message
from context_assembly.replay.rules import AnthropicCache, Usage
from context_assembly.replay.synth import (
    BLOCK_TOKENS,
    VOCABULARY,
    TraceError,
    block_text,
    blocks_text,
    parse_trace,
    read_trace,
    rebuild,
)
from context_assembly.tokens.encodings import get_encoding

HERE = Path(__file__).resolve().parent
TRACES = sorted((HERE / "traces").glob("trace_*.json.gz"))


def count(text: str) -> int:
    return len(get_encoding("o200k_base").encode_ordinary(text))


def test_every_word_is_one_token_and_a_block_counts_64() -> None:
    """Each word of the vocabulary is one o200k token with its leading space; a block's text
    counts 64, and n blocks together count 64 × n: the counts add up by construction."""
    assert len(set(VOCABULARY)) == 256
    assert all(count(" " + word) == 1 for word in VOCABULARY)
    assert all(count(block_text(i)) == BLOCK_TOKENS for i in range(1, 200))
    assert count(blocks_text(range(1, 301))) == 300 * BLOCK_TOKENS


def test_equal_ids_give_equal_text_and_different_ids_differ() -> None:
    """The words are seeded by the block id alone."""
    assert block_text(42) == block_text(42)
    assert len({block_text(i) for i in range(1000)}) == 1000


def _request(t: float, blocks: int, out: int, **fields: Any) -> dict[str, Any]:
    return {
        "t": t,
        "type": "n",
        "model": "claude-sonnet-4-5-20250929",
        "in": blocks * 64 + 10,
        "out": out,
        "hash_ids": list(range(1, blocks + 1)),
        "input_types": ["text"],
        "output_types": ["text"],
        "stop": "end_turn",
        **fields,
    }


# A trace without tools: 20 system blocks (1,280 tokens), then a conversation.
SMALL = {
    "id": "small",
    "models": ["claude-sonnet-4-5-20250929"],
    "block_size": 64,
    "tool_tokens": 0,
    "system_tokens": 1280,
    "requests": [
        _request(0, 24, 130),  # a user message of 4 blocks
        _request(100, 29, 64),  # + an answer of round(130 / 64) = 2 blocks, a user message of 3
        _request(460, 31, 64),  # six minutes later: + 1 answer block, 1 user block
        {"t": 470, "type": "subagent", "in": 5000, "out": 10, "hash_ids": [900]},
        # + 1 answer block, 1 user block; its list also names the partial block (34): ignored.
        {**_request(480, 33, 64), "hash_ids": list(range(1, 35)), "in": 33 * 64 + 20},
    ],
}


def test_a_small_trace_by_hand() -> None:
    """The plain client's figures of SMALL, computed by hand: a message counts its text plus 3,
    the system prompt 1,280 + 3."""
    conversation = rebuild(parse_trace(SMALL))
    assert conversation.notes == ["1 subagent requests skipped"]
    cache = AnthropicCache(minimum=1024)
    counter = TextCounter()
    got = []
    for call in conversation.calls:
        body = mark_last_message(call.body, "anthropic", "5m")
        got.append(cache.send(anthropic_segments(body, counter), call.at.timestamp()))
    assert got == [
        # system 1,283 + user (256 + 3) = 1,542, all written at the marker.
        Usage(1542, 0, 1542),
        # + answer 128 + 3, user 192 + 3: the marker's lookback reads the first request's 1,542.
        Usage(1868, 1542, 326),
        # Six minutes later: nothing is alive. + 67 + 67.
        Usage(2002, 0, 2002),
        # 20 seconds later: the previous request's 2,002 read, 134 written.
        Usage(2136, 2002, 134),
    ]
    assert [c.reference_input_tokens for c in conversation.calls] == [1546, 1866, 1994, 2132]


def test_messages_are_kept_while_their_blocks_are_a_prefix() -> None:
    """Each call begins with the previous call's messages, ends on the new input, and the
    system prompt and conversation hold exactly the trace's blocks."""
    conversation = rebuild(parse_trace(SMALL))
    calls = conversation.calls
    for before, after in itertools.pairwise(calls):
        assert after.messages[: len(before.messages)] == before.messages
        assert [m["role"] for m in after.messages[len(before.messages) :]] == ["assistant", "user"]
    last = calls[-1]
    assert last.instructions == blocks_text(range(1, 21))
    texts = "".join(
        m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
        for m in last.messages
    )
    assert texts == blocks_text(range(21, 34))


def test_a_tool_loop_pairs_each_call_with_its_result() -> None:
    """After a request that stopped on tool_use, a tool_result input answers the answer's call;
    the splits are after the last answer (call) and at the last user text (turn)."""
    trace = {
        **SMALL,
        "tool_tokens": 64 * 20,
        "requests": [
            _request(0, 44, 100, stop="tool_use"),
            _request(10, 48, 100, stop="tool_use", input_types=["tool_result"]),
            _request(20, 52, 100, input_types=["tool_result"]),
        ],
    }
    conversation = rebuild(parse_trace(trace))
    last = conversation.calls[-1]
    assert len(last.tools) == 2 and last.tools[0]["name"] == "tool_00"
    roles = [
        (m["role"], [b["type"] for b in m["content"]] if isinstance(m["content"], list) else "text")
        for m in last.messages
    ]
    assert roles == [
        ("user", "text"),
        ("assistant", ["text", "tool_use"]),
        ("user", ["tool_result"]),
        ("assistant", ["text", "tool_use"]),
        ("user", ["tool_result"]),
    ]
    calls = [
        b
        for m in last.messages
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    results = [
        b
        for m in last.messages
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert [c["id"] for c in calls] == [r["tool_use_id"] for r in results]
    assert (last.call_split, last.turn_split) == (4, 0)


def test_a_rewritten_conversation_starts_over() -> None:
    """A request that shares only the system blocks starts over with one user message."""
    second = {**_request(10, 26, 100), "hash_ids": [*range(1, 21), *range(500, 506)]}
    conversation = rebuild(parse_trace({**SMALL, "requests": [_request(0, 30, 100), second]}))
    last = conversation.calls[-1]
    assert last.rewritten and len(last.messages) == 1
    assert last.messages[0]["content"] == blocks_text(range(500, 506))
    assert conversation.notes == ["1 rewritten conversations (started over from the system prompt)"]


def test_plain_and_gzipped_files_read_the_same(tmp_path: Path) -> None:
    """A trace reads from .json and .json.gz alike; a file that is not a trace is refused."""
    plain = tmp_path / "small.json"
    plain.write_bytes(orjson.dumps(SMALL))
    packed = tmp_path / "small.json.gz"
    packed.write_bytes(gzip.compress(orjson.dumps(SMALL)))
    assert read_trace(plain) == read_trace(packed)
    assert read_trace(plain).skipped_subagents == 1
    wrong = tmp_path / "wrong.json"
    wrong.write_bytes(b'{"calls": []}')
    with pytest.raises(TraceError, match="not a trace"):
        read_trace(wrong)


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_the_fixture_traces_rebuild_into_counted_frames(path: Path) -> None:
    """Every request of the shipped fixtures rebuilds; the plain frame counts the trace's full
    blocks (64 × blocks) plus the framing, a little over the trace's own input count."""
    conversation = rebuild(read_trace(path))
    counter = TextCounter()
    for call in conversation.calls:
        frame = sum(s.tokens for s in anthropic_segments(call.body, counter))
        assert call.reference_input_tokens is not None
        assert 0 < frame - call.reference_input_tokens < 1000
