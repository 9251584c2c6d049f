"""Fixtures for the token tests: the two shipped encodings and the generated text corpus."""

from __future__ import annotations

import pytest
import tiktoken
from token_corpus import make_samples

from context_assembly.tokens.encodings import get_encoding


@pytest.fixture(scope="session")
def samples() -> dict[str, str]:
    return make_samples()


@pytest.fixture(scope="session")
def o200k() -> tiktoken.Encoding:
    return get_encoding("o200k_base")


@pytest.fixture(scope="session")
def cl100k() -> tiktoken.Encoding:
    return get_encoding("cl100k_base")
