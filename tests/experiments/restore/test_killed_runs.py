"""A storage-stack sweep killed between two points: its evidence is valid JSON, marked
incomplete, and never reads PASS (the points' verdict so far is kept apart)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache")

ROOT = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).with_name("hang_driver.py")


def start_sweep(spec: Path, out: Path, hang_at: int = 3, **env: str) -> subprocess.Popen[bytes]:
    """`bsrctl sweep SPEC --stack storage` in its own process; its third measure hangs."""
    return subprocess.Popen(
        [sys.executable, str(DRIVER), "sweep", str(spec), "--stack", "storage", "--out", str(out)],
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "BSRCTL_TEST_HANG_AT": str(hang_at),
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_points(out: Path, n: int, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> Path:
    """The run folder once its evidence holds n points (the process is then hanging)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        assert proc.poll() is None, proc.communicate()
        for ev in out.glob("*/evidence.json"):
            try:
                if len(json.loads(ev.read_text())["points"]) >= n:
                    return ev.parent
            except (json.JSONDecodeError, OSError):
                pass  # never half-written (atomic); the file may not exist yet
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no evidence with {n} points after {timeout_s} s")


def evidence(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "evidence.json").read_text())  # valid JSON, or this raises


def test_sigkilled_sweep_is_incomplete_and_never_pass(small_spec, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start_sweep(small_spec(), out)
    run_dir = wait_points(out, 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    doc = evidence(run_dir)
    assert [p["id"] for p in doc["points"]] == ["n1024-w2", "n1024-w0"]
    assert (doc["complete"], doc["finished_at"], doc["verdict"]) == (False, None, "UNKNOWN")
    assert doc["points_verdict"] == "PASS"  # what the two points said, under its own name


def test_sigtermed_sweep_aborts_and_never_reads_pass(small_spec, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start_sweep(small_spec(), out)
    run_dir = wait_points(out, 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 3, stderr.decode()
    doc = evidence(run_dir)
    assert [p["id"] for p in doc["points"]] == ["n1024-w2", "n1024-w0"]
    assert (doc["complete"], doc["verdict"], doc["points_verdict"]) == (False, "UNKNOWN", "PASS")
    assert doc["summary"]["aborted"] == "interrupted: Interrupted: signal SIGTERM"
    assert doc["finished_at"] is not None
    assert (run_dir / "summary.md").read_text().startswith(f"# {run_dir.name} (sweep): UNKNOWN")
