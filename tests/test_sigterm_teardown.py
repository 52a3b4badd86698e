"""A pytest ended by SIGTERM (a CI cancel, `timeout`, `make fuzz`'s last round) tears its
fixtures down as a run that ends normally does (tests/conftest.py turns SIGTERM into ^C):
a child pytest whose module fixture started a real process, SIGTERMed mid-test, stops that
process by PID before it exits. Without the handler the interpreter dies at once and the
process, in a session of its own, runs on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bsrctl.stack.launch.process import pids_alive, stop_pids

ROOT = Path(__file__).resolve().parents[1]
CHILD = ROOT / "tests" / "data" / "sigterm" / "child_module.py"


def wait_for(path: Path, child: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert child.poll() is None, f"the child pytest exited early: {child.returncode}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout_s:.0f} s"
        time.sleep(0.1)


def child_pids(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


@pytest.mark.process
@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "1"]], ids=["serial", "xdist"])
def test_a_sigterm_ends_the_session_with_every_fixture_torn_down(
    tmp_path: Path, workers: list[str]
) -> None:
    # xdist: the controller is SIGTERMed; its interrupt shuts the worker down through the
    # worker's own teardown (the fixture and the process live in the worker)
    env = {**os.environ, "SIGTERM_CHILD_OUT": str(tmp_path)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
            "--rootdir", str(ROOT), str(CHILD)]  # fmt: skip
    child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    pid = None
    try:
        wait_for(tmp_path / "pid", child, 120.0)
        pid = int((tmp_path / "pid").read_text())
        assert pids_alive([pid]) == [pid]
        launcher = psutil.Process(pid).parent()  # the child pytest, or its xdist worker
        assert launcher is not None and launcher.pid in (child.pid, *child_pids(child.pid))
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
        text = out.decode(errors="replace")
        assert child.returncode == pytest.ExitCode.INTERRUPTED, text
        assert "KeyboardInterrupt" in text and "signal 15" in text, text
        assert (tmp_path / "torn-down").read_text() == str(pid)
        assert pids_alive([pid]) == []
    finally:
        if child.poll() is None:
            stop_pids([child.pid], 5.0)
        if pid is not None and pids_alive([pid]):
            stop_pids([pid], 5.0)  # the failure above is the report; leave nothing behind
