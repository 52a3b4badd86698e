"""The settings TempoKV's live controller starts with inside LMCache's server
(``tempokv.configure``; ``bsrkv.tempokv.wire`` carries them): read strictly, an unknown field
or a policy that needs the run's future refused naming it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bsrkv.tempokv.policies import CAUSAL_POLICIES


@dataclass(frozen=True, slots=True)
class LiveConfig:
    policy: str = "tempokv"
    capacity_bytes: int = 64 << 20  # the fast tier the provider models (L1's room for it)
    budget_bytes: int = 32 << 20  # protected-capacity budget
    concurrency: int = 1
    prior_bytes_s: float = 64 << 20  # calibrated staging rate (the shaped L2's)
    prior_latency_s: float = 0.0  # the shaped L2's per-op latency (the progress estimate)
    static_rate_bytes_s: float | None = None  # TempoKV-Static (default: the prior)
    tick_s: float = 0.05
    chunk_tokens: int = 256
    tier: str = "l2"  # "dax": L1 is the flash tier's arena, staging is mlock (tempokv.flash)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> LiveConfig:
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"tempokv config: unknown fields {unknown};"
                f" known: {sorted(cls.__dataclass_fields__)}"
            )
        cfg = cls(**raw)
        if cfg.policy not in CAUSAL_POLICIES and not cfg.policy.startswith("queue-"):
            raise ValueError(
                f"tempokv config.policy: {cfg.policy!r};"
                f" live policies: {', '.join(CAUSAL_POLICIES)}"
                " (the oracle needs the run's future: simulation only)"
            )
        return cfg
