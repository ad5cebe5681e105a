"""Token layout of phasefix's synthetic tasks.

    0                          BOS
    1 .. F                     filler tokens (decorative padding)
    F+1 .. F+K                 key tokens
    F+K+1 .. F+K+V             value tokens
    F+K+V+1 .. F+K+V+B         byte tokens (LM mix only; B = 0 or 256)

The ranges are disjoint, so a token's role can be read off its id.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from phasefix.errors import check


@dataclass(frozen=True)
class RetrievalVocab:
    num_keys: int = 32
    num_values: int = 32
    num_filler: int = 16
    num_bytes: int = 0

    bos: ClassVar[int] = 0

    def __post_init__(self) -> None:
        for key in ("num_keys", "num_values", "num_filler"):
            value = getattr(self, key)
            check(isinstance(value, int) and value >= 1, key, value, "must be an integer >= 1")
        check(self.num_bytes in (0, 256), "num_bytes", self.num_bytes, "must be 0 or 256")

    @property
    def filler_start(self) -> int:
        return 1

    @property
    def key_start(self) -> int:
        return 1 + self.num_filler

    @property
    def value_start(self) -> int:
        return self.key_start + self.num_keys

    @property
    def byte_start(self) -> int:
        return self.value_start + self.num_values

    @property
    def size(self) -> int:
        """Number of token ids the layout needs (a model's vocab_size must be at least this)."""
        return self.byte_start + self.num_bytes

    # The helpers accept ints or integer numpy arrays (vectorised generation).
    def filler_token(self, i):
        return self.filler_start + i

    def key_token(self, i):
        return self.key_start + i

    def value_token(self, i):
        return self.value_start + i

    def byte_token(self, b):
        return self.byte_start + b

    def is_key(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens)
        return (tokens >= self.key_start) & (tokens < self.value_start)

    def is_value(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens)
        return (tokens >= self.value_start) & (tokens < self.byte_start)

    def is_filler(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens)
        return (tokens >= self.filler_start) & (tokens < self.key_start)

    def check_fits(self, vocab_size: int) -> None:
        check(vocab_size >= self.size, "model.vocab_size", vocab_size,
              f"must be >= {self.size} (the data's token layout: {self})")
