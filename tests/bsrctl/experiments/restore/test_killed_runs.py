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

pytestmark = pytest.mark.process  # runs bsrctl (or a browser) as a process: not in test-fast

pytest.importorskip("lmcache")

ROOT = Path(__file__).resolve().parents[4]
DRIVER = Path(__file__).with_name("hang_driver.py")


def hang_after_points(arms: int, points: int) -> int:
    """The measure to hang on once ``points`` points are written: every arm's accuracy pass
    comes first, then one timed pass completes each point (one repeat)."""
    return arms + points + 1


# small_spec's sweep: 3 sizes, at W = 2 and W = 0
SMALL_ARMS = 6


def start_sweep(
    spec: Path, out: Path, hang_at: int = hang_after_points(SMALL_ARMS, 2), **env: str
) -> subprocess.Popen[bytes]:
    """`bsrctl sweep SPEC --stack storage` in its own process (and process group, so that a
    test can kill the whole group as CI's job cancel or the OOM killer would); the measure
    after its second point hangs."""
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
        start_new_session=True,
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


# ---- /dev/shm: a SIGKILLed run's L1 pools are reclaimed by the next run and by doctor -----


def shm_of(pid: int) -> set[str]:
    """The storage stack's L1 pools of process `pid` in /dev/shm."""
    return {n for n in os.listdir("/dev/shm") if f"_bsrctl_storage_{pid}_" in n}


@pytest.mark.parametrize("next_command", ["sweep", "doctor"])
def test_sigkilled_storage_run_leaks_no_shm(
    small_spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, next_command: str
) -> None:
    from typer.testing import CliRunner

    from bsrctl.cli import app
    from bsrctl.stack.launch import shm_ledger

    monkeypatch.setenv(shm_ledger.LEDGER_ENV, str(tmp_path / "ledger"))
    before = set(os.listdir("/dev/shm"))
    out = tmp_path / "out"
    spec = small_spec(tp=2)
    proc = start_sweep(spec, out)
    wait_points(out, 2, proc)
    named = shm_of(proc.pid)
    assert len(named) == 2  # one L1 pool per rank
    (record,) = (tmp_path / "ledger").iterdir()
    assert set(json.loads(record.read_text())["segments"]) == named
    # The whole group, Python's resource tracker included (on CPU it would unlink LMCache's
    # pools when its parent dies; CUDA builds allocate without it): nothing tears down.
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert shm_of(proc.pid) == named  # leaked until someone reclaims them
    assert set(os.listdir("/dev/shm")) - before >= named

    sweep = ["sweep", str(spec), "--stack", "storage", "--out", str(tmp_path / "next")]
    args = ["doctor"] if next_command == "doctor" else sweep
    res = CliRunner().invoke(app, args)
    assert shm_of(proc.pid) == set()
    assert not (set(os.listdir("/dev/shm")) - before) & named
    assert list((tmp_path / "ledger").iterdir()) == []  # the next run's own record is released
    said = " ".join(res.output.split())
    assert "reclaimed 2 " in said and "segment(s), 16.0 MiB" in said, res.output
    assert all(n in said for n in named)
    if next_command == "sweep":
        assert res.exit_code == 0, res.output


def test_a_clean_run_releases_its_shm_record(
    small_spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bsrctl.experiments.restore.spec import load_experiment
    from bsrctl.stack.launch import shm_ledger
    from bsrctl.stack.storage.target import StorageTarget

    monkeypatch.setenv(shm_ledger.LEDGER_ENV, str(tmp_path / "ledger"))
    spec, _ = load_experiment(small_spec(tp=2), "sweep", "storage")
    target = StorageTarget(spec, tmp_path / "run")
    target.deploy(1 << 20, spec.settings(2))
    named = shm_of(os.getpid())
    assert len(named) == 2 and len(list((tmp_path / "ledger").iterdir())) == 1
    target.cleanup()
    assert shm_of(os.getpid()) == set()  # LMCache unlinks its pools on close ...
    assert list((tmp_path / "ledger").iterdir()) == []  # ... and the record goes with them
