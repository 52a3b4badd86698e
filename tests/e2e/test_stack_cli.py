"""`bsrctl stack up|status|down` across invocations: state on disk, stop by PID."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bsrctl.stack.launch.process import pids_alive
from bsrctl.stack.launch.serving import shm_mapped, shm_segments

pytestmark = pytest.mark.e2e
DEMO = Path(__file__).parents[2] / "ladders" / "demo-roundtrip.yaml"


def test_up_status_down(tmp_path: Path, bsrctl: Callable[..., Any]) -> None:
    run_dir = tmp_path / "stack"
    shm_before = shm_segments()
    up = bsrctl("stack", "up", str(DEMO), "--run-dir", str(run_dir))
    state_path = run_dir / "stack" / "state.json"
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        state = json.loads(state_path.read_text())
        pids = [p for part in state["launched"] for p in [part["pid"], *part["children"]]]
        assert [p["name"] for p in state["launched"]] == [
            "netns", "mooncake-master", "mooncake-node", "lmcache", "vllm",
        ]  # fmt: skip
        mains = [part["pid"] for part in state["launched"]]
        assert pids_alive(mains) == mains  # up leaves the stack running

        again = bsrctl("stack", "up", str(DEMO), "--run-dir", str(run_dir))
        assert again.returncode == 2 and "already up" in again.stderr

        st = bsrctl("stack", "status", "--run-dir", str(run_dir))
        assert st.returncode == 0, st.stdout
        rows = json.loads(st.stdout)
        assert sorted(rows) == ["lmcache", "mooncake-master", "mooncake-node", "vllm"]
        assert {rows[n]["healthy"] for n in rows} == {True}
        for name, port_key in (("lmcache", "lmcache.http_port"), ("vllm", "vllm.port")):
            assert rows[name]["healthy"] is True
            assert rows[name]["endpoint"] == f"http://127.0.0.1:{state['ports'][port_key]}"
            assert rows[name]["pid"] == state["parts"][name]["pid"]
    finally:
        down = bsrctl("stack", "down", "--run-dir", str(run_dir), timeout=120)
    assert down.returncode == 0, down.stderr
    assert pids_alive(pids) == []
    # `down` runs in another process than `up`: state.json carries what to clean
    assert sorted(s for s in shm_segments() - shm_before if not shm_mapped(s)) == []
    st = bsrctl("stack", "status", "--run-dir", str(run_dir))
    assert st.returncode == 3
    assert {r["alive"] for r in json.loads(st.stdout).values()} == {False}
