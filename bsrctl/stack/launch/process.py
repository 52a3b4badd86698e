"""Supervised processes: command line, PID, log file, bounded health waits, stop by PID.

Every process bsrctl starts is stopped by its own PID and its children's (never by name):
SIGTERM, then SIGKILL after a timeout. vLLM's EngineCore/Worker children sometimes ignore
SIGTERM, so children are collected before the parent is signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bsrctl.errors import BadInput, StackFailed

LOG_TAIL_LINES = 30


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_port_free(port: int, field_name: str) -> None:
    """Bad input, not a stack failure: a port another program holds."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise BadInput(
                f"{field_name}: port {port} on 127.0.0.1 is in use ({exc.strerror}); "
                f"choose a free port or 0 to pick one"
            ) from None


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes] | None:
    """(status, body) of a GET; None if nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, OSError, ValueError):
        return None


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    res = http_get(url, timeout_s)
    return res is not None and 200 <= res[0] < 300


def tcp_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass
class Supervised:
    """One child process. Mutable on purpose: it is a live handle, not a decision."""

    name: str  # part name: "lmcache", "vllm", "mooncake-master", ...
    argv: list[str]  # full command line as executed
    log_path: Path  # stdout+stderr of the process
    env: dict[str, str] = field(default_factory=dict)  # additions to os.environ
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    _children: set[int] = field(default_factory=set)  # every descendant PID seen, for the kill
    shm_before: set[str] = field(default_factory=set)  # /dev/shm names present at start

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child's lifetime
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                cwd=self.cwd,
                start_new_session=True,  # a terminal's ^C reaches us, not the stack directly
            )
        except FileNotFoundError as exc:
            raise StackFailed(f"{self.name}: cannot run {self.argv[0]!r}: {exc}") from None
        finally:
            log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code if the process ends within timeout_s, else None (still running)."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def descendants(self) -> list[int]:
        """Current descendants, remembered so that ones re-parented later are still killed."""
        if self.pid is None:
            return []
        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        self._children.update(k.pid for k in kids)
        return sorted(self._children)

    def tail(self) -> str:
        return log_tail(self.log_path)

    def wait_healthy(
        self, probe: Callable[[], bool], timeout_s: float, interval_s: float = 0.5
    ) -> float:
        """Poll probe() until it is true; fail fast if the process dies. Returns seconds."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise StackFailed(
                    f"{self.name} exited with code {code} before it was healthy "
                    f"(log {self.log_path})",
                    self.tail(),
                )
            self.descendants()
            if probe():
                return time.monotonic() - t0
            time.sleep(interval_s)
        raise StackFailed(
            f"{self.name} not healthy after {timeout_s:.0f} s (log {self.log_path})", self.tail()
        )

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the process and its descendants, SIGKILL what is left after timeout_s."""
        if self.proc is None:
            return
        pids = [*self.descendants(), self.proc.pid]
        stop_pids(pids, timeout_s)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def stop_pids(pids: Sequence[int], timeout_s: float) -> list[int]:
    """Stop exactly these PIDs: TERM, wait, KILL. Returns the PIDs that needed SIGKILL."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in alive]


def pids_alive(pids: Sequence[int]) -> list[int]:
    """PIDs still running (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out
