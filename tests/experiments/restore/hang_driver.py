"""TEST-ONLY: `bsrctl ARGS...` in a process whose storage target hangs on measure number
BSRCTL_TEST_HANG_AT (1-based) until a signal ends it, so a test can kill a run between two
points deterministically. Run as a script with the repository on PYTHONPATH."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from bsrctl.stack import storage_target

HANG_AT = int(os.environ.get("BSRCTL_TEST_HANG_AT", "3"))
_real = storage_target.StorageTarget.measure
_calls = {"n": 0}


def _measure(self: Any, *a: Any, **k: Any) -> Any:
    _calls["n"] += 1
    if _calls["n"] == HANG_AT:
        while True:  # the test signals us here; SIGTERM raises out of the sleep
            time.sleep(0.05)
    return _real(self, *a, **k)


storage_target.StorageTarget.measure = _measure  # type: ignore[method-assign]

if __name__ == "__main__":
    from bsrctl.cli import app

    sys.argv[0] = "bsrctl"
    app(prog_name="bsrctl")
