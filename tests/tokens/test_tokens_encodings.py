"""The shipped tiktoken encodings: offline, hash-checked, identical to tiktoken's own definitions."""

from __future__ import annotations

import hashlib
import shutil
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken_ext.openai_public as openai_public  # type: ignore[import-untyped]

from context_assembly.tokens import encodings
from context_assembly.tokens.encodings import (
    SPECS,
    EncodingName,
    TokenizerDataError,
    build_encoding,
    data_dir,
    get_encoding,
)

NAMES: list[EncodingName] = ["o200k_base", "cl100k_base"]

# Token ids from the perf baseline (verified there against tiktoken's downloaded files and an
# independent Rust BPE implementation).
KNOWN_IDS: dict[EncodingName, dict[str, list[int]]] = {
    "o200k_base": {
        "hello world": [24912, 2375],
        "tiktoken is great!": [83, 8251, 2488, 382, 2212, 0],
    },
    "cl100k_base": {
        "hello world": [15339, 1917],
        "tiktoken is great!": [83, 1609, 5963, 374, 2294, 0],
    },
}
N_VOCAB: dict[EncodingName, int] = {"o200k_base": 200019, "cl100k_base": 100277}
ENDOFTEXT_ID: dict[EncodingName, int] = {"o200k_base": 199999, "cl100k_base": 100257}


def _tiktoken_definition(
    name: EncodingName, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, Any], str]:
    """Call tiktoken's own constructor with its downloader replaced; return it and the pinned hash."""
    pinned: list[str] = []

    def fake_load(_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        assert expected_hash is not None
        pinned.append(expected_hash)
        return {}

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", fake_load)
    definition = openai_public.ENCODING_CONSTRUCTORS[name]()
    return definition, pinned[0]


@pytest.mark.parametrize("name", NAMES)
def test_pattern_and_special_tokens_equal_tiktoken(
    name: EncodingName, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our copied split pattern and special tokens are exactly the installed tiktoken's."""
    definition, _ = _tiktoken_definition(name, monkeypatch)
    assert SPECS[name].pat_str == definition["pat_str"]
    assert SPECS[name].special_tokens == definition["special_tokens"]
    assert "explicit_n_vocab" not in definition


@pytest.mark.parametrize("name", NAMES)
def test_pinned_hash_equals_tiktoken_and_sha256sums(
    name: EncodingName, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sha256 we check is the one tiktoken pins and the one listed in data/SHA256SUMS."""
    _, tiktoken_hash = _tiktoken_definition(name, monkeypatch)
    listed: dict[str, str] = {}
    for line in data_dir().joinpath("SHA256SUMS").read_text().splitlines():
        if line.strip():
            digest, filename = line.split()
            listed[filename] = digest
    assert SPECS[name].sha256 == tiktoken_hash == listed[SPECS[name].filename]


@pytest.mark.parametrize("name", NAMES)
def test_shipped_file_matches_its_hash(name: EncodingName) -> None:
    """The committed rank file hashes to the pinned value."""
    data = data_dir().joinpath(SPECS[name].filename).read_bytes()
    assert hashlib.sha256(data).hexdigest() == SPECS[name].sha256


@pytest.mark.parametrize("name", NAMES)
def test_known_token_ids(name: EncodingName) -> None:
    """Known texts encode to the published token ids, and the vocabulary has the known size."""
    encoding = get_encoding(name)
    for text, ids in KNOWN_IDS[name].items():
        assert encoding.encode_ordinary(text) == ids
    assert encoding.n_vocab == N_VOCAB[name]
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [ENDOFTEXT_ID[name]]


@pytest.mark.parametrize("name", NAMES)
def test_special_token_text_is_ordinary_text(name: EncodingName) -> None:
    """encode_ordinary counts '<|endoftext|>' inside block text as plain characters, not a special token."""
    ids = get_encoding(name).encode_ordinary("before <|endoftext|> after")
    assert ENDOFTEXT_ID[name] not in ids
    assert len(ids) > 3


@pytest.mark.parametrize("name", NAMES)
def test_non_ascii_round_trips(name: EncodingName) -> None:
    """Non-ASCII and emoji text decodes back to itself."""
    text = "Größe – 上下文 🏳️‍🌈 👩‍👩‍👧‍👦 \u00a0tab\tend"
    encoding = get_encoding(name)
    assert encoding.decode(encoding.encode_ordinary(text)) == text


def test_get_encoding_builds_once_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent first calls build the encoding once and all get the same object."""
    built: list[str] = []
    real_build = encodings.build_encoding

    def counting_build(name: EncodingName, directory: Any = None) -> tiktoken.Encoding:
        built.append(name)
        return real_build(name, directory)

    monkeypatch.setattr(encodings, "_built", {})
    monkeypatch.setattr(encodings, "build_encoding", counting_build)
    start = threading.Barrier(4)
    results: list[tiktoken.Encoding] = []

    def worker() -> None:
        start.wait()
        results.append(encodings.get_encoding("cl100k_base"))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert built == ["cl100k_base"]
    assert len(results) == 4 and all(result is results[0] for result in results)


def test_loading_never_touches_the_network_or_tiktoken_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Building both encodings from scratch opens no socket and writes no tiktoken cache file."""
    attempts: list[object] = []

    def refuse(_sock: socket.socket, address: object) -> None:
        attempts.append(address)
        raise AssertionError(f"network connection attempted to {address!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(cache))
    for name in NAMES:
        encoding = build_encoding(name)
        assert encoding.encode_ordinary("hello world") == KNOWN_IDS[name]["hello world"]
    assert attempts == []
    assert list(cache.iterdir()) == []


def _copy_data(tmp_path: Path) -> Path:
    directory = tmp_path / "data"
    directory.mkdir()
    for spec in SPECS.values():
        with (
            data_dir().joinpath(spec.filename).open("rb") as source,
            (directory / spec.filename).open("wb") as target,
        ):
            shutil.copyfileobj(source, target)
    return directory


def test_corrupted_file_raises_naming_file_and_hashes(tmp_path: Path) -> None:
    """A rank file with one changed byte is rejected with its path and the expected and actual hashes."""
    directory = _copy_data(tmp_path)
    path = directory / "cl100k_base.tiktoken"
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(TokenizerDataError) as caught:
        build_encoding("cl100k_base", directory)
    message = str(caught.value)
    assert str(path) in message
    assert SPECS["cl100k_base"].sha256 in message
    assert hashlib.sha256(bytes(data)).hexdigest() in message


def test_missing_file_raises_naming_file_and_hash(tmp_path: Path) -> None:
    """A missing rank file is reported with its path and expected hash, not as a bare OSError."""
    directory = _copy_data(tmp_path)
    (directory / "o200k_base.tiktoken").unlink()
    with pytest.raises(TokenizerDataError) as caught:
        build_encoding("o200k_base", directory)
    assert str(directory / "o200k_base.tiktoken") in str(caught.value)
    assert SPECS["o200k_base"].sha256 in str(caught.value)
    assert isinstance(caught.value.__cause__, FileNotFoundError)


def test_intact_copy_in_another_directory_loads(tmp_path: Path) -> None:
    """The directory argument is honoured: an intact copy elsewhere builds a working encoding."""
    directory = _copy_data(tmp_path)
    assert build_encoding("cl100k_base", directory).encode_ordinary("hello world") == [15339, 1917]


def test_tokenizer_data_error_is_a_runtime_error() -> None:
    """Callers that catch RuntimeError at startup also catch a tokenizer data failure."""
    assert issubclass(TokenizerDataError, RuntimeError)
