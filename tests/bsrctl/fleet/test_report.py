"""`bsrctl fleet report` on synthetic evidence (one stored storage sweep, copied per node
with chosen restore times): the grid, the robust score and the outlier it names, exactly;
runs of different specs refused; a node against its previous run; a missing node."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.fleet.report import CUTOFF, fleet_report, robust_scores

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "evidence" / "sweep-storage.json"
BASE = json.loads(FIXTURE.read_text())
POINT = "n4096-w4"


def node(root: Path, name: str, restore_s: float, verdict: str = "PASS", **doc_fields) -> Path:
    doc = copy.deepcopy(BASE)
    doc.update(run_id=f"br-e1-{name}", verdict=verdict, **doc_fields)
    for p in doc["points"]:
        if p["id"] == POINT:
            p["measures"]["restore_s"] = restore_s
    run = root / name / doc["run_id"]
    run.mkdir(parents=True)
    (run / "evidence.json").write_text(json.dumps(doc))
    return root / name


def test_robust_scores_mad_meanad_and_constant() -> None:
    # median 10, |dev| = 1, 0, 0, 1, 90 -> MAD 1: z = 0.6745 * (x - 10)
    assert robust_scores([9, 10, 10, 11, 100]) == pytest.approx([-0.6745, 0, 0, 0.6745, 60.705])
    # MAD 0 (most values equal): the mean absolute deviation, 2.5 here, stands in
    assert robust_scores([5, 5, 5, 15]) == pytest.approx([0, 0, 0, 10 / (1.253314 * 2.5)])
    assert robust_scores([7, 7, 7]) == [0, 0, 0]
    assert CUTOFF == 3.5


def test_the_slow_node_is_named_the_outlier_on_restore_time(tmp_path: Path) -> None:
    folders = [node(tmp_path, f"n{i}", s) for i, s in enumerate([0.010, 0.011, 0.012, 0.050])]
    fr = fleet_report(folders)
    assert fr.grid == {f"n{i}": {"sweep": "PASS"} for i in range(4)} and fr.passed
    (o,) = fr.outliers  # every other metric is the same on every node
    assert (o.node, o.kind, o.point, o.metric) == ("n3", "sweep", POINT, "restore_s")
    assert o.median == pytest.approx(0.0115) and o.score == pytest.approx(0.6745 * 0.0385 / 0.001)
    res = CliRunner().invoke(app, ["fleet", "report", *map(str, folders)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[:5] == [
        "n0: sweep PASS", "n1: sweep PASS", "n2: sweep PASS", "n3: sweep PASS",
        "OUTLIER n3: restore_s at n4096-w4 (sweep): 50.0 ms, fleet median 11.5 ms, z = +26.0",
    ]  # fmt: skip
    md = (tmp_path / "report.md").read_text()
    assert "| node | sweep |\n|---|---|\n| n0 | PASS |" in md
    assert f"| {POINT} | 11.5 ms | 1.0 ms | 10.0 ms | 50.0 ms | 4 | n3 |" in md
    assert "![sweep: restore_s across nodes](fleet-sweep-restore_s.svg)" in md
    page = (tmp_path / "report.html").read_text()
    assert page.count("<svg") == 1 and 'src="fleet-' not in page  # inline: self-contained
    assert (tmp_path / "fleet-sweep-restore_s.svg").is_file()


def test_a_failed_or_missing_node_fails_the_fleet(tmp_path: Path) -> None:
    folders = [node(tmp_path, "a", 0.01), node(tmp_path, "b", 0.01, verdict="FAIL")]
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("fleet: f\nimage: i\nresults: {pvc: r}\nnodes:\n"
                     + "".join(f"  - {{name: {n}, node_name: {n}}}\n" for n in "abc"))  # fmt: skip
    res = CliRunner().invoke(app, ["fleet", "report", *map(str, folders), "--nodes", str(nodes)])
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert lines[:3] == ["a: sweep PASS", "b: sweep FAIL", "c: sweep MISSING"]
    assert lines[-1] == "fleet: FAIL"


def test_runs_of_different_specs_are_refused(tmp_path: Path) -> None:
    a = node(tmp_path, "a", 0.01)
    b = node(tmp_path, "b", 0.01, spec_sha256="f" * 64)
    res = CliRunner().invoke(app, ["fleet", "report", str(a), str(b)])
    assert res.exit_code == 2
    assert "different specs" in res.output and "a fleet report takes runs of one spec" in res.output


def test_each_node_against_its_previous_run(tmp_path: Path) -> None:
    before = [node(tmp_path / "before", n, 0.010) for n in ("a", "b")]
    now = [node(tmp_path / "now", "a", 0.010), node(tmp_path / "now", "b", 0.030)]
    assert before[0].parent == tmp_path / "before"
    gate = ["--baseline", str(tmp_path / "before"), "--fail-on", "restore_s:50"]
    res = CliRunner().invoke(app, ["fleet", "report", *map(str, now), *gate])
    assert res.exit_code == 1, res.output
    (line,) = [s for s in res.output.splitlines() if "REGRESSION" in s]
    assert line.startswith("b sweep: br-e1-b against br-e1-b: REGRESSION restore_s at n4096-w4")
    md = (tmp_path / "now" / "report.md").read_text()
    assert "- a sweep: br-e1-a against br-e1-a: no regression beyond a bound" in md
