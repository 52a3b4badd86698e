"""An unexpected exception in any command: exit 3 and one line naming the step and the log
file that holds the traceback, never Python's traceback on the console and exit 1 (the
code of a FAIL verdict). Bad input stays exit 2 and stack failures exit 3 (``cli.guarded``);
``cli.GuardedGroup`` (the only typer importer) calls ``report`` around every command.

The step is the command and, inside a run, the last phase its console showed (``note``);
the log is ``<run>/logs/bsrctl-error.log`` of the run it was in (``note_run``), else a file
in the temporary directory.
"""

from __future__ import annotations

import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

_state: dict[str, Any] = {"step": "", "run_dir": None}


def note(step: str) -> None:
    """The phase a run's console shows now (its step when it fails)."""
    _state["step"] = step


def note_run(run_dir: Path) -> None:
    """The folder of the run this process is in (its log takes the traceback)."""
    _state["run_dir"] = Path(run_dir)


def reset() -> None:
    _state.update(step="", run_dir=None)


def log_path() -> Path:
    run_dir = _state["run_dir"]
    if run_dir is not None and Path(run_dir).is_dir():
        return Path(run_dir) / "logs" / "bsrctl-error.log"
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return Path(tempfile.gettempdir()) / f"bsrctl-error-{stamp}.log"


def report(exc: BaseException, command: str) -> str:
    """Write the traceback to the log; the one line the console shows."""
    step = " ".join(x for x in (command, _state["step"] and f"({_state['step']})") if x)
    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {step}\n")
        f.write("".join(traceback.format_exception(exc)))
    what = str(exc).splitlines()[0][:200] if str(exc) else ""
    return (
        f"error: unexpected {type(exc).__name__} in {step or 'bsrctl'}"
        f"{': ' + what if what else ''}; traceback in {path}"
    )


def begin(ctx: Any) -> str:
    """A command starts (``ctx``: the top group's context): nothing noted yet; the command
    path its arguments name ("sweep", "stack up")."""
    reset()
    args = [*getattr(ctx, "_protected_args", ()), *getattr(ctx, "protected_args", ())]
    words = [a for a in [*args, *ctx.args] if not a.startswith("-")]
    return " ".join(words[:2] if words[:1] == ["stack"] else words[:1])
