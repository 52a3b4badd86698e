"""What a storage-stack sweep prints: no LMCache line (its logs land in the run folder), one
line per point with its verdict; --quiet only those; --json only the evidence path and the
verdict. Each in a fresh `bsrctl` process, so LMCache is imported there as a user's is."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # runs bsrctl (or a browser) as a process: not in test-fast

pytest.importorskip("lmcache")

ROOT = Path(__file__).resolve().parents[4]
IDS = [f"n{n}-w{w}" for n in (1024, 2048, 4096) for w in (2, 0)]


def bsrctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LMCACHE_LOG_LEVEL": "INFO",  # LMCache at its default: hundreds of lines per run
        "BSRCTL_SHM_LEDGER": str(tmp_path / "ledger"),
    }
    return subprocess.run(
        [sys.executable, "-m", "bsrctl.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def sweep_args(spec: Path, out: Path) -> list[str]:
    return ["sweep", str(spec), "--stack", "storage", "--out", str(out)]


def test_default_console_has_no_lmcache_line(small_spec, tmp_path: Path) -> None:
    res = bsrctl(tmp_path, *sweep_args(small_spec(), tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    console = res.stdout + res.stderr
    assert "LMCache" not in console and "lmcache" not in console.lower().replace(
        "lmcache_l1", ""
    ), console
    (run_dir,) = (tmp_path / "out").iterdir()
    logged = (run_dir / "logs" / "lmcache.log").read_text()
    assert " INFO lmcache." in logged  # the lines are all there, in the run folder
    points = [line for line in res.stderr.splitlines() if line.startswith("[")]
    assert [line.split()[1:3] for line in points] == [[i, "PASS"] for i in IDS]
    assert points[0].startswith("[1/6] n1024-w2 PASS peak 0.50 MiB")
    assert "· deploying: L1 8388608 B, W = 2" in res.stderr.splitlines()
    assert res.stdout == f"verdict: PASS  ({run_dir})\n"


def test_quiet_keeps_one_line_per_point(small_spec, tmp_path: Path) -> None:
    res = bsrctl(tmp_path, *sweep_args(small_spec(), tmp_path / "out"), "--quiet")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert [re.sub(r"^\[(\d)/6\] (\S+) (\w+) .*", r"\1 \2 \3", s) for s in lines] == [
        f"{i} {pid} PASS" for i, pid in enumerate(IDS, 1)
    ]
    assert res.stdout.startswith("verdict: PASS  (")


def test_json_prints_only_the_evidence_path_and_verdict(small_spec, tmp_path: Path) -> None:
    res = bsrctl(tmp_path, *sweep_args(small_spec(), tmp_path / "out"), "--json")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    doc = json.loads(res.stdout)
    (run_dir,) = (tmp_path / "out").iterdir()
    assert doc == {"evidence": str((run_dir / "evidence.json").resolve()), "verdict": "PASS"}
    assert res.stdout.count("\n") == 1
