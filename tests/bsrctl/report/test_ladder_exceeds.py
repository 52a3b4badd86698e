"""A ladder rung the whole plan exceeds by the capacity law reads EXCEEDS (console, summary.md,
report.html), never FAIL, and stays out of "not passing" and the run verdict; a rung the plan
fits that is not reused stays FAIL and fails the run. Evidence made in-process, no stack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bsrctl.evidence import Verdict
from bsrctl.evidence.verdict import Check, Point
from bsrctl.experiments.console import point_line
from bsrctl.experiments.restore.ladder import LadderWriter, rung_outcome, whole_plan_bytes
from bsrctl.report import render
from bsrctl.report.document import html_page

MIB = 1 << 20
C = 262_144  # make demo's tiny Llama: 256 tokens per chunk
P, F, U = Verdict.PASS, Verdict.FAIL, Verdict.UNKNOWN
NAMES = ("cached_token_accounting", "tier_isolation", "registration_identity",
         "canonical_output", "post_request_health")  # fmt: skip


def rung(tokens: int, l1: int, reused: bool) -> Point:
    """One measured rung as ``_Ladder.measure`` writes it: its checks, the law's bytes and
    the outcome they give."""
    verdicts = (P, P, P, P, P) if reused else (F, U, U, P, P)
    checks = tuple(Check(n, v, f"{n} {v}") for n, v in zip(NAMES, verdicts, strict=True))
    plan = whole_plan_bytes(tokens, 256, C, 1)
    expected = tokens - 1
    measures = {"cached_tokens": expected if reused else 0, "expected_cached_tokens": expected}
    params = {"tokens": tokens, "window_chunks": 0, "l1_capacity_bytes": l1}
    extra = {"whole_plan_bytes": plan, "rung_outcome": rung_outcome(checks, plan <= l1)}
    return Point(f"n{tokens}-l1-{l1}", params, measures, checks, extra)


def run(tmp_path: Path, points: list[Point]) -> tuple[Verdict, dict[str, Any]]:
    w = LadderWriter(tmp_path, "ladder", {}, "t-salt", {"kind": "serving"})
    for p in points:
        w.add_point(p)
    return w.finish({"sizes": []}), w.doc


def test_a_rung_past_l1_by_the_law_reads_exceeds_and_the_run_passes(tmp_path: Path) -> None:
    verdict, doc = run(tmp_path, [rung(8192, 4 * MIB, False), rung(8192, 16 * MIB, True)])
    assert (verdict, doc["verdict"], doc["points_verdict"]) == (P, "PASS", "PASS")
    past = doc["points"][0]
    assert (past["rung_outcome"], past["verdict"], past["whole_plan_bytes"]) == (
        "exceeds", "FAIL", 8 * MIB)  # fmt: skip
    assert point_line(past) == (
        "cached 0/8191 tok · whole plan 8.00 MiB > L1 4.00 MiB (capacity law)"
    )
    md = render(doc)
    assert "| n8192-l1-4194304 | EXCEEDS | 8192 | 0 | 4 MiB |" in md
    assert "| n8192-l1-16777216 | PASS | 8192 | 0 | 16 MiB |" in md
    assert md.split("## Rungs the whole plan exceeds (capacity law)\n\n")[1].split("\n")[0] == (
        "- n8192-l1-4194304: whole plan 8.00 MiB > L1 rung 4 MiB; cached 0 of 8191 tokens (not "
        "reused, as the law says); no other check failed, stack healthy."
    )
    assert "## Not passing" not in md
    checks_table = md.split("## Checks per point")[1].split("\n\n")[1]
    assert "n8192-l1-4194304" not in checks_table
    page = html_page(md, [doc], {doc["run_id"]: []})
    assert '<td class="EXCEEDS">EXCEEDS</td>' in page
    assert '<td class="FAIL">FAIL</td>' not in page


def test_a_rung_the_plan_fits_that_is_not_reused_stays_fail(tmp_path: Path) -> None:
    verdict, doc = run(tmp_path, [rung(2048, 4 * MIB, False)])
    assert (verdict, doc["verdict"]) == (F, "FAIL")
    point = doc["points"][0]
    assert (point["rung_outcome"], point["verdict"], point["whole_plan_bytes"]) == (
        "fail", "FAIL", 2 * MIB)  # fmt: skip
    assert point_line(point) == (
        "cached 0/2047 tok · not passing: cached_token_accounting, tier_isolation, "
        "registration_identity"
    )
    md = render(doc)
    assert "| n2048-l1-4194304 | FAIL | 2048 | 0 | 4 MiB |" in md
    assert "- n2048-l1-4194304 / cached_token_accounting: FAIL: cached_token_accounting FAIL" in md
    assert "## Rungs the whole plan exceeds" not in md
