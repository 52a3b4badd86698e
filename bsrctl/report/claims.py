"""Paper vs measured: one row per claim a run checks, the paper's statement (with the
figure it predicts for this registration) beside what the run measured and the verdict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bsrctl.evidence.kinds import KindName
from bsrctl.report.units import mib, size


@dataclass(frozen=True)
class Claim:
    claim: str  # what the paper says, in words
    paper: str  # the figure it predicts here
    measured: str  # what the run measured
    verdict: str  # PASS | FAIL | UNKNOWN


ClaimsOf = Callable[[dict[str, Any]], list[Claim]]


def _merged(verdicts: list[str]) -> str:
    if not verdicts:
        return "UNKNOWN"
    if "FAIL" in verdicts:
        return "FAIL"
    return "UNKNOWN" if "UNKNOWN" in verdicts else "PASS"


def _run_check(doc: dict[str, Any], name: str) -> str:
    for c in (doc.get("summary") or {}).get("checks", []):
        if c.get("name") == name:
            return str(c.get("verdict", "UNKNOWN"))
    return "UNKNOWN"


def _counted(p: dict[str, Any]) -> bool:
    """Whether a point judges the system (a ladder's rungs past L1 by the law, "capacity" in
    older evidence, and superseded attempts are measurements kept out of the run verdict)."""
    outcome = p.get("rung_outcome")
    return outcome not in ("exceeds", "capacity", "memory_limit") and not p.get("superseded_by")


def _point_checks(doc: dict[str, Any], name: str) -> list[str]:
    return [
        c["verdict"]
        for p in doc.get("points", [])
        if _counted(p)
        for c in p.get("checks", [])
        if c["name"] == name
    ]


def _c(doc: dict[str, Any]) -> int | None:
    reg = (doc.get("stack") or {}).get("registration") or {}
    return reg.get("bytes_per_chunk")


def _bounded(doc: dict[str, Any]) -> list[Claim]:
    bounded = _point_checks(doc, "bounded_restore")
    if not bounded:
        return []
    peaks = [
        (p["measures"].get("restore_pool_peak_bytes"), p["measures"].get("rws_bound_bytes"))
        for p in doc.get("points", [])
        if p["params"].get("window_chunks")
    ]
    worst = max((pk - b for pk, b in peaks if pk is not None and b), default=None)
    return [
        Claim(
            "With W > 0 the restore pool holds at most W·c + aux bytes",
            "peak ≤ W·c + aux at every point",
            "" if worst is None else f"largest peak − bound: {worst / 2**20:+.2f} MiB",
            _merged(bounded),
        )
    ]


def _canonical(doc: dict[str, Any]) -> list[Claim]:
    canonical = _point_checks(doc, "canonical_output") + _point_checks(doc, "canonical_bytes")
    if not canonical:
        return []
    return [
        Claim(
            "A restored request reads exactly the canonical state (or output)",
            "every point identical to the canonical one",
            f"{canonical.count('PASS')} of {len(canonical)} points identical",
            _merged(canonical),
        )
    ]


def _sweep(doc: dict[str, Any]) -> list[Claim]:
    pts, c = doc.get("points", []), _c(doc)
    rows: list[Claim] = []
    w = [p for p in pts if p["params"].get("window_chunks") and "salt" not in p["params"]]
    zero = [p for p in pts if p["params"].get("window_chunks") == 0]
    win = w[0]["params"]["window_chunks"] if w else None
    peaks_w = sorted({p["measures"].get("restore_pool_peak_bytes") or 0 for p in w})
    if win:
        rows.append(
            Claim(
                "BSR's restore pool does not grow with the prefix N",
                f"{mib(c * win if c else None)} (W·c, W = {win}) at every N ≥ W chunks",
                ", ".join(mib(v) for v in peaks_w) + f" over {len(w)} sizes",
                _run_check(doc, "peak_independent_of_n"),
            )
        )
    if zero:
        grow = " → ".join(mib(p["measures"].get("restore_pool_peak_bytes")) for p in zero)
        rows.append(
            Claim(
                "The whole-plan path (W = 0) stages the whole prefix: peak grows with N",
                "N / chunk · c",
                grow,
                _run_check(doc, "whole_plan_grows_with_n") if win else "UNKNOWN",
            )
        )
    return rows


def _law(doc: dict[str, Any]) -> list[Claim]:
    c = _c(doc)
    fit = (doc.get("summary") or {}).get("fit") or {}
    slope = fit.get("slope_bytes_per_chunk")
    return [
        Claim(
            "The restore-pool peak is linear in W with slope c (the capacity law)",
            f"slope c = {mib(c)} per chunk",
            ""
            if slope is None
            else f"slope {mib(slope)} per chunk ({fit.get('slope_relative_error', 0):+.4%}),"
            f" R² {fit.get('r2')}",
            _run_check(doc, "capacity_law"),
        )
    ]


def _ladder(doc: dict[str, Any]) -> list[Claim]:
    c = _c(doc)
    chunk = ((doc.get("stack") or {}).get("registration") or {}).get("chunk_tokens") or 256
    rows = []
    for row in (doc.get("summary") or {}).get("sizes", []):
        n = row["tokens"]
        whole = c * (n // chunk) if c else None
        first = row.get("first_passing_rung_bytes")
        rows.append(
            Claim(
                f"Whole-plan restore of {n} tokens needs L1 ≥ the whole prefix",
                f"≥ {mib(whole)} per rank (N / chunk · c)",
                f"first passing rung {size(first)}" if first else "no passing rung",
                _run_check(doc, f"ladder_n{n}"),
            )
        )
    return rows


def _none(doc: dict[str, Any]) -> list[Claim]:
    return []


def restore_claims(own: ClaimsOf = _none) -> ClaimsOf:
    """A restore kind's claims: the bounded pool, the kind's own claims, canonical reads."""

    def of(doc: dict[str, Any]) -> list[Claim]:
        return _bounded(doc) + own(doc) + _canonical(doc)

    return of


def failmatrix_claims(doc: dict[str, Any]) -> list[Claim]:
    rows = []
    names = list(dict.fromkeys(c["name"] for p in doc.get("points", []) for c in p["checks"]))
    for name in names:
        got = _point_checks(doc, name)
        rows.append(
            Claim(
                f"Every failed restore ends closed: {name.replace('_', ' ')}",
                "holds in every cell",
                f"{got.count('PASS')} of {len(got)} cells PASS",
                _merged(got),
            )
        )
    return rows


def tempokv_claims(doc: dict[str, Any]) -> list[Claim]:
    return [
        Claim(
            str(c.get("claim") or c["name"]),
            str(c.get("expect", "")),
            str(c.get("detail", "")),
            str(c["verdict"]),
        )
        for c in (doc.get("summary") or {}).get("checks", [])
    ]


# The claims of each evidence kind: one function per kind of the evidence registry
# (``bsrctl.evidence.kinds``), the one table ``claims`` dispatches on.
CLAIMS: dict[KindName, ClaimsOf] = {
    "ladder": restore_claims(_ladder),
    "sweep": restore_claims(_sweep),
    "law": restore_claims(_law),
    "failmatrix": failmatrix_claims,
    "tempokv": tempokv_claims,
    "roundtrip": restore_claims(),
    "bench": restore_claims(),
    "soak": restore_claims(),
}


def claims(doc: dict[str, Any]) -> list[Claim]:
    """The paper-vs-measured rows of one run, by its kind."""
    of = CLAIMS.get(doc["kind"])
    if of is None:
        raise ValueError(f"no claims for evidence kind {doc['kind']!r}; known: {sorted(CLAIMS)}")
    return of(doc)


def claims_table(rows: list[Claim]) -> list[str]:
    if not rows:
        return []
    out = ["| claim | paper | measured | verdict |", "|---|---|---|---|"]
    out += [f"| {r.claim} | {r.paper} | {r.measured} | {r.verdict} |" for r in rows]
    return out
