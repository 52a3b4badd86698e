"""The failure matrix's summary.md, rendered from its evidence alone: cells x checks with the
time to the fallback result, then every check that did not PASS."""

from __future__ import annotations

from typing import Any

from bsrctl.report.claims import claims_table, failmatrix_claims
from bsrctl.report.units import registration_line, versions_line

# The table's check columns, in the order the cells run them (a cell's other checks, e.g.
# setup_seeded or fault_injected, show only under "Not passing").
CHECK_ORDER = (
    "cached_prefix_all_or_nothing",
    "no_valid_block_after_failure",
    "canonical_output",
    "force_local",
    "corruption_caught_before_install",
    "one_failed_restore",
    "stopped_at_first_slow_window",
    "hits_after_new_store",
    "bsr_restores_same_prefix",
    "later_requests_canonical",
    "all_answered",
    "every_prefix_restored",
    "pool_bound",
    "post_request_health",
    "bounded_time",
    "processes_accounted",
    "extensions_healthy",
)


def render(doc: dict[str, Any]) -> str:
    """Markdown of one failmatrix run's evidence.json (as ``load_evidence`` returns it)."""
    points = doc.get("points", [])
    seen = list(dict.fromkeys(c["name"] for p in points for c in p["checks"]))
    # the known checks in their order, then any other a cell recorded (never dropped)
    names = [n for n in CHECK_ORDER if n in seen] + [n for n in seen if n not in CHECK_ORDER]
    lines = [
        f"# {doc['run_id']} (failmatrix): {doc['verdict']}",
        "",
        f"- complete: {doc['complete']}; started {doc['started_at']}; finished "
        f"{doc.get('finished_at')}; salt `{doc['salt']}`",
    ]
    stack = doc.get("stack") or {}
    if stack:
        lines.append(
            f"- stack: {stack.get('kind')} ({versions_line(stack)}); registration: "
            f"{registration_line(stack.get('registration') or {})}"
        )
    if doc.get("summary", {}).get("aborted"):
        lines.append(f"- aborted: {doc['summary']['aborted']}")
    paper = claims_table(failmatrix_claims(doc))
    if paper:
        lines += ["", "## Paper vs measured", "", *paper, "", "## Cells"]
    head = ["cell", "fault", "covers", "at", "expect", "verdict", "fallback_s", "cached", *names]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in points:
        by = {c["name"]: c["verdict"] for c in p["checks"]}
        m, prm = p["measures"], p["params"]
        t = m.get("time_to_fallback_s")
        row = [
            p["id"],
            prm.get("fault", ""),
            m.get("covers", ""),
            _at(prm),
            prm.get("expect", ""),
            p["verdict"],
            "" if t is None else f"{t:.2f}",
            str(m.get("cached_tokens", "")),
        ]
        lines.append("| " + " | ".join(row + [by.get(n, "") for n in names]) + " |")
    bad = [(p["id"], c) for p in points for c in p["checks"] if c["verdict"] != "PASS"]
    if bad:
        lines += ["", "## Not passing", ""]
        lines += [f"- {pid} / {c['name']}: {c['verdict']}: {c['detail']}" for pid, c in bad]
    skipped = doc.get("summary", {}).get("skipped_cells")
    if skipped:
        lines += ["", f"Cells not run on this stack: {', '.join(skipped)}"]
    return "\n".join(lines) + "\n"


def _at(params: dict[str, Any]) -> str:
    at = params.get("at", "")
    return at if at == "before_request" else f"{at} k={params.get('window')}"
