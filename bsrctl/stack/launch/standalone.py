"""`bsrctl stack up/down`: one serving stack started from a spec's `stack:` and `restore:`
sections (W = 0) and left running, found again and stopped by the PIDs its state records."""

from __future__ import annotations

import json
from pathlib import Path

from bsrctl.errors import BadInput
from bsrctl.specs import load_stack_section
from bsrctl.stack.launch.extensions import bsr_extensions
from bsrctl.stack.launch.process import pids_alive
from bsrctl.stack.launch.serving import ServingStack, check_ports, stop_from_state
from bsrkv.settings import RestoreSettings


def live_parts(run_dir: Path) -> list[int]:
    """The PIDs of the stack in ``run_dir`` that are still alive."""
    state = json.loads((run_dir / "stack" / "state.json").read_text())
    return pids_alive([p["pid"] for p in state.get("parts", {}).values() if p.get("pid")])


def stack_up(spec: Path, run_dir: Path) -> ServingStack:
    parsed, tuning = load_stack_section(spec)
    if parsed.kind == "attach":
        raise BadInput(
            "stack.kind: attach names a deployment someone else started; `stack up` starts "
            "nothing for it (run sweep, law or failmatrix against it)"
        )
    if (run_dir / "stack" / "state.json").exists() and live_parts(run_dir):
        raise BadInput(f"--run-dir: a stack is already up in {run_dir}; `bsrctl stack down`")
    check_ports(parsed)
    st = ServingStack(parsed, run_dir, bsr_extensions(RestoreSettings.of(tuning, 0)))
    st.up()
    return st


def stack_down(run_dir: Path) -> list[int]:
    """Stop every part by PID (SIGTERM, then SIGKILL); the PIDs still alive after it."""
    state = run_dir / "stack" / "state.json"
    if not state.is_file():
        raise BadInput(f"--run-dir: no stack state at {state}; nothing to stop")
    return stop_from_state(state)
