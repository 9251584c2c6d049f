"""Counts that add up across a join: the split rule of the shipped encodings
(``encodings.splits_between``) and ``core.counting.count_joined``, against full counts."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from context_assembly.core.counting import TokenCounter, count_joined
from context_assembly.core.select import DATA_CLOSE, DATA_OPEN, SEPARATOR
from context_assembly.tokens.counter import CachedCounter, TiktokenCounter, get_counter
from context_assembly.tokens.encodings import SPECS, EncodingName, get_encoding, splits_between
from context_assembly.tokens.estimate import EstimateCounter
from hypothesis_budget import examples

ENCODINGS: list[EncodingName] = sorted(SPECS)
PROPERTY = settings(
    max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# What the pre-tokenisers tell apart: Unicode whitespace (and characters Python calls space that
# the patterns do not), newlines, letters of every case class, marks, digits, punctuation with
# the slash and the apostrophe, contractions, emoji, and the JSON of the data message.
WHITESPACE = [" ", "  ", "\t", "\n", "\r", "\r\n", "\n\n", "\x0b", "\x0c", "\x1c", "\x85", "\xa0"]
WHITESPACE += ["\u2028", "\u3000", "\u200b"]
LETTERS = ["a", "word", "Z", "ABC", "é", "ß", "ǅ", "ʰ", "中文", "ا", "й", "e\u0301", "\u093f"]
DIGITS = ["0", "7", "1234567", "٣", "²"]
PUNCTUATION = ["'", "'s", "'ll", "'T", '"', "/", "//", "{", "}", ",", ".", "!", "-", "_", "…"]
PUNCTUATION += ['{"', '"}', "],", "😀", "<|endoftext|>"]
PIECES = WHITESPACE + LETTERS + DIGITS + PUNCTUATION
FRAMING = [DATA_OPEN, DATA_CLOSE, SEPARATOR, '{"source":"memory","blocks":[\n', '{"id":"a"}']


def _text(max_size: int = 6) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(PIECES), max_size=max_size).map("".join)


@st.composite
def joins(draw: st.DrawFn) -> tuple[str, str, str]:
    """``(left, right, rest)``: half with a character at the join that the rule admits (a
    newline before it, a space after it), so that its claim is tested often, with every
    character class on the other side of the join; a quarter with other whitespace after it."""
    left, right = draw(_text()), draw(_text())
    edge = draw(st.sampled_from(["newline", "space", "whitespace", "free"]))
    if edge == "newline":
        left += draw(st.sampled_from(["", *PIECES])) + "\n"
    elif edge == "space":
        right = " " + draw(st.sampled_from(["", *PIECES])) + right
    elif edge == "whitespace":
        left += draw(st.sampled_from(PIECES))
        right = draw(st.sampled_from(WHITESPACE)) + right
    return left, right, draw(_text(3))


def _encode(name: EncodingName, text: str) -> list[int]:
    return get_encoding(name).encode_ordinary(text)


# One character of each class the patterns tell apart, for the exhaustive test below.
EDGES = ["", "\n", " ", "\t", "\r", "\x85", "\xa0", "\u3000", "/", ".", "'", "s", "Z", "中"]
EDGES += ["\u0301", "7", "}", '"', "😀"]


def test_a_split_join_encodes_each_side_alone_for_every_pair_of_edge_characters() -> None:
    """For every two characters before the join and every two after it (one of each class),
    where the rule says the join splits, every shipped encoding encodes each side alone."""
    encodings = [get_encoding(name) for name in ENCODINGS]
    for a in EDGES:
        for b in EDGES:
            left = "x" + a + b
            for c in EDGES:
                for d in EDGES:
                    right = c + d + "y"
                    if not splits_between(left, right):
                        continue
                    for encoding in encodings:
                        encode = encoding.encode_ordinary
                        assert encode(left + right) == encode(left) + encode(right), (
                            encoding.name,
                            left,
                            right,
                        )


@PROPERTY
@given(joins())
@example(("x.\n", '{"id"', " ,\n"))
@example(('{"id":"a","text":"b."}', " ,\n", '{"id"'))
@example(("'", " s", ""))
@example(("x \n\n", "word", ""))
def test_a_split_join_encodes_each_side_alone(join: tuple[str, str, str]) -> None:
    """Where the rule says a join splits, every shipped encoding encodes the text on each side
    alone, whatever follows: the tokens of left + right + rest are those of left, then those of
    right + rest (so the counts add up)."""
    left, right, rest = join
    if not splits_between(left, right):
        return
    for name in ENCODINGS:
        assert _encode(name, left + right + rest) == _encode(name, left) + _encode(
            name, right + rest
        ), name


def test_the_rule_admits_the_joins_of_the_data_message_and_no_join_that_merges() -> None:
    """The data message's joins split (after a newline, before a space); a join inside a
    punctuation run, a word or a run of whitespace does not, nor one with an empty side."""
    assert splits_between(DATA_OPEN, '{"source":"memory"')
    assert splits_between('{"id":"a","text":"b."}', SEPARATOR)
    assert splits_between(SEPARATOR, '{"id":"b"')
    assert splits_between('{"id":"a","text":"b"}', DATA_CLOSE)
    assert splits_between(DATA_CLOSE, DATA_CLOSE)
    for left, right in (('"}', ","), ("wo", "rd"), (" ", " x"), ("x\n", "\n"), ("x\n", "/")):
        assert not splits_between(left, right)
    assert not splits_between("", "x") and not splits_between("x", "")


COUNTERS: list[TokenCounter] = [
    *(TiktokenCounter(name) for name in ENCODINGS),
    *(get_counter(name) for name in ENCODINGS),
    get_counter("estimate"),
    CachedCounter(EstimateCounter()),
]


@st.composite
def parts(draw: st.DrawFn) -> list[str]:
    """A text in parts: the data message's framing and free text, in any order."""
    return draw(st.lists(st.one_of(st.sampled_from(FRAMING), _text(4)), max_size=8))


@PROPERTY
@given(parts())
@example([DATA_OPEN, '{"source":"m","blocks":[\n', '{"id":"a"}', SEPARATOR, '{"id":"b"}'])
@example(['{"id":"a"}', ",", '{"id":"b"}'])
def test_a_joined_count_is_the_count_of_the_whole_text(pieces: list[str]) -> None:
    """``count_joined`` gives the count of the whole text for every shipped encoding (cached or
    not) and for the estimate: the sum of the parts' counts where each join splits, a count of
    the whole text where one does not."""
    for counter in COUNTERS:
        counts = [counter.count(piece) for piece in pieces]
        whole = counter.count("".join(pieces))
        assert count_joined(pieces, counts, counter) == whole, counter


class _Recording:
    """Counts characters, splits where it is told to, and records what it counts."""

    name = "estimate"

    def __init__(self, splits: bool) -> None:
        self._splits = splits
        self.counted: list[str] = []

    def count(self, text: str) -> int:
        self.counted.append(text)
        return len(text)

    def splits(self, left: str, right: str) -> bool:
        return self._splits


def test_a_joined_count_sums_the_given_counts_where_every_join_splits() -> None:
    """Where every join splits, the parts' given counts are summed and nothing is counted;
    otherwise the whole text is counted once."""
    splitting = _Recording(splits=True)
    assert count_joined(["ab", "cd"], [5, 7], splitting) == 12  # type: ignore[arg-type]
    assert splitting.counted == []
    merging = _Recording(splits=False)
    assert count_joined(["ab", "cd"], [5, 7], merging) == 4  # type: ignore[arg-type]
    assert merging.counted == ["abcd"]
