"""summary.md of a restore run (ladder, sweep, law, round trip), from its evidence alone.

It leads with the few figures that matter, in MiB, ms and tokens (for a sweep: the peak
against W·c, cached against expected, TTFT, the verdict per check), then the paper's claims
beside what was measured, one compact row per point and the checks. Every other measure
stays in evidence.json.
"""

from __future__ import annotations

from typing import Any

from bsrctl.evidence.verdict import EXCEEDS, shown_verdict
from bsrctl.report.claims import claims, claims_table
from bsrctl.report.units import header, mib, ms, ms_ci, size, span, table


def render(doc: dict[str, Any]) -> str:
    points = doc.get("points", [])
    lines = header(doc)
    glance = GLANCE.get(doc["kind"], lambda _d: [])(doc)
    integrity = tier_integrity(doc)
    if integrity:
        glance.append(integrity)
    run_checks = (doc.get("summary") or {}).get("checks", [])
    if run_checks:
        glance.append(
            "Run checks: " + "; ".join(f"{c['name']} {c['verdict']}" for c in run_checks) + "."
        )
    if glance:
        lines += ["", "## At a glance", "", *(f"- {g}" for g in glance)]
    paper = claims_table(claims(doc))
    if paper:
        lines += ["", "## Paper vs measured", "", *paper]
    if points:
        lines += ["", "## Points", "", *_points_table(doc)]
    # A rung the whole plan exceeds has checks that cannot pass there: its own list, not
    # the checks table or "Not passing", which are for points that judge the system.
    past = [p for p in points if shown_verdict(p) == EXCEEDS]
    judged = [p for p in points if shown_verdict(p) != EXCEEDS]
    names = list(dict.fromkeys(c["name"] for p in judged for c in p["checks"]))
    if names:
        lines += ["", "## Checks per point", ""]
        rows = []
        for p in judged:
            by = {c["name"]: c["verdict"] for c in p["checks"]}
            rows.append([p["id"], *(by.get(n, "") for n in names)])
        lines += table(["point", *names], rows)
    if past:
        lines += ["", "## Rungs the whole plan exceeds (capacity law)", ""]
        lines += [f"- {_exceeds_line(p)}" for p in past]
    bad = [(p["id"], c) for p in judged for c in p["checks"] if c["verdict"] != "PASS"]
    if bad:
        lines += ["", "## Not passing", ""]
        lines += [f"- {pid} / {c['name']}: {c['verdict']}: {c['detail']}" for pid, c in bad]
    lines += ["", "Every other measure of every point is in evidence.json."]
    return "\n".join(lines) + "\n"


def tier_integrity(doc: dict[str, Any]) -> str:
    """The storage stack's line for what its L2 tier verifies at load ("" elsewhere, or
    from evidence written before the stack recorded it): never silent about a tier that
    checks nothing."""
    st = doc.get("stack") or {}
    got = st.get("tier_integrity")
    if st.get("kind") != "storage" or got is None:
        return ""
    after = "every pass's installed bytes compared with the canonical bytes (timed passes: "
    after += "after their timer)"
    if got == "none":
        adapter = st.get("l2_adapter")
        why = {
            "stock": "LMCache's stock FS adapter keeps no checksum",
            "bsr_fs": "restore.checksum is off",
        }.get(adapter, f"the {adapter} tier verifies no checksum here")
        return f"L2 tier integrity: none ({why}); {after}."
    return (
        f"L2 tier integrity: {got} checksum sidecars, verified at load (a corrupted object "
        f"is a miss: the restore fails closed); {after}."
    )


def _exceeds_line(p: dict[str, Any]) -> str:
    """Why a rung reads EXCEEDS, in the law's bytes and what was measured."""
    m = p.get("measures") or {}
    return (
        f"{p['id']}: whole plan {mib(p.get('whole_plan_bytes'))} > L1 rung "
        f"{size(p['params']['l1_capacity_bytes'])}; cached {m.get('cached_tokens')} of "
        f"{m.get('expected_cached_tokens')} tokens (not reused, as the law says); no other "
        f"check failed, stack healthy."
    )


def _points_table(doc: dict[str, Any]) -> list[str]:
    ladder = doc["kind"] == "ladder"
    head = ["point", "verdict", "N tokens", "W", "L1 rung" if ladder else "L1", "peak",
            "W·c + aux", "cached / expected tok", "TTFT", "restore", "restored"]  # fmt: skip
    if ladder:
        head.append("rung outcome")
    repeated = any(p.get("samples") for p in doc["points"])
    if repeated:  # timed columns: medians [95 % CI] of the timed passes (production path)
        head[head.index("TTFT")] = "TTFT (timed)"
        head[head.index("restore")] = "restore (timed)"
        head += ["restore (accuracy pass)", "passes"]
    rows = []
    for p in doc["points"]:
        m, prm = p.get("measures") or {}, p.get("params") or {}
        cached, expected = m.get("cached_tokens"), m.get("expected_cached_tokens")
        tokens = prm.get("tokens", m.get("tokens"))
        l1 = prm.get("l1_capacity_bytes", m.get("l1_capacity_bytes"))
        row = [
            p["id"],
            shown_verdict(p),
            "" if tokens is None else str(tokens),
            "" if prm.get("window_chunks") is None else str(prm["window_chunks"]),
            "" if l1 is None else size(l1),
            mib(m.get("restore_pool_peak_bytes")),
            mib(m.get("rws_bound_bytes") or None),
            "" if cached is None else f"{cached} / {'' if expected is None else expected}",
            ms_ci(p, "ttft_s"),
            ms_ci(p, "restore_s"),
            mib(m.get("bytes_restored")),
        ]
        if ladder:
            row.append(str(p.get("rung_outcome", "")))
        if repeated:
            acc = (p.get("accuracy_pass") or {}).get("restore_s")
            timed = p.get("repeats") if p.get("samples") else 0
            row += [ms(acc), f"1 accuracy + {timed} timed" if timed else "1 accuracy"]
        rows.append(row)
    return table(head, rows)


# ---- at a glance, per kind ---------------------------------------------------------------


def _by_window(points: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for p in points:
        if "salt" in p["params"] or p["params"].get("window_chunks") is None:
            continue
        out.setdefault(p["params"]["window_chunks"], []).append(p)
    return out


def _tokens_glance(points: list[dict[str, Any]]) -> str:
    pairs = [
        (p["id"], p["measures"].get("cached_tokens"), p["measures"].get("expected_cached_tokens"))
        for p in points
    ]
    short = [f"{pid} {got} of {want}" for pid, got, want in pairs if got != want]
    if not short:
        return f"Cached tokens: every one of the {len(points)} points reused its whole prefix."
    return "Cached tokens short of expected: " + "; ".join(short) + "."


def _sweep(doc: dict[str, Any]) -> list[str]:
    reg = (doc.get("stack") or {}).get("registration") or {}
    c, chunk = reg.get("bytes_per_chunk"), reg.get("chunk_tokens") or 1
    by_w = _by_window([p for p in doc.get("points", []) if p.get("measures")])
    out = []
    for w, pts in sorted(by_w.items(), reverse=True):
        peaks = [(p["params"]["tokens"], p["measures"].get("restore_pool_peak_bytes")) for p in pts]
        sizes = ", ".join(str(n) for n, _ in peaks)
        if w:
            full = [pk for n, pk in peaks if n // chunk >= w]
            flat = "the same at every N ≥ W chunks" if len(set(full)) == 1 else "NOT flat"
            out.append(
                f"W = {w}: restore-pool peak {span([pk for _, pk in peaks], mib)} over N = {sizes} "
                f"tokens, {flat}; W·c = {mib(c * w if c else None)}{_allocated(pts, w, c)}."
            )
        else:
            out.append(
                f"W = 0 (whole plan): peak {' → '.join(mib(pk) for _, pk in peaks)} over N = "
                f"{sizes} tokens."
            )
    out.append(_tokens_glance([p for p in doc.get("points", []) if p.get("measures")]))
    out += _timed_glance(doc, by_w)
    return out


def _timed_glance(doc: dict[str, Any], by_w: dict[int, list[dict[str, Any]]]) -> list[str]:
    """TTFT and restore time: per point median [95 % CI] where the points have samples,
    else the span per W; then W against the whole plan per size (the sweep's summary)."""
    out = []
    repeats = max((p.get("repeats", 1) for pts in by_w.values() for p in pts), default=1)
    for label, key in (("TTFT", "ttft_s"), ("Restore time", "restore_s")):
        if repeats > 1:
            parts = [
                f"N = {p['params']['tokens']} W = {w} {ms_ci(p, key)}"
                for w, pts in sorted(by_w.items(), reverse=True)
                for p in pts
                if p["measures"].get(key) is not None
            ]
            if parts:
                out.append(
                    f"{label}, median [95 % CI] over {repeats} repeats: " + "; ".join(parts) + "."
                )
            continue
        parts = [
            f"{span([p['measures'].get(key) for p in pts], ms)} at W = {w}"
            for w, pts in sorted(by_w.items(), reverse=True)
            if any(p["measures"].get(key) is not None for p in pts)
        ]
        if parts:
            out.append(f"{label}: " + "; ".join(parts) + ".")
    every = [p for pts in by_w.values() for p in pts]
    if any(p.get("sample_path") for p in every):
        out.append(
            "Times are from the timed passes on the production path (read-back off); each "
            "point's accuracy pass carried the oracle and is timed apart (restore (accuracy "
            "pass) in the table)."
        )
    ratios = (doc.get("summary") or {}).get("whole_plan_ratio_by_tokens") or {}
    for n, r in ratios.items():
        if r.get("ratio") is None:
            continue
        iv = r.get("interval")
        ci = f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else " (1 repeat: no interval)"
        judged = f", claim ≤ {r['bound']:g}: {r['verdict']}" if r.get("judged") else ""
        out.append(
            f"{r['metric']} W / whole plan at N = {n}: {r['ratio']:.3f}{ci} over "
            f"{r['repeats']} paired repeats{judged}."
        )
    return out


def _allocated(pts: list[dict[str, Any]], w: int, c: int | None) -> str:
    """ ", W·c_allocated = ..." where L1's allocation unit makes a chunk larger than c."""
    alloc = next((p["measures"].get("bytes_per_chunk_allocated") for p in pts), None)
    return "" if alloc in (None, c) else f", W·c_allocated = {mib(alloc * w)}"


def _law(doc: dict[str, Any]) -> list[str]:
    fit = (doc.get("summary") or {}).get("fit") or {}
    if not fit:
        return []
    ws = ", ".join(str(w) for w in fit["windows_chunks"])
    return [
        f"Peak over W = {ws}: {', '.join(mib(p) for p in fit['restore_pool_peak_bytes'])}.",
        f"Least-squares slope {mib(fit['slope_bytes_per_chunk'], 4)} per chunk against c = "
        f"{mib(fit['bytes_per_chunk'], 4)} ({fit['slope_relative_error']:+.4%}); intercept "
        f"{fit['intercept_bytes']:.0f} B; R² {fit['r2']}.",
    ]


def _ladder(doc: dict[str, Any]) -> list[str]:
    out = []
    for row in (doc.get("summary") or {}).get("sizes", []):
        first, last = row.get("first_passing_rung_bytes"), row.get("last_failing_rung_bytes")
        plan = row.get("whole_plan_bytes")
        if first and plan is not None:
            out.append(
                f"N = {row['tokens']} tokens: first passing L1 rung {size(first)} (whole plan "
                f"{mib(plan)} by the capacity law; largest rung it exceeds: "
                f"{size(last) if last else 'none'}), L1 peak {mib(row.get('l1_peak_bytes'))}."
            )
        elif first:  # evidence from before the law: its rungs below were "last failing"
            out.append(
                f"N = {row['tokens']} tokens: first passing L1 rung {size(first)} (last failing "
                f"{size(last) if last else 'none'}), L1 peak {mib(row.get('l1_peak_bytes'))}."
            )
        elif row.get("memory_ends_at_rung_bytes"):
            out.append(
                f"N = {row['tokens']} tokens: no passing rung; this machine's memory ends at "
                f"{size(row['memory_ends_at_rung_bytes'])}."
            )
        else:
            out.append(f"N = {row['tokens']} tokens: no passing rung.")
    return out


def _roundtrip(doc: dict[str, Any]) -> list[str]:
    out = []
    for p in doc.get("points", []):
        m = p["measures"]
        same = m.get("output_sha256") is not None and m.get("output_sha256") == m.get(
            "canonical_sha256"
        )
        out.append(
            f"{p['id']}: cached {m.get('cached_tokens')} tokens, TTFT {ms(m.get('ttft_s'))}, "
            f"output {'canonical' if same else 'NOT canonical'} ({p['verdict']})."
        )
    return out


GLANCE = {"sweep": _sweep, "law": _law, "ladder": _ladder, "roundtrip": _roundtrip}
