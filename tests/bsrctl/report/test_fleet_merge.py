"""The nightly's merge step (nightly-gpu.yml's "Fleet report, gated", which runs
.github/scripts/fleet-merge.sh), executed as the workflow runs it over folders shaped as
download-artifact leaves the artifacts node-NAME (each the uploaded folder's contents: the
node's br-* run and node.json), with and without a last good night."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_workflows import merge_step

pytestmark = pytest.mark.process
ROOT = Path(__file__).resolve().parents[3]
BASE = json.loads((ROOT / "tests" / "data" / "evidence" / "sweep-storage.json").read_text())
STORAGE = {"GATE_FAIL_ON": "restore_pool_peak_bytes:0 restore_s:25"}  # no TTFT without vLLM
NODES = "fleet: f\nimage: i\nresults: {pvc: r}\nnodes:\n" + "".join(
    f"  - {{name: {n}, node_name: {n}}}\n" for n in ("h200-a", "h200-b", "h200-c")
)


def artifact(root: Path, node: str, restore_s: float = 0.01, verdict: str = "PASS") -> None:
    """What `gh run download` / download-artifact leave of node NODE's upload of reports/nightly."""
    doc = copy.deepcopy(BASE)
    doc.update(run_id=f"br-e1-{node}", verdict=verdict)
    for p in doc["points"]:
        p["measures"]["restore_s"] = restore_s
    run = root / f"node-{node}" / doc["run_id"]
    run.mkdir(parents=True)
    (run / "evidence.json").write_text(json.dumps(doc))
    (root / f"node-{node}" / "node.json").write_text(json.dumps({"node": node}))


def merge(cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (cwd / ".github").symlink_to(ROOT / ".github")
    (cwd / "nodes.yaml").write_text(NODES)
    return subprocess.run(
        ["bash", "-c", merge_step()["run"]], cwd=cwd, capture_output=True, text=True,
        timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
        "BSRCTL": str(Path(sys.executable).parent / "bsrctl"), "NODES_FILE": "nodes.yaml", **env},
    )  # fmt: skip


def test_a_first_night_of_passing_nodes_passes(tmp_path: Path) -> None:
    for n in ("h200-a", "h200-b", "h200-c"):
        artifact(tmp_path / "nodes", n)
    res = merge(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "first night: no last good runs in baseline, nothing to compare against"
    assert lines[1:4] == ["h200-a: sweep PASS", "h200-b: sweep PASS", "h200-c: sweep PASS"]
    assert (tmp_path / "fleet-report" / "report.html").is_file()


def test_a_failed_or_missing_node_fails_the_merge(tmp_path: Path) -> None:
    artifact(tmp_path / "nodes", "h200-a")
    artifact(tmp_path / "nodes", "h200-b", verdict="FAIL")  # h200-c uploaded nothing
    res = merge(tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "h200-b: sweep FAIL" in res.stdout and "h200-c: sweep MISSING" in res.stdout


def test_a_node_that_regressed_against_last_night_fails_and_is_named(tmp_path: Path) -> None:
    for n in ("h200-a", "h200-b", "h200-c"):
        artifact(tmp_path / "baseline", n)
        artifact(tmp_path / "nodes", n, restore_s=0.02 if n == "h200-c" else 0.01)
    res = merge(tmp_path, **STORAGE)
    assert res.returncode == 1, res.stdout + res.stderr
    regressions = [s for s in res.stdout.splitlines() if "REGRESSION" in s]
    assert regressions and all(s.startswith("h200-c sweep: ") for s in regressions)
    assert "restore_s" in regressions[0]


def test_nothing_uploaded_fails(tmp_path: Path) -> None:
    res = merge(tmp_path)
    assert res.returncode == 1 and "no node uploaded a run" in res.stderr


def last_good(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / ".github" / "scripts" / "last-good-per-node.sh"), "candidates",
         "baseline"], cwd=cwd, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_each_node_gets_its_own_last_good_run_from_earlier_nights(tmp_path: Path) -> None:
    """Night 12 (the newest): h200-a PASS, h200-b FAIL; night 9: h200-b PASS (slow),
    h200-c PASS; night 3: h200-a PASS. Each node's baseline is its newest PASS: a from 12,
    b from 9 (12 failed), c from 9; the older a of night 3 is never taken."""
    cand = tmp_path / "candidates"
    artifact(cand / "12", "h200-a", restore_s=0.011)
    artifact(cand / "12", "h200-b", verdict="FAIL")
    artifact(cand / "9", "h200-b", restore_s=0.05)
    artifact(cand / "9", "h200-c", restore_s=0.013)
    artifact(cand / "3", "h200-a", restore_s=0.5)
    res = last_good(tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "h200-a: last good run from night 12",
        "h200-b: last good run from night 9",
        "h200-c: last good run from night 9",
    ]
    got = {
        p.parent.parent.name: json.loads(p.read_text())["points"][0]["measures"]["restore_s"]
        for p in (tmp_path / "baseline").glob("node-*/br-*/evidence.json")
    }
    assert got == {"node-h200-a": 0.011, "node-h200-b": 0.05, "node-h200-c": 0.013}
    # the gate over those: h200-b now runs at 0.01 against its 0.05 (faster, no regression)
    for n in ("h200-a", "h200-b", "h200-c"):
        artifact(tmp_path / "nodes", n, restore_s=0.01)
    merged = merge(tmp_path, **STORAGE)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "first night" not in merged.stdout


def test_no_earlier_night_is_a_first_night(tmp_path: Path) -> None:
    res = last_good(tmp_path)
    assert (res.returncode, res.stdout) == (0, "")
    assert list((tmp_path / "baseline").iterdir()) == []
