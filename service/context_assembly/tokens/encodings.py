"""The two OpenAI encodings (``o200k_base``, ``cl100k_base``), built from the rank files we ship.

``tiktoken.get_encoding`` downloads its rank file on first use and, when a cached copy is missing
or bad, silently retries the network. We never call it. Instead each encoding is built directly
as a ``tiktoken.Encoding`` from ``data/<name>.tiktoken`` (option (d) of the perf baseline):

1. read the file from the installed package (``importlib.resources``), never from a URL;
2. check its sha256 against the value tiktoken itself pins in ``tiktoken_ext/openai_public.py``
   (also listed in ``data/SHA256SUMS``); a missing file or a mismatch raises
   :class:`TokenizerDataError` naming the file and both hashes;
3. parse the ``<base64 token> <rank>`` lines ourselves, so ``tiktoken.load`` (which may write a
   copy into its cache directory) is never involved.

The split pattern and special tokens below are copied from ``openai_public.py`` (tiktoken 0.14);
``tests/tokens`` compares them with the installed tiktoken so a drift fails CI, not production.
Each encoding is built once per process, on first use, under a lock: building o200k_base takes
0.3–0.6 s of CPU (cl100k_base about half), which two threads must not both spend.

``splits_between`` says where the split patterns cut any text, so that counts add up across
such a join (the data message is laid out on such joins: ``core/select.py``).
"""

from __future__ import annotations

import binascii
import hashlib
import threading
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

import tiktoken

EncodingName = Literal["o200k_base", "cl100k_base"]

ENDOFTEXT = "<|endoftext|>"
FIM_PREFIX = "<|fim_prefix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_SUFFIX = "<|fim_suffix|>"
ENDOFPROMPT = "<|endofprompt|>"


class TokenizerDataError(RuntimeError):
    """A shipped tokenizer file is missing, unreadable, or not the file we expect."""


@dataclass(frozen=True, slots=True)
class EncodingSpec:
    """Everything needed to build one encoding offline."""

    name: EncodingName
    filename: str
    sha256: str
    pat_str: str
    special_tokens: dict[str, int]


# Source: tiktoken 0.14.0, tiktoken_ext/openai_public.py (cl100k_base(), o200k_base()).
_CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT_STR = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

SPECS: dict[EncodingName, EncodingSpec] = {
    "o200k_base": EncodingSpec(
        name="o200k_base",
        filename="o200k_base.tiktoken",
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        pat_str=_O200K_PAT_STR,
        special_tokens={ENDOFTEXT: 199999, ENDOFPROMPT: 200018},
    ),
    "cl100k_base": EncodingSpec(
        name="cl100k_base",
        filename="cl100k_base.tiktoken",
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        pat_str=_CL100K_PAT_STR,
        special_tokens={
            ENDOFTEXT: 100257,
            FIM_PREFIX: 100258,
            FIM_MIDDLE: 100259,
            FIM_SUFFIX: 100260,
            ENDOFPROMPT: 100276,
        },
    ),
}


def splits_between(left: str, right: str) -> bool:
    """Whether the pre-tokeniser of every encoding in ``SPECS`` splits ``left + right`` exactly
    between the two, whatever follows ``right``: then the tokens of ``left + right + rest`` are
    those of ``left`` followed by those of ``right + rest``, and counts add up across the join.

    tiktoken first splits a text with its pattern (``pat_str``), then encodes each piece alone.
    A conservative rule on the two characters at the join (``False`` says nothing either way):

    * ``left`` ends with a newline and ``right`` starts with neither whitespace nor ``/``: the
      alternatives that take a newline go on only over whitespace (the ``\\s`` ones), or over
      newlines (cl100k's punctuation run) and slashes (o200k's); the letter alternatives' one
      leading character is never a newline.
    * ``left`` ends with a character other than whitespace and ``right`` starts with a space: a
      space follows anything but whitespace only as the first character of a piece (the letter
      and punctuation alternatives' optional leading character), so a piece ends at the join;
      and ``left`` does not end with the whitespace that the lookaheads (``(?!\\S)``, ``$``)
      read past the join.

    Python's ``str.isspace`` holds for every character the patterns' ``\\s`` matches (and for a
    few more), so it errs on the safe side. ``tests/tokens`` checks the rule against full counts
    for every encoding in ``SPECS``, on texts with whitespace, letters, marks, digits and
    punctuation at the join.
    """
    if not left or not right:
        return False  # an empty part has no join of its own: its neighbours' join decides
    last, first = left[-1], right[0]
    if last == "\n":
        return not first.isspace() and first != "/"
    return first == " " and not last.isspace()


def data_dir() -> Traversable:
    """The package's ``tokens/data`` directory (works from a wheel, a checkout or a zip)."""
    return resources.files("context_assembly.tokens").joinpath("data")


def read_verified(source: Traversable | Path, expected_sha256: str) -> bytes:
    """Read a file and return its bytes only if their sha256 is the expected one."""
    try:
        data = source.read_bytes()
    except OSError as err:  # FileNotFoundError, PermissionError, IsADirectoryError, ...
        raise TokenizerDataError(
            f"tokenizer file {source} could not be read ({err.__class__.__name__}: {err}); "
            f"expected a file with sha256 {expected_sha256}"
        ) from err
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_sha256:
        raise TokenizerDataError(
            f"tokenizer file {source} has sha256 {actual}, expected {expected_sha256}; "
            "the file is corrupt or not the one this version ships"
        )
    return data


def parse_ranks(data: bytes, source: str) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file: one ``<base64 token> <rank>`` pair per line."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[binascii.a2b_base64(token)] = int(rank)
        except (ValueError, binascii.Error) as err:
            # Unreachable for a file that passed the hash check; reachable only when a caller
            # hands us unverified bytes, and then it should still name the file and line.
            raise TokenizerDataError(f"tokenizer file {source}: bad line {number}") from err
    return ranks


def build_encoding(
    name: EncodingName, directory: Traversable | Path | None = None
) -> tiktoken.Encoding:
    """Build one encoding from its shipped rank file (no cache: every call reads and parses)."""
    spec = SPECS[name]
    source = (directory if directory is not None else data_dir()).joinpath(spec.filename)
    ranks = parse_ranks(read_verified(source, spec.sha256), str(source))
    return tiktoken.Encoding(
        name=spec.name,
        pat_str=spec.pat_str,
        mergeable_ranks=ranks,
        special_tokens=dict(spec.special_tokens),
    )


_built: dict[EncodingName, tiktoken.Encoding] = {}
_build_lock = threading.Lock()


def get_encoding(name: EncodingName) -> tiktoken.Encoding:
    """The process-wide encoding for ``name``, built on first use (thread-safe, built once)."""
    encoding = _built.get(name)
    if encoding is None:
        with _build_lock:
            encoding = _built.get(name)
            if encoding is None:
                encoding = _built[name] = build_encoding(name)
    return encoding
