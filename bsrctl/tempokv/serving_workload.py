"""The live serving workload as people run one: when each request is sent (a fixed interval,
or seeded Poisson / gamma arrivals as ``vllm bench serve`` draws them), what it asks (a
document prefix, then a conversation's questions so far: documents reused across turns) and
how many answered within a TTFT SLO (goodput, as ``vllm bench serve --goodput`` counts it).
Pure: the serving run and the Figure 6 bench send what these return."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field

from bsrctl.spec_io import Strict


class ArrivalSpec(Strict):
    """When the requests are sent. ``fixed``: request i at i x interval_s. ``poisson``:
    gaps drawn from a gamma of shape ``burstiness`` and mean interval_s (burstiness 1 is a
    Poisson process; below 1 burstier, above 1 more even), their sum rescaled so the last
    request leaves at n x interval_s, as vLLM's benchmark does
    (vllm/benchmarks/serve.py:449-497), from a generator seeded with ``seed``."""

    process: Literal["fixed", "poisson"] = "fixed"
    burstiness: float = Field(1.0, gt=0, le=1000)
    seed: int = Field(0, ge=0)


def arrival_offsets(n: int, interval_s: float, arrivals: ArrivalSpec) -> tuple[float, ...]:
    """Each request's send time after the first's start, in seconds (non-decreasing)."""
    if arrivals.process == "fixed" or interval_s == 0 or n == 0:
        return tuple(i * interval_s for i in range(n))
    rng = np.random.default_rng(arrivals.seed)
    b = arrivals.burstiness
    gaps = rng.gamma(shape=b, scale=interval_s / b, size=n)
    cum = np.cumsum(gaps)
    cum *= (n * interval_s) / cum[-1]  # vLLM's normalisation: the same total for every seed
    return tuple(float(x) for x in cum)


@dataclass(frozen=True)
class Turn:
    """Request i: document ``doc``'s conversation ``conversation``, its ``turn``-th question
    (0 first); the prompt is the document then the questions of turns 0..turn."""

    index: int
    conversation: int
    doc: int
    turn: int


def conversation_plan(num_requests: int, num_docs: int, turns: int) -> tuple[Turn, ...]:
    """Requests in send order: every conversation's first turn, then every second turn, ...
    (a document comes back one round later, as a chat user answers). Conversation j reads
    document j mod num_docs. One turn: request i is conversation i, document i mod n."""
    conversations = math.ceil(num_requests / turns)
    return tuple(
        Turn(i, i % conversations, (i % conversations) % num_docs, i // conversations)
        for i in range(num_requests)
    )


def question_salts(seed: int, turn: Turn) -> tuple[str, ...]:
    """The salts of the questions a turn's prompt carries (turn 0's as a one-turn run's)."""
    j = turn.conversation
    return tuple(f"tk-q-{seed}-{j}" if t == 0 else f"tk-q-{seed}-{j}-t{t}"
                 for t in range(turn.turn + 1))  # fmt: skip


@dataclass(frozen=True)
class Goodput:
    """Requests that finished with TTFT within the SLO: their share of all sent, and per
    second of the run (``vllm bench serve``'s request goodput: good completions over the
    benchmark's duration, vllm/benchmarks/serve.py:640-664,750)."""

    slo_ttft_s: float
    good: int
    requests: int
    share: float
    req_s: float


def goodput(ttfts_s: Sequence[float | None], slo_ttft_s: float, duration_s: float) -> Goodput:
    """``ttfts_s``: one per request sent, None for one that did not finish (never good)."""
    good = sum(1 for t in ttfts_s if t is not None and t <= slo_ttft_s)
    n = len(ttfts_s)
    share = good / n if n else math.nan
    rate = good / duration_s if duration_s > 0 else math.nan
    return Goodput(slo_ttft_s, good, n, share, rate)


__all__ = [
    "ArrivalSpec",
    "Goodput",
    "Turn",
    "arrival_offsets",
    "conversation_plan",
    "goodput",
    "question_salts",
]
