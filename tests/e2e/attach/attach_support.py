"""Shared by the attach tests (imported top-level): the operator script's runner, finding
processes by an environment mark, the operator's deployment handle, bsrctl as a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SCRIPT = HERE / "operator_stack.py"
SMOKE = HERE.parents[2] / "ladders" / "cpu-smoke.yaml"
MARK = "BSRCTL_OPERATOR_DEPLOYMENT"
RUN_MARK = "BSRCTL_ATTACH_TEST_RUN"
TOKEN_ENV = "BSRCTL_ATTACH_TOKEN"  # bsrctl's side: the variable stack.attach names


def readme_token() -> str:
    """The control token docs/attach.md's `lmcache server` line gives the server module."""
    from operator_stack import readme_block

    words = readme_block("lmcache")
    (token,) = [w.split("=", 1)[1] for w in words if w.startswith("BSRKV_CONTROL_TOKEN=")]
    return token


def operator(*args: str, timeout: float = 400) -> str:
    res = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def pool_pids() -> set[int]:
    """The session's kept reference vLLMs (``bsrctl.stack.measure.reference_pool``) with their
    children: a run that missed the canonical cache started one, under that run's
    environment, and the pool keeps it past the run by design (``close_pool`` stops every
    one by PID at the session's end and asserts none is left)."""
    import psutil

    from bsrctl.stack.measure import reference_pool

    pool = reference_pool.pool_dir()
    out: set[int] = set()
    for entry in reference_pool.entries(pool) if pool is not None else []:
        state = entry / "stack" / "state.json"
        if not state.is_file():
            continue
        for part in json.loads(state.read_text()).get("parts", {}).values():
            try:
                proc = psutil.Process(part["pid"])
                out |= {proc.pid, *(c.pid for c in proc.children(recursive=True))}
            except psutil.Error:
                continue
    return out


def marked(name: str, value: str) -> list[int]:
    """PIDs of every live process whose environment carries name=value, but the reference
    pool's (``pool_pids``)."""
    needle = f"{name}={value}".encode()
    out = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in env.read_bytes().split(b"\0"):
                out.append(int(env.parent.name))
        except OSError:
            continue
    kept = pool_pids() if out else set()
    return sorted(set(out) - kept)


@dataclass
class Deployment:
    root: Path
    state: dict[str, Any]

    @property
    def ports(self) -> dict[str, int]:
        return self.state["ports"]

    def reload(self) -> None:
        self.state = json.loads((self.root / "state.json").read_text())

    def processes(self) -> list[int]:
        return marked(MARK, str(self.root))

    def attach_section(self, **over: Any) -> str:
        p = self.ports
        doc = {
            "vllm_url": f"http://127.0.0.1:{p['vllm']}",
            "lmcache_url": f"tcp://127.0.0.1:{p['lmcache']}",
            "lmcache_http_port": p["lmcache_http"],
            "control_token_env": TOKEN_ENV,  # run_bsrctl sets it to docs/attach.md's token
            **over,
        }
        return "  attach: " + json.dumps(doc) + "\n"

    def commands(self) -> dict[str, str]:
        base = f"{sys.executable} {SCRIPT}"
        return {
            "restart_vllm": f"{base} restart-vllm {self.root}",
            "restart_lmcache": f"{base} restart-lmcache {self.root}",
        }


def run_bsrctl(*args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess[str], str]:
    """bsrctl as a process, its environment marked: whatever it starts carries the mark."""
    mark = uuid.uuid4().hex
    env = {**os.environ, RUN_MARK: mark, TOKEN_ENV: readme_token()}
    res = subprocess.run(
        [sys.executable, "-m", "bsrctl.cli", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    return res, mark
