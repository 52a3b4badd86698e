"""A vLLM or LMCache that lacks one declared name: `bsrctl doctor --vllm-from` exits 3 naming
it, and the scheduler adapter and the server module refuse to load with one line naming it.

The trees are the installed packages' own files (those the check reads), one name edited
out, put first on PYTHONPATH: ``find_spec`` then finds them, and nothing of them runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import bsrctl
from bsrctl import cli_evidence
from bsrctl.cli import app
from bsrctl.stack.doctor.surface import surface_findings
from bsrctl.stack.doctor.uses import DECLARED
from bsrkv.hostsurface.check import check
from tests.bsrctl.hostsurface.fake_tree import fake_tree

WT = Path(bsrctl.__file__).resolve().parent.parent
SCHED = "vllm.v1.core.sched.scheduler"
WAITING = (SCHED, "self.kv_holding_waiting = ", "self.kv_holding_queue = ")
LOOKUP = "lmcache.v1.multiprocess.modules.lookup"
END_SESSION = (LOOKUP, "def end_session(self", "def close_session(self")


def _import(module: str, first: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join((str(first), str(WT), str(WT / "mechanisms")))
    return subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip


def test_doctor_names_the_missing_attribute_and_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    side = fake_tree("vllm", tmp_path / "side", "0.99.0", WAITING)
    monkeypatch.setattr(cli_evidence.out, "width", 40)  # a row stays one line at any width
    res = CliRunner().invoke(app, ["doctor", "--vllm-from", str(side)])
    assert res.exit_code == 3, res.output
    lines = res.output.splitlines()
    assert lines[:2] == [
        f"!! vLLM surface: {SCHED}.Scheduler.kv_holding_waiting missing in vllm 0.99.0 at "
        f"{side}: Scheduler has no kv_holding_waiting; read by bsrkv.vllm_ext.scheduler",
        "   fix: use vllm 0.32.0 (tested with), or port bsrkv.vllm_ext.scheduler to 0.99.0",
    ]
    assert lines[2].startswith("ok LMCache surface: complete: 141 names, 17 flags in lmcache 0.5.6")
    # 0.99 >= 0.34 with LMCache 0.5.6: the known-broken pair, with its cause
    assert lines[3].startswith("!! known-broken pair: vLLM 0.99.0 with LMCache 0.5.6: LMCache")
    assert len(lines) == 5


def test_doctor_refuses_a_folder_without_vllm(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["doctor", "--vllm-from", str(tmp_path)])
    assert res.exit_code == 2
    assert f"--vllm-from: no vllm/ package folder in {tmp_path}" in res.output


def test_the_scheduler_adapter_refuses_to_load_in_one_line(tmp_path: Path) -> None:
    side = fake_tree("vllm", tmp_path / "side", "0.99.0", WAITING)
    res = _import("bsrkv.vllm_ext.scheduler", side)
    assert res.returncode == 1
    assert res.stderr.splitlines()[-1] == (
        "bsrkv.hostsurface.check.SurfaceMissing: bsrkv.vllm_ext: vllm 0.99.0 lacks what bsrkv "
        f"uses: {SCHED}.Scheduler.kv_holding_waiting (Scheduler has no kv_holding_waiting, read "
        "by bsrkv.vllm_ext.scheduler) (bsrkv is tested with vllm 0.32.0; the harness's "
        "`doctor` lists the surface)"
    )
    assert "vllm.v1" not in res.stderr.replace(f"{SCHED}.Scheduler", "")  # vLLM never imported


def test_the_server_module_refuses_to_load_in_one_line(tmp_path: Path) -> None:
    side = fake_tree("lmcache", tmp_path / "side", "0.5.7", END_SESSION)
    res = _import("bsrkv.lmcache_ext.server", side)
    assert res.returncode == 1
    assert res.stderr.splitlines()[-1] == (
        "bsrkv.hostsurface.check.SurfaceMissing: bsrkv.lmcache_ext: lmcache 0.5.7 lacks what "
        f"bsrkv uses: {LOOKUP}.LookupModule.end_session(request_id) (LookupModule has no "
        "end_session, read by bsrkv.lmcache_ext.server.lookup) (bsrkv is tested with lmcache "
        "0.5.6; the harness's `doctor` lists the surface)"
    )


def test_doctor_says_a_package_not_there_once(tmp_path: Path) -> None:
    rows = surface_findings((check("vllm", tmp_path, DECLARED),))
    n = sum(1 for d in DECLARED if d.package == "vllm")
    assert [(r.name, r.ok, r.value, r.fix) for r in rows] == [
        ("vLLM surface", False, f"no vllm at {tmp_path}: its {n} declared names unchecked",
         "install vllm (or `make venv`)"),
    ]  # fmt: skip
