"""A serving-stack sweep (cpu-smoke) killed whole by SIGKILL after its first point, as CI's
job cancel or the OOM killer ends a cgroup: bsrctl, its resource trackers and every stack
process at once. The console showed no LMCache or vLLM line (their logs are in the run
folder); the /dev/shm segments the dead run named are reclaimed by `bsrctl doctor`, and
nothing else in /dev/shm is touched."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bsrctl.stack.launch.process import pids_alive
from tests.bsrctl.experiments.restore.test_killed_runs import (
    DRIVER,
    ROOT,
    hang_after_points,
    wait_points,
)

from .e2e_support import SMOKE, launched_pids, require_server_module

pytestmark = pytest.mark.e2e
# cpu-smoke's sweep: 2 sizes, at W = 2 and W = 0
SMOKE_SWEEP_ARMS = 4
LIBRARY_LINE = re.compile(r"LMCache|^(INFO|WARNING|DEBUG|ERROR)\b|\b(INFO|WARNING) \d\d-\d\d ")


def test_sigkilled_serving_sweep_quiet_console_and_shm_reclaimed(tmp_path: Path) -> None:
    require_server_module()
    ledger, out = tmp_path / "ledger", tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BSRCTL_TEST_HANG_TARGET": "serving",
        "BSRCTL_TEST_HANG_AT": str(hang_after_points(SMOKE_SWEEP_ARMS, 1)),
        "BSRCTL_SHM_LEDGER": str(ledger),
        "LMCACHE_LOG_LEVEL": "INFO",
    }
    before = set(os.listdir("/dev/shm"))
    argv = [sys.executable, str(DRIVER), "sweep", str(SMOKE), "--stack", "serving"]
    proc = subprocess.Popen(
        [*argv, "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids: list[int] = []
    try:
        run_dir = wait_points(out, 1, proc, timeout_s=840)
        (record,) = ledger.iterdir()
        named = set(json.loads(record.read_text())["segments"])
        assert named and named <= set(os.listdir("/dev/shm")) - before, named
        pids = launched_pids(run_dir)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        if not pids:  # failed before the point: still stop what it launched, by PID
            pids = [p for d in out.glob("*/") for p in launched_pids(d)]
        for pid in pids_alive(pids):
            os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids_alive(pids) == []

    bad = [line for line in (stdout + stderr).splitlines() if LIBRARY_LINE.search(line)]
    assert bad == [], bad
    assert "[1/4] n1024-w2 PASS" in stderr
    assert (run_dir / "stack" / "lmcache.log").stat().st_size > 0
    assert (run_dir / "stack" / "vllm.log").stat().st_size > 0

    leaked = named & set(os.listdir("/dev/shm"))
    assert leaked, "nothing leaked: the kill did not reach what tears down"
    doctor = subprocess.run(
        [sys.executable, "-m", "bsrctl.cli", "doctor"], env=env, capture_output=True, text=True
    )
    said = " ".join(doctor.stdout.split())
    assert f"reclaimed {len(leaked)} segment(s)" in said, doctor.stdout
    assert named & set(os.listdir("/dev/shm")) == set()
    assert list(ledger.iterdir()) == []
