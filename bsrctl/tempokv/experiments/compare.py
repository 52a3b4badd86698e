"""Per-policy orderings of two runs of one spec (the serving stack and the simulation):
each run's policies ranked by a measure, and where the two rankings disagree, as the
policy pairs they order differently (Kendall's tau over the policies both runs have)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import combinations


@dataclass(frozen=True, slots=True)
class OrderingAgreement:
    measure: str
    left: tuple[str, ...]  # policies, lowest measure first (ties by name)
    right: tuple[str, ...]
    discordant: tuple[tuple[str, str], ...]  # pairs (a, b) left a<b, right b<a (strictly)
    ties: int  # pairs tied (equal measure) in either run: neither agree nor disagree
    tau: float  # Kendall's tau-a over the shared policies; 1.0: same order, no ties


def ordering(rows: Mapping[str, Mapping[str, float]], measure: str) -> tuple[str, ...]:
    return tuple(sorted(rows, key=lambda p: (rows[p][measure], p)))


def compare(
    left: Mapping[str, Mapping[str, float]],
    right: Mapping[str, Mapping[str, float]],
    measure: str,
) -> OrderingAgreement:
    shared = set(left) & set(right)
    lo = tuple(p for p in ordering(left, measure) if p in shared)
    ro = tuple(p for p in ordering(right, measure) if p in shared)
    pairs = list(combinations(lo, 2))  # a before b on the left
    lv = {p: left[p][measure] for p in shared}
    rv = {p: right[p][measure] for p in shared}
    tied = [(a, b) for a, b in pairs if lv[a] == lv[b] or rv[a] == rv[b]]
    discordant = tuple((a, b) for a, b in pairs if lv[a] < lv[b] and rv[a] > rv[b])
    concordant = len(pairs) - len(tied) - len(discordant)
    tau = (concordant - len(discordant)) / len(pairs) if pairs else 1.0
    return OrderingAgreement(measure, lo, ro, discordant, len(tied), round(tau, 6))
