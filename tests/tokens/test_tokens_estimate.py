"""The conservative estimator: an upper bound of o200k and cl100k on the generated corpus, cheap and exact-integer."""

from __future__ import annotations

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from token_corpus import KNOWN_GAPS, LATIN_TEXT

from context_assembly.core.counting import TokenCounter
from context_assembly.tokens.encodings import get_encoding
from context_assembly.tokens.estimate import SHORT_TEXT_BYTES, EstimateCounter, estimate_tokens
from hypothesis_budget import examples

REQUIRED_KINDS = ("prose", "code", "json", "zh", "ja", "ko", "emoji")


def _real(text: str, o200k: tiktoken.Encoding, cl100k: tiktoken.Encoding) -> int:
    return max(len(o200k.encode_ordinary(text)), len(cl100k.encode_ordinary(text)))


def _slices(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_corpus_covers_the_required_kinds(samples: dict[str, str]) -> None:
    """The corpus has prose, code, JSON, Chinese, Japanese, Korean and emoji samples of real size."""
    for kind in REQUIRED_KINDS:
        assert any(name.startswith(kind) and len(text) >= 2000 for name, text in samples.items()), (
            kind
        )


def test_upper_bound_on_every_sample_and_slice(
    samples: dict[str, str], o200k: tiktoken.Encoding, cl100k: tiktoken.Encoding
) -> None:
    """The estimate is ≥ both o200k and cl100k on each whole sample and each 300/2,000-char slice (known gaps aside)."""
    failures = []
    for name, text in samples.items():
        if name in KNOWN_GAPS:
            continue
        for piece in [text, *_slices(text, 2000), *_slices(text, 300)]:
            real = _real(piece, o200k, cl100k)
            if estimate_tokens(piece) < real:
                failures.append((name, piece[:40], estimate_tokens(piece), real))
    assert failures == []


def test_latin_text_keeps_claude_headroom(
    samples: dict[str, str], o200k: tiktoken.Encoding, cl100k: tiktoken.Encoding
) -> None:
    """On Latin-script prose, code and JSON the estimate is ≥ 1.3× the exact counts (Claude counts ~1.26× o200k)."""
    for name in LATIN_TEXT:
        text = samples[name]
        for piece in [text, *_slices(text, 2000)]:
            assert estimate_tokens(piece) >= 1.3 * _real(piece, o200k, cl100k), name


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("prose_docs", 1.6, 1.9),
        ("code_python", 1.6, 1.9),
        ("json_pretty", 1.45, 1.7),
        ("zh", 2.5, 3.0),
    ],
)
def test_documented_bias_against_o200k(
    samples: dict[str, str], o200k: tiktoken.Encoding, name: str, low: float, high: float
) -> None:
    """The over-estimate stays near the figures in the module docstring (it is an upper bound, not a wild one)."""
    ratio = estimate_tokens(samples[name]) / len(o200k.encode_ordinary(samples[name]))
    assert low <= ratio <= high


def test_known_gap_is_as_documented(samples: dict[str, str], cl100k: tiktoken.Encoding) -> None:
    """Uniformly random Hangul is under-estimated against cl100k by about the documented 0.81×."""
    text = samples["hangul_random"]
    assert 0.75 <= estimate_tokens(text) / len(cl100k.encode_ordinary(text)) < 1.0


@pytest.mark.parametrize(
    "text",
    [
        "user",
        "assistant",
        "call_8f3a9b2c4d5e6f7a8b9c0d1e",
        "toolu_01A09q90qw90lq917835lq9",
        "😀",
        "中",
        "a" * SHORT_TEXT_BYTES,
        "é" * (SHORT_TEXT_BYTES // 2),
    ],
)
def test_short_text_is_its_byte_length(text: str) -> None:
    """Up to 64 UTF-8 bytes the estimate is the byte length, a hard upper bound for byte-level BPE."""
    assert estimate_tokens(text) == len(text.encode("utf-8"))


def test_empty_text_is_zero() -> None:
    """The empty string costs nothing."""
    assert estimate_tokens("") == 0


def test_hand_computed_value() -> None:
    """A long text gets exactly ceil(2 + Σ weight × class count) from the docstring table."""
    text = "Hello World 42!\n" * 5  # 80 bytes, above the short-text rule
    # per line: upper H,W 2; lower "ello","orld" 8; digits 2; spaces 2; "!" 1; "\n" 1 (hundredths)
    per_line = 2 * 133 + 8 * 22 + 2 * 130 + 2 * 80 + 1 * 90 + 1 * 20
    assert estimate_tokens(text) == -(-(200 + 5 * per_line) // 100) == 51


def test_non_ascii_classes_by_utf8_length() -> None:
    """2-, 3- and 4-byte characters cost 1.25, 2.10 and 3.00 on top of the base."""
    assert estimate_tokens("é" * 40) == 2 + 50  # 80 bytes
    assert estimate_tokens("中" * 30) == 2 + 63  # 90 bytes
    assert estimate_tokens("😀" * 20) == 2 + 60  # 80 bytes


def test_four_space_runs_cost_less_than_four_spaces() -> None:
    """Indentation in runs of four spaces costs 1.10 per run, not 4 × 0.80."""
    indented = "        x\n" * 10  # 100 bytes: 20 runs of four, 10 x, 10 newlines
    assert estimate_tokens(indented) == -(-(200 + 20 * 110 + 10 * 22 + 10 * 20) // 100)


def test_lone_surrogate_does_not_crash() -> None:
    """A lone surrogate (possible in a Python str) is counted as a 3-byte character."""
    assert estimate_tokens("\ud800" * 30) == 2 + 63


@settings(max_examples=examples(100))
@given(st.text(max_size=400))
def test_never_above_byte_length_and_positive(text: str) -> None:
    """For any text: 0 only when empty, never above the UTF-8 byte length, same input same output."""
    size = len(text.encode("utf-8", "surrogatepass"))
    estimate = estimate_tokens(text)
    assert (estimate == 0) == (text == "")
    assert estimate <= size
    assert estimate == estimate_tokens(text)


@settings(max_examples=examples(100))
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=SHORT_TEXT_BYTES))
def test_at_least_exact_count_on_short_text(text: str) -> None:
    """Any text up to 64 bytes is never under-counted by o200k or cl100k (hard byte bound)."""
    if len(text.encode("utf-8")) <= SHORT_TEXT_BYTES:
        real = max(
            len(get_encoding(name).encode_ordinary(text)) for name in ("o200k_base", "cl100k_base")
        )
        assert estimate_tokens(text) >= real


def test_estimate_counter_is_a_token_counter() -> None:
    """EstimateCounter is named 'estimate' and counts with estimate_tokens."""
    counter: TokenCounter = EstimateCounter()
    assert counter.name == "estimate"
    assert counter.count("x" * 100) == estimate_tokens("x" * 100)
