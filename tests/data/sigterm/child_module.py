"""Run by tests/test_sigterm_teardown.py as a child pytest (not collected by the suite: the
name is not test_*): a module fixture starts a real process with the project's launcher and
stops it by PID in its teardown; the test writes the PID and waits to be SIGTERMed."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bsrctl.stack.launch.process import Supervised

OUT = Path(os.environ["SIGTERM_CHILD_OUT"])


@pytest.fixture(scope="module")
def sleeper() -> Iterator[Supervised]:
    proc = Supervised("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"],
                      OUT / "sleeper.log")  # fmt: skip
    proc.start()
    yield proc
    proc.stop(5.0)
    (OUT / "torn-down").write_text(str(proc.pid))


def test_waits_to_be_terminated(sleeper: Supervised) -> None:
    (OUT / "pid.tmp").write_text(str(sleeper.pid))
    (OUT / "pid.tmp").rename(OUT / "pid")
    time.sleep(300)
