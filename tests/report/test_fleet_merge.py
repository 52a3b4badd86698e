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
ROOT = Path(__file__).resolve().parents[2]
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
