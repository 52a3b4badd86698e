"""Deterministic prompts and output digests.

A prompt is a list of token ids drawn from (salt, length): the same salt gives the same prefix
whatever the length, so prefixes of different sizes share their first chunks only when asked.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

FIRST_ORDINARY_ID = 2  # 0 and 1 are <s> and </s> in the tiny tokenizer


def prompt_ids(salt: str, num_tokens: int, vocab_size: int) -> list[int]:
    seed = int.from_bytes(hashlib.sha256(salt.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    return [rng.randrange(FIRST_ORDINARY_ID, vocab_size) for _ in range(num_tokens)]


def tokens_sha256(token_ids: Sequence[int]) -> str:
    """sha256 over the ids as comma-separated decimals: stable across languages."""
    return hashlib.sha256(",".join(str(int(t)) for t in token_ids).encode()).hexdigest()


def expected_external_tokens(num_tokens: int, chunk_tokens: int) -> int:
    """Tokens an external cache serves: the whole chunks of the prompt, capped one short of
    the prompt (vLLM always computes the last prompt token). 4096 / 256 -> 4095; 4000 -> 3840."""
    return min((num_tokens // chunk_tokens) * chunk_tokens, num_tokens - 1)
