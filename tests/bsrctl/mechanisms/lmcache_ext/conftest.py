"""Fixtures for the L2 adapter tests: a private network namespace, a real Mooncake store,
and a driver process that runs LMCache's StorageManager inside the namespace.

Every process started here is stopped by its PID in a finaliser: SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bsrctl.stack.launch.netns import NetNamespace, namespace_support, start_netns
from bsrctl.stack.launch.process import pids_alive, stop_pids
from bsrctl.stack.launch.serving.mooncake import MooncakeStack, start_mooncake

# lmcext_kv and the adapter driver are bsrkv's own test helpers (tests/bsrkv/lmcache_ext)
HERE = Path(__file__).resolve().parents[3] / "bsrkv" / "lmcache_ext"
if str(HERE) not in sys.path:  # --import-mode=importlib: make lmcext_kv importable
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def netns_support():
    support = namespace_support()
    if not support.ok:
        pytest.skip(f"no private network namespace here: {support.detail}")
    return support


@pytest.fixture(scope="module")
def netns(netns_support, tmp_path_factory) -> Iterator[NetNamespace]:
    ns = start_netns(tmp_path_factory.mktemp("netns"))
    try:
        yield ns
    finally:
        pid = ns.pid
        ns.stop(5.0)
        assert pids_alive([pid]) == [], f"namespace holder {pid} still alive"


@pytest.fixture
def mooncake(netns, tmp_path) -> Iterator[MooncakeStack]:
    """A fresh master + storage node per test (tests stop parts of it on purpose)."""
    stack = start_mooncake(netns, tmp_path / "logs", segment_size=str(512 << 20))
    try:
        yield stack
    finally:
        pids = [p for p in stack.pids().values() if p is not None]
        stack.stop(10.0)
        assert pids_alive(pids) == [], f"Mooncake processes still alive: {pids_alive(pids)}"


class Driver:
    """adapter_driver.py in the namespace; request() sends one JSON command, waits the reply."""

    def __init__(self, netns: NetNamespace, log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            netns.wrap([sys.executable, str(HERE / "adapter_driver.py")]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=HERE,
            start_new_session=True,
        )
        self._replies: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._replies.put(line.decode())

    def request(self, timeout_s: float = 60.0, **req) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        try:
            reply = json.loads(self._replies.get(timeout=timeout_s))
        except queue.Empty:
            raise TimeoutError(
                f"driver gave no reply to {req['op']} in {timeout_s} s; log {self.log_path}:\n"
                + self.log_tail()
            ) from None
        if not reply.get("ok"):
            raise AssertionError(f"driver {req['op']} failed: {reply}\n{self.log_tail()}")
        return reply

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.request(timeout_s=15.0, op="close")
                self.proc.wait(timeout=10)
        except Exception:
            pass
        finally:
            stop_pids([self.proc.pid], timeout_s=5.0)
            self._log.close()
        assert pids_alive([self.proc.pid]) == []


@pytest.fixture
def driver_factory(netns, tmp_path) -> Iterator:
    drivers: list[Driver] = []

    def make() -> Driver:
        d = Driver(netns, tmp_path / f"driver-{len(drivers)}.log")
        drivers.append(d)
        return d

    try:
        yield make
    finally:
        for d in drivers:
            d.stop()
