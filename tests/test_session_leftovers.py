"""The suite's last safety net (tests/conftest.py): an orphan that outlived every test is
found by this session's pool path in its environment and named with the test that started
it; one of another session (another pool path), or a child of this process, is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bsrctl.stack.launch.process import stop_pids
from bsrctl.stack.measure.reference_pool import POOL_ENV

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import session_leftovers  # noqa: E402


def test_a_process_of_this_pool_is_found_with_its_test_and_another_pools_is_not(
    tmp_path: Path,
) -> None:
    ours, theirs = tmp_path / "pool-a", tmp_path / "pool-b"
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    env = {**os.environ, "PYTEST_CURRENT_TEST": "tests/x.py::t (call)"}
    # an orphan, as a stack a SIGKILLed bsrctl left is: started by a shell that exits at once
    quiet = "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"
    orphan = [*sleep[:2], f"import subprocess; print(subprocess.Popen({sleep!r}, {quiet}).pid)"]

    def start(pool: Path) -> int:
        out = subprocess.run(orphan, env={**env, POOL_ENV: str(pool)}, capture_output=True,
                             text=True, timeout=30, check=True)  # fmt: skip
        return int(out.stdout)

    a, b = start(ours), start(theirs)
    child = subprocess.Popen(sleep, env={**env, POOL_ENV: str(ours)})  # ends with this process
    try:
        argv = f"{sys.executable} -c import time; time.sleep(60)"
        assert session_leftovers(ours) == {a: f"tests/x.py::t (call): {argv}"}
        assert session_leftovers(theirs) == {b: f"tests/x.py::t (call): {argv}"}
    finally:
        stop_pids([a, b, child.pid], 5.0)
        child.wait(5)
    assert session_leftovers(ours) == {}
