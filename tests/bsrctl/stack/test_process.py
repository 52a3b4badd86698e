import sys
import time
from pathlib import Path

import pytest

from bsrctl.errors import BadInput, StackFailed
from bsrctl.stack.launch.process import Supervised, ensure_port_free, free_port, pids_alive

# A parent that starts a child which ignores SIGTERM: the stop must still end both, by PID.
STUBBORN = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print("child", child.pid, flush=True)
time.sleep(600)
"""


def test_stop_kills_parent_and_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    part = Supervised("stubborn", [sys.executable, "-c", STUBBORN], tmp_path / "s.log")
    part.start()
    try:
        deadline = time.monotonic() + 20
        while "child" not in (tmp_path / "s.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        kids = part.descendants()
        assert len(kids) == 1
    finally:
        part.stop(timeout_s=1)
    assert pids_alive([part.pid, *kids]) == []


def test_wait_healthy_fails_fast_with_the_log_tail_when_the_process_dies(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "print('boom: bad flag'); raise SystemExit(7)"]
    part = Supervised("dies", argv, tmp_path / "d.log")
    part.start()
    with pytest.raises(StackFailed, match="exited with code 7") as exc:
        part.wait_healthy(lambda: False, timeout_s=30)
    assert "boom: bad flag" in exc.value.log_tail


def test_wait_healthy_is_bounded(tmp_path: Path) -> None:
    part = Supervised("slow", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "x")
    part.start()
    try:
        with pytest.raises(StackFailed, match="not healthy after 1 s"):
            part.wait_healthy(lambda: False, timeout_s=1, interval_s=0.1)
    finally:
        part.stop(timeout_s=2)
    assert pids_alive([part.pid]) == []


def test_missing_binary_is_a_stack_failure(tmp_path: Path) -> None:
    with pytest.raises(StackFailed, match="cannot run"):
        Supervised("nope", ["/nonexistent/bin"], tmp_path / "n.log").start()


def test_port_in_use_is_bad_input_naming_the_field() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(BadInput, match=f"stack.vllm.port: port {port} .* in use"):
            ensure_port_free(port, "stack.vllm.port")
