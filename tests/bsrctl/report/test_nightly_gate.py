"""The nightly's regression gate (.github/scripts/nightly-gate.sh), executed over baseline
folders shaped as `gh run download` leaves an artifact that upload-artifact wrote: the
uploaded directory's contents at the artifact's root. The nightly uploads the folder above
its run (the run's br-* folder inside); an artifact of the run folder itself (evidence.json
at the root, what the nightly uploaded before) is found too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process
ROOT = Path(__file__).resolve().parents[3]
GATE = ROOT / ".github" / "scripts" / "nightly-gate.sh"
STORAGE = {"GATE_FAIL_ON": "restore_pool_peak_bytes:0 restore_s:25"}  # no TTFT without vLLM


def gate(baseline: Path, run_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    bsrctl = Path(sys.executable).parent / "bsrctl"
    return subprocess.run(
        ["bash", str(GATE), str(baseline), str(run_dir)],
        capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "BSRCTL": str(bsrctl), "PYTHONPATH": str(ROOT),
             "PYTHON": sys.executable, **env},
    )  # fmt: skip


def uploaded(run: Path, artifact: Path, keep_folder: bool) -> Path:
    """What `gh run download` leaves of an upload of the run's parent (keep_folder) or of
    the run folder itself."""
    shutil.copytree(run, artifact / run.name if keep_folder else artifact)
    return artifact


def regressed(run: Path, to: Path) -> Path:
    """A copy of the run whose first point's restore-pool peak is one page higher."""
    shutil.copytree(run, to)
    ev = to / "evidence.json"
    doc = json.loads(ev.read_text())
    doc["points"][0]["measures"]["restore_pool_peak_bytes"] += 4096
    ev.write_text(json.dumps(doc))
    return to


def test_a_first_night_passes_saying_there_is_nothing_to_compare(make_run, tmp_path) -> None:
    run = make_run("sweep")
    for baseline in (tmp_path / "never-downloaded", tmp_path / "empty"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        res = gate(baseline, run)
        assert res.returncode == 0, res.stderr
        assert f"first night: no last good run in {baseline}" in res.stdout


@pytest.mark.parametrize("keep_folder", [True, False], ids=["parent-uploaded", "run-uploaded"])
def test_the_same_run_passes_and_a_regression_fails(make_run, tmp_path, keep_folder) -> None:
    run = make_run("sweep")
    base = uploaded(run, tmp_path / "baseline", keep_folder)
    same = gate(base, run, **STORAGE)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "comparing" in same.stdout and "last good run" in same.stdout
    worse = regressed(run, tmp_path / "worse" / run.name)
    res = gate(base, worse, **STORAGE)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "restore_pool_peak_bytes" in res.stdout


def test_a_bound_on_a_metric_the_run_lacks_is_a_broken_gate_not_a_pass(make_run, tmp_path):
    run = make_run("sweep")  # the nightly's default bounds include ttft_s: storage has none
    res = gate(uploaded(run, tmp_path / "baseline", keep_folder=True), run)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "no point measures ['ttft_s']" in res.stdout + res.stderr


def test_a_baseline_of_another_kind_warns_and_passes(make_run, tmp_path) -> None:
    base = uploaded(make_run("law"), tmp_path / "baseline", keep_folder=True)
    res = gate(base, make_run("sweep"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "::warning::the last good run" in res.stdout and "another spec or kind" in res.stdout


def test_bad_arguments_exit_2(make_run, tmp_path) -> None:
    assert gate(tmp_path, tmp_path / "no-run").returncode == 2
    two = tmp_path / "two"
    for name in ("br-e1-a", "br-e1-b"):
        shutil.copytree(make_run("sweep"), two / name)
    res = gate(two, make_run("sweep"))
    assert res.returncode == 2 and "holds 2 runs" in res.stderr
