"""TempoKV's typed measures. The serving policy grid: one policy over one repeat
(``RepeatMeasures``, a point's measures) and its repeats pooled (``PooledMeasures``, a row
of the summary's ``policies``). The simulation: one policy's run in virtual time
(``SimMeasures``, a grid point and a row of its cell), and beside it what Figure 1's lead
sweep (``LeadMeasures``, ``OracleLeadMeasures``) and Figure 2's rank grid (``RankMeasures``)
measure of a point.

Evidence stores ``to_json()``: flat, in field order, lists for the sequences; the optional
fields (goodput without an SLO, the flash tier's read bytes off it) are left out when None,
as the run has always written them, so evidence written before these types reads back as
them and writes back byte for byte. ``from_json`` refuses a key the type does not have (a
renamed measure fails loudly instead of reading None) and a required key that is missing.
A point's measures also carry ``guards`` (``bsrctl.evidence.guards.with_guards`` adds it
to every point): it is the evidence's, not the policy's, so ``point_measures`` sets it apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Self, get_type_hints

GUARDS = "guards"  # the guard deltas every point's measures carry beside its own


class _Flat:
    """to_json / from_json of a frozen dataclass of numbers, tuples and nested records."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset()  # left out of the JSON when None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if v is None and f.name in self.OPTIONAL:
                continue
            out[f.name] = v.to_json() if isinstance(v, _Flat) else _plain(v)
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Self:
        known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(doc) - set(known))
        if unknown:
            raise ValueError(f"unknown {cls.__name__} key(s) {unknown}; known: {sorted(known)}")
        required = {n for n, f in known.items() if f.default is MISSING}
        missing = sorted(required - set(doc))
        if missing:
            raise ValueError(f"{cls.__name__} misses {missing}")
        hints = get_type_hints(cls)
        kw = {k: _typed(hints[k], v) for k, v in doc.items()}
        return cls(**kw)


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _typed(hint: Any, v: Any) -> Any:
    if v is None:
        return None
    if hint is PerRepeat:
        return PerRepeat.from_json(v)
    return tuple(v) if isinstance(v, list) else v


@dataclass(frozen=True, kw_only=True)
class RepeatMeasures(_Flat):
    """One policy over the spec's arrivals, once (``serving._measure``)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {"slo_ttft_s", "goodput_requests", "goodput_share", "goodput_req_s", "flash_read_bytes"}
    )

    ttfts_s: tuple[float, ...]  # per completed request, client side (streamed)
    makespan_s: float
    output_tokens: int
    p95_ttft_s: float
    mean_ttft_s: float  # NaN: no request completed
    output_tok_s: float
    c_byte_s: float  # the sampled pins' integral (the server's)
    c_mib_s_per_req: float
    model_c_byte_s: float  # the provider's reserved-from-commit byte-time
    model_c_mib_s_per_req: float
    peak_locked_bytes: int
    peak_reserved_bytes: int
    budget_bytes: int
    canonical: int  # outputs equal to the canonical one
    requests: int
    committed: int  # claims committed with a TTR estimate
    deferred_claims: int
    claims: int
    reports_dropped_since_start: dict[str, int]  # the server's drop counters, by reason
    retrievals: dict[str, str]  # each claim's retrieval state at the end
    ttr_error_s: tuple[float, ...]  # stage-ready − TTR estimate, sorted
    ttr_error_abs_p50_s: float
    ttr_error_abs_p95_s: float
    ttu_error_s: tuple[float, ...]  # retrieval − TTU estimate, sorted
    # with an SLO (serving.slo_ttft_s) only: the requests whose first token came within it
    slo_ttft_s: float | None = None
    goodput_requests: int | None = None
    goodput_share: float | None = None
    goodput_req_s: float | None = None
    flash_read_bytes: int | None = None  # on the flash tier only: the cell's reads


@dataclass(frozen=True, kw_only=True)
class PerRepeat(_Flat):
    """A pooled row's measures per repeat, in run order: whether an ordering flips."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"goodput_share"})

    p95_ttft_s: tuple[float, ...]
    c_mib_s_per_req: tuple[float, ...]
    output_tok_s: tuple[float, ...]
    committed: tuple[int, ...]
    claims: tuple[int, ...]
    goodput_share: tuple[float, ...] | None = None  # when every repeat had an SLO


@dataclass(frozen=True, kw_only=True)
class PooledMeasures(_Flat):
    """One policy's repeats pooled over requests (``pooled.pool``): a summary row."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"slo_ttft_s", "goodput_share", "goodput_req_s"})

    repeats: int
    p95_ttft_s: float
    mean_ttft_s: float
    output_tok_s: float
    c_byte_s: float
    c_mib_s_per_req: float
    model_c_mib_s_per_req: float
    peak_locked_bytes: int
    peak_reserved_bytes: int
    budget_bytes: int
    canonical: int
    requests: int
    committed: int
    claims: int
    deferred_claims: int
    ttr_error_s: tuple[float, ...]
    ttr_error_abs_p50_s: float
    ttr_error_abs_p95_s: float
    ttu_error_s: tuple[float, ...]
    per_repeat: PerRepeat
    slo_ttft_s: float | None = None
    goodput_share: float | None = None
    goodput_req_s: float | None = None


def point_measures(doc: Mapping[str, Any]) -> tuple[RepeatMeasures, Any]:
    """A serving point's measures as written: the policy's, and the guard deltas beside."""
    d = dict(doc)
    guards = d.pop(GUARDS, None)
    return RepeatMeasures.from_json(d), guards


def policy_rows(summary: Mapping[str, Any]) -> dict[str, PooledMeasures]:
    """A serving summary's ``policies`` as typed rows, in the run's order."""
    return {p: PooledMeasures.from_json(m) for p, m in summary.get("policies", {}).items()}


@dataclass(frozen=True, kw_only=True)
class SimMeasures(_Flat):
    """One policy's run in virtual time (``sim.run.SimResult.measures``)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {
            "oracle_iterations",
            "oracle_converged",
            "oracle_moved_s",
            "oracle_delayed_claims",
            "oracle_early_gib_s_per_req",
        }
    )

    c_gib_s_per_req: float  # protected byte-time per completed request
    p95_ttft_s: float
    mean_ttft_s: float
    output_tok_s: float
    deferred_commits: int  # claims refused at least once for lack of protected budget
    capacity_refusals: int  # refused attempts in all
    ordinary_retrievals: int
    completed: int
    requests: int
    peak_reserved_gib: float
    budget_gib: float
    makespan_s: float
    # the oracle's fixed point (``sim.oracle``): replays, whether they converged, how far the
    # last moved a commit, the claims held past their plan, stage-ready before retrieval
    oracle_iterations: int | None = None
    oracle_converged: bool | None = None
    oracle_moved_s: float | None = None
    oracle_delayed_claims: int | None = None
    oracle_early_gib_s_per_req: float | None = None


def sim_fields(m: SimMeasures) -> dict[str, Any]:
    """A run's measures as keywords, for a point type that extends them."""
    return {f.name: getattr(m, f.name) for f in fields(m)}


@dataclass(frozen=True, kw_only=True)
class LeadMeasures(SimMeasures):
    """Figure 1: one request committed ``lead_s`` before it is submitted."""

    ttft_s: float
    lead_byte_time_gib_s: float  # protected byte-time from commit to submission
    footprint_gib: float


@dataclass(frozen=True, kw_only=True)
class OracleLeadMeasures(SimMeasures):
    """Figure 1's oracle: the lead it picked."""

    lead_s: float
    ttft_s: float


@dataclass(frozen=True, kw_only=True)
class RankMeasures(_Flat):
    """Figure 2: Queue-1's commit at t = 0 against the oracle's."""

    time_to_ready_s: float
    margin_s: float
    oracle_commit_s: float
    oracle_margin_s: float
