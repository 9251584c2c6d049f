"""Token counting for the service: tiktoken from shipped files, a conservative estimator, models.

``get_counter(name)`` gives the process-wide counter for a tokenizer; ``ModelRegistry.load()``
gives the model profiles (context window, framing overhead, tokenizer) from ``data/models.json``.
Nothing here touches the network: the tiktoken rank files ship in ``data/`` and are checked
against their sha256 before use.
"""

from context_assembly.tokens.counter import (
    CachedCounter,
    CacheInfo,
    CountCache,
    TiktokenCounter,
    get_counter,
)
from context_assembly.tokens.encodings import TokenizerDataError, get_encoding
from context_assembly.tokens.estimate import EstimateCounter, estimate_tokens
from context_assembly.tokens.registry import ModelRegistry, RegistryDataError

__all__ = [
    "CacheInfo",
    "CachedCounter",
    "CountCache",
    "EstimateCounter",
    "ModelRegistry",
    "RegistryDataError",
    "TiktokenCounter",
    "TokenizerDataError",
    "estimate_tokens",
    "get_counter",
    "get_encoding",
]
