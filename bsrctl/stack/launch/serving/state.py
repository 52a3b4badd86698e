"""A serving stack across bsrctl invocations: its state.json, ``bsrctl stack down`` from it,
and the port check before anything starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil

from bsrctl.specs import StackSpec
from bsrctl.stack.launch import shm_ledger
from bsrctl.stack.launch.process import ensure_port_free, pids_alive, stop_pids
from bsrctl.stack.launch.serving.shm import remove_unmapped_shm


def write_state(stack_dir: Path, state: dict[str, Any]) -> None:
    stack_dir.mkdir(parents=True, exist_ok=True)
    (stack_dir / "state.json").write_text(json.dumps(state, indent=2))


def check_ports(spec: StackSpec) -> None:
    """Fail on a taken port before anything starts (in a private namespace none can be)."""
    if spec.mooncake.enabled:
        return
    for name, port in (
        ("stack.lmcache.port", spec.lmcache.port),
        ("stack.lmcache.http_port", spec.lmcache.http_port),
        ("stack.vllm.port", spec.vllm.port),
    ):
        if port:
            ensure_port_free(port, name)


def stop_from_state(state_path: Path, timeout_s: float = 15.0) -> list[int]:
    """`bsrctl stack down`: stop every PID a saved state names. Returns PIDs still alive."""
    state = json.loads(Path(state_path).read_text())
    pids: list[int] = []
    for part in state.get("parts", {}).values():
        pids += [*part.get("children", []), part["pid"]]
    moon = state.get("mooncake") or {}
    pids += [p for p in moon.get("pids", []) if p]
    if state.get("netns_pid"):
        pids.append(state["netns_pid"])
    storage_node = (state.get("topology") or {}).get("storage_node") or {}
    if storage_node.get("netns_pid"):  # two hosts: its veth goes with the namespaces
        pids.append(storage_node["netns_pid"])
    known = {int(k): v for k, v in state.get("pid_start_times", {}).items()}
    now = start_times([p for p in pids if p])
    # Only the processes we started: same PID and same start time as recorded.
    pids = [p for p, t in now.items() if known.get(p) == t]
    stop_pids(pids, timeout_s)
    if state.get("fast_tier"):  # the flash tier's cgroups, loop device and arena file
        from bsrctl.stack.launch.fast_tier import remove_from_state

        remove_from_state(state["fast_tier"])
    if "shm_at_up" in state:
        remove_unmapped_shm(set(state["shm_at_up"]))
    shm_ledger.reclaim()  # the stopped stack's record (and any other dead run's)
    return pids_alive(pids)


def start_times(pids: list[int]) -> dict[int, float]:
    """PID -> process start time, for the PIDs alive now."""
    out: dict[int, float] = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).create_time()
        except psutil.Error:
            continue
    return out
