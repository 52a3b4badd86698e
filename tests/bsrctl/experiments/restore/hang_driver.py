"""TEST-ONLY: `bsrctl ARGS...` in a process whose target (BSRCTL_TEST_HANG_TARGET: storage
or serving) hangs on measure number BSRCTL_TEST_HANG_AT (1-based) until a signal ends it,
so a test can kill a run between two points deterministically. Run as a script with the
repository on PYTHONPATH."""

from __future__ import annotations

import os
import sys
import time
from importlib import import_module
from typing import Any

HANG_AT = int(os.environ.get("BSRCTL_TEST_HANG_AT", "3"))
_module, _class = {
    "storage": ("bsrctl.stack.storage.target", "StorageTarget"),
    "serving": ("bsrctl.stack.measure.target", "RunningTarget"),
}[os.environ.get("BSRCTL_TEST_HANG_TARGET", "storage")]
_target = getattr(import_module(_module), _class)
_real = _target.measure
_calls = {"n": 0}


def _measure(self: Any, *a: Any, **k: Any) -> Any:
    _calls["n"] += 1
    if _calls["n"] == HANG_AT:
        while True:  # the test signals us here; SIGTERM raises out of the sleep
            time.sleep(0.05)
    return _real(self, *a, **k)


_target.measure = _measure

if __name__ == "__main__":
    from bsrctl.cli import app

    sys.argv[0] = "bsrctl"
    app(prog_name="bsrctl")
