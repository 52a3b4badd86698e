"""The soak's fault schedule: a pure function of (seed, duration, catalogue, gap).

Only faults of the failure matrix that are safe to repeat on one deployment are drawn (they
arm a rule of the fault wrapper or damage one object; none stops a process), so one
deployment lives through the whole schedule. Same inputs, same schedule: random.Random(seed)
is the only source of choice (CPython documents its sequence as stable for a given seed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# failure-matrix fault names (experiments/failmatrix/injectors.py INJECTORS) safe to repeat,
# the default catalogue; `bsrctl soak` passes its spec's cell ids (soak.spec.SOAK_FAULTS)
REPEATABLE: tuple[str, ...] = (
    "window_timeout",
    "object_corrupted",
    "object_truncated",
)


@dataclass(frozen=True)
class ScheduledFault:
    """One fault: when it is armed (seconds from the soak's start), what, and its target."""

    index: int
    start_s: float
    fault: str
    window: int  # the window of the restore it hits (0-based)
    prefix: int  # which of the workload's prefixes it targets (index into the prefix list)


@dataclass(frozen=True)
class Schedule:
    seed: int
    duration_s: float
    faults: tuple[ScheduledFault, ...]


def make_schedule(
    seed: int,
    duration_s: float,
    catalogue: tuple[str, ...] = REPEATABLE,
    mean_gap_s: float = 10.0,
    windows: int = 2,
    prefixes: int = 3,
) -> Schedule:
    """Faults at exponential gaps (mean `mean_gap_s`) until `duration_s`; each draws a
    fault, a window and a prefix uniformly. Start times rounded to ms for exact replay."""
    if duration_s <= 0 or mean_gap_s <= 0 or windows < 1 or prefixes < 1 or not catalogue:
        raise ValueError("duration, gap, windows, prefixes and catalogue must be positive")
    rng = random.Random(seed)
    out: list[ScheduledFault] = []
    t = 0.0
    while True:
        t += rng.expovariate(1.0 / mean_gap_s)
        if t >= duration_s:
            break
        out.append(
            ScheduledFault(
                index=len(out),
                start_s=round(t, 3),
                fault=catalogue[rng.randrange(len(catalogue))],
                window=rng.randrange(windows),
                prefix=rng.randrange(prefixes),
            )
        )
    return Schedule(seed=seed, duration_s=duration_s, faults=tuple(out))
