"""Running bsrctl as a child: on a timeout it gets SIGTERM first, so it tears its stack down
(SIGKILL would orphan every process it started), and SIGKILL only if that does not end it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from bsrctl.stack.launch.process import stop_pids

BSRCTL = [sys.executable, "-m", "bsrctl.cli"]
TEARDOWN_GRACE_S = 120.0

RunBsrctl = Callable[..., subprocess.CompletedProcess[str]]


def run_bsrctl(*args: str, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [*BSRCTL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=TEARDOWN_GRACE_S)
        except subprocess.TimeoutExpired:
            stop_pids([proc.pid], 5)
            out, err = proc.communicate()
        pytest.fail(f"bsrctl {' '.join(args)} ran over {timeout:.0f} s\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="session")
def bsrctl() -> RunBsrctl:
    return run_bsrctl
