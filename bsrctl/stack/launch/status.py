"""`bsrctl stack status`: health of a stack started by another bsrctl invocation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bsrctl.errors import BadInput
from bsrctl.stack.launch.netns import NetNamespace, maybe_inside
from bsrctl.stack.launch.process import http_ok, pids_alive

HEALTH = {"vllm": ("vllm.port", "/health"), "lmcache": ("lmcache.http_port", "/healthcheck")}


def status_from_state(run_dir: Path) -> dict[str, dict[str, Any]]:
    path = Path(run_dir) / "stack" / "state.json"
    if not path.is_file():
        raise BadInput(f"--run-dir: no stack state at {path}; start one with `bsrctl stack up`")
    state = json.loads(path.read_text())
    ns = NetNamespace(pid=state["netns_pid"]) if state.get("netns_pid") else None
    rows: dict[str, dict[str, Any]] = {}
    if ns is not None and not ns.alive():
        ns = None  # the namespace is gone with its holder: every part is down
    with maybe_inside(ns):
        for name, part in state.get("parts", {}).items():
            port_key, route = HEALTH[name]
            url = f"http://127.0.0.1:{state['ports'][port_key]}"
            alive = bool(pids_alive([part["pid"]]))
            rows[name] = {
                "pid": part["pid"],
                "alive": alive,
                "healthy": alive and http_ok(url + route),
                "endpoint": url,
                "log": part["log"],
            }
    for name, part in ((state.get("mooncake") or {}).get("parts") or {}).items():
        alive = bool(pids_alive([part["pid"]]))
        rows[name] = {**part, "alive": alive, "healthy": alive}
    return rows
