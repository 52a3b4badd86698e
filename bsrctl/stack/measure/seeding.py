"""Seeding a serving deployment: cold requests until the tiers a restore relies on hold every
whole chunk of a prompt (bounded attempts). The one loop behind the serving target's points
and the failure matrix's cells.

vLLM answers before LMCache has the KV in L2 (the store RPC is queued, the write-through is
asynchronous), so a request alone is no proof: each attempt waits until every relied tier
holds the prompt's whole chunks or ``wait_s`` has passed, and one more cold request (after
L1 and vLLM's local cache were made to forget) stores the chunks a tier still misses. That
request runs with the lookups of every wrapped tier missing but the short relied ones: a
tier that holds the whole prefix (FS, when a Mooncake store failed midway) would otherwise
serve it, vLLM would load instead of compute, and nothing would be stored again (seen in
CI: Mooncake short 6/15 after both). A short tier still serves its own prefix, so vLLM
computes from where that ends and only the rest passes through L1 again: a prefix longer
than L1 is stored in parts (whole-plan-past-l1: 32 of 36 chunks the first time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from bsrctl.stack.measure.tiers import lookups_hidden, wait_tiers_hold

SEED_ATTEMPTS = 2  # a cold request, then one more for the chunks a tier still misses
SEED_WAIT_S = 20.0  # per attempt: how long a tier's write-through may take


@dataclass(frozen=True)
class SeedAttempt:
    """One cold request of a seeding."""

    cached_tokens: int | None  # of the cold request (vLLM's usage.cached_tokens; None: unreported)
    held: dict[str, int]  # chunks each relied tier held after it (per rank, the least)
    l1_used_before: int | None  # L1 bytes left by the forget before it; None: no forget
    hidden: tuple[str, ...] = ()  # tiers whose lookups missed while it ran (a retry: every
    # wrapped tier but the relied ones still short)


@dataclass(frozen=True)
class TierSeed:
    """How a prompt's prefix reached the tiers a restore relies on."""

    tiers: tuple[str, ...]
    chunks: int  # whole chunks of the prompt
    attempts: tuple[SeedAttempt, ...]
    seed_s: float

    @property
    def held(self) -> dict[str, int]:
        """Chunks each tier held after the last attempt."""
        return dict(self.attempts[-1].held) if self.attempts else dict.fromkeys(self.tiers, 0)

    @property
    def short(self) -> dict[str, int]:
        """The tiers that miss chunks, with what they hold."""
        return {t: c for t, c in self.held.items() if c != self.chunks}

    @property
    def complete(self) -> bool:
        return not self.short


def seed_tiers(
    stack: Any,
    client: Any,
    ids: list[int],
    *,
    chunk_tokens: int,
    tiers: tuple[str, ...],
    max_tokens: int,
    forget_first: bool,
    forget_wait_s: float,
    ranks: int = 1,
    attempts: int = SEED_ATTEMPTS,
    wait_s: float = SEED_WAIT_S,
) -> TierSeed:
    """Cold requests of `ids` on `stack` (a ServingStack) until every tier in `tiers` holds
    all of its whole chunks (`ranks` objects each on FS), at most `attempts` of them.

    Before every attempt but the first (and before the first too with `forget_first`), L1
    is emptied through `client` (a BsrModuleClient, waiting up to `forget_wait_s`) and vLLM
    forgets its local prefix cache; a retry also runs with the lookups of every wrapped tier
    (``stack.fault_tiers()``) missing but the relied tiers still short, so no other tier's
    copy serves the chunks they miss: vLLM computes and LMCache stores them. What is left in
    L1 and vLLM after the last attempt is the caller's to forget."""
    n = len(ids) // chunk_tokens
    t0 = time.monotonic()
    done: list[SeedAttempt] = []
    short: set[str] = set()  # relied tiers the last attempt left short
    for i in range(attempts):
        l1_left = None
        if i or forget_first:
            l1_left = client.forget(wait_s=forget_wait_s).l1_used_bytes_after
            stack.forget_local()
        hidden = tuple(t for t in stack.fault_tiers() if t not in short) if i else ()
        with lookups_hidden(stack, hidden):  # only a short tier's own prefix may serve it
            cached = stack.complete(ids, max_tokens).cached_tokens
        held = wait_tiers_hold(stack, ids, chunk_tokens, tiers, wait_s, ranks)
        done.append(SeedAttempt(cached, {t: held.get(t, 0) for t in tiers}, l1_left, hidden))
        short = {t for t in tiers if held.get(t, 0) < n}
        if not short:
            break
    return TierSeed(tiers, n, tuple(done), round(time.monotonic() - t0, 3))
