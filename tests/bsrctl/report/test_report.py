"""`bsrctl report RUN_DIR…`: summary.md leads with figures in MiB/ms/tokens (no dict
literal), report.md and one self-contained report.html with every kind's plots, each naming
its run id, stack, versions and registration; byte-stable; paper vs measured per claim."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.evidence import load_evidence
from bsrctl.report import render, write_report

pytest.importorskip("lmcache")
KINDS = ["sweep", "law", "ladder", "failmatrix", "tempokv"]
PLOTS = {
    "sweep": ["peak-vs-tokens", "times-vs-tokens"],
    "law": ["capacity-law"],
    "ladder": ["ladder"],
    "failmatrix": ["failmatrix"],
    "tempokv": ["tempokv-c-vs-p95"],
}
DICT_LITERAL = re.compile(r"\{['\"]|\{\d+:")


@pytest.mark.parametrize("kind", ["sweep", "law", "ladder"])
def test_restore_summary_leads_with_figures_in_units_not_dicts(make_run, kind: str) -> None:
    md = (make_run(kind) / "summary.md").read_text()
    assert not DICT_LITERAL.search(md), DICT_LITERAL.search(md)
    heads = [line for line in md.splitlines() if line.startswith("## ")]
    assert heads[:3] == ["## At a glance", "## Paper vs measured", "## Points"]
    glance = md.split("## At a glance")[1].split("## Paper")[0]
    assert "MiB" in glance
    points_table = md.split("## Points")[1].split("\n\n")[1].splitlines()
    assert len(points_table[0].split("|")) - 2 <= 12  # a dozen columns at most, not 32
    assert "registration: tiny-llama-cpu: c = 0.25 MiB per 256-token chunk" in md


def test_sweep_summary_reads_the_peak_against_w_c(make_run) -> None:
    md = (make_run("sweep") / "summary.md").read_text()
    assert (
        "- W = 2: restore-pool peak 0.50 MiB over N = 1024, 2048, 4096 tokens, the same at "
        "every N ≥ W chunks; W·c = 0.50 MiB." in md
    )
    assert "- W = 0 (whole plan): peak 1.00 MiB → 2.00 MiB → 4.00 MiB over N = 1024, 2048" in md
    assert "- Cached tokens: every one of the 6 points reused its whole prefix." in md
    assert "- Run checks: peak_independent_of_n PASS; whole_plan_grows_with_n PASS." in md
    assert (
        "| BSR's restore pool does not grow with the prefix N | 0.50 MiB (W·c, W = 2) at every "
        "N ≥ W chunks | 0.50 MiB over 3 sizes | PASS |" in md
    )
    assert "| n4096-w2 | PASS | 4096 | 2 | 8 MiB | 0.50 MiB | 0.50 MiB | 4096 / 4096 |" in md


def test_law_and_ladder_claims(make_run) -> None:
    law = (make_run("law") / "summary.md").read_text()
    assert (
        "| The restore-pool peak is linear in W with slope c (the capacity law) | slope c = " in law
    )
    assert "slope 0.25 MiB per chunk (+0.0000%), R² 1.0 | PASS |" in law
    ladder = (make_run("ladder") / "summary.md").read_text()
    assert (
        "- N = 2048 tokens: first passing L1 rung 2 MiB (whole plan 2.00 MiB by the capacity "
        "law; largest rung it exceeds: 1 MiB), L1 peak 2.00 MiB." in ladder
    )
    assert "| n2048-l1-1048576 | EXCEEDS |" in ladder
    assert (
        "| Whole-plan restore of 2048 tokens needs L1 ≥ the whole prefix | ≥ 2.00 MiB per rank "
        "(N / chunk · c) | first passing rung 2 MiB | PASS |" in ladder
    )
    assert "| A restored request reads exactly the canonical state (or output) | every point " \
        "identical to the canonical one | 2 of 2 points identical | PASS |" in ladder  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_report_of_one_run_has_its_plots_inline_and_names_its_source(
    figures: None, make_run, kind: str
) -> None:
    run_dir = make_run(kind)
    doc = load_evidence(run_dir / "evidence.json")
    res = CliRunner().invoke(app, ["report", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        f"report.md: {run_dir / 'report.md'}",
        f"report.html: {run_dir / 'report.html'}",
    ]
    page = (run_dir / "report.html").read_text()
    assert page.count("<svg") == len(PLOTS[kind])
    assert page.count("<figure>") == len(PLOTS[kind])
    # self-contained: nothing fetched (the only URLs are SVG/XLink namespace names)
    assert not re.search(r"""(src|href)=["'](?!#|data:)""", page)  # inline or data: only
    urls = set(re.findall(r"https?://[^\s\"'<>]+", page))
    assert urls == {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls
    versions = doc["stack"]["versions"]
    for name in PLOTS[kind]:
        svg = (run_dir / "figures" / f"{doc['run_id']}-{name}.svg").read_text()
        assert doc["run_id"] in svg and f"{doc['kind']} · {doc['stack']['kind']} stack" in svg
        assert all(f"{k} {v}" in svg for k, v in versions.items() if not k.endswith("sha256"))
        if kind != "tempokv":  # the registration (TempoKV's sim runs have none)
            assert f"{doc['stack']['registration']['model']}: c = " in svg
    md = (run_dir / "report.md").read_text()
    assert md.count("](figures/") == len(PLOTS[kind])
    assert "## Paper vs measured" in md or "### Paper vs measured" in md or kind == "tempokv"


def test_report_is_byte_stable_and_keeps_summary(make_run, tmp_path: Path) -> None:
    run_dir = make_run("sweep")
    summary = (run_dir / "summary.md").read_text()
    first = write_report([run_dir], tmp_path / "a")
    again = write_report([run_dir], tmp_path / "b")
    assert first.html.read_bytes() == again.html.read_bytes()
    assert first.markdown.read_bytes() == again.markdown.read_bytes()
    assert (
        (run_dir / "summary.md").read_text()
        == summary
        == render(load_evidence(run_dir / "evidence.json"))
    )


def test_report_of_several_runs(figures, make_run, tmp_path: Path) -> None:
    runs = [make_run(k) for k in ("sweep", "law", "failmatrix")]
    res = CliRunner().invoke(app, ["report", *map(str, runs), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "r" / "report.md").read_text()
    assert md.startswith("# bsrctl report: 3 runs\n")
    ids = [r.name for r in runs]
    assert [line.split(" | ")[0][2:] for line in md.splitlines()[4:7]] == ids
    assert all(f"\n## {i} (" in md for i in ids)
    assert (tmp_path / "r" / "report.html").read_text().count("<svg") == 4


def test_failmatrix_and_tempokv_tables_of_claims(make_run) -> None:
    from bsrctl.report.claims import claims

    doc = load_evidence(make_run("failmatrix") / "evidence.json")
    rows = claims(doc)
    assert rows and all(r.verdict == "PASS" for r in rows)
    assert any("force local" in r.claim for r in rows)
    tk = load_evidence(make_run("tempokv") / "evidence.json")
    assert [r.claim for r in claims(tk)] == [c["claim"] for c in tk["summary"]["checks"]]
